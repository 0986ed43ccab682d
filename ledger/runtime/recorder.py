"""Every fact the runtime records goes through `append_events` under the run lease's fencing
token, so an executor that lost its lease (paused, partitioned, a zombie) is `fenced` on its next
write instead of interleaving with the one that took the run over. Before each write the lease is
renewed once more than half of it has passed (a sub-run's writes renew its parent's lease too,
since the parent writes nothing while its sub-run works).

Test seams (documented here, read only from the environment, inert when unset):

- RUNLEDGER_KILL_AFTER_SEQUENCE=N: the process SIGKILLs itself right after the commit that took
  the log to sequence N or beyond, if this process wrote past N (a resumer started after N lives).
- RUNLEDGER_KILL_BEFORE_SEQUENCE=N: it SIGKILLs itself right before the write (one commit, maybe
  of several events) that would commit sequence N, i.e. after the work that event records (a
  model reply, a tool run) was done: the in-flight case a resume must repeat.

Facts with no effect outside between them share one commit: a model's response is deferred to
the write that claims the tool call it asks for (or ends the session), a tool call's outcome to
the write that records the next model call (or claims the next tool call, or ends the step).
Whatever acts outside (a model request, a tool run) runs only after a commit that holds
everything before it, so a crash loses at most the in-flight call's answer.
- RUNLEDGER_KILL_RUN_ID=run_…: the two above apply only to that run's writes (a parent or one of
  its sub-runs); unset, to every run this process writes.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from typing import Any

from .. import clock, gateway
from ..append import append_events
from ..leases import Lease, renew_run_lease
from ..models import Workspace
from ..vocabulary import with_origin

KILL_AFTER_ENV = "RUNLEDGER_KILL_AFTER_SEQUENCE"
KILL_BEFORE_ENV = "RUNLEDGER_KILL_BEFORE_SEQUENCE"
KILL_RUN_ENV = "RUNLEDGER_KILL_RUN_ID"


def _seam(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value else None


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Recorder:
    def __init__(self, *, workspace: Workspace, run_id: str, last_sequence: int, lease: Lease | None = None,
                 parent: Recorder | None = None, origin: str | None = None) -> None:
        self.workspace = workspace
        self.origin = origin  # a re-execution's: stamped on model and tool events that carry none
        self.run_id = run_id
        self.lease = lease
        self.parent = parent
        self.last_sequence = last_sequence
        self._started_at = last_sequence
        self._pending: list[Mapping[str, Any]] = []
        self._completion: dict[str, Any] | None = None
        armed = os.environ.get(KILL_RUN_ENV, "").strip() in ("", run_id)
        self._kill_after = _seam(KILL_AFTER_ENV) if armed else None
        self._kill_before = _seam(KILL_BEFORE_ENV) if armed else None

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

    def defer_completion(self, *, call_id: str, lease_token: str, outcome: str, value: Any, step_path: str) -> None:
        """Hold a tool call's gateway completion for the next write (see `defer`). The value is
        checked now, so a value with no JSON form still fails where the tool returned it."""
        self.flush()  # at most one completion waits; an earlier one goes first
        self._completion = {"call_id": call_id, "lease_token": lease_token, "outcome": outcome, "step_path": step_path,
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
        self._before_write(len(batch) + (completion is not None) + (claim is not None))
        self.discard()
        if completion is None and claim is None:
            last = append_events(workspace=self.workspace, run_id=self.run_id, events=batch,
                                 fencing_token=self.fencing_token).last_sequence
            outcome = gateway.Batch(None, None, last)
        else:
            outcome = gateway.runtime_batch(workspace=self.workspace, run_id=self.run_id,
                                            fencing_token=self.fencing_token, complete=completion, events=batch,
                                            claim=claim, origin=self.origin)
        self._after_write(outcome.last_sequence)
        return outcome

    def keep_alive(self) -> None:
        """Renew the lease (and the parent's) when more than half of it has passed; Fenced if lost."""
        if self.lease is not None and self.lease.due_for_renewal(clock.now()):
            self.lease = renew_run_lease(workspace=self.workspace, lease=self.lease)
        if self.parent is not None:
            self.parent.keep_alive()

    def _before_write(self, count: int) -> None:
        # `count` is what the write is expected to append (a gateway refusal may add or drop one)
        if self._kill_before is not None and self.last_sequence < self._kill_before <= self.last_sequence + count:
            _die()
        self.keep_alive()

    def _after_write(self, last_sequence: int) -> None:
        self.last_sequence = last_sequence
        n = self._kill_after
        if n is not None and self._started_at < n <= last_sequence:
            _die()
