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
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

from .. import clock, gateway, selectors
from ..append import append_events
from ..fold import RunState
from ..leases import (Lease, LeaseHeld, acquire_run_lease, new_owner, owner_is_dead, release_run_lease,
                      renew_run_lease)
from ..models import Workspace
from ..projection import log_of
from ..vocabulary import with_origin
from .record import Record, read_record

LEASE_TTL_S = 300.0


class WriteSeam(Protocol):
    def before_write(self, last_sequence: int, count: int) -> None: ...

    def after_write(self, last_sequence: int) -> None: ...


# A test seam (ledger/runtime/testing.py installs one): given a new recorder's run id and log end,
# what to call around its writes. None in production.
test_seam: Callable[[str, int], WriteSeam | None] | None = None


class Recorder:
    def __init__(self, *, workspace: Workspace, run_id: str, last_sequence: int, lease: Lease | None = None,
                 parent: Recorder | None = None, record: Record | None = None, origin: str | None = None) -> None:
        self.workspace = workspace
        self.origin = origin  # a re-execution's: stamped on model and tool events that carry none
        self.run_id = run_id
        self.lease = lease
        self.parent = parent
        # What the log held when the lease was taken (nothing, for the write that starts a run).
        self.record = record if record is not None else Record(RunState(run_id=run_id))
        self.last_sequence = last_sequence
        self._pending: list[Mapping[str, Any]] = []
        self._completion: dict[str, Any] | None = None
        self._seam = test_seam(run_id, last_sequence) if test_seam is not None else None

    @classmethod
    @contextmanager
    def leased(cls, *, workspace: Workspace, run_id: str, take_over: bool, parent: Recorder | None = None,
               origin: str | None = None) -> Iterator[Recorder]:
        """Take the run's lease, read its log through the fold, and give the lease back at the end."""
        lease = _acquire(workspace, run_id, take_over)
        recorder: Recorder | None = None
        try:
            record = read_record(run_id, log_of(selectors.get_run(workspace, run_id)))
            recorder = cls(workspace=workspace, run_id=run_id, last_sequence=record.last_sequence, lease=lease,
                           parent=parent, record=record, origin=origin)
            yield recorder
        finally:
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
        self._completion = {"call_id": claimed.call_id, "lease_token": claimed.lease_token, "held": claimed,
                            "outcome": outcome, "step_path": step_path,
                            "value": gateway.prepare_outcome(self.workspace, outcome, value)}

    def claim_outbound(self, **claim: Any) -> gateway.Claimed | gateway.Finished:
        """Claim a tool call and mark it outbound in one commit with everything deferred: after it
        returns Claimed, the call may run."""
        claimed = self._write([], claim=claim).claimed
        assert claimed is not None
        return claimed

    def flush(self) -> None:
        if self._pending or self._completion is not None:
            self._write([])

    def discard(self) -> None:
        """Forget what was deferred (after a failed write that may or may not have carried it)."""
        self._pending, self._completion = [], None

    def _write(self, events: list[Mapping[str, Any]], claim: dict[str, Any] | None = None) -> gateway.Batch:
        batch, completion = [with_origin(e, self.origin) for e in (*self._pending, *events)], self._completion
        if self._seam is not None:
            self._seam.before_write(self.last_sequence, len(batch) + (completion is not None) + (claim is not None))
        if self.parent is not None:
            self.parent.keep_alive()
        self.discard()
        if self.lease is None:  # the write that starts a run (and creates its row) comes before its lease
            last = append_events(workspace=self.workspace, run_id=self.run_id, events=batch).last_sequence
            outcome = gateway.Batch(None, None, last)
        else:
            # The lease is renewed by this write once half of it has passed, in the same transaction.
            outcome = gateway.runtime_batch(workspace=self.workspace, run_id=self.run_id,
                                            fencing_token=self.fencing_token, complete=completion, events=batch,
                                            claim=claim, origin=self.origin, renew=self._due_for_renewal())
            self.lease = outcome.lease or self.lease
        self.last_sequence = outcome.last_sequence
        if self._seam is not None:
            self._seam.after_write(outcome.last_sequence)
        return outcome

    def keep_alive(self) -> None:
        """Renew the lease (and the parent's) when more than half of it has passed; Fenced if lost.
        For a parent, which writes nothing while its sub-run works: its own writes renew it."""
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
        return acquire_run_lease(workspace=workspace, run_id=run_id, owner=owner, ttl_s=LEASE_TTL_S,
                                 take_over=take_over)
    except LeaseHeld as exc:
        # An executor of this host that died (killed, crashed) cannot give its lease back.
        if not owner_is_dead(str(exc.details.get("owner", ""))):
            raise
        return acquire_run_lease(workspace=workspace, run_id=run_id, owner=owner, ttl_s=LEASE_TTL_S, take_over=True)
