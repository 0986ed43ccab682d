"""The runtime's one recorder: it owns the run's lease and fencing token, reads what the run's
log already holds (from the fold, `record`), and batches the runtime's writes.

Every fact goes through the one write path under the lease's fencing token, so an executor that
lost its lease (paused, partitioned, a zombie) is `fenced` on its next write instead of
interleaving with the one that took the run over. Once more than half of the lease has passed,
the next write renews it in its own transaction (a sub-run's writes renew its parent's lease too,
with a commit of their own, since the parent writes nothing while its sub-run works).

Facts with no effect outside between them share one commit: a model's response is deferred to
the write that claims the tool call it asks for (or to the step's end), a tool call's outcome to
the write that records the next model call (or claims the next tool call, or ends the step).
Whatever acts outside (a model request, a tool run, a step's code) runs only after a commit that
holds everything before it, so a crash loses at most the in-flight call's answer.

The commits of a run, then (the executor's rhythm):

- RunStarted, alone (the run's row must exist before its lease is taken);
- one per step boundary, just before a step's body runs: the previous step's end (its
  StepCompleted, the session's end and the last model response of an `ai.generate` step) with
  this step's StepScheduled and StepAttemptStarted;
- inside an `ai.generate` step, two per model call that asks for a tool: harness.model.called
  (with the session's start, or the previous tool call's outcome) before the request, then
  harness.model.responded with the claim of the tool call, stamped outbound, before the tool runs;
- the last step's end with RunCompleted (or RunFailed).

A re-execution serving calls from a record writes nothing that acts outside inside a step, so
its steps commit once each, at their boundary.

Branches of a parallel group run in threads, each with a view of the recorder (`branch()`): its
own deferred facts, the one lease, log end and lock of the run. Every write takes that lock, so
the writes of concurrent branches commit one after another under the run's fencing token, each
branch's facts in its own commits, the log dense.

Heartbeat: while the run is leased, a background thread renews the lease whenever more than half
of it passed without a write (a long tool or model call, a step's silent code), so a second
executor cannot take the run over from a live one. If the renewal finds the lease taken over, the
run is lost to this executor: its next write raises `fenced` without writing. The heartbeat, like
parallel branches, needs the executor's writes committed (another thread's connection cannot see
an open transaction's), so inside an atomic block (a test's transaction) there is none.
"""

from __future__ import annotations

import contextvars
import copy
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

from django.conf import settings
from django.db import connection, connections

from .. import clock
from ..errors import Fenced
from ..fold import RunState
from ..log import append
from ..log.envelopes import log_of
from ..log.leases import (
    Lease,
    LeaseHeld,
    acquire_run_lease,
    new_owner,
    owner_is_dead,
    release_run_lease,
    renew_run_lease,
)
from ..log.vocabulary import with_origin
from ..models import Workspace
from ..reads import selectors
from ..replay import gateway
from . import progress
from .record import Record, read_record

logger = logging.getLogger(__name__)


def lease_ttl_s() -> float:
    """The run lease's length (RUNLEDGER_RUN_LEASE_SECONDS), read when a lease is taken."""
    return float(settings.RUNLEDGER_RUN_LEASE_SECONDS)


def threads_allowed() -> bool:
    """Whether work may move to other threads: not inside an atomic block, whose writes another
    thread's database connection cannot see."""
    return not connection.in_atomic_block


class WriteSeam(Protocol):
    def before_write(self, last_sequence: int, count: int) -> None: ...

    def after_write(self, last_sequence: int) -> None: ...


# Who a run the runtime starts on nobody's named behalf was started by (Run.started_by).
RUNTIME = "system:runtime"


# A test seam (ledger/runtime/testing.py installs one): given a new recorder's run id and log end,
# what to call around its writes. None in production.
test_seam: Callable[[str, int], WriteSeam | None] | None = None


