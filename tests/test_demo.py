"""`ledger demo`: real runs made by the runtime, each showing what it is there to show."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from datetime import timedelta
from decimal import Context, Decimal
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import transaction
from django.test import Client, override_settings
from django.utils import timezone

from ledger.demo import DEMO_PASSWORD, load_demo
from ledger.fold.pricing import prices_for
from ledger.log.envelopes import log_of
from ledger.log.projection import COMPARE_PLACES
from ledger.log.verify import verify_run
from ledger.models import AuditEntry, CostEntry, Event, Run, ToolGatewayClaim, Workspace
from ledger.reads import attention, failure
from ledger.tenancy.services import create_key

pytestmark = pytest.mark.django_db

HISTORY = 21


@pytest.fixture(scope="module")
def demo(
    django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Workspace]]:
    """All of `ledger demo`, loaded once for the module in a transaction rolled back at its end.
    Each test reads it inside its own savepoint, which rolls back what the test writes (a second
    load included): one load for the module instead of one per test. Its artifacts are the
    module's too (so no test moves ARTIFACTS_ROOT, see below)."""
    artifacts = override_settings(ARTIFACTS_ROOT=tmp_path_factory.mktemp("demo") / "artifacts")
    with artifacts, django_db_blocker.unblock(), transaction.atomic():
        try:
            load_demo(history_runs=HISTORY)
            yield {f"{ws.tenant.slug}/{ws.slug}": ws for ws in Workspace.objects.select_related("tenant")}
        finally:
            transaction.set_rollback(True)


@pytest.fixture(autouse=True)
def _artifacts_in_tmp() -> None:
    """The module's demo keeps its artifacts for every test (tests/conftest.py gives each its own)."""


def _log(ws: Workspace, run_id: str) -> list[dict[str, Any]]:
    return log_of(Run.objects.get(workspace=ws, run_id=run_id))


def _types(events: list[dict[str, Any]], prefix: str) -> list[tuple[str, Any]]:
    return [(e["type"], e["payload"].get("turn")) for e in events if e["type"].startswith(prefix)]


def test_the_crashed_run_resumed_by_fast_forwarding(demo: dict[str, Workspace]) -> None:
    events = _log(demo["acme/support"], "run_demo_crashed_resumed")
    assert events[-1]["type"] == "RunCompleted"
    # Turn 1 and its tool call were committed before the crash: called and answered once each.
    # Turn 2 was in flight: called once before the crash, answered once after the resume.
    assert _types(events, "harness.model.") == [
        ("harness.model.called", 1),
        ("harness.model.responded", 1),
        ("harness.model.called", 2),
        ("harness.model.responded", 2),
    ]
    called_2, responded_2 = (e for e in events if e["type"].startswith("harness.model.") and e["payload"]["turn"] == 2)
    assert responded_2["recordedAt"] > called_2["recordedAt"]
    assert sum(e["type"] == "StepCompleted" and e["payload"]["stepPath"] == "normalize" for e in events) == 1


def test_the_showcase_runs(demo: dict[str, Workspace]) -> None:
    support, research = demo["acme/support"], demo["acme/research"]
    in_doubt = Run.objects.get(workspace=support, run_id="run_demo_in_doubt")
    assert in_doubt.status == "running"
    assert "harness.tool_call.in_doubt" in [e["type"] for e in log_of(in_doubt)]
    assert ToolGatewayClaim.objects.get(run=in_doubt, tool_name="issue_refund").status == "in_doubt"

    house = Run.objects.get(workspace=research, run_id="run_demo_house_model")
    assert house.status == "completed" and house.cost_usd is None and house.unpriced_calls == 2

    export = Run.objects.get(workspace=research, run_id="run_demo_export")
    assert export.status == "completed" and export.output_ref.startswith("artifact://")

    triage = Run.objects.get(workspace=support, run_id="run_demo_triage")
    assert triage.status == "completed" and triage.cost_usd is not None and triage.cost_usd > 0


def test_the_orchestrator_fans_out_five_sub_runs_and_the_loop_takes_three_visits(demo: dict[str, Workspace]) -> None:
    research, support = demo["acme/research"], demo["acme/support"]
    orchestrator = Run.objects.get(workspace=research, run_id="run_demo_orchestrator")
    children = Run.objects.filter(workspace=research, parent_run_id=orchestrator.run_id)
    assert orchestrator.status == "completed"
    assert sorted(children.values_list("status", flat=True)) == ["completed"] * 4 + ["failed"]
    assert set(children.values_list("root_run_id", flat=True)) == {orchestrator.run_id}
    started = [e for e in log_of(orchestrator) if e["type"] == "harness.tool_call.started"]
    assert sorted(e["payload"]["args"]["subRunId"] for e in started) == sorted(
        children.values_list("run_id", flat=True)
    )

    escalation = Run.objects.get(workspace=support, run_id="run_demo_escalation")
    paths = [s.step_path for s in escalation.steps.all()]
    assert [p for p in paths if p.startswith("draft")] == ["draft.visit[0]", "draft.visit[1]", "draft.visit[2]"]
    assert escalation.status == "completed" and escalation.output["passes"] == 3


