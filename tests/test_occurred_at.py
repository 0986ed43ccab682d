"""When a fact happened, for writers that report after the fact (docs/operations.md): an event's
`occurredAt` times runs, steps and attempts in the fold, the projections and the API instead of
the moment the log took it; a run's end may restate its start (`runStartedAt`); a text that names
no instant is ignored, never refused; the fold's law holds across the split."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ledger.fold import fold, fold_into
from ledger.log import AppendResult
from ledger.log.verify import verify_run
from ledger.models import Run, Step
from ledger.reads import serialize
from ledger.reads.subruns import own_usage
from tests.conftest import envelopes, ev, started

ITEMS: list[tuple[str, dict[str, Any]]] = [
    ("RunStarted", {"workflowVersionId": "wf", "occurredAt": "2026-01-01T09:00:00.250000Z"}),
    ("StepScheduled", {"stepPath": "a", "occurredAt": "2026-01-01T09:00:01Z"}),
    ("StepAttemptStarted", {"stepPath": "a", "attempt": 1, "occurredAt": "2026-01-01T09:00:01.000001Z"}),
    ("StepCompleted", {"stepPath": "a", "attempt": 1, "occurredAt": "2026-01-01T09:00:03.5Z"}),
    ("StepAttemptStarted", {"stepPath": "b", "attempt": 1, "occurredAt": "2026-13-01T09:00:00Z"}),  # no such month
    ("StepCompleted", {"stepPath": "b", "attempt": 1, "occurredAt": "yesterday"}),
    ("RunCompleted", {"occurredAt": "2026-01-01T09:00:05Z", "runStartedAt": "2026-01-01T08:59:59.999Z"}),
]


def test_the_fold_times_runs_and_steps_by_when_they_happened() -> None:
    log = envelopes(ITEMS, run_id="run_late")
    state = fold(log, run_id="run_late")
    assert (state.started_at, state.finished_at) == ("2026-01-01T08:59:59.999Z", "2026-01-01T09:00:05Z")
    a = state.steps["a"]
    assert (a.started_at, a.finished_at) == ("2026-01-01T09:00:01.000001Z", "2026-01-01T09:00:03.5Z")
    assert (a.attempts[0].started_at, a.attempts[0].finished_at) == (a.started_at, a.finished_at)
    b = state.steps["b"]  # what names no instant is ignored: the log's own time stands
    assert (b.started_at, b.finished_at) == (log[4]["recordedAt"], log[5]["recordedAt"])
    for cut in range(len(log) + 1):
        assert fold_into(fold(log[:cut], run_id="run_late"), log[cut:]) == state


def test_the_run_and_its_steps_read_the_same_through_the_api(append: Callable[..., AppendResult]) -> None:
    append(
        "run_reported_late",
        started(occurredAt="2026-01-01T09:00:00.250000Z"),
        ev("StepAttemptStarted", stepPath="a", attempt=1, occurredAt="2026-01-01T09:00:01.000001Z"),
    )
    append(
        "run_reported_late",
        ev("StepCompleted", stepPath="a", attempt=1, occurredAt="2026-01-01T09:00:03.5Z"),
        ev("RunCompleted", occurredAt="2026-01-01T09:00:05Z", runStartedAt="2026-01-01T08:59:59.999Z"),
    )
    run = Run.objects.get(run_id="run_reported_late")
    assert run.started_at == datetime(2026, 1, 1, 8, 59, 59, 999000, tzinfo=UTC)
    assert run.finished_at == datetime(2026, 1, 1, 9, 0, 5, tzinfo=UTC)
    step = Step.objects.get(run=run, step_path="a")
    assert (step.finished_at - step.started_at).total_seconds() == 2.499999
    shown = serialize.run(run, children=0, attention=None, tree=own_usage(run))
    assert (shown["startedAt"], shown["finishedAt"]) == ("2026-01-01T08:59:59.999Z", "2026-01-01T09:00:05.000Z")
    assert all(check.status == "pass" for check in verify_run(run))
