"""Progress of an execution for a person watching `ledger run` / `ledger resume`: steps done of
the workflow's steps, the step running now, and the run's cost so far.

The recorder tells the reporter what it wrote (`notify`, after each commit); nothing else is
observed, so what is shown is what the log holds. On a terminal it is one line rewritten in
place; otherwise (a pipe, a CI log) a plain line per change. A sub-run's writes are not shown:
its parent's step is what runs. The cost is the run's projected total (one read per write, and
only while a reporter is installed: executions without one pay nothing).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from decimal import Decimal
from typing import IO, Any

from django.core.management.base import OutputWrapper

from ..models import Run, Step, Workspace

Stream = IO[str] | OutputWrapper  # a command's stderr, or any text stream
_VISIT = re.compile(r"\.visit\[\d+\]$")


def step_id_of(path: str) -> str | None:
    """The workflow step a top-level step path names (a decision loop's visits included); None
    for the inside of a parallel group (`step[key]`)."""
    base = _VISIT.sub("", path)
    return None if "[" in base or "/" in base else base


def cost_text(cost: Decimal | None, unpriced: int) -> str:
    if cost is None:
        return "cost n/a (unpriced)"
    text = f"${cost:.4f}" if cost < 1 else f"${cost:,.2f}"
    return text + (f" (+{unpriced} unpriced)" if unpriced else "")


class Reporter:
    """What one execution shows; `tty` decides the form (None: whether `stream` is a terminal)."""

    def __init__(
        self,
        stream: Stream,
        *,
        workspace: Workspace,
        run_id: str,
        step_ids: Sequence[str],
        completed: Sequence[str] = (),
        tty: bool | None = None,
    ) -> None:
        self.stream, self.workspace, self.run_id = stream, workspace, run_id
        self.step_ids = list(step_ids)
        self.done: set[str] = {s for s in (step_id_of(p) for p in completed) if s in self.step_ids}
        self.current: str | None = None
        self.cost: Decimal | None = Decimal(0)
        self.unpriced = 0
        self.tty = stream.isatty() if tty is None else tty
        self._shown = ""
        self._width = 0

    def line(self) -> str:
        where = (
            f"step {self.current}" if self.current else ("done" if len(self.done) == len(self.step_ids) else "starting")
        )
        return (
            f"{self.run_id}: {len(self.done)}/{len(self.step_ids)} steps done · {where} · "
            f"{cost_text(self.cost, self.unpriced)}"
        )

    def written(self, events: Sequence[Mapping[str, Any]]) -> None:
        for event in events:
            payload = event.get("payload")
            path = payload.get("stepPath") if isinstance(payload, Mapping) else None
            step = step_id_of(path) if isinstance(path, str) else None
            if step is None or step not in self.step_ids:
                continue
            if event.get("type") in ("StepScheduled", "StepAttemptStarted"):
                self.current = step
            elif event.get("type") in ("StepCompleted", "StepFailed"):
                if event.get("type") == "StepCompleted":
                    self.done.add(step)
                if self.current == step:
                    self.current = None
        if any(e.get("type") == "harness.model.responded" for e in events):
            usage = (
                Run.objects.filter(workspace=self.workspace, run_id=self.run_id)
                .values_list("cost_usd", "unpriced_calls")
                .first()
            )
            if usage is not None:
                self.cost, self.unpriced = usage
        self.show()

    def show(self) -> None:
        text = self.line()
        if text == self._shown:
            return
        self._shown = text
        if self.tty:
            pad = max(0, self._width - len(text))
            self._write("\r" + text + " " * pad)
            self._width = len(text)
        else:
            self._write(text + "\n")

    def close(self) -> None:
        if self.tty and self._width:
            self._write("\n")

    def _write(self, text: str) -> None:
        if isinstance(self.stream, OutputWrapper):  # a command's stderr: it would end every write with a newline
            self.stream.write(text, ending="")
        else:
            self.stream.write(text)
        self.stream.flush()


_active: ContextVar[Reporter | None] = ContextVar("ledger_progress", default=None)


@contextmanager
def reporting(reporter: Reporter) -> Iterator[Reporter]:
    """Show `reporter`'s run's progress while the block executes it."""
    token = _active.set(reporter)
    reporter.show()
    try:
        yield reporter
    finally:
        _active.reset(token)
        reporter.close()


def notify(run_id: str, events: Sequence[Mapping[str, Any]]) -> None:
    """The recorder of `run_id` committed `events`."""
    reporter = _active.get()
    if reporter is not None and reporter.run_id == run_id:
        reporter.written(events)


def reporter_for(
    stream: Stream, *, workspace: Workspace, run_id: str, workflow: Any, tty: bool | None = None
) -> Reporter:
    """A reporter of `run_id` executing `workflow`, counting the steps its log already completed
    and starting from the cost it already recorded (a resume's first line is the cost so far)."""
    completed = list(
        Step.objects.filter(run__workspace=workspace, run__run_id=run_id, status="completed").values_list(
            "step_path", flat=True
        )
    )
    reporter = Reporter(
        stream,
        workspace=workspace,
        run_id=run_id,
        step_ids=[s.id for s in workflow.steps],
        completed=completed,
        tty=tty,
    )
    usage = Run.objects.filter(workspace=workspace, run_id=run_id).values_list("cost_usd", "unpriced_calls").first()
    if usage is not None:
        reporter.cost, reporter.unpriced = usage
    return reporter
