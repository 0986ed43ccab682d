"""Repricing one workspace's recorded costs, asked for by one of its admins on the Prices page and
worked through by `ledger worker` (docs/operations.md § Members and prices on the Settings pages).

`request_reprice` records the request (`RepriceRequest`, queued) and the audit entry
`prices.reprice_requested`, and queues the task `reprice_workspace` on the durable queue
(django-tasks, as re-executions are) in the same transaction. One open request per workspace:
a second is refused while one is queued or running (409 `reprice_in_progress`).

The task goes over the workspace's runs in run order, each in its own transaction under the run's
head lock (ledger/log/repricing.py `reprice_run`: a run whose cost entries all name the table in
force is left alone, so going over it again changes nothing), at most RUNS_PER_TASK runs a task,
then queues the next task for the rest: a long workspace never holds a worker for long, and
appends go on meanwhile. The request keeps where it stands (`after_run_pk`) and its counts, so a
task lost with its worker is queued again by the worker's sweep (`recover_stalled`) and takes up
after the last run done. The last task marks the request done and writes `prices.repriced`
(runs, runs changed, entries changed). A run that cannot be repriced (its costs overflow the
columns, say) fails the request instead: `failed` with why, audited `prices.reprice_failed`,
no longer open, so the sweep leaves it and a new one may be asked for. A change of the
workspace's prices while a request is open sends it over the runs again from the first
(`restart_open`), so when it is done every run is at the table in force.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import F
from django_tasks import task
from django_tasks_db import DatabaseBackend

from .. import audit, clock
from ..errors import LedgerError
from ..log.repricing import reprice_run
from ..models import RepriceRequest, Run, Workspace

Status = RepriceRequest.Status
QUEUE = "reprices"
# Runs a task goes over before it queues the next for the rest.
RUNS_PER_TASK = 200
# A request open this long without progress has lost its task: the sweep queues it again.
STALLED_AFTER = timedelta(minutes=5)
ACTOR = "system:reprice"
# What a failed request keeps of the error (the database's or the fold's message) for its admins.
FAILURE_CHARS = 500

logger = logging.getLogger(__name__)


class RepriceInProgress(LedgerError):
    code = "reprice_in_progress"
    status = 409


def latest(workspace: Workspace) -> RepriceRequest | None:
    """The workspace's newest request, whatever its state."""
    return RepriceRequest.objects.filter(workspace=workspace).order_by("-requested_at", "-pk").first()


def request_reprice(*, workspace: Workspace, by: AbstractBaseUser | audit.Actor) -> RepriceRequest:
    """Queue the reprice of `workspace`'s recorded costs; RepriceInProgress while one is open."""
    actor = by if isinstance(by, audit.Actor) else audit.Actor.of(by)
    with transaction.atomic():
        ws = Workspace.objects.select_for_update().select_related("tenant").get(pk=workspace.pk)
        now = clock.now()
        if RepriceRequest.objects.filter(workspace=ws, status__in=RepriceRequest.OPEN).exists():
            raise _in_progress()
        try:
            with transaction.atomic():
                request = RepriceRequest.objects.create(
                    workspace=ws, requested_by=actor.name[:160], requested_at=now, touched_at=now
                )
        except IntegrityError:  # another admin's request, committed since the check
            raise _in_progress() from None
        audit.record(
            actor=actor,
            tenant=ws.tenant,
            workspace=ws,
            action=audit.Action.PRICES_REPRICE_REQUESTED,
            target=f"{ws.tenant.slug}/{ws.slug}",
            details={"requestedAt": request.requested_at.isoformat()},
        )
        _enqueue(request.pk)
    return request


def _in_progress() -> RepriceInProgress:
    return RepriceInProgress("a reprice of this workspace's recorded costs is already queued or running")


def _enqueue(request_pk: int) -> None:
    """The task in the caller's transaction on the database backend (never a request without its
    task), after commit on the others (the immediate backend of tests)."""
    if isinstance(reprice_workspace.get_backend(), DatabaseBackend):
        reprice_workspace.enqueue(request_pk)
    else:
        transaction.on_commit(lambda: reprice_workspace.enqueue(request_pk))


@task(queue_name=QUEUE)
def reprice_workspace(request_pk: int) -> str:
    """Up to RUNS_PER_TASK runs of the request's workspace after where it stands; then the next
    task, or the request done. What it did, for the task's result."""
    request = RepriceRequest.objects.filter(pk=request_pk).first()
    if request is None or request.status not in RepriceRequest.OPEN:
        return "nothing to do"
    now = clock.now()
    RepriceRequest.objects.filter(pk=request_pk, status=Status.QUEUED).update(
        status=Status.RUNNING, started_at=now, touched_at=now
    )
    this_pass = request.restarts
    pks = list(
        Run.objects.filter(workspace_id=request.workspace_id, pk__gt=request.after_run_pk)
        .order_by("pk")
        .values_list("pk", flat=True)[:RUNS_PER_TASK]
    )
    for pk in pks:
        try:
            changed = reprice_run(pk)
        except Exception as exc:  # noqa: BLE001 - any failure ends the request, never leaves it open
            logger.exception("reprice request %s: run pk %s could not be repriced", request_pk, pk)
            return _fail(request_pk, pk, exc)
        # Counted once per run even if two tasks of the request meet: only the one that moves
        # the request past the run counts it.
        moved = RepriceRequest.objects.filter(pk=request_pk, after_run_pk__lt=pk, restarts=this_pass).update(
            after_run_pk=pk,
            runs=F("runs") + 1,
            runs_changed=F("runs_changed") + (1 if changed else 0),
            entries_changed=F("entries_changed") + changed,
            touched_at=clock.now(),
        )
        if not moved and _restarted(request_pk, this_pass):
            return _again(request_pk)
    if len(pks) == RUNS_PER_TASK:
        with transaction.atomic():
            _enqueue(request_pk)
        return f"{len(pks)} run(s), more to come"
    return _finish(request_pk, this_pass)


