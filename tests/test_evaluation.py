"""Regression evaluations on recorded runs (docs/evaluations.md): datasets frozen by version,
the built-in scorers, evaluations under a policy and outside it, the spend ceiling, the report
and verdict, zero tool invocations, audit, and other tenants' 404."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from xml.etree import ElementTree

import pytest
from django.contrib.auth.models import User

from ledger.errors import NotFound
from ledger.evaluation import budget, datasets, evaluations, failif, policies, scorers
from ledger.evaluation.errors import EvaluationForbidden, InvalidEvaluation
from ledger.log import append
from ledger.log.envelopes import log_of
from ledger.models import AuditEntry, Evaluation, ReexecutionRequest, Run, Workspace
from ledger.reexecution import services
from ledger.reexecution.errors import SelfApprovalForbidden
from ledger.reexecution.executor import run_request
from ledger.runtime.model import ModelReply, ModelRequest
from ledger.runtime.providers import ScriptedProvider, register_provider, unregister_provider
from ledger.tenancy.services import create_key
from tests.conftest import named_user
from tests.evaluation_support import (
    Calls,
    CountingOrders,
    count_tool_edge,
    model_change,
    registered_providers,
    triage_runs,
)
from tests.runtime_support import every_run_verifies  # noqa: F401  (autouse: ledger verify passes on every run)

pytestmark = [pytest.mark.usefixtures("clock"), pytest.mark.django_db]

Status = Evaluation.Status
RxStatus = ReexecutionRequest.Status


@pytest.fixture
def people(admin: User, approver: User, operator: User, viewer: User, other_workspace: Workspace) -> dict[str, User]:
    olga = named_user("olga", "approver", tenant="globex")
    return {user.get_username(): user for user in (admin, approver, operator, viewer, olga)}


@pytest.fixture
def providers() -> Iterator[Calls]:
    yield from registered_providers()


@pytest.fixture
def tool_counter(monkeypatch: pytest.MonkeyPatch) -> CountingOrders:
    return count_tool_edge(monkeypatch)


@pytest.fixture
def runs(workspace: Workspace) -> list[str]:
    return triage_runs(workspace)


@pytest.fixture
def dataset(workspace: Workspace, runs: list[str], people: dict[str, User]) -> str:
    datasets.add_runs(workspace=workspace, name="triage-golden", run_ids=runs, by=people["alice"])
    return "triage-golden"


def _policy(workspace: Workspace, bob: User, **terms: Any) -> Any:
    body: dict[str, Any] = {
        "dataset": "triage-golden",
        "change_kinds": ["model"],
        "scorers": ["exact", "json_fields", "regex", "model_graded"],
        "ceiling_per_evaluation_usd": "1",
        "ceiling_per_day_usd": "5",
        "ttl_hours": 24,
        "note": "CI may evaluate model swaps on the golden set",
    }
    body.update(terms)
    return policies.approve_policy(workspace=workspace, by=bob, **body)


def _start(workspace: Workspace, by: Any, change: dict[str, Any], **extra: Any) -> Evaluation:
    body: dict[str, Any] = {
        "dataset": "triage-golden",
        "change": change,
        "scorers": ["exact"],
        "fail_if": "pass_rate < 0.95",
        "reason": "gpt-4o-mini -> a cheaper mapping",
    }
    body.update(extra)
    return evaluations.start_evaluation(workspace=workspace, by=by, **body)


def _actions(target: str) -> list[str]:
    return list(AuditEntry.objects.filter(target=target).order_by("pk").values_list("action", flat=True))


# --- datasets ---------------------------------------------------------------------------------


def test_a_dataset_version_is_frozen_by_its_runs_last_sequences_and_digest(workspace, runs, people) -> None:
    v1 = datasets.add_runs(workspace=workspace, name="golden", run_ids=runs[:3], by=people["carol"]).version
    assert v1.number == 1 and [m["runId"] for m in v1.members] == runs[:3]
    first = Run.objects.get(workspace=workspace, run_id=runs[0])
    assert v1.members[0]["lastSequence"] == first.last_sequence and v1.members[0]["expected"] == first.output
    before = (list(v1.members), v1.digest)
    # A later append to a member run changes neither the version nor its digest.
    append(
        workspace=workspace,
        run_id=runs[0],
        events=[{"type": "custom.note", "payload": {"text": "looked at this"}}],
    )
    v1.refresh_from_db()
    assert (v1.members, v1.digest) == before
    assert datasets.version_digest("golden", v1.members) == v1.digest
    # Every change is the next version; the earlier one stays as it was.
    v2 = datasets.add_runs(workspace=workspace, name="golden", run_ids=[runs[3]], by=people["carol"]).version
    v3 = datasets.remove_runs(workspace=workspace, name="golden", run_ids=[runs[1]], by=people["carol"])
    v4 = datasets.set_expected(
        workspace=workspace, name="golden", run_id=runs[0], expected={"reply": "edited"}, by=people["carol"]
    )
    assert [v.number for v in (v2, v3, v4)] == [2, 3, 4]
    assert len(v2.members) == 4 and runs[1] not in [m["runId"] for m in v3.members]
    assert v4.members[0]["expected"] == {"reply": "edited"} and v4.members[0]["expectedEditedBy"] == "carol"
    assert datasets.get_version(datasets.get_dataset(workspace, "golden"), 1).digest == before[1]
    assert _actions("dataset:golden") == ["dataset.changed"] * 4
    # Adding only runs it already holds is no change: no version, no audit entry.
    again = datasets.add_runs(workspace=workspace, name="golden", run_ids=[runs[0], runs[3]], by=people["carol"])
    assert not again.made and again.version.number == 4 and again.version.digest == v4.digest
    assert datasets.get_dataset(workspace, "golden").versions.count() == 4
    assert _actions("dataset:golden") == ["dataset.changed"] * 4


def test_datasets_refuse_viewers_outsiders_unfinished_and_bad_names(workspace, other_workspace, runs, people) -> None:
    with pytest.raises(EvaluationForbidden):
        datasets.add_runs(workspace=workspace, name="golden", run_ids=runs[:1], by=people["dave"])
    with pytest.raises(NotFound):
        datasets.add_runs(workspace=workspace, name="golden", run_ids=runs[:1], by=people["olga"])
    with pytest.raises(NotFound):  # another tenant's workspace does not hold these runs
        datasets.add_runs(workspace=other_workspace, name="golden", run_ids=runs[:1], by=people["olga"])
    with pytest.raises(InvalidEvaluation):
        datasets.add_runs(workspace=workspace, name="Bad Name!", run_ids=runs[:1], by=people["carol"])
    append(
        workspace=workspace,
        run_id="run_open",
        events=[{"type": "RunStarted", "payload": {"input": {}, "workflowVersionId": "w@1"}}],
    )
    with pytest.raises(InvalidEvaluation):
        datasets.add_runs(workspace=workspace, name="golden", run_ids=["run_open"], by=people["carol"])
    assert not AuditEntry.objects.filter(action="dataset.changed").exists()


def test_removing_a_run_the_dataset_does_not_hold_is_refused_not_a_new_version(workspace, runs, people) -> None:
    """A removal naming a run that is not a member (another workspace's, one removed already by a
    page sent twice) made an identical next version and audited a change that was none; it is
    refused like setting the expected output of a non-member, and nothing is written."""
    datasets.add_runs(workspace=workspace, name="golden", run_ids=runs[:2], by=people["carol"])
    for strangers in ([runs[5]], [runs[0], runs[5]], ["run_elsewhere"]):
        with pytest.raises(NotFound, match="is not in dataset golden"):
            datasets.remove_runs(workspace=workspace, name="golden", run_ids=strangers, by=people["carol"])
    assert datasets.latest(datasets.get_dataset(workspace, "golden")).number == 1
    assert _actions("dataset:golden") == ["dataset.changed"]
    v2 = datasets.remove_runs(workspace=workspace, name="golden", run_ids=[runs[0]], by=people["carol"])
    assert v2.number == 2 and [m["runId"] for m in v2.members] == [runs[1]]


# --- scorers ----------------------------------------------------------------------------------


def _ctx(workspace: Workspace, output: Any, expected: Any, **args: Any) -> scorers.ScoreContext:
    return scorers.ScoreContext(
        workspace=workspace, run_id="run_x", output=output, expected=expected, original_output=expected, args=args
    )


def test_the_exact_json_fields_and_regex_scorers(workspace) -> None:
    exact = scorers.exact(_ctx(workspace, {"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}))
    assert exact.passed and exact.value == 1.0
    assert not scorers.exact(_ctx(workspace, {"a": 1}, {"a": 2})).passed
    fields = scorers.json_fields(
        _ctx(
            workspace,
            {"x": {"p": 1.04}, "y": "ok", "z": 3},
            {"x": {"p": 1.0}, "y": "ok", "z": 4},
            fields=["x.p", "y", "z"],
            tolerance=0.05,
        )
    )
    assert not fields.passed and fields.value == pytest.approx(2 / 3) and "z" in fields.reason
    tight = scorers.json_fields(_ctx(workspace, {"x": {"p": 1.04}}, {"x": {"p": 1.0}}, fields=["x.p"], tolerance=0.01))
    assert not tight.passed
    assert scorers.json_fields(
        _ctx(workspace, {"x": {"p": 1.04}}, {"x": {"p": 1.0}}, fields=["x.p"], tolerance=0.1)
    ).passed
    assert scorers.regex(_ctx(workspace, {"reply": "Answer for: X"}, None, pattern=r"^Answer", field="reply")).passed
    missed = scorers.regex(_ctx(workspace, {"reply": "No"}, None, pattern=r"^Answer", field="reply"))
    assert not missed.passed and missed.value == 0.0
    long = scorers.regex(_ctx(workspace, {"reply": "No"}, None, pattern="(Answer|Reply)" + "x?" * 1500, field="reply"))
    assert not long.passed and len(long.reason) < 160  # the pattern's beginning, not all of it per run
    for bad in ([{"name": "regex", "args": {"pattern": "("}}], [{"name": "json_fields"}], ["nope"], []):
        with pytest.raises(InvalidEvaluation):
            scorers.check_specs(bad)


def test_a_regex_scorer_runs_on_re2_and_refuses_what_would_backtrack(workspace) -> None:
    """A member's pattern is scored in time linear in the output (RE2): a pattern only a
    backtracking engine runs (a backreference, a lookaround) is refused when the evaluation is made."""
    for pattern in (r"(a)\1", r"Answer(?= for)", r"(?<!No)Answer"):
        with pytest.raises(InvalidEvaluation, match="does not compile as RE2"):
            scorers.check_specs([{"name": "regex", "args": {"pattern": pattern}}])
    output = {"reply": "a" * 100_000 + "!"}  # what `(a+)+$` takes exponential time over with backtracking
    assert not scorers.regex(_ctx(workspace, output, None, pattern=r"(a+)+$", field="reply")).passed
    assert scorers.regex(_ctx(workspace, output, None, pattern=r"(a+)+!$", field="reply")).passed


def test_the_model_graded_scorer_asks_a_registered_provider_and_prices_its_call(workspace, providers: Calls) -> None:
    spec = {"name": "model_graded", "args": {"provider": "grader", "model": "gpt-4o-mini"}}
    args = spec["args"]
    good = scorers.run_scorer(
        spec, _ctx(workspace, {"reply": "Answer for: parcel"}, {"reply": "Answer for: parcel"}, **args)
    )
    bad = scorers.run_scorer(spec, _ctx(workspace, {"reply": "I cannot help"}, {"reply": "Answer for: parcel"}, **args))
    assert good.passed and good.value == 1.0 and "answers the ticket" in good.reason
    assert not bad.passed and bad.value == 0.0
    assert good.usage == {"inputTokens": 300, "outputTokens": 10} and good.cost_usd > 0
    assert [c[0] for c in providers.made] == ["grader", "grader"]


@dataclass
class _SilentGrader:
    """A grader whose server reports no usage (`{}`, as the openai-compatible provider records it)."""

    name: str
    model_id: str

    def generate(self, request: ModelRequest) -> ModelReply:
        return ModelReply(text="PASS it answers", tool_calls=[], usage={})


def test_a_grader_call_without_reported_usage_is_unpriced_not_free(workspace) -> None:
    register_provider("silent", lambda model, current: _SilentGrader("openai", model))
    try:
        spec = {"name": "model_graded", "args": {"provider": "silent", "model": "gpt-4o-mini"}}
        score = scorers.run_scorer(spec, _ctx(workspace, "a", "a", **spec["args"]))
    finally:
        unregister_provider("silent")
    assert score.passed and score.usage == {} and score.cost_usd is None
    assert score.as_json()["costUsd"] is None


def test_fail_if_reads_a_small_language_and_refuses_anything_else() -> None:
    node = failif.parse("pass_rate < 0.95 or (cost_delta > 0.10 and not changed == 0)")
    assert failif.evaluate(node, {"pass_rate": 0.9, "cost_delta": 0.0, "changed": 0})
    assert not failif.evaluate(node, {"pass_rate": 1.0, "cost_delta": 0.2, "changed": 0})
    assert failif.evaluate(node, {"pass_rate": 1.0, "cost_delta": 0.2, "changed": 1})
    assert not failif.evaluate(failif.parse("cost_delta > 0.1"), {"cost_delta": None})
    for bad in ("", "pass_rate", "pass_rate <", "__import__('os') < 1", "pass_rate < 1 or", "(pass_rate < 1"):
        with pytest.raises(InvalidEvaluation):
            failif.parse(bad)


# --- evaluations ------------------------------------------------------------------------------


def test_an_evaluation_inside_a_policy_starts_without_approval_and_keeps_every_outcome(
    workspace, dataset, people, providers: Calls, tool_counter: CountingOrders
) -> None:
    policy = _policy(workspace, people["bob"])
    lookups = tool_counter.lookups
    made = _start(
        workspace,
        people["carol"],
        model_change("counting"),
        scorers=["exact", {"name": "regex", "args": {"pattern": "^Answer for", "field": "reply"}}],
    )
    assert made.status == Status.RUNNING and made.policy == policy and made.ceiling_usd == Decimal(1)
    requests = ReexecutionRequest.objects.filter(batch_id=made.batch_id)
    assert requests.count() == 10 and {r.status for r in requests} == {RxStatus.APPROVED}
    assert {r.approver_name for r in requests} == {f"policy:{policy.public_id}"}
    done = evaluations.execute_here(made)
    assert done.status == Status.FINISHED and done.verdict == Evaluation.Verdict.PASSED
    aggregates = done.report["aggregates"]
    assert aggregates["runs"] == 10 and aggregates["passRate"] == 1.0 and aggregates["changed"] == 0
    assert aggregates["meanScoreDelta"] == 0.0 and aggregates["meanScoreDeltaCi95"] == [0.0, 0.0]
    assert aggregates["costDelta"] == 0.0 and aggregates["liveToolCalls"] == 0
    # Zero tool invocations: the tool's edge was never reached; every model call was live.
    assert tool_counter.lookups == lookups
    assert len([c for c in providers.made if c[0] == "counting"]) == 20
    row = done.report["runs"][0]
    assert row["outcome"] == "kept" and row["scores"]["exact"] == {
        "before": {"value": 1.0, "passed": True, "reason": "the output equals the expected output"},
        "after": {"value": 1.0, "passed": True, "reason": "the output equals the expected output"},
    }
    # The scores are on each new run, in its log.
    new_log = log_of(Run.objects.get(workspace=workspace, run_id=row["newRunId"]))
    scored = [e for e in new_log if e["type"] == "custom.evaluation.scored"]
    assert len(scored) == 1 and scored[0]["payload"]["evaluationId"] == done.public_id
    assert scored[0]["payload"]["scores"]["exact"]["passed"] is True
    assert _actions(done.public_id) == ["evaluation.started", "evaluation.finished"]
    # Advancing again changes nothing (idempotent).
    assert evaluations.advance(done.pk).report == done.report
    assert (
        len(
            [
                e
                for e in log_of(Run.objects.get(workspace=workspace, run_id=row["newRunId"]))
                if e["type"] == "custom.evaluation.scored"
            ]
        )
        == 1
    )


def test_a_regressing_change_fails_the_gate_with_its_junit_file(
    workspace, dataset, people, providers: Calls, tool_counter: CountingOrders
) -> None:
    _policy(workspace, people["bob"])
    lookups = tool_counter.lookups
    made = _start(
        workspace,
        people["carol"],
        model_change("regressing"),
        scorers=["exact", {"name": "model_graded", "args": {"provider": "grader", "model": "gpt-4o-mini"}}],
    )
    done = evaluations.execute_here(made)
    assert done.verdict == Evaluation.Verdict.FAILED
    aggregates = done.report["aggregates"]
    assert aggregates["passRate"] == 0.7 and aggregates["passRateBefore"] == 1.0 and aggregates["changed"] == 3
    low, high = aggregates["meanScoreDeltaCi95"]
    assert low < aggregates["meanScoreDelta"] < high < 0 or low < aggregates["meanScoreDelta"] < high
    assert Decimal(aggregates["graderCostUsd"]) > 0  # 20 grader calls (before and after), priced
    assert len([c for c in providers.made if c[0] == "grader"]) == 20
    assert tool_counter.lookups == lookups and aggregates["liveToolCalls"] == 0
    changed = [r for r in done.report["runs"] if r["outcome"] == "changed"]
    assert all(r["firstDivergence"] == "draft" for r in changed)
    assert all(not r["scores"]["model_graded"]["after"]["passed"] for r in changed)
    suite = ElementTree.fromstring(evaluations.junit_xml(done))
    assert suite.get("tests") == "11" and suite.get("failures") == "4"
    gate = suite.find("testcase[@name='gate']")
    assert gate is not None and "pass_rate < 0.95" in gate.find("failure").get("message")


def test_an_evaluation_outside_every_policy_waits_for_an_approver(workspace, dataset, people, providers) -> None:
    _policy(workspace, people["bob"], scorers=["exact"])
    # A scorer the policy does not allow: it waits, as any batch does.
    made = _start(
        workspace,
        people["carol"],
        model_change("counting"),
        scorers=[{"name": "regex", "args": {"pattern": "Answer"}}],
    )
    assert made.status == Status.PENDING_APPROVAL and made.policy is None
    requests = ReexecutionRequest.objects.filter(batch_id=made.batch_id)
    assert {r.status for r in requests} == {RxStatus.PENDING_APPROVAL}
    assert providers.made == []
    first = requests.order_by("pk").first()
    assert first is not None
    services.approve(workspace=workspace, reexecution_id=first.public_id, by=people["bob"], note="go")
    evaluations.advance(made.pk)
    made.refresh_from_db()
    assert made.status == Status.RUNNING
    done = evaluations.execute_here(made)
    assert done.status == Status.FINISHED and done.verdict == Evaluation.Verdict.PASSED
    # An expired policy, a revoked one and one whose row was changed cover nothing.
    revoked = _policy(workspace, people["bob"])
    policies.revoke_policy(workspace=workspace, public_id=revoked.public_id, by=people["bob"])
    tampered = _policy(workspace, people["bob"])
    type(tampered).objects.filter(pk=tampered.pk).update(ceiling_per_evaluation_usd=Decimal(100))
    waits = _start(
        workspace,
        people["carol"],
        model_change("counting"),
        scorers=["exact", "regex"][:1] + [{"name": "json_fields", "args": {"fields": ["reply"]}}],
    )
    assert waits.status == Status.PENDING_APPROVAL
    assert _actions(revoked.public_id) == ["evaluation_policy.approved", "evaluation_policy.revoked"]


def test_of_two_policies_approved_in_one_instant_the_later_covers(workspace, dataset, people, providers) -> None:
    """The newest active policy covers an evaluation, and its ceilings are the ones kept: of two
    approved in one instant (this module's clock stands still; elsewhere, two approvals within a
    microsecond), the one approved last, not whichever the database returns first."""
    first = _policy(workspace, people["bob"], ceiling_per_evaluation_usd="1")
    later = _policy(workspace, people["bob"], ceiling_per_evaluation_usd="2")
    assert first.created_at == later.created_at
    made = _start(workspace, people["carol"], model_change("counting"))
    assert made.status == Status.RUNNING and made.policy == later


def test_a_policy_never_covers_its_own_approvers_evaluations(workspace, dataset, people, providers) -> None:
    """Four eyes: an evaluate re-execution is approved by a member other than its requester, so
    bob's policy does not start bob's own evaluation, in a session or with a key he owns; it waits
    for another approver (who may approve it), and bob's own approval is refused. carol's starts."""
    _policy(workspace, people["bob"])
    own = _start(workspace, people["bob"], model_change("counting"))
    assert own.status == Status.PENDING_APPROVAL and own.policy is None and own.ceiling_usd is None
    first = ReexecutionRequest.objects.filter(batch_id=own.batch_id).order_by("pk").first()
    assert first is not None
    with pytest.raises(SelfApprovalForbidden):
        services.approve(workspace=workspace, reexecution_id=first.public_id, by=people["bob"], note="mine")
    services.approve(workspace=workspace, reexecution_id=first.public_id, by=people["alice"], note="go")
    key, _ = create_key(workspace=workspace, scopes=["read", "execute"], by=people["bob"])
    with_his_key = _start(workspace, key, model_change("counting"))
    assert with_his_key.status == Status.PENDING_APPROVAL and with_his_key.policy is None
    started = AuditEntry.objects.get(action="evaluation.started", target=with_his_key.public_id)
    assert started.details["waitsForApproval"] is True
    assert _start(workspace, people["carol"], model_change("counting")).status == Status.RUNNING
    assert providers.made == []


def test_a_denied_evaluation_ends_denied(workspace, dataset, people, providers) -> None:
    made = _start(workspace, people["carol"], model_change("counting"))
    first = ReexecutionRequest.objects.filter(batch_id=made.batch_id).order_by("pk").first()
    assert first is not None
    services.deny(workspace=workspace, reexecution_id=first.public_id, by=people["bob"], note="not now")
    assert evaluations.advance(made.pk).status == Status.DENIED
    assert _actions(made.public_id) == ["evaluation.started", "evaluation.finished"]


def test_the_spend_ceiling_stops_the_batch_mid_way_and_no_call_is_made_past_it(
    workspace, dataset, people, providers: Calls
) -> None:
    one_run = Run.objects.get(workspace=workspace, run_id="run_t000").cost_usd
    assert one_run is not None and one_run > 0
    ceiling = one_run * Decimal("2.5")
    _policy(workspace, people["bob"], ceiling_per_evaluation_usd=str(ceiling))
    made = _start(workspace, people["carol"], model_change("counting"))
    spent_at_call: list[Decimal] = []

    def counting_with_spend(model: str, current: Any) -> Any:
        from ledger.runtime.providers import ScriptedProvider

        script = current.script

        def answer(request: Any) -> Any:
            spent_at_call.append(budget.spend(Evaluation.objects.get(pk=made.pk)))
            return script(request)

        return ScriptedProvider(script=answer, name=current.name, model_id=model)

    from ledger.runtime.providers import register_provider

    register_provider("counting", counting_with_spend)
    done = evaluations.execute_here(made)
    assert done.verdict == Evaluation.Verdict.BUDGET_EXHAUSTED and done.budget_exhausted
    # Every call that was made started under the ceiling; the batch stopped mid-way.
    assert spent_at_call and all(spent < ceiling for spent in spent_at_call)
    assert 2 <= len(spent_at_call) < 20
    requests = ReexecutionRequest.objects.filter(batch_id=made.batch_id)
    assert requests.filter(status=RxStatus.FAILED).count() >= 6
    refused = [
        e
        for r in requests.filter(status=RxStatus.FAILED)
        for e in log_of(Run.objects.get(workspace=workspace, run_id=r.new_run_id))
        if e["type"] == "harness.model.failed"
    ]
    assert refused and all("budget_exhausted" in e["payload"]["error"]["message"] for e in refused)
    assert Decimal(done.report["aggregates"]["spendUsd"]) < ceiling + one_run


def test_a_ceiling_over_calls_of_unknown_cost_stops_the_batch_after_the_first(
    workspace, dataset, people, providers: Calls
) -> None:
    """A model with no price costs an unknown amount: a ceiling cannot be kept over it, so the
    first live call that comes back unpriced is the last one the evaluation makes, and the day's
    ceiling of its policy is unknown too: the next evaluation waits for a person."""
    policy = _policy(workspace, people["bob"], ceiling_per_evaluation_usd="1000", ceiling_per_day_usd="5000")
    # Round amounts read as written (Decimal's normalize() alone writes 1E+3).
    assert policies.policy_json(policy)["ceilingPerEvaluationUsd"] == "1000"
    made = _start(workspace, people["carol"], model_change("counting", "house-model-1"))
    assert evaluations.evaluation_json(made, report=False)["ceilingUsd"] == "1000"
    done = evaluations.execute_here(made)
    assert done.verdict == Evaluation.Verdict.BUDGET_EXHAUSTED and done.budget_exhausted
    assert len([c for c in providers.made if c[0] == "counting"]) == 1
    requests = ReexecutionRequest.objects.filter(batch_id=made.batch_id)
    refused = [
        e["payload"]["error"]["message"]
        for r in requests.exclude(new_run_id="")
        for e in log_of(Run.objects.get(workspace=workspace, run_id=r.new_run_id))
        if e["type"] == "harness.model.failed"
    ]
    assert refused and all(
        "cannot keep its ceiling of 1000 USD: a model call of its runs has no known cost" in m for m in refused
    )
    assert budget.spend(done) == 0 and budget.unpriced_calls(done) == 1
    waits = _start(workspace, people["carol"], model_change("counting"))
    assert waits.status == Status.PENDING_APPROVAL and waits.policy is None


def test_a_runs_call_that_failed_after_its_request_left_stops_the_ceiling_like_an_unpriced_one(
    workspace, dataset, people, providers: Calls
) -> None:
    """The provider hung up after reading the request: it may bill it, so the run counts the
    failure as a call of unknown cost, and the evaluation's guard refuses the retry (and every
    later live call) as it does after an unpriced answer; the refused retry itself costs nothing."""
    hung_up: list[str] = []

    def hangs_up(model: str, current: Any) -> Any:
        assert isinstance(current, ScriptedProvider) and callable(current.script)
        script = current.script

        def answer(request: ModelRequest) -> Any:
            if not hung_up:
                hung_up.append(request.step_path)
                raise ConnectionResetError("the provider hung up after reading the request")
            return script(request)

        return ScriptedProvider(script=answer, name=current.name, model_id=model)

    register_provider("hangs-up", hangs_up)
    try:
        _policy(workspace, people["bob"], ceiling_per_evaluation_usd="1000", ceiling_per_day_usd="5000")
        made = _start(workspace, people["carol"], model_change("hangs-up"))
        done = evaluations.execute_here(made)
    finally:
        unregister_provider("hangs-up")

    assert done.verdict == Evaluation.Verdict.BUDGET_EXHAUSTED and len(hung_up) == 1
    why = (
        f"evaluation {made.public_id} cannot keep its ceiling of 1000 USD: a model call of its runs has no "
        "known cost (no price for the model, no usage reported, or a failure after the request left)"
    )
    assert done.budget_reason == {"code": "cost_unknown", "message": why}
    assert budget.spend(done) == 0 and budget.unpriced_calls(done) == 1
    first = Run.objects.get(workspace=workspace, run_id=done.report["runs"][0]["newRunId"])
    failures = [e["payload"] for e in log_of(first) if e["type"] == "harness.model.failed"]
    assert [(f["requestLeft"], f["error"]["name"]) for f in failures] == [
        (True, "ConnectionResetError"),
        (False, "BudgetExhausted"),  # the slot's two retries, refused before they left
        (False, "BudgetExhausted"),
    ]
    assert (first.priced_calls, first.unpriced_calls) == (0, 1)


def _judge(provider: str, model: str) -> dict[str, Any]:
    return {"name": "model_graded", "args": {"provider": provider, "model": model}}


def _refusals(workspace: Workspace, made: Evaluation) -> dict[str, set[str]]:
    """The messages of the live calls the guard refused, by the original run of each new run."""
    requests = ReexecutionRequest.objects.filter(batch_id=made.batch_id).exclude(new_run_id="")
    out: dict[str, set[str]] = {}
    for r in requests:
        for e in log_of(Run.objects.get(workspace=workspace, run_id=r.new_run_id)):
            if e["type"] == "harness.model.failed":
                out.setdefault(r.original_run_id, set()).add(e["payload"]["error"]["message"])
    return out


@pytest.mark.parametrize(
    "judge",
    [
        pytest.param(("grader", "house-judge-1"), id="the judge model has no price"),
        pytest.param(("silent-grader", "gpt-4o-mini"), id="the judge reports no usage"),
    ],
)
def test_a_judge_call_of_unknown_cost_is_the_last_paid_call_of_the_evaluation(
    workspace, runs, dataset, people, providers: Calls, judge: tuple[str, str]
) -> None:
    """A grader's call is paid like a run's: once one comes back unpriced, the evaluation's spend
    is unknown, so its next paid call (the next grader call, the next run's live call) is refused
    with the reason, which the evaluation keeps; the policy's daily ceiling is unknown for the
    day, so an evaluation already running under it stops too and the next one waits for a person."""
    policy = _policy(workspace, people["bob"], ceiling_per_evaluation_usd="1000", ceiling_per_day_usd="5000")
    made = _start(workspace, people["carol"], model_change("counting"), scorers=["exact", _judge(*judge)])
    neighbour = _start(workspace, people["carol"], model_change("counting"), scorers=["exact"])
    assert made.status == neighbour.status == Status.RUNNING
    done = evaluations.execute_here(made)
    assert done.verdict == Evaluation.Verdict.BUDGET_EXHAUSTED and done.budget_exhausted
    unknown = (
        "a grader call has no known cost "
        "(no price for the model, no usage reported, or a failure after the request left)"
    )
    why = f"evaluation {made.public_id} cannot keep its ceiling of 1000 USD: {unknown}"
    assert done.budget_reason == {"code": "cost_unknown", "message": why}
    assert evaluations.evaluation_json(done)["budgetReason"] == done.budget_reason
    # One run made its live calls; the grader was asked once (the score before of that run): its
    # score after was not asked, nor was any later run's live call or grader.
    assert [c[0] for c in providers.made] == ["counting", "counting", judge[0]]
    first = done.report["runs"][0]["scores"]["model_graded"]
    assert first["before"]["costUsd"] is None and first["before"]["passed"] is True
    assert first["after"] == {
        "value": 0.0,
        "passed": False,
        "reason": f"budget_exhausted: {why}; the grader was not asked",
    }
    # Every later run's first live call was refused, with the reason.
    assert _refusals(workspace, made) == {
        r: {f"budget_exhausted: {why}; no live call is made past it"} for r in runs[1:]
    }
    assert budget.spend(done) == sum(
        (r.cost_usd for r in Run.objects.filter(run_id__in=[x["newRunId"] for x in done.report["runs"]])), Decimal(0)
    )
    assert budget.unpriced_calls(done) == 1 and done.grader_cost_usd == 0 and done.grader_unpriced_calls == 1
    # The day: the policy's ceiling cannot be kept either.
    assert budget.day_spent(policy)
    stopped = evaluations.execute_here(neighbour)
    assert stopped.verdict == Evaluation.Verdict.BUDGET_EXHAUSTED
    day_why = f"policy {policy.public_id} cannot keep its ceiling of 5000 USD for today: {unknown}"
    assert stopped.budget_reason == {"code": "day_cost_unknown", "message": day_why}
    assert _refusals(workspace, neighbour) == {
        r: {f"budget_exhausted: {day_why}; no live call is made past it"} for r in runs
    }
    assert [c[0] for c in providers.made].count("counting") == 2
    waits = _start(workspace, people["carol"], model_change("counting"), scorers=["exact", _judge(*judge)])
    assert waits.status == Status.PENDING_APPROVAL and waits.policy is None


@pytest.fixture
def judge_price(workspace: Workspace) -> None:
    """Prices for the judges, set before any run is recorded (a run priced under another table
    would not verify until repriced), in USD per 1M tokens: `openai/judge-1` 1000 input and
    output (0.31 USD a grader call), `openai/judge-2` 1300 input, 1000 output (0.40)."""
    workspace.price_overrides = {
        "openai/judge-1": {"input": 1000, "output": 1000},
        "openai/judge-2": {"input": 1300, "output": 1000},
    }
    workspace.save(update_fields=["price_overrides"])


def test_priced_judge_calls_count_toward_the_spend_exactly_and_reach_the_ceiling(
    workspace, judge_price, dataset, people, providers: Calls
) -> None:
    """At a known price each grader call adds its exact dollars to the spend, and the spend they
    make stops the batch at the ceiling like the runs' own."""
    per_call = Decimal("0.31")  # (300 input + 10 output tokens) x 1000 USD / 1M
    _policy(workspace, people["bob"], ceiling_per_evaluation_usd="1", ceiling_per_day_usd="5")
    made = _start(workspace, people["carol"], model_change("counting"), scorers=["exact", _judge("grader", "judge-1")])
    done = evaluations.execute_here(made)
    # Two runs, each graded before and after: 4 x 0.31 = 1.24 with the runs' cost, past 1 USD
    # after the fourth; the third run's first live call was refused, and its grader not asked.
    assert [c[0] for c in providers.made] == ["counting", "counting", "grader", "grader"] * 2
    assert done.verdict == Evaluation.Verdict.BUDGET_EXHAUSTED
    assert done.budget_reason == {
        "code": "ceiling_reached",
        "message": f"evaluation {made.public_id} spent its ceiling of 1 USD",
    }
    graded = [r["scores"]["model_graded"] for r in done.report["runs"][:2]]
    assert [Decimal(s[side]["costUsd"]) for s in graded for side in ("before", "after")] == [per_call] * 4
    assert done.grader_cost_usd == 4 * per_call and done.grader_unpriced_calls == 0
    runs_cost = sum(
        (r.cost_usd for r in Run.objects.filter(run_id__in=[x["newRunId"] for x in done.report["runs"]])), Decimal(0)
    )
    assert 0 < runs_cost < Decimal("0.01")
    aggregates = done.report["aggregates"]
    assert aggregates["graderCostUsd"] == "1.24"
    assert Decimal(aggregates["spendUsd"]) == Decimal("1.24") + runs_cost == budget.spend(done)
    assert budget.day_spend(done.policy) == Decimal("1.24") + runs_cost


def test_the_policys_day_counts_the_grader_calls_of_the_scoring_in_progress(
    workspace, judge_price, dataset, people, providers: Calls
) -> None:
    """Two evaluations under one policy of 1 USD a day, judged at 0.40 USD a call: once the first
    has spent 0.80, the second's grader is asked once more (1.20 with it) and not again, though
    that call's dollars are not yet on the second evaluation's row when its next score asks."""
    policy = _policy(workspace, people["bob"], ceiling_per_evaluation_usd="1", ceiling_per_day_usd="1")
    judged = ["exact", _judge("grader", "judge-2")]
    first, second = (_start(workspace, people["carol"], model_change("counting"), scorers=judged) for _ in range(2))
    for made in (first, second):
        request = ReexecutionRequest.objects.filter(batch_id=made.batch_id).order_by("original_run_id").first()
        assert request is not None
        run_request(request_pk=request.pk)
    # The first: its run's two live calls, its grader before and after; the second: the same, but
    # its grader after was not asked.
    assert [c[0] for c in providers.made] == ["counting"] * 2 + ["grader"] * 2 + ["counting"] * 2 + ["grader"]
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.grader_cost_usd == Decimal("0.8") and not first.budget_exhausted
    assert second.grader_cost_usd == Decimal("0.4") and second.budget_exhausted
    why = f"policy {policy.public_id} spent its ceiling of 1 USD for today"
    assert second.budget_reason == {"code": "day_ceiling_reached", "message": why}
    scored = next(iter(second.scores.values()))["after"]["model_graded"]
    assert scored["reason"] == f"budget_exhausted: {why}; the grader was not asked"


def test_other_tenants_get_404_on_datasets_policies_and_evaluations(
    workspace, other_workspace, dataset, people, providers
) -> None:
    policy = _policy(workspace, people["bob"])
    made = _start(workspace, people["carol"], model_change("counting"))
    with pytest.raises(NotFound):
        datasets.get_dataset(other_workspace, dataset)
    with pytest.raises(NotFound):
        policies.get_policy(other_workspace, policy.public_id)
    with pytest.raises(NotFound):
        evaluations.get_evaluation(other_workspace, made.public_id)
    with pytest.raises(NotFound):
        _start(workspace, people["olga"], model_change("counting"))
    with pytest.raises(NotFound):
        _policy(workspace, people["olga"])
    with pytest.raises(EvaluationForbidden):
        _policy(workspace, people["carol"])  # an operator is no approver


def test_bad_input_is_refused_and_leaves_nothing_behind(workspace, dataset, people, providers) -> None:
    for change in (
        None,
        {"kind": "prompt"},
        {"kind": "model", "modelOverrides": {}},
        {"kind": "model", "modelOverrides": {"default": "x"}},
    ):
        with pytest.raises(InvalidEvaluation):
            _start(workspace, people["carol"], change)
    with pytest.raises(InvalidEvaluation):
        _start(workspace, people["carol"], model_change("counting"), fail_if="pass_rate <<< 1")
    with pytest.raises(InvalidEvaluation):
        _start(workspace, people["carol"], model_change("counting"), reason=" ")
    for terms in (
        {"ceiling_per_evaluation_usd": "-1"},
        {"ceiling_per_evaluation_usd": "9", "ceiling_per_day_usd": "5"},
        {"ttl_hours": 0},
        {"change_kinds": ["tools"]},
        {"scorers": ["nope"]},
    ):
        with pytest.raises(InvalidEvaluation):
            _policy(workspace, people["bob"], **terms)
    assert not Evaluation.objects.exists() and not ReexecutionRequest.objects.exists()
    assert not AuditEntry.objects.filter(action__startswith="evaluation").exists()


def test_once_the_policy_spent_its_day_the_next_evaluation_waits_for_a_person(
    workspace, dataset, people, providers
) -> None:
    one_run = Run.objects.get(workspace=workspace, run_id="run_t000").cost_usd
    assert one_run is not None
    ceiling = one_run * Decimal("1.5")
    _policy(workspace, people["bob"], ceiling_per_evaluation_usd=str(ceiling), ceiling_per_day_usd=str(ceiling))
    first = evaluations.execute_here(_start(workspace, people["carol"], model_change("counting")))
    assert first.verdict == Evaluation.Verdict.BUDGET_EXHAUSTED
    assert budget.day_spend(first.policy) >= ceiling
    second = _start(workspace, people["carol"], model_change("counting"))
    assert second.status == Status.PENDING_APPROVAL and second.policy is None
    started = AuditEntry.objects.get(action="evaluation.started", target=second.public_id)
    assert started.details["waitsForApproval"] is True
