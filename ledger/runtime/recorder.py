"""Every fact the runtime records goes through `append_events` under the run lease's fencing
token, so an executor that lost its lease (paused, partitioned, a zombie) is `fenced` on its next
write instead of interleaving with the one that took the run over. Before each write the lease is
renewed once more than half of it has passed (a sub-run's writes renew its parent's lease too,
since the parent writes nothing while its sub-run works).

Test seams (documented here, read only from the environment, inert when unset):

- RUNLEDGER_KILL_AFTER_SEQUENCE=N: the process SIGKILLs itself right after the commit that took
  the log to sequence N or beyond, if this process wrote past N (a resumer started after N lives).
- RUNLEDGER_KILL_BEFORE_SEQUENCE=N: it SIGKILLs itself right before the write that would commit
  sequence N, i.e. after the work that event records (a model reply, a tool run) was done: the
  in-flight case a resume must repeat.
- RUNLEDGER_KILL_RUN_ID=run_…: the two above apply only to that run's writes (a parent or one of
  its sub-runs); unset, to every run this process writes.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .. import clock
from ..append import AppendResult, append_events
from ..leases import Lease, renew_run_lease
from ..models import Run, Workspace

KILL_AFTER_ENV = "RUNLEDGER_KILL_AFTER_SEQUENCE"
KILL_BEFORE_ENV = "RUNLEDGER_KILL_BEFORE_SEQUENCE"
KILL_RUN_ENV = "RUNLEDGER_KILL_RUN_ID"
T = TypeVar("T")


def _seam(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value else None


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Recorder:
    def __init__(self, *, workspace: Workspace, run_id: str, last_sequence: int, lease: Lease | None = None,
                 parent: Recorder | None = None) -> None:
        self.workspace = workspace
        self.run_id = run_id
        self.lease = lease
        self.parent = parent
        self.last_sequence = last_sequence
        self._started_at = last_sequence
        armed = os.environ.get(KILL_RUN_ENV, "").strip() in ("", run_id)
        self._kill_after = _seam(KILL_AFTER_ENV) if armed else None
        self._kill_before = _seam(KILL_BEFORE_ENV) if armed else None

    @property
    def fencing_token(self) -> int | None:
        return self.lease.fencing_token if self.lease else None

    def append(self, *events: Mapping[str, Any]) -> AppendResult:
        self._before_write()
        result = append_events(workspace=self.workspace, run_id=self.run_id, events=list(events),
                               fencing_token=self.fencing_token)
        self._after_write(result.last_sequence)
        return result

    def gateway(self, service: Callable[..., T], *, appends: bool = True, **kwargs: Any) -> T:
        """Call a tool gateway service for this run: it appends itself, with our fencing token."""
        if appends:
            self._before_write()
        outcome = service(workspace=self.workspace, run_id=self.run_id, fencing_token=self.fencing_token, **kwargs)
        last = Run.objects.filter(workspace=self.workspace, run_id=self.run_id).values_list(
            "last_sequence", flat=True).get()
        self._after_write(last)
        return outcome

    def keep_alive(self) -> None:
        """Renew the lease (and the parent's) when more than half of it has passed; Fenced if lost."""
        if self.lease is not None and self.lease.due_for_renewal(clock.now()):
            self.lease = renew_run_lease(workspace=self.workspace, lease=self.lease)
        if self.parent is not None:
            self.parent.keep_alive()

    def _before_write(self) -> None:
        if self._kill_before is not None and self.last_sequence + 1 == self._kill_before:
            _die()
        self.keep_alive()

    def _after_write(self, last_sequence: int) -> None:
        self.last_sequence = last_sequence
        n = self._kill_after
        if n is not None and self._started_at < n <= last_sequence:
            _die()
