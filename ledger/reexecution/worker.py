"""`ledger worker`: django-tasks-db's worker runs approved requests from the durable queue
(ledger/reexecution/tasks.py, each executed by ledger/reexecution/executor.py), and a sweep
expires overdue approvals and recovers stalled requests.

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
from collections.abc import Callable

from django.db import close_old_connections, connections

from .. import clock
from ..log.leases import new_owner, owner_is_dead
from ..log.rules import lease_live
from ..models import ReexecutionRequest
from . import execution, toolapprovals
from .tasks import execute_request

log = logging.getLogger(__name__)

Status = ReexecutionRequest.Status


def recover_stalled() -> list[str]:
    """Queue again every built-in request that a worker should be running but none is: `running`
    with a lease that ran out or an owner process that is gone, and `approved` ones whose task was
    lost (approved longer than a lease ago and never started). The public ids queued."""
    now = clock.now()
    ttl = execution.lease_ttl()
    candidates = (
        ReexecutionRequest.objects.filter(executor=ReexecutionRequest.Executor.BUILTIN)
        .filter(status__in=[Status.RUNNING, Status.APPROVED])
        .only("pk", "public_id", "status", "lease_owner", "lease_expires_at", "decided_at")
    )
    queued = []
    for request in candidates:
        if execution.is_parked(request):
            stalled = False  # its run waits for a tool call's approver; the decision queues it again
        elif request.status == Status.RUNNING:
            stalled = not lease_live(request.lease_expires_at, now) or owner_is_dead(request.lease_owner)
        else:
            stalled = request.decided_at is not None and request.decided_at <= now - ttl
        if stalled:
            execute_request.enqueue(request.pk)
            queued.append(request.public_id)
    return queued


# More housekeeping a package above this one adds to the sweep (name -> a pass returning what it
# did): ledger/evaluation finishes an evaluation whose batch ended without its hook reaching it.
_SWEEPS: dict[str, Callable[[], list[str]]] = {}


def on_sweep(name: str, fn: Callable[[], list[str]]) -> None:
    _SWEEPS[name] = fn


def sweep() -> dict[str, list[str]]:
    """One pass of the worker's housekeeping: expire overdue approvals, recover stalled requests,
    queue again the lost resume of a run whose tool call was decided (toolapprovals.py), and the
    passes registered with `on_sweep`."""
    found = {
        "expired": execution.expire_overdue(),
        "requeued": recover_stalled(),
        "resumed": toolapprovals.recover_lost(),
    }
    for name, fn in _SWEEPS.items():
        found[name] = fn()
    return found


def run_worker(
    *, interval: float = 1.0, sweep_every: float = 10.0, batch: bool = False, max_tasks: int | None = None
) -> None:
    """`ledger worker`: django-tasks-db's worker on every queue, plus the sweep in a thread."""
    from django_tasks_db.management.commands.db_worker import Worker

    stop = threading.Event()

    def sweeping() -> None:
        try:
            while True:
                try:
                    found = sweep()
                    if any(found.values()):
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
    worker = Worker(
        queue_names=["*"],
        interval=interval,
        batch=batch,
        backend_name="default",
        startup_delay=False,
        max_tasks=max_tasks,
        worker_id=new_owner(),
        excluded_queue_names=[],
    )
    worker.configure_signals()
    try:
        worker.run()
    finally:
        stop.set()
