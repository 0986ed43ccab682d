"""The built-in executor of one approved request: the request's lease taken, kept by a heartbeat
thread while the runtime executes it, and the request finished with the new run's outcome."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections

from ..errors import LedgerError
from ..log.leases import new_owner, owner_is_dead
from ..runtime.errors import WAITING_APPROVAL
from . import execution

log = logging.getLogger(__name__)


class _Heartbeat(threading.Thread):
    """Renews the request's lease every third of its TTL until stopped."""

    def __init__(self, request_pk: int, lease_token: str) -> None:
        super().__init__(name=f"reexecution-heartbeat-{request_pk}", daemon=True)
        self.request_pk, self.lease_token = request_pk, lease_token
        self.stopped = threading.Event()

    def run(self) -> None:
        interval = execution.lease_ttl().total_seconds() / 3
        try:
            while not self.stopped.wait(interval):
                if not execution.heartbeat(request_pk=self.request_pk, lease_token=self.lease_token):
                    log.warning(
                        "re-execution %s was taken over; the runtime's fencing stops this worker's writes",
                        self.request_pk,
                    )
                    return
        finally:
            connections.close_all()


def _error(exc: BaseException) -> dict[str, Any]:
    error: dict[str, Any] = {"name": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, LedgerError):
        error["code"] = exc.code
    return error


# A factory of the guard asked before each live model call of a request's execution (None: no
# guard); ledger/evaluation registers the one that keeps an evaluation inside its spend ceiling.
_GUARD_FACTORIES: list[Callable[[Any], Callable[[Any], None] | None]] = []


def register_guard_factory(factory: Callable[[Any], Callable[[Any], None] | None]) -> None:
    if factory not in _GUARD_FACTORIES:
        _GUARD_FACTORIES.append(factory)


# Called with the request's pk after the built-in executor is done with it (its run lease
# released): ledger/evaluation scores the new run then, which it cannot while the executor still
# holds the run (an append without the fencing token is `fenced`).
_AFTER_REQUEST: list[Callable[[int], None]] = []


def after_request(listener: Callable[[int], None]) -> None:
    if listener not in _AFTER_REQUEST:
        _AFTER_REQUEST.append(listener)


def _after(request_pk: int) -> None:
    for listener in _AFTER_REQUEST:
        try:
            listener(request_pk)
        except Exception:  # a listener's failure never fails the request it follows
            log.warning("after-request listener failed for request %s", request_pk, exc_info=True)


def _guard_for(request: Any) -> Callable[[Any], None] | None:
    guards = [g for g in (factory(request) for factory in _GUARD_FACTORIES) if g is not None]
    if not guards:
        return None

    def guard(model_request: Any) -> None:
        for g in guards:
            g(model_request)

    return guard


def run_request(*, request_pk: int, owner: str | None = None) -> str:
    """Execute one request end to end (the task's body). Returns what happened, for the task result."""
    from ..runtime.reexecute import UNSET, execute_reexecution

    request = execution.start(request_pk=request_pk, owner=owner or new_owner(), owner_is_dead=owner_is_dead)
    if request is None:
        return "skipped"
    heartbeat = _Heartbeat(request.pk, request.lease_token)
    heartbeat.start()
    try:
        outcome = execute_reexecution(
            workspace=request.workspace,
            original_run_id=request.original_run_id,
            mode=request.mode,
            new_run_id=request.new_run_id,
            reexecution_id=request.public_id,
            from_step=request.from_step,
            input=request.input if request.has_input else UNSET,
            model_overrides=request.model_overrides or None,
            guard=_guard_for(request),
            prompt_overrides=request.prompt_overrides or None,
            workflow=request.workflow or None,
            workflow_version=request.workflow_version or None,
        )
    except Exception as exc:  # the runtime refused or broke: the request failed, the worker lives on
        log.warning("re-execution %s failed", request.public_id, exc_info=True)
        execution.finish(request_pk=request.pk, lease_token=request.lease_token, succeeded=False, error=_error(exc))
        _after(request.pk)
        return "failed"
    finally:
        heartbeat.stopped.set()
        heartbeat.join()
    if outcome.status == WAITING_APPROVAL:
        # The run stopped for a tool call's approver, not ended: the request stays running, held
        # by nobody, and the decision's task (resume_approved) executes it again under its rules.
        execution.park(request_pk=request.pk, lease_token=request.lease_token)
        return outcome.status
    # Normally the new run's terminal event already settled the request in its append
    # transaction (execution.settle_on_terminal); this covers a run that had ended before.
    execution.finish(
        request_pk=request.pk,
        lease_token=request.lease_token,
        succeeded=outcome.status == "completed",
        error=outcome.error,
    )
    _after(request.pk)
    return outcome.status


def resume_approved(*, workspace_pk: int, run_id: str) -> str:
    """Resume a run one of whose tool calls an approver decided (toolapprovals.py): the task's
    body. Returns the run's status, `waiting_approval` at its next wait, or `refused: <code>` when
    the runtime refuses (another executor holds the run, its workflow is not registered here, a
    call in doubt): the log is left as it was, the refusal logged, and `ledger resume` can still
    take the run."""
    from ..models import Workspace
    from ..runtime.executor import resume_run

    parked = execution.waiting_request(workspace_pk, run_id)
    if parked is not None:
        # A re-execution's run: executed again through its request, so it goes on under the rules
        # its RunStarted recorded (model overrides, origins) and settles the request.
        return run_request(request_pk=parked.pk)
    workspace = Workspace.objects.select_related("tenant").get(pk=workspace_pk)
    try:
        outcome = resume_run(workspace=workspace, run_id=run_id)
    except LedgerError as exc:
        log.warning("resuming %s after a tool approval was refused: %s", run_id, exc.message)
        return f"refused: {exc.code}"
    return outcome.status
