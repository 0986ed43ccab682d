"""Projections are the fold of the log: kept current by appends, rebuilt, verified, repriced."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.fold import fold
from ledger.fold.pricing import prices_for
from ledger.log import append
from ledger.log.envelopes import log_of
from ledger.log.projection import differences
from ledger.log.states import STATES
from ledger.models import CostEntry, Run, Step, ToolCall
from tests.conftest import ev, ledger_cli, started


def responded(step: str | None, turn: int, provider: str, model: str, **usage: int) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "turn": turn,
        "callId": f"m{turn}-{step}",
        "model": {"provider": provider, "modelId": model},
        "response": {"text": "ok", "usage": usage},
    }
    if step:
        payload["stepPath"] = step
    return {"type": "harness.model.responded", "payload": payload}


def assert_projection_is_fold(run: Run) -> None:
    run.refresh_from_db()
    log = log_of(run)
    assert differences(run, fold(log, prices=prices_for(run.workspace), run_id=run.run_id), log) == []


@pytest.mark.django_db
def test_worked_examples_land_in_the_projections(workspace, append) -> None:
    append(
        "run_cost",
        started(),
        ev("StepScheduled", stepPath="a"),
        responded("a", 1, "openai", "gpt-4o", inputTokens=1_000_000, outputTokens=500_000),
        responded("a", 2, "openai", "gpt-4o-mini", inputTokens=10_000, cachedInputTokens=8_000, outputTokens=2_000),
        responded("b", 1, "acme.chat", "nope", inputTokens=5, outputTokens=5),
        responded(None, 1, "openai.responses", "gpt-4o-mini", inputTokens=10_000, outputTokens=2_000),
        ev("harness.session.completed", stepPath="a", usage={"inputTokens": 1_010_000, "outputTokens": 502_000}),
    )
    run = Run.objects.get(run_id="run_cost")
    costs = list(CostEntry.objects.filter(run=run).order_by("sequence").values_list("model_id", "cost_usd"))
    assert costs == [
        ("gpt-4o", Decimal("7.5")),
        ("gpt-4o-mini", Decimal("0.0021")),
        ("nope", None),
        ("gpt-4o-mini", Decimal("0.0027")),
    ]
    assert (run.cost_usd, run.priced_calls, run.unpriced_calls) == (Decimal("7.5048"), 3, 1)
    assert run.input_tokens == 1_020_005  # the session rollup added nothing
    step_a, step_b = Step.objects.filter(run=run).order_by("position")
    assert (step_a.step_path, step_a.cost_usd, step_a.priced_calls) == ("a", Decimal("7.5021"), 2)
    assert (step_b.step_path, step_b.cost_usd, step_b.unpriced_calls) == ("b", None, 1)  # NULL, never 0
    assert_projection_is_fold(run)


@pytest.mark.django_db
def test_run_state_and_tool_calls_are_projected(workspace, append) -> None:
    append("run_parent", started())
    append(
        "run_child",
        started(parentRunId="run_parent", label="child", input={"q": 1}),
        ev("StepAttemptStarted", stepPath="s", attempt=1),
        ev("StepFailed", stepPath="s", attempt=1, error={"message": "boom"}),
        ev("StepAttemptStarted", stepPath="s", attempt=2),
        ev("harness.tool_call.started", callId="t1", caller="model", toolName="search", args={"q": "x"}, stepPath="s"),
        ev("harness.tool_call.succeeded", callId="t1", result={"hits": 2}, durationMs=12.5),
        ev("StepCompleted", stepPath="s", attempt=2, output={"done": True}),
        ev("RunCompleted", output={"answer": 42}),
    )
    run = Run.objects.get(run_id="run_child")
    assert (run.status, run.parent_run_id, run.root_run_id, run.label) == (
        "completed",
        "run_parent",
        "run_parent",
        "child",
    )
    assert (run.input, run.output, run.event_count, run.last_sequence) == ({"q": 1}, {"answer": 42}, 8, 8)
    assert run.started_at is not None and run.finished_at is not None
    step = Step.objects.get(run=run)
    assert step.status == "completed" and [a["status"] for a in step.attempts] == ["failed", "completed"]
    call = ToolCall.objects.get(run=run)
    assert (call.tool_name, call.status, call.result, call.duration_ms, call.step_path) == (
        "search",
        "succeeded",
        {"hits": 2},
        12.5,
        "s",
    )
    assert_projection_is_fold(run)


EVENT_POOL = [
    ev("StepScheduled", stepPath="a"),
    ev("StepAttemptStarted", stepPath="a", attempt=1),
    ev("StepCompleted", stepPath="a", attempt=1, output=1),
    ev("StepScheduled", stepPath="b.visit[1]"),
    ev("StepFailed", stepPath="b.visit[1]", attempt=1, error="x"),
    ev("harness.tool_call.started", callId="t1", caller="model", toolName="x", args={}, stepPath="a"),
    ev("harness.tool_call.succeeded", callId="t1", result=1, durationMs=1),
    ev("harness.tool_call.started", callId="t2", caller="code", toolName="y", args=[1], stepPath="b.visit[1]"),
    ev("harness.tool_call.in_doubt", callId="t2"),
    ev("custom.note", text="hi"),
    responded("a", 1, "openai", "gpt-4o-mini", inputTokens=100, outputTokens=10),
    responded("b.visit[1]", 2, "acme", "nope", inputTokens=5, outputTokens=1),
    responded(None, 3, "anthropic", "claude-sonnet-4-6", inputTokens=7, cachedInputTokens=9, outputTokens=3),
]


@pytest.mark.django_db(transaction=True)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["run_x", "run_y"]),
            st.lists(st.sampled_from(range(len(EVENT_POOL))), min_size=1, max_size=6),
        ),
        min_size=1,
        max_size=8,
    ),
    st.booleans(),
)
def test_projection_equals_fold_after_random_interleavings(batches, forget_cache) -> None:
    from ledger.tenancy.services import bootstrap

    workspace = bootstrap(tenant="acme", workspace=f"hyp-{Run.objects.count()}")
    for run_id in ("run_x", "run_y"):
        append(workspace=workspace, run_id=run_id, events=[started()])
    for run_id, picks in batches:
        if forget_cache:  # another process appended: the next append must fold from the log
            STATES.clear()
        append(workspace=workspace, run_id=run_id, events=[EVENT_POOL[i] for i in picks])
    for run in Run.objects.filter(workspace=workspace):
        assert_projection_is_fold(run)


class _CountedSteps(dict):
    """A run state's steps that count the entries a walk over them visits."""

    visited = 0

    def _count(self, entries: Any) -> Any:
        for entry in entries:
            type(self).visited += 1
            yield entry

    def __iter__(self) -> Any:
        return self._count(super().__iter__())

    def __reversed__(self) -> Any:
        return self._count(super().__reversed__())

    def items(self) -> Any:
        return self._count(super().items())

    def values(self) -> Any:
        return self._count(super().values())


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("forget_cache", [False, True])
def test_an_append_writes_the_rows_of_the_steps_it_names_and_walks_no_other(
    workspace, monkeypatch: pytest.MonkeyPatch, forget_cache: bool
) -> None:
    """A run of 300 steps; a batch that names an early step (its answer's usage moves it), starts
    two new ones and notes something on a third (a custom event: no step is touched). Exactly
    those three step rows are written, the new ones at the next positions, the early one keeping
    its own, and finding them visits the two new steps and the one before them, not the run's
    300: an append costs the same on a run of ten thousand steps as on one of ten."""
    from ledger.log import strategies

    append(workspace=workspace, run_id="run_many", events=[started()])
    append(workspace=workspace, run_id="run_many", events=[ev("StepScheduled", stepPath=f"s{i}") for i in range(300)])
    if forget_cache:  # another process appended: the next append folds the log first
        STATES.clear()
    written: list[str] = []
    batch_changes = strategies.batch_changes

    def counted(workspace_id: int, state: Any, envelopes: Any, before: Any) -> Any:
        steps, state.steps = state.steps, _CountedSteps(state.steps)
        try:
            changes = batch_changes(workspace_id, state, envelopes, before)
        finally:
            state.steps = steps
        written.extend(row["step_path"] for row in changes.steps)
        return changes

    monkeypatch.setattr(strategies, "batch_changes", counted)
    _CountedSteps.visited = 0

    append(
        workspace=workspace,
        run_id="run_many",
        events=[
            responded("s3", 1, "openai", "gpt-4o-mini", inputTokens=100, outputTokens=10),
            ev("StepScheduled", stepPath="late_a"),
            ev("custom.note", stepPath="s7", text="a custom event touches no step"),
            ev("StepScheduled", stepPath="late_b"),
        ],
    )

    assert sorted(written) == ["late_a", "late_b", "s3"]
    assert _CountedSteps.visited == 3
    run = Run.objects.get(workspace=workspace, run_id="run_many")
    rows = {s.step_path: s for s in Step.objects.filter(run=run, step_path__in=["s3", "late_a", "late_b"])}
    assert (rows["s3"].position, rows["late_a"].position, rows["late_b"].position) == (3, 300, 301)
    assert rows["s3"].input_tokens == 100 and rows["s3"].last_sequence == 302
    assert_projection_is_fold(run)


