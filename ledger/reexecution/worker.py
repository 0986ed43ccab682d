"""The built-in executor: runs approved requests from the durable queue, and recovers stalled ones.

A request is held under a lease (RUNLEDGER_REEXEC_LEASE_SECONDS) that a heartbeat thread renews
while the runtime executes. A worker that dies (SIGKILL, power loss) stops renewing; its request
stays `running` with a dead lease, and its django-tasks row stays RUNNING for ever (the database
backend does not retry). `recover_stalled` — swept by `ledger worker` every few seconds — puts a
fresh task on the queue for such a request, and the worker that takes it resumes the SAME new run
id (reserved at approval; the runtime resumes a run that already exists), so a request is never
executed into a second new run, and no call whose answer was committed is made again.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.db import close_old_connections, connections

from .. import clock
from ..errors import LedgerError
from ..log.leases import new_owner, owner_is_dead
from ..log.rules import lease_live
from ..models import ReexecutionRequest
from . import services

log = logging.getLogger(__name__)

Status = ReexecutionRequest.Status


class _Heartbeat(threading.Thread):
    """Renews the request's lease every third of its TTL until stopped."""

    def __init__(self, request_pk: int, lease_token: str) -> None:
        super().__init__(name=f"reexecution-heartbeat-{request_pk}", daemon=True)
        self.request_pk, self.lease_token = request_pk, lease_token
        self.stopped = threading.Event()

    def run(self) -> None:
        interval = services.lease_ttl().total_seconds() / 3
        try:
            while not self.stopped.wait(interval):
                if not services.heartbeat(request_pk=self.request_pk, lease_token=self.lease_token):
                    log.warning("re-execution %s was taken over; the runtime's fencing stops this worker's writes",
                                self.request_pk)
                    return
        finally:
            connections.close_all()


def _error(exc: BaseException) -> dict[str, Any]:
    error: dict[str, Any] = {"name": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, LedgerError):
        error["code"] = exc.code
    return error


def run_request(*, request_pk: int, owner: str | None = None) -> str:
    """Execute one request end to end (the task's body). Returns what happened, for the task result."""
    from ..runtime.reexecute import UNSET, execute_reexecution

    request = services.start(request_pk=request_pk, owner=owner or new_owner(), owner_is_dead=owner_is_dead)
    if request is None:
        return "skipped"
    heartbeat = _Heartbeat(request.pk, request.lease_token)
    heartbeat.start()
    try:
        outcome = execute_reexecution(
            workspace=request.workspace, original_run_id=request.original_run_id, mode=request.mode,
            new_run_id=request.new_run_id, reexecution_id=request.public_id, from_step=request.from_step,
            input=request.input if request.has_input else UNSET,
            model_overrides=request.model_overrides or None,
        )
    except Exception as exc:  # the runtime refused or broke: the request failed, the worker lives on
        log.warning("re-execution %s failed", request.public_id, exc_info=True)
        services.finish(request_pk=request.pk, lease_token=request.lease_token, succeeded=False, error=_error(exc))
        return "failed"
    finally:
        heartbeat.stopped.set()
        heartbeat.join()
    # Normally the new run's terminal event already settled the request in its append
    # transaction (services.settle_on_terminal); this covers a run that had ended before.
    services.finish(request_pk=request.pk, lease_token=request.lease_token,
                    succeeded=outcome.status == "completed", error=outcome.error)
    return outcome.status


def recover_stalled() -> list[str]:
    """Queue again every built-in request that a worker should be running but none is: `running`
    with a lease that ran out or an owner process that is gone, and `approved` ones whose task was
    lost (approved longer than a lease ago and never started). The public ids queued."""
    from .tasks import execute_request

    now = clock.now()
    ttl = services.lease_ttl()
    candidates = ReexecutionRequest.objects.filter(executor=ReexecutionRequest.Executor.BUILTIN).filter(
        status__in=[Status.RUNNING, Status.APPROVED]).only(
        "pk", "public_id", "status", "lease_owner", "lease_expires_at", "decided_at")
    queued = []
    for request in candidates:
        if request.status == Status.RUNNING:
            stalled = (not lease_live(request.lease_expires_at, now)
                       or owner_is_dead(request.lease_owner))
        else:
            stalled = request.decided_at is not None and request.decided_at <= now - ttl
        if stalled:
            execute_request.enqueue(request.pk)
            queued.append(request.public_id)
    return queued


def sweep() -> dict[str, list[str]]:
    """One pass of the worker's housekeeping: expire overdue approvals, recover stalled requests."""
    return {"expired": services.expire_overdue(), "requeued": recover_stalled()}


def run_worker(*, interval: float = 1.0, sweep_every: float = 10.0, batch: bool = False,
               max_tasks: int | None = None) -> None:
    """`ledger worker`: django-tasks-db's worker on every queue, plus the sweep in a thread."""
    from django_tasks_db.management.commands.db_worker import Worker

    stop = threading.Event()

    def sweeping() -> None:
        try:
            while True:
                try:
                    found = sweep()
                    if found["expired"] or found["requeued"]:
                        log.warning("re-execution sweep: %s", found)
                except Exception:  # a sweep that fails (database restarting) is retried next time
                    log.warning("re-execution sweep failed", exc_info=True)
                finally:
                    close_old_connections()
                if stop.wait(sweep_every):
                    return
        finally:
            connections.close_all()

    if batch:
        sweep()  # once, before draining the queue
    else:
        threading.Thread(target=sweeping, name="reexecution-sweep", daemon=True).start()
    worker = Worker(queue_names=["*"], interval=interval, batch=batch, backend_name="default",
                    startup_delay=False, max_tasks=max_tasks, worker_id=new_owner(), excluded_queue_names=[])
    worker.configure_signals()
    try:
        worker.run()
    finally:
        stop.set()

