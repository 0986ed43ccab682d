"""What features hang on the log: callables the append runs in its transaction when a batch ends
the run (RunCompleted or RunFailed written). The log imports no feature; a feature registers
itself here from its app config (the re-execution package settles the request whose new run
just ended: ledger/reexecution/apps.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..models import Run


class RunEnded(Protocol):
    def __call__(self, *, run: Run, written: Sequence[Mapping[str, Any]]) -> None: ...


_run_ended: list[RunEnded] = []


def on_run_ended(hook: RunEnded) -> RunEnded:
    """Register `hook(run=, written=)`, called in the append's transaction after the batch
    `written` (its envelopes) ended `run`. Registering the same hook again keeps one."""
    if hook not in _run_ended:
        _run_ended.append(hook)
    return hook


def run_ended(run: Run, written: Sequence[Mapping[str, Any]]) -> None:
    for hook in _run_ended:
        hook(run=run, written=written)
