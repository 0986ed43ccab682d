"""How a failed run ended, for a person: cancelled with its reason, or its error's name, message
and the step that failed (docs/api.md, the run object's `cancelled` and `error`).

A cancel ends the run `RunFailed {error: {name: "Cancelled", message: reason}}`
(ledger/replay/cancellation.py): the status stays `failed`, as docs/api.md has it, and the run
reads "cancelled" wherever it is shown. The failed step is the error's own `stepPath` when the
writer put one there, else the step that failed last in the log.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..models import Run, RunStatus, Step

CANCELLED = "Cancelled"  # the name cancellation.cancelled_error writes


def is_cancelled(run: Run) -> bool:
    return run.status == RunStatus.FAILED and isinstance(run.error, dict) and run.error.get("name") == CANCELLED


@dataclass(frozen=True)
class Failure:
    cancelled: bool
    name: str | None
    message: str | None
    step_path: str | None


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


def for_runs(runs: Iterable[Run]) -> dict[str, Failure]:
    """The failure of each failed run, by run id: one query for a whole page."""
    failed = [r for r in runs if r.status == RunStatus.FAILED]
    if not failed:
        return {}
    last_failed: dict[int, str] = {}
    steps = Step.objects.filter(run_id__in=[r.pk for r in failed], status="failed").order_by("run_id", "last_sequence")
    for run_pk, step_path in steps.values_list("run_id", "step_path"):
        last_failed[run_pk] = step_path  # ordered by sequence: the last one wins
    out = {}
    for run in failed:
        error = run.error if isinstance(run.error, dict) else {}
        cancelled = is_cancelled(run)
        step = error.get("stepPath") if isinstance(error.get("stepPath"), str) else last_failed.get(run.pk)
        out[run.run_id] = Failure(
            cancelled=cancelled,
            name=_text(error.get("name")),
            message=_text(error.get("message")) if error else _text(run.error),
            step_path=None if cancelled else step,
        )
    return out


def of_run(run: Run) -> Failure | None:
    return for_runs([run]).get(run.run_id)