class Recorder:
    def __init__(
        self,
        *,
        workspace: Workspace,
        run_id: str,
        last_sequence: int,
        lease: Lease | None = None,
        parent: Recorder | None = None,
        record: Record | None = None,
        origin: str | None = None,
        started_by: str = "",
    ) -> None:
        self.workspace = workspace
        # Who the write that starts the run records as its starter (Run.started_by): the person
        # `ledger run --requested-by` names, else the runtime itself.
        self.started_by = started_by
        self.origin = origin  # a re-execution's: stamped on model and tool events that carry none
        self.run_id = run_id
        self.parent = parent
        # What the log held when the lease was taken (nothing, for the write that starts a run).
        self.record = record if record is not None else Record(RunState(run_id=run_id))
        # Shared by every view of this recorder (`branch`): the lease, the log's end, the write lock.
        self._core = _Core(
            lease=lease,
            last_sequence=last_sequence,
            seam=test_seam(run_id, last_sequence) if test_seam is not None else None,
        )
        self._pending: list[Mapping[str, Any]] = []
        self._completion: dict[str, Any] | None = None

    @property
    def lease(self) -> Lease | None:
        return self._core.lease

    @lease.setter
    def lease(self, lease: Lease | None) -> None:
        self._core.lease = lease

    @property
    def last_sequence(self) -> int:
        return self._core.last_sequence

    def branch(self) -> Recorder:
        """A view for one parallel branch: its own deferred facts, this recorder's lease, log end
        and write lock. Flush it before the branch ends (what it still holds is not written)."""
        view = copy.copy(self)
        view._pending, view._completion = [], None
        return view

    @classmethod
    @contextmanager
    def leased(
        cls,
        *,
        workspace: Workspace,
        run_id: str,
        take_over: bool,
        parent: Recorder | None = None,
        origin: str | None = None,
    ) -> Iterator[Recorder]:
        """Take the run's lease, read its log through the fold, and give the lease back at the end."""
        lease = _acquire(workspace, run_id, take_over)
        recorder: Recorder | None = None
        heartbeat: _Heartbeat | None = None
        try:
            run = selectors.get_run(workspace, run_id)
            record = read_record(run_id, log_of(run), run=run)
            recorder = cls(
                workspace=workspace,
                run_id=run_id,
                last_sequence=record.last_sequence,
                lease=lease,
                parent=parent,
                record=record,
                origin=origin,
            )
            if threads_allowed():
                heartbeat = _Heartbeat(workspace, recorder._core)
            yield recorder
        finally:
            if heartbeat is not None:
                heartbeat.stop()
            release_run_lease(workspace=workspace, lease=recorder.lease if recorder and recorder.lease else lease)

    @property
    def fencing_token(self) -> int | None:
        return self.lease.fencing_token if self.lease else None

    def append(self, *events: Mapping[str, Any]) -> int:
        """Commit `events` (after whatever was deferred) in one transaction; the log's new end."""
        return self._write(list(events)).last_sequence

    def defer(self, *events: Mapping[str, Any]) -> None:
        """Hold `events` for the next write, which commits them first. Only for facts with no
        effect outside before that write: every call that acts outside (a model request, a tool
        run) is preceded by a write, and `flush` runs before it anyway."""
        self._pending.extend(events)

    def defer_completion(self, *, claimed: gateway.Claimed, outcome: str, value: Any, step_path: str) -> None:
        """Hold the gateway completion of the tool call `claimed` for the next write (see `defer`).
        The value is checked now, so a value with no JSON form still fails where the tool returned it."""
        self.flush()  # at most one completion waits; an earlier one goes first
        self._completion = {
            "call_id": claimed.call_id,
            "lease_token": claimed.lease_token,
            "held": claimed,
            "outcome": outcome,
            "step_path": step_path,
            "value": gateway.prepare_outcome(self.workspace, outcome, value),
        }

    def claim_outbound(self, **claim: Any) -> gateway.Claimed | gateway.Finished:
        """Claim a tool call and mark it outbound in one commit with everything deferred: after it
        returns Claimed, the call may run."""
        claimed = self._write([], claim=claim).claimed
        assert claimed is not None
        return claimed

    def declare_in_doubt(self, *, claimed: gateway.Claimed, reason: str, **details: Any) -> None:
        """Give up on the outbound call `claimed` without an outcome: it is in doubt (gateway)."""
        self.flush()
        with self._core.lock:
            if self._core.lost is not None:
                raise self._core.lost
            self._core.last_sequence = gateway.declare_in_doubt(
                workspace=self.workspace,
                run_id=self.run_id,
                call_id=claimed.call_id,
                lease_token=claimed.lease_token,
                reason=reason,
                fencing_token=self.fencing_token,
                **details,
            )

    def flush(self) -> None:
        if self._pending or self._completion is not None:
            self._write([])

    def discard(self) -> None:
        """Forget what was deferred (after a failed write that may or may not have carried it)."""
        self._pending, self._completion = [], None

    def _write(self, events: list[Mapping[str, Any]], claim: dict[str, Any] | None = None) -> gateway.Batch:
        with self._core.lock:  # one write at a time per run, whichever branch it comes from
            return self._write_locked(events, claim)

    def _write_locked(self, events: list[Mapping[str, Any]], claim: dict[str, Any] | None) -> gateway.Batch:
        batch, completion = [with_origin(e, self.origin) for e in (*self._pending, *events)], self._completion
        seam = self._core.seam
        if self._core.lost is not None:  # the heartbeat found the lease taken over: write nothing more
            self.discard()
            raise self._core.lost
        if seam is not None:
            seam.before_write(self.last_sequence, len(batch) + (completion is not None) + (claim is not None))
        if self.parent is not None:
            self.parent.keep_alive()
        self.discard()
        if self.lease is None:  # the write that starts a run (and creates its row) comes before its lease
            last = append(
                workspace=self.workspace, run_id=self.run_id, events=batch, by=self.started_by or RUNTIME
            ).last_sequence
            outcome = gateway.Batch(None, None, last)
        else:
            # The lease is renewed by this write once half of it has passed, in the same transaction.
            outcome = gateway.runtime_batch(
                workspace=self.workspace,
                run_id=self.run_id,
                fencing_token=self.fencing_token,
                complete=completion,
                events=batch,
                claim=claim,
                origin=self.origin,
                renew=self._due_for_renewal(),
            )
            self.lease = outcome.lease or self.lease
        self._core.last_sequence = outcome.last_sequence
        if seam is not None:
            seam.after_write(outcome.last_sequence)
        progress.notify(self.run_id, batch)
        return outcome

    def keep_alive(self) -> None:
        """Renew the lease (and the parent's) when more than half of it has passed; Fenced if lost.
        For a parent, which writes nothing while its sub-run works: its own writes renew it."""
        with self._core.lock:
            if self._core.lost is not None:
                raise self._core.lost
            lease = self._due_for_renewal()
            if lease is not None:
                self.lease = renew_run_lease(workspace=self.workspace, lease=lease)
        if self.parent is not None:
            self.parent.keep_alive()

    def _due_for_renewal(self) -> Lease | None:
        return self.lease if self.lease is not None and self.lease.due_for_renewal(clock.now()) else None