def test_the_outer_loop_takes_three_cycles_each_a_run_and_its_page_lists_them(demo: dict[str, Workspace]) -> None:
    from ledger.runtime.outer_loop import read_loop

    research = demo["acme/research"]
    loop = read_loop(research, "ol_demo_refine")
    assert loop.status == "completed" and loop.max_cycles == 5
    assert [(c.status, c.supervise["kind"]) for c in loop.cycles] == [  # type: ignore[index]
        ("completed", "continue"),
        ("completed", "continue"),
        ("completed", "done"),
    ]
    assert loop.cycles[1].supervise == {
        "kind": "continue",
        "promptNote": "cut it to 120 words and lead with the finding",
    }
    assert loop.result is not None and loop.result["finalOutput"]["cycles"] == 3
    assert loop.usage.cost_usd == sum(c.usage.cost_usd for c in loop.cycles) and loop.usage.priced_calls == 3
    for cycle in loop.cycles:
        assert Run.objects.get(workspace=research, run_id=cycle.run_id).status == "completed"
    client = Client()
    client.force_login(User.objects.get(username="dave"))
    page = client.get("/w/acme/research/loops/ol_demo_refine/")
    assert page.status_code == 200 and page.content.decode().count('class="cycle"') == 3


def test_a_cancelled_run_and_a_tool_call_waiting_for_approval(demo: dict[str, Workspace]) -> None:
    support = demo["acme/support"]
    cancelled = Run.objects.get(workspace=support, run_id="run_demo_cancelled")
    assert cancelled.status == "failed" and cancelled.error["name"] == "Cancelled"
    assert _log(support, "run_demo_cancelled")[-1]["type"] == "RunFailed"
    waiting = Run.objects.get(workspace=support, run_id="run_demo_awaiting_approval")
    assert waiting.status == "running"
    assert [(c.tool_name, c.status) for c in waiting.tool_calls.all()] == [("send_goodwill_credit", "waiting_approval")]
    assert AuditEntry.objects.filter(action="run.cancelled", target="run_demo_cancelled", actor="carol").count() == 1


def test_the_demo_holds_a_run_in_every_attention_state(demo: dict[str, Workspace]) -> None:
    support = demo["acme/support"]
    runs = Run.objects.filter(workspace=support).select_related("workspace__tenant")
    shown = {run_id: needs.kind for run_id, needs in attention.for_runs(support, runs).items()}
    assert shown == {
        "run_demo_awaiting_approval": "waiting_tool_approval",
        "run_demo_in_doubt": "tool_call_in_doubt",
        "run_demo_triage": "reexecution_pending",
        "run_demo_retry_scheduled": "retry_scheduled",
    }
    assert failure.of_run(runs.get(run_id="run_demo_cancelled")) == failure.Failure(
        cancelled=True, name="Cancelled", message="order D-4 was delivered on time: no credit is due", step_path=None
    )
    assert all(c.status == "pass" for c in verify_run(runs.get(run_id="run_demo_retry_scheduled")))


def test_history_spreads_over_thirty_days_and_every_run_verifies(demo: dict[str, Workspace]) -> None:
    history = Run.objects.filter(run_id__startswith="run_hist_")
    assert history.count() == HISTORY
    oldest = history.order_by("created_at").first()
    assert oldest is not None and oldest.created_at < timezone.now() - timedelta(days=28)
    assert history.filter(status="failed").exists() and history.filter(status="completed").count() > HISTORY // 2
    for run in Run.objects.select_related("workspace"):
        failed = [c for c in verify_run(run) if c.status != "pass"]
        assert not failed, (run.run_id, failed)
    assert load_demo(history_runs=HISTORY).startswith("0 run(s) created")


def test_no_demo_run_starts_or_records_anything_in_the_future(demo: dict[str, Workspace]) -> None:
    now = timezone.now()
    assert Run.objects.exists() and not Run.objects.filter(started_at__gt=now).exists()
    assert not Run.objects.filter(created_at__gt=now).exists()
    assert not Event.objects.filter(recorded_at__gt=now).exists()
    newest = Run.objects.filter(run_id__startswith="run_hist_").order_by("-started_at").first()
    assert newest is not None and newest.started_at is not None and newest.started_at > now - timedelta(days=3)


