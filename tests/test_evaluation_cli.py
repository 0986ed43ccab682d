"""`ledger evaluate` (the CI gate) and `ledger dataset`: exit status and JUnit file for a passing
and a regressing change, refusals, and zero tool invocations."""

from __future__ import annotations

import io
import json
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from ledger.evaluation import policies
from ledger.evaluation.scorers import unregister_scorer
from ledger.models import Evaluation, ReexecutionRequest, Workspace
from ledger.reexecution.executor import run_request
from ledger.runtime.model import ModelProvider, ModelRequest
from ledger.runtime.providers import ScriptedProvider, register_provider, unregister_provider
from tests.evaluation_support import Calls, CountingOrders, count_tool_edge, registered_providers, triage_runs
from tests.runtime_support import every_run_verifies  # noqa: F401  (autouse: ledger verify passes on every run)

pytestmark = [pytest.mark.usefixtures("clock"), pytest.mark.django_db]


@pytest.fixture
def providers() -> Iterator[Calls]:
    yield from registered_providers()


@pytest.fixture
def tool_counter(monkeypatch: pytest.MonkeyPatch) -> CountingOrders:
    return count_tool_edge(monkeypatch)


def ledger(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("ledger", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    except CommandError as exc:
        code = exc.returncode
        err.write(str(exc))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def golden(workspace: Workspace, operator: User, approver: User) -> str:
    runs = triage_runs(workspace)
    code, out, _ = ledger("dataset", "add", "golden", *runs, "--workspace", "acme/support", "--as", "carol")
    assert code == 0 and out.startswith("golden version 1 sha256:") and "(10 runs)" in out
    code, out, _ = ledger("dataset", "add", "golden", runs[0], "--workspace", "acme/support", "--as", "carol")
    assert code == 0 and out.startswith("golden version 1 sha256:") and "already in it: no new version" in out
    policies.approve_policy(
        workspace=workspace,
        dataset="golden",
        change_kinds=["model"],
        scorers=["exact", "regex"],
        ceiling_per_evaluation_usd="1",
        ceiling_per_day_usd="5",
        ttl_hours=24,
        by=approver,
    )
    return "golden"


def _gate(change: str, tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    return ledger(
        "evaluate", "golden", "--workspace", "acme/support", "--as", "carol",
        "--change", change, "--scorer", "exact", "--fail-if", "pass_rate < 0.95 or cost_delta > 0.10",
        "--here", "--junit", str(tmp_path / "junit.xml"), "--json", str(tmp_path / "report.json"), *extra,
    )  # fmt: skip


def test_dataset_versions_count_their_runs_in_words(golden: str, workspace: Workspace) -> None:
    """`ledger dataset remove` down to one run says "(1 run)", not "(1 runs)"."""
    runs = triage_runs(workspace)
    code, out, _ = ledger("dataset", "remove", "golden", *runs[1:], "--workspace", "acme/support", "--as", "carol")
    assert code == 0 and out.startswith("golden version 2 sha256:") and out.rstrip().endswith("(1 run)")


def test_the_gate_passes_a_change_that_keeps_every_outcome(golden, tmp_path, providers, tool_counter) -> None:
    lookups = tool_counter.lookups
    code, out, err = _gate("model:default=counting/gpt-4o-mini", tmp_path)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["verdict"] == "passed" and summary["passRate"] == 1.0 and summary["changed"] == 0
    suite = ElementTree.parse(tmp_path / "junit.xml").getroot()
    assert suite.tag == "testsuite" and suite.get("tests") == "11" and suite.get("failures") == "0"
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["verdict"] == "passed" and len(report["report"]["runs"]) == 10
    assert tool_counter.lookups == lookups and report["report"]["aggregates"]["liveToolCalls"] == 0


def test_the_gate_fails_a_regressing_change_with_exit_1_and_a_failing_junit(golden, tmp_path, providers) -> None:
    code, out, err = _gate("model:default=regressing/gpt-4o-mini", tmp_path)
    assert code == 1 and "verdict: failed" in err
    assert json.loads(out)["passRate"] == 0.7
    suite = ElementTree.parse(tmp_path / "junit.xml").getroot()
    assert suite.get("failures") == "4"
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert failed == ["run_t001", "run_t005", "run_t009", "gate"]


def test_a_pricier_model_fails_on_cost_delta(golden, tmp_path, providers) -> None:
    code, out, _ = _gate("model:default=counting/gpt-4o", tmp_path)
    assert code == 1 and json.loads(out)["costDelta"] > 0.10


def test_a_judge_of_unknown_cost_stops_the_gate_with_exit_3_and_says_why(golden, tmp_path, providers, approver) -> None:
    policy = policies.approve_policy(
        workspace=Workspace.objects.get(slug="support"),
        dataset="golden",
        change_kinds=["model"],
        scorers=["exact", "model_graded"],
        ceiling_per_evaluation_usd="1",
        ceiling_per_day_usd="5",
        ttl_hours=24,
        by=approver,
    )
    judge = 'model_graded:{"provider": "grader", "model": "house-judge-1"}'
    code, out, err = _gate("model:default=counting/gpt-4o-mini", tmp_path, "--scorer", judge)
    summary = json.loads(out)
    assert code == 3 and summary["verdict"] == "budget_exhausted"
    why = (
        f"evaluation {summary['id']} cannot keep its ceiling of 1 USD: a grader call has no known cost "
        "(no price for the model, no usage reported, or a failure after the request left)"
    )
    assert err.splitlines()[-1] == f"verdict: budget_exhausted: {why}"
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["policyId"] == policy.public_id
    assert report["budgetReason"] == {"code": "cost_unknown", "message": why}
    assert [c[0] for c in providers.made] == ["counting", "counting", "grader"]


def test_outside_a_policy_the_gate_has_no_verdict_and_refusals_exit_5(golden, tmp_path, providers) -> None:
    code, out, err = ledger(
        "evaluate", "golden", "--workspace", "acme/support", "--as", "carol",
        "--change", "model:default=counting/gpt-4o-mini", "--scorer", "model_graded:{\"provider\": \"grader\", \"model\": \"m\"}",
        "--wait", "--timeout", "0",
    )  # fmt: skip
    assert code == 4 and "waits for an approver" in err and json.loads(out)["status"] == "pending_approval"
    for bad in (["--change", "prompt:x"], ["--change", "model:default=counting/m", "--scorer", "nope"]):
        code, _, _ = ledger(
            "evaluate", "golden", "--workspace", "acme/support", "--as", "carol", "--scorer", "exact", *bad
        )
        assert code == 5
    code, _, _ = ledger(
        "evaluate", "missing", "--workspace", "acme/support", "--as", "carol",
        "--change", "model:default=counting/m", "--scorer", "exact",
    )  # fmt: skip
    assert code == 5
    assert Evaluation.objects.count() == 1


def test_a_scorer_registered_in_a_workflow_module_is_found(
    golden, tmp_path, providers, settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/evaluations.md: register your own scorer in a workflow module (RUNLEDGER_WORKFLOW_MODULES).
    `ledger evaluate` looked the name up before anything imported those modules: exit 5, "no scorer
    named 'polite'". Now it is found (the evaluation, outside the policy's scorers, waits: exit 4)."""
    (tmp_path / "docsaudit_scorers.py").write_text(
        "from ledger.evaluation.scorers import Score, register_scorer\n"
        "register_scorer('docsaudit_polite', lambda ctx: Score(1.0, True, 'fine'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "docsaudit_scorers", raising=False)
    settings.RUNLEDGER_WORKFLOW_MODULES = [*settings.RUNLEDGER_WORKFLOW_MODULES, "docsaudit_scorers"]
    try:
        code, out, err = ledger(
            "evaluate", "golden", "--workspace", "acme/support", "--as", "carol",
            "--change", "model:default=counting/gpt-4o-mini", "--scorer", "docsaudit_polite",
            "--wait", "--timeout", "0",
        )  # fmt: skip
    finally:
        unregister_scorer("docsaudit_polite")
    assert "no scorer named" not in err
    assert code == 4 and json.loads(out)["status"] == "pending_approval"


TERSE_SYSTEM = "system:draft=You answer support tickets. Answer in one short sentence."


def _every_kind(workspace: Workspace, approver: User) -> None:
    policies.approve_policy(
        workspace=workspace,
        dataset="golden",
        change_kinds=["model", "prompt", "input", "workflow"],
        scorers=["exact", "regex"],
        ceiling_per_evaluation_usd="1",
        ceiling_per_day_usd="5",
        ttl_hours=24,
        by=approver,
    )


def test_a_prompt_change_from_the_command_line(golden, workspace, approver, tmp_path, tool_counter) -> None:
    # The golden policy allows model mappings only: a prompt change waits for an approver.
    code, out, err = ledger(
        "evaluate", "golden", "--workspace", "acme/support", "--as", "carol", "--change", TERSE_SYSTEM,
        "--scorer", "exact", "--wait", "--timeout", "0",
    )  # fmt: skip
    assert code == 4 and json.loads(out)["status"] == "pending_approval" and "waits for an approver" in err
    _every_kind(workspace, approver)
    lookups = tool_counter.lookups
    code, out, err = _gate(TERSE_SYSTEM, tmp_path, "--change", "prompt:draft={original}")
    assert code == 1 and "verdict: failed" in err
    summary = json.loads(out)
    assert summary["passRate"] == 0.8 and summary["changed"] == 2
    made = Evaluation.objects.get(public_id=summary["id"])
    assert made.change == {
        "kind": "prompt",
        "prompts": {"draft": {"system": TERSE_SYSTEM.split("=", 1)[1], "prompt": "{original}"}},
    }
    failed = [c.get("name") for c in ElementTree.parse(tmp_path / "junit.xml").getroot().iter("testcase")
              if c.find("failure") is not None]  # fmt: skip
    assert failed == ["run_t002", "run_t006", "gate"]
    assert tool_counter.lookups == lookups


def test_input_and_workflow_changes_from_the_command_line(golden, workspace, approver, tmp_path) -> None:
    _every_kind(workspace, approver)
    code, out, err = _gate('input:{"channel": "email"}', tmp_path)
    assert code == 0, err
    assert Evaluation.objects.get(public_id=json.loads(out)["id"]).change == {
        "kind": "input",
        "mergePatch": {"channel": "email"},
    }
    code, out, _ = _gate('input:run_t000={"ticket": "Is it lost?", "orderId": "C-3"}', tmp_path)
    assert code == 1 and json.loads(out)["changed"] == 1
    # The premium workflow answers the same at a higher price: the cost gate fails it.
    code, out, _ = _gate("workflow:support.triage-premium", tmp_path)
    summary = json.loads(out)
    assert code == 1 and summary["changed"] == 0 and summary["costDelta"] > 0.10
    made = Evaluation.objects.get(public_id=summary["id"])
    assert made.change["workflow"] == "support.triage-premium" and made.change["version"].startswith("wfver_")
    code, out, _ = _gate('json:{"kind": "input", "mergePatch": {"locale": "fr"}}', tmp_path)
    assert code == 0
    before = Evaluation.objects.count()
    for bad in (
        ["--change", "model:default=counting/m", "--change", "system:draft=x"],  # two kinds
        ["--change", "input:{not json"],
        ["--change", "json:[1]"],
        ["--change", "workflow:support.nope"],
        ["--change", "workflow:support.triage@wfver_support.triage_000000000000"],
        ["--change", "prompt:confirm=x"],
    ):
        code, _, err = ledger(
            "evaluate", "golden", "--workspace", "acme/support", "--as", "carol", "--scorer", "exact", *bad
        )
        assert code == 5, (bad, err)
    assert Evaluation.objects.count() == before


@pytest.mark.django_db(transaction=True)
def test_here_waits_for_the_requests_a_worker_of_the_deployment_took(golden, tmp_path) -> None:
    """`--here` beside a running worker (`bin/serve`): the worker takes some of the batch the
    moment the policy approves it, and `--here` skips those. It printed `running` and exited 4
    ("verdict: running") while the worker was still at them; it now waits for them, as --wait
    does, and answers the verdict."""
    held: list[threading.Thread] = []

    def worker_elsewhere(request_pk: int) -> None:
        try:
            run_request(request_pk=request_pk, owner="worker-elsewhere")
        finally:
            connection.close()

    def takes_the_last_request(model: str, current: ModelProvider) -> ModelProvider:
        assert isinstance(current, ScriptedProvider) and callable(current.script)
        script = current.script

        def answer(request: ModelRequest) -> Mapping[str, Any]:
            if threading.current_thread() is not threading.main_thread():
                # The worker's run is the slower: it answers once --here is done with the others.
                batch = ReexecutionRequest.objects.filter(batch_id=Evaluation.objects.get().batch_id)
                for _ in range(3000):
                    if batch.filter(status=ReexecutionRequest.Status.SUCCEEDED).count() == 9:
                        break
                    time.sleep(0.01)
                time.sleep(1)
            elif not held:  # the first call of --here: the worker has just taken the batch's last request
                evaluation = Evaluation.objects.get()
                last = ReexecutionRequest.objects.filter(batch_id=evaluation.batch_id).order_by("pk").last()
                assert last is not None and last.status == ReexecutionRequest.Status.APPROVED
                held.append(threading.Thread(target=worker_elsewhere, args=(last.pk,)))
                held[0].start()
                for _ in range(300):  # until the worker holds it (its start commits at once)
                    last.refresh_from_db()
                    if last.status != ReexecutionRequest.Status.APPROVED:
                        break
                    time.sleep(0.01)
                assert last.lease_owner == "worker-elsewhere"
            return script(request)

        return ScriptedProvider(script=answer, name=current.name, model_id=model)

    register_provider("beside-a-worker", takes_the_last_request)
    try:
        code, out, err = _gate("model:default=beside-a-worker/gpt-4o-mini", tmp_path, "--timeout", "60")
    finally:
        unregister_provider("beside-a-worker")
        for thread in held:
            thread.join(timeout=60)
    summary = json.loads(out)
    assert summary["status"] == "finished" and summary["verdict"] == "passed", err
    assert code == 0 and (tmp_path / "junit.xml").exists()
    assert ReexecutionRequest.objects.filter(lease_owner="worker-elsewhere").count() == 1