def _restarted(request_pk: int, this_pass: int) -> bool:
    """The prices changed since this task's pass began (restart_open): it is over."""
    return RepriceRequest.objects.filter(pk=request_pk).exclude(restarts=this_pass).exists()


def _again(request_pk: int) -> str:
    with transaction.atomic():
        _enqueue(request_pk)
    return "the prices changed: going over the runs again"


def restart_open(workspace: Workspace) -> None:
    """The workspace's prices changed (in the caller's transaction, under the workspace's row
    lock): its open request, if any, goes over its runs again from the first, so it ends with
    every run at the table in force when it is done, not some at the one it began with. The task
    of the pass under way stops at its next run (`restarts`) and queues the next; the counts of
    changes go on adding up, the runs gone over count again."""
    RepriceRequest.objects.filter(workspace=workspace, status__in=RepriceRequest.OPEN).update(
        restarts=F("restarts") + 1, after_run_pk=0, runs=0, touched_at=clock.now()
    )


def _finish(request_pk: int, this_pass: int) -> str:
    with transaction.atomic():
        request = RepriceRequest.objects.select_for_update().select_related("workspace__tenant").get(pk=request_pk)
        if request.status not in RepriceRequest.OPEN:
            return f"{request.status} before"
        if request.restarts != this_pass:  # the prices changed since this pass began
            _enqueue(request_pk)
            return "the prices changed: going over the runs again"
        request.status, request.finished_at = Status.DONE, clock.now()
        request.save(update_fields=["status", "finished_at"])
        ws = request.workspace
        details: dict[str, Any] = {
            # The request named as its own entry names it: not by its row id, which counts every
            # tenant's requests (docs/security.md § What ids and cursors reveal).
            "requestedAt": request.requested_at.isoformat(),
            "requestedBy": request.requested_by,
            "runs": request.runs,
            "runsChanged": request.runs_changed,
            "entriesChanged": request.entries_changed,
        }
        if request.restarts:
            details["restarts"] = request.restarts
        audit.record(
            actor=ACTOR,
            tenant=ws.tenant,
            workspace=ws,
            action=audit.Action.PRICES_REPRICED,
            target=f"{ws.tenant.slug}/{ws.slug}",
            details=details,
        )
    return f"done: {request.runs} run(s), {request.entries_changed} cost entries changed"


def _fail(request_pk: int, run_pk: int, exc: Exception) -> str:
    """The request failed on one run (its transaction rolled back; the runs before it stay
    repriced): marked failed with why, audited `prices.reprice_failed`, and no longer open, so
    the sweep leaves it and an admin may ask again once the cause is fixed."""
    run_id = Run.objects.filter(pk=run_pk).values_list("run_id", flat=True).first() or "?"
    failure = f"run {run_id} could not be repriced: {type(exc).__name__}: {exc}"[:FAILURE_CHARS]
    with transaction.atomic():
        request = RepriceRequest.objects.select_for_update().select_related("workspace__tenant").get(pk=request_pk)
        if request.status not in RepriceRequest.OPEN:
            return f"{request.status} before"
        request.status, request.finished_at, request.failure = Status.FAILED, clock.now(), failure
        request.save(update_fields=["status", "finished_at", "failure"])
        ws = request.workspace
        audit.record(
            actor=ACTOR,
            tenant=ws.tenant,
            workspace=ws,
            action=audit.Action.PRICES_REPRICE_FAILED,
            target=f"{ws.tenant.slug}/{ws.slug}",
            details={
                "requestedAt": request.requested_at.isoformat(),
                "requestedBy": request.requested_by,
                "runs": request.runs,
                "runsChanged": request.runs_changed,
                "entriesChanged": request.entries_changed,
                "failure": failure,
            },
        )
    return f"failed: {failure}"


def recover_stalled() -> list[str]:
    """Queue again each open request without progress for STALLED_AFTER (its task lost with a
    worker that died): the worker's sweep. The workspaces queued."""
    queued = []
    for request in RepriceRequest.objects.filter(
        status__in=RepriceRequest.OPEN, touched_at__lt=clock.now() - STALLED_AFTER
    ).select_related("workspace__tenant"):
        with transaction.atomic():
            if RepriceRequest.objects.filter(pk=request.pk, touched_at=request.touched_at).update(
                touched_at=clock.now()
            ):
                _enqueue(request.pk)
                queued.append(f"{request.workspace.tenant.slug}/{request.workspace.slug}")
    return queued