@pytest.mark.django_db(transaction=True)
def test_appends_across_commits_use_and_refresh_the_cached_state(workspace) -> None:
    append(workspace=workspace, run_id="run_c", events=[started()])
    for turn in range(1, 6):
        append(
            workspace=workspace,
            run_id="run_c",
            events=[responded("s", turn, "openai", "gpt-4o-mini", inputTokens=1000, outputTokens=100)],
        )
    run = Run.objects.get(run_id="run_c")
    assert run.priced_calls == 5 and run.input_tokens == 5000
    assert_projection_is_fold(run)


@pytest.mark.django_db
def test_verify_catches_a_hand_corrupted_projection_and_rebuild_mends_it(workspace, append) -> None:
    append(
        "run_v", started(), ev("StepScheduled", stepPath="s"), ev("StepCompleted", stepPath="s", attempt=1, output=1)
    )
    assert ledger_cli("verify", "run_v")[0] == 0
    Step.objects.filter(run__run_id="run_v").update(status="failed")
    Run.objects.filter(run_id="run_v").update(status="failed")
    code, out = ledger_cli("verify", "run_v")
    assert code == 1 and "projections" in out and "step s.status" in out and "run.status" in out
    assert ledger_cli("rebuild", "run_v") == (0, "rebuilt projections of 1 run(s)\n")
    assert ledger_cli("verify", "run_v")[0] == 0


