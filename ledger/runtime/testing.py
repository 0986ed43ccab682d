"""Test seams of the runtime: inert until a test installs them, never read by production code.

`install_kill_switches()` makes every Recorder created afterwards read these environment
variables once, when it is created (tests/runtime_workflows.py installs it on import, so a
`manage.py ledger run --module tests.runtime_workflows` subprocess and a forked executor both
have it):

- RUNLEDGER_KILL_AFTER_SEQUENCE=N: the process SIGKILLs itself right after the commit that took
  the log to sequence N or beyond, if this process wrote past N (a resumer started after N lives).
- RUNLEDGER_KILL_BEFORE_SEQUENCE=N: it SIGKILLs itself right before the write (one commit, maybe
  of several events) that would commit sequence N, i.e. after the work that event records (a
  model reply, a tool run) was done: the in-flight case a resume must repeat.
- RUNLEDGER_KILL_RUN_ID=run_…: the two above apply only to that run's writes (a parent or one of
  its sub-runs); unset, to every run this process writes.
- RUNLEDGER_COMMITS_FILE=path: after every commit, the line `<run id> <last sequence>` is appended
  to that file, so a test knows where a run's commits end (the only places its executor can die).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from . import recorder

KILL_AFTER_ENV = "RUNLEDGER_KILL_AFTER_SEQUENCE"
KILL_BEFORE_ENV = "RUNLEDGER_KILL_BEFORE_SEQUENCE"
KILL_RUN_ENV = "RUNLEDGER_KILL_RUN_ID"
COMMITS_ENV = "RUNLEDGER_COMMITS_FILE"


def _sequence(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value else None


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class KillSwitch:
    """Where one recorder dies: before the write that would commit `before`, after the commit
    that reached `after` (only if this recorder wrote past the point it started at). With
    `commits`, every commit's end is written down there first."""

    run_id: str
    started_at: int
    after: int | None
    before: int | None
    commits: Path | None = None

    def before_write(self, last_sequence: int, count: int) -> None:
        # `count` is what the write is expected to append (a gateway refusal may add or drop one)
        if self.before is not None and last_sequence < self.before <= last_sequence + count:
            _die()

    def after_write(self, last_sequence: int) -> None:
        if self.commits is not None:
            with self.commits.open("a") as out:
                out.write(f"{self.run_id} {last_sequence}\n")
        if self.after is not None and self.started_at < self.after <= last_sequence:
            _die()


def _kill_switch(run_id: str, last_sequence: int) -> KillSwitch | None:
    commits = os.environ.get(COMMITS_ENV, "").strip()
    after = before = None
    if os.environ.get(KILL_RUN_ENV, "").strip() in ("", run_id):
        after, before = _sequence(KILL_AFTER_ENV), _sequence(KILL_BEFORE_ENV)
    if after is None and before is None and not commits:
        return None
    return KillSwitch(
        run_id=run_id, started_at=last_sequence, after=after, before=before, commits=Path(commits) if commits else None
    )


def commit_ends(path: Path) -> dict[str, list[int]]:
    """Per run, where each of its commits ended, from a RUNLEDGER_COMMITS_FILE."""
    ends: dict[str, list[int]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        run_id, last = line.split()
        ends.setdefault(run_id, []).append(int(last))
    return ends


def install_kill_switches() -> None:
    """Arm the environment's kill switches on every Recorder created from now on."""
    recorder.test_seam = _kill_switch