def _acquire(workspace: Workspace, run_id: str, take_over: bool) -> Lease:
    owner = new_owner()
    try:
        return acquire_run_lease(
            workspace=workspace, run_id=run_id, owner=owner, ttl_s=lease_ttl_s(), take_over=take_over
        )
    except LeaseHeld as exc:
        # An executor of this host that died (killed, crashed) cannot give its lease back.
        if not owner_is_dead(str(exc.details.get("owner", ""))):
            raise
        return acquire_run_lease(workspace=workspace, run_id=run_id, owner=owner, ttl_s=lease_ttl_s(), take_over=True)


class _Core:
    """What every view of one recorder shares."""

    def __init__(self, *, lease: Lease | None, last_sequence: int, seam: WriteSeam | None) -> None:
        self.lease = lease
        self.last_sequence = last_sequence
        self.seam = seam
        self.lock = threading.RLock()
        self.lost: Fenced | None = None  # set by the heartbeat when the lease was taken over


class _Heartbeat:
    """Renews a leased run's lease from a background thread while the run is silent for more than
    half of it (see the module docstring); stops at `stop()` or once the lease is lost."""

    def __init__(self, workspace: Workspace, core: _Core) -> None:
        self.workspace, self.core = workspace, core
        self._stopped = threading.Event()
        lease = core.lease
        assert lease is not None
        # Often enough that a renewal comes well before the lease's second half runs out.
        self._interval = max(0.02, lease.ttl_s / 10)
        # In the executor's context: its clock (ledger.clock's backdating, for the demo) is the lease's.
        self._thread = threading.Thread(
            target=contextvars.copy_context().run, args=(self._beat,), name=f"heartbeat:{lease.run_id}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def _beat(self) -> None:
        try:
            while not self._stopped.wait(self._interval):
                if not self._renew():
                    return
        finally:
            connections.close_all()  # this thread's own connections

    def _renew(self) -> bool:
        """False once the lease is lost (nothing more to renew)."""
        with self.core.lock:
            lease = self.core.lease
            if lease is None or self.core.lost is not None:
                return False
            if not lease.due_for_renewal(clock.now()):
                return True
            try:
                self.core.lease = renew_run_lease(workspace=self.workspace, lease=lease)
            except Fenced as lost:
                self.core.lost = lost
                return False
            except Exception:  # a passing database error: the next beat tries again
                logger.warning("heartbeat of run %s could not renew its lease", lease.run_id, exc_info=True)
        return True