@pytest.mark.django_db
def test_verify_catches_a_missing_projection_row(workspace, append) -> None:
    append("run_v", started(), ev("harness.tool_call.started", callId="c", caller="model", toolName="t", args={}))
    ToolCall.objects.filter(run__run_id="run_v").delete()
    code, out = ledger_cli("verify", "run_v")
    assert code == 1 and "tool call c: missing" in out


@pytest.mark.django_db
def test_verify_catches_a_deleted_event(workspace, append) -> None:
    append("run_v", started(), ev("StepScheduled", stepPath="s"), ev("StepScheduled", stepPath="t"))
    with transaction.atomic(), connection.cursor() as cur:  # only raw database access can do this
        cur.execute("UPDATE ledger_run SET pruning = %s WHERE run_id = 'run_v'", [True])
        cur.execute(
            "DELETE FROM ledger_event WHERE sequence = 2 AND run_id = (SELECT id FROM ledger_run WHERE run_id = 'run_v')"
        )
        cur.execute("UPDATE ledger_run SET pruning = %s WHERE run_id = 'run_v'", [False])
    code, out = ledger_cli("verify", "run_v")
    assert code == 1 and "dense_sequence" in out and "missing [2]" in out
    assert "cannot be folded" in out


@pytest.mark.django_db
def test_reprice_applies_a_workspace_price_override(workspace, append) -> None:
    append(
        "run_p",
        started(),
        responded("s", 1, "acme.chat", "house", inputTokens=1_000_000, outputTokens=0),
        responded("s", 2, "openai", "gpt-4o", inputTokens=1_000_000, outputTokens=0),
    )
    assert Run.objects.get(run_id="run_p").cost_usd == Decimal("2.5")
    workspace.price_overrides = {"acme.chat/house": {"input": 1, "output": 2}}
    workspace.save()
    assert ledger_cli("reprice") == (0, "repriced 1 run(s): 2 cost entries changed\n")
    run = Run.objects.get(run_id="run_p")
    assert (run.cost_usd, run.priced_calls, run.unpriced_calls) == (Decimal("3.5"), 2, 0)
    versions = set(CostEntry.objects.filter(run=run).values_list("price_table_version", flat=True))
    assert len(versions) == 1 and "+ws." in versions.pop()
    assert ledger_cli("verify", "run_p")[0] == 0