def test_demo_runs_are_visible_through_the_api_and_only_to_their_workspace(demo: dict[str, Workspace]) -> None:
    _, key = create_key(workspace=demo["acme/support"], scopes=["read"])
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    listed = client.get("/api/v1/runs?limit=200").json()
    ids = {r["runId"] for r in listed["runs"]}
    assert {"run_demo_triage", "run_demo_crashed_resumed", "run_demo_in_doubt"} <= ids
    assert "run_demo_export" not in ids and "run_demo_globex" not in ids
    evidence = client.get("/api/v1/runs/run_demo_in_doubt/evidence").json()
    assert [c["toolName"] for c in evidence["toolCalls"] if c["status"] == "in_doubt"] == ["issue_refund"]
    assert client.get("/api/v1/runs/run_demo_export").status_code == 404


# A moment anywhere in an answer: a date, a time, then an offset or Z.
MOMENT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def _moments(value: Any, where: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _moments(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _moments(item, f"{where}[{i}]")
    elif isinstance(value, str) and MOMENT.match(value):
        yield where, value


def test_every_moment_the_api_answers_is_utc_with_a_z(demo: dict[str, Workspace]) -> None:
    """One format for every resource's moments (DRF's: `…Z`), so a client may compare them as it
    reads them; evaluations, datasets and policies wrote `+00:00` before."""
    _, key = create_key(workspace=demo["acme/support"], scopes=["read"])
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    evaluation = client.get("/api/v1/evaluations?limit=1").json()["evaluations"][0]["id"]
    reexecution = client.get("/api/v1/reexecutions?limit=1").json()["reexecutions"][0]["id"]
    paths = [
        "/api/v1/runs?limit=5",
        "/api/v1/runs/run_demo_in_doubt",
        "/api/v1/runs/run_demo_in_doubt/tool-calls",
        "/api/v1/runs/run_demo_triage/reexecutions",
        f"/api/v1/reexecutions/{reexecution}",
        "/api/v1/evaluations?limit=5",
        f"/api/v1/evaluations/{evaluation}",
        "/api/v1/datasets",
        "/api/v1/evaluation-policies",
    ]
    seen = []
    for path in paths:
        answer = client.get(path)
        assert answer.status_code == 200, (path, answer.content[:200])
        seen += [(path + where, value) for where, value in _moments(answer.json())]
    offsets = [(where, value) for where, value in seen if not value.endswith("Z")]
    assert not offsets
    assert {where.split("?")[0].split(".")[0] for where, _ in seen} >= {
        "/api/v1/datasets",
        "/api/v1/evaluation-policies",
        f"/api/v1/evaluations/{evaluation}",
    }


def test_the_demo_lays_out_a_re_execution_in_every_state(demo: dict[str, Workspace]) -> None:
    from ledger.demo import reexecution as demo_reexecution
    from ledger.models import AuditEntry, ReexecutionRequest
    from ledger.replay.divergence import divergence_report

    support = demo["acme/support"]
    by_reason = {r.reason: r for r in ReexecutionRequest.objects.filter(workspace=support)}
    waiting = by_reason[demo_reexecution.WAITING]
    assert (waiting.mode, waiting.status, waiting.requested_by) == ("fork", "pending_approval", "carol")

    changed = by_reason[demo_reexecution.CHANGED]
    assert (changed.mode, changed.status, changed.approver_name) == ("fork", "succeeded", "bob")
    report = divergence_report(workspace=support, original_run_id="run_demo_triage", new_run_id=changed.new_run_id)
    assert report["firstDivergence"] == "normalize" and report["counts"]["changed"] >= 1
    assert report["new"]["output"] != report["original"]["output"]

    simulated = by_reason[demo_reexecution.SIMULATED]
    assert (simulated.mode, simulated.status) == ("simulate", "succeeded")
    report = divergence_report(workspace=support, original_run_id="run_demo_triage", new_run_id=simulated.new_run_id)
    assert report["firstDivergence"] is None and report["divergences"] == []
    assert report["new"]["output"] == report["original"]["output"]

    denied = by_reason[demo_reexecution.DENIED]
    assert (denied.mode, denied.status, denied.approver_name) == ("rerun", "denied", "bob")
    for run_id in (changed.new_run_id, simulated.new_run_id):
        run = Run.objects.get(workspace=support, run_id=run_id)
        assert all(c.status == "pass" for c in verify_run(run)), run_id
    assert AuditEntry.objects.filter(action="reexecution.approved", target=changed.public_id).count() == 1
    assert AuditEntry.objects.filter(action="reexecution.denied", target=denied.public_id).count() == 1

    load_demo(history_runs=HISTORY)
    # Each evaluation's batch shares one reason (tests/test_demo.py::test_the_demo_evaluations).
    assert ReexecutionRequest.objects.filter(workspace=support, batch_id="").count() == len(by_reason) - 2


def test_loading_the_demo_again_resets_only_a_password_someone_changed(demo: dict[str, Workspace]) -> None:
    """`make run` loads the demo on every start: setting the same password again was a reset each
    time, audited, which ended the demo people's sessions (logged out of their browsers)."""
    resets = AuditEntry.objects.filter(action="member.password_reset").order_by("pk")
    before = resets.count()
    alice = User.objects.get(username="alice")
    alice.set_password("changed-by-alice-1")
    alice.save()
    load_demo(history_runs=HISTORY, evaluations_too=False)
    assert list(resets.all()[before:].values_list("target", flat=True)) == ["user:alice"]
    for name in ("alice", "bob", "carol", "dave", "gina"):
        assert User.objects.get(username=name).check_password(DEMO_PASSWORD), name


def test_every_demo_dollar_equals_the_decimal_definition(demo: dict[str, Workspace]) -> None:
    """The fold prices in integers (ledger.fold.pricing.price_call): every stored cost entry and run
    total of the demo is what the Decimal definition gives, tokens x rate / 1M, summed."""
    wide = Context(prec=200)
    totals: dict[int, Decimal] = {}
    entries = CostEntry.objects.select_related("run__workspace")
    assert entries.count() > 20
    for entry in entries:
        rates = prices_for(entry.run.workspace).lookup(entry.provider, entry.model_id)
        if rates is None:
            assert entry.cost_usd is None
            continue
        cache_rate = rates.input if rates.cached_input is None else rates.cached_input
        expected = wide.divide(
            wide.add(
                wide.add(
                    wide.multiply(Decimal(entry.input_tokens - entry.cached_input_tokens), rates.input),
                    wide.multiply(Decimal(entry.cached_input_tokens), cache_rate),
                ),
                wide.multiply(Decimal(entry.output_tokens), rates.output),
            ),
            Decimal(1_000_000),
        )
        assert entry.cost_usd == expected.quantize(Decimal("1e-12")), entry.sequence
        totals[entry.run_id] = totals.get(entry.run_id, Decimal(0)) + expected
    for run in Run.objects.filter(pk__in=totals):
        assert run.cost_usd is not None
        assert run.cost_usd.quantize(COMPARE_PLACES) == totals[run.pk].quantize(COMPARE_PLACES), run.run_id


def test_the_demo_evaluations_pass_a_model_swap_and_fail_a_regression(demo: dict[str, Workspace]) -> None:
    from ledger.demo import evaluations as demo_evaluations
    from ledger.models import Evaluation, EvaluationPolicy

    support = demo["acme/support"]
    kept = Evaluation.objects.get(workspace=support, reason=demo_evaluations.KEPT)
    regressed = Evaluation.objects.get(workspace=support, reason=demo_evaluations.REGRESSED)
    assert (kept.status, kept.verdict) == ("finished", "passed")
    assert kept.report["aggregates"]["changed"] == 0 and kept.report["aggregates"]["liveToolCalls"] == 0
    assert (regressed.status, regressed.verdict) == ("finished", "failed")
    assert regressed.report["aggregates"]["passRate"] == 0.8 and regressed.report["aggregates"]["changed"] == 2
    # The model swap keeps every outcome; the regression is a prompt change (the draft step's
    # system message) that spoils the two lost-parcel tickets, with no tool invoked either.
    assert kept.change["kind"] == "model" and regressed.change["kind"] == "prompt"
    assert regressed.report["aggregates"]["liveToolCalls"] == 0
    spoiled = [r["runId"] for r in regressed.report["runs"] if r["outcome"] == "changed"]
    assert spoiled == ["run_demo_eval_02", "run_demo_eval_06"]
    assert all(r["firstDivergence"] == "draft" for r in regressed.report["runs"] if r["outcome"] == "changed")
    assert kept.policy is not None and kept.policy == regressed.policy
    assert EvaluationPolicy.objects.filter(workspace=support).count() == 1
    load_demo(history_runs=HISTORY)
    assert Evaluation.objects.filter(workspace=support).count() == 2


def test_the_readmes_evaluation_command_keeps_every_outcome_and_fails_on_cost(demo: dict[str, Workspace]) -> None:
    """README § Gate a change: the command as written (with `--here`, no worker here) answers what
    the README says it does on the demo: every outcome kept, the gate failed by `cost_delta`."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    command = re.search(r"^manage\.py ledger evaluate (triage-golden .*?)\n```", readme, re.S | re.M)
    assert command is not None
    words = [w for w in shlex.split(command.group(1).replace("\\\n", " ")) if w != "--wait"]
    words = words[: words.index("--junit")]  # no file left behind
    out = StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("ledger", "evaluate", *words, "--here", stdout=out, stderr=StringIO())
    answer = json.loads(out.getvalue().splitlines()[-1])
    assert exited.value.code == 1
    assert (answer["passRate"], answer["changed"], answer["verdict"]) == (1.0, 0, "failed")
    assert round(answer["costDelta"], 1) == 15.7
    assert '"costDelta"` about 15.7' in readme