@pytest.mark.django_db
def test_rebuild_then_verify_passes_on_every_demo_run() -> None:
    ledger_cli("demo", "--history-runs", "10")
    assert ledger_cli("rebuild")[0] == 0
    code, out = ledger_cli("verify")
    assert code == 0 and out.endswith("ok\n")


@pytest.mark.django_db
def test_report_cli_json_and_table(workspace, append) -> None:
    append(
        "run_r",
        started(),
        responded(
            "extract", 1, "openai", "gpt-4o-mini", inputTokens=20_000, cachedInputTokens=16_000, outputTokens=10_000
        ),
        responded("classify", 1, "acme.chat", "nope", inputTokens=900, outputTokens=120),
        responded("tiny", 1, "openai", "gpt-4o-mini", inputTokens=1, outputTokens=0),
        ev("RunCompleted"),
    )
    code, out = ledger_cli("report", "run_r")
    report = json.loads(out)
    assert code == 0 and report["total"]["costUsd"] == pytest.approx(0.00780015)
    assert report["hasUnpricedCalls"] is True
    code, table = ledger_cli("report", "run_r", "--table")
    lines = table.splitlines()
    assert lines[0] == "Run run_r (completed)"
    assert lines[2].split() == ["STEP", "IN", "CACHED", "CACHE%", "OUT", "CALLS", "COST", "(USD)"]
    rows = {line.split()[0]: line for line in lines[4:] if line.strip()}
    assert rows["classify"].endswith("0+1?         n/a")
    assert rows["tiny"].endswith("<0.000001")
    assert rows["extract"].endswith("0.007800")
    assert rows["TOTAL"].split()[-2:] == ["2+1?", "0.007800"]
    assert lines[-1] == "Note: 1 model call(s) had no registry pricing and are excluded from the cost above."


@pytest.mark.django_db
def test_report_of_a_run_without_model_calls_is_a_true_zero(workspace, append) -> None:
    append("run_z", started(), ev("StepScheduled", stepPath="s"))
    _, table = ledger_cli("report", "run_z", "--table")
    assert table.splitlines()[-1].endswith("0.000000")


@pytest.mark.django_db
def test_report_and_replay_plan_of_an_unknown_run_exit_1(workspace) -> None:
    assert ledger_cli("report", "run_missing")[0] == 1
    assert ledger_cli("replay-plan", "run_missing")[0] == 1


@pytest.mark.django_db
def test_replay_plan_cli_names_what_would_run(workspace, append) -> None:
    append(
        "run_plan",
        started(),
        ev("StepCompleted", stepPath="extract", attempt=1, output=1),
        ev("StepScheduled", stepPath="summarize"),
        ev("harness.model.called", turn=1, stepPath="summarize", promptHash="sha256:x", request={}),
    )
    code, out = ledger_cli("replay-plan", "run_plan")
    plan = json.loads(out)
    assert code == 0
    assert (plan["completedStepPaths"], plan["pendingStepPaths"]) == (["extract"], ["summarize"])
    assert plan["sessions"] == [] or all(
        c["action"] in ("replay", "reinvoke") for s in plan["sessions"] for c in s["calls"]
    )
    assert plan["integrity"]["ok"] is True
