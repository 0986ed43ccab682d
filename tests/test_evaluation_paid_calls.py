"""What an evaluation's scorers' model calls cost and what its budget does with them
(docs/evaluations.md "Scorers" and "Budget"): a judge call that fails after its request left is
of unknown cost, never free, and stops the evaluation under a ceiling; a call that never left
costs nothing; a registered scorer's calls through the provider registry are checked before each
one like the built-in judge's; and the count of calls of unknown cost stands beside the spend in
the API (and its schema), on the console's page and in `ledger evaluate`'s line."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from ledger.evaluation import datasets, evaluations, policies
from ledger.evaluation.scorers import Score, ScoreContext, Spending, register_scorer, run_scorer, unregister_scorer
from ledger.fold.pricing import price_recorded, prices_for
from ledger.log.envelopes import log_of
from ledger.models import Evaluation, ReexecutionRequest, Run, Workspace
from ledger.reexecution import services
from ledger.runtime.model import ModelProvider, ModelRequest
from ledger.runtime.openai_compat import OpenAICompatibleProvider
from ledger.runtime.providers import ScriptedProvider, provider_for, register_provider, unregister_provider
from ledger.tenancy.services import create_key
from tests.conftest import named_user
from tests.evaluation_support import Calls, model_change, registered_providers, triage_runs
from tests.runtime_support import every_run_verifies  # noqa: F401  (autouse: ledger verify passes on every run)
from tests.test_runtime_openai import ChatServer

pytestmark = [pytest.mark.usefixtures("clock"), pytest.mark.django_db]

Verdict = Evaluation.Verdict
PER_CALL = Decimal("0.31")  # a grader call of openai/judge-1: (300 input + 10 output tokens) x 1000 USD / 1M
UNKNOWN = "no price for the model, no usage reported, or a failure after the request left"


@pytest.fixture
def people(admin: User, approver: User, operator: User, viewer: User, other_workspace: Workspace) -> dict[str, User]:
    named_user("olga", "approver", tenant="globex")
    return {user.get_username(): user for user in (admin, approver, operator, viewer)}


@pytest.fixture
def judge_price(workspace: Workspace) -> None:
    """`openai/judge-1` at 1000 USD per 1M tokens in and out, set before any run is recorded."""
    workspace.price_overrides = {"openai/judge-1": {"input": 1000, "output": 1000}}
    workspace.save(update_fields=["price_overrides"])


@pytest.fixture
def providers() -> Iterator[Calls]:
    """The shared ones (evaluation_support), and `failing-grader`: a scripted judge whose provider
    answers with an error after the request went out (an overloaded upstream)."""
    for calls in registered_providers():

        def failing(model: str, current: ModelProvider) -> ModelProvider:
            def answer(request: ModelRequest) -> Mapping[str, Any]:
                calls.made.append(("failing-grader", request.step_path, request.turn))
                raise RuntimeError("upstream overloaded (HTTP 529)")

            return ScriptedProvider(script=answer, name="openai", model_id=model)

        register_provider("failing-grader", failing)
        try:
            yield calls
        finally:
            unregister_provider("failing-grader")


@pytest.fixture
def golden(workspace: Workspace, judge_price: None, people: dict[str, User]) -> list[str]:
    runs = triage_runs(workspace, count=3)
    datasets.add_runs(workspace=workspace, name="golden", run_ids=runs, by=people["alice"])
    return runs


def _policy(workspace: Workspace, bob: User, scorers: list[str], ceiling: str) -> Any:
    return policies.approve_policy(
        workspace=workspace,
        dataset="golden",
        change_kinds=["model"],
        scorers=scorers,
        ceiling_per_evaluation_usd=ceiling,
        ceiling_per_day_usd="5000",
        ttl_hours=24,
        note="CI",
        by=bob,
    )


def _start(workspace: Workspace, carol: User, scorers: list[Any], change: Any = None) -> Evaluation:
    return evaluations.start_evaluation(
        workspace=workspace,
        dataset="golden",
        change=change or model_change("counting"),
        scorers=scorers,
        fail_if="pass_rate < 0.95",
        reason="judged",
        by=carol,
    )


def _judge(provider: str, model: str = "judge-1") -> dict[str, Any]:
    return {"name": "model_graded", "args": {"provider": provider, "model": model}}


def _refusals(workspace: Workspace, made: Evaluation) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in ReexecutionRequest.objects.filter(batch_id=made.batch_id).exclude(new_run_id=""):
        for e in log_of(Run.objects.get(workspace=workspace, run_id=r.new_run_id)):
            if e["type"] == "harness.model.failed":
                out.setdefault(r.original_run_id, set()).add(e["payload"]["error"]["message"])
    return out


# --- 1. a judge call that fails ------------------------------------------------------------------


def test_a_judge_call_that_failed_after_its_request_left_is_of_unknown_cost_not_free(
    workspace, golden, people, providers: Calls
) -> None:
    """The judge's model has a price, but its provider failed once the request was out: the
    provider may have charged for it, so its cost is unknown and the ceiling cannot be kept; the
    evaluation stops at its next paid call and says why."""
    _policy(workspace, people["bob"], ["exact", "model_graded"], ceiling="1000")
    made = _start(workspace, people["carol"], ["exact", _judge("failing-grader")])
    done = evaluations.execute_here(made)
    why = (
        f"evaluation {made.public_id} cannot keep its ceiling of 1000 USD: a grader call has no known cost ({UNKNOWN})"
    )
    assert done.verdict == Verdict.BUDGET_EXHAUSTED
    assert done.budget_reason == {"code": "cost_unknown", "message": why}
    # The first run's live calls, its judge asked once (the score before): nothing after it.
    assert [c[0] for c in providers.made] == ["counting", "counting", "failing-grader"]
    first = done.report["runs"][0]["scores"]["model_graded"]
    assert first["before"] == {
        "value": 0.0,
        "passed": False,
        "reason": "the scorer raised RuntimeError: upstream overloaded (HTTP 529)",
        "usage": {},
        "costUsd": None,
    }
    assert first["after"]["reason"] == f"budget_exhausted: {why}; the grader was not asked"
    assert _refusals(workspace, made) == {
        r: {f"budget_exhausted: {why}; no live call is made past it"} for r in golden[1:]
    }
    assert done.grader_unpriced_calls == 1 and done.grader_cost_usd == 0
    shown = evaluations.evaluation_json(done)
    assert shown["unpricedCalls"] == 1 and shown["report"]["aggregates"]["unpricedCalls"] == 1


def test_calls_that_never_left_cost_nothing_and_stop_nothing(workspace, golden, people, providers: Calls) -> None:
    """A scorer that refuses its input itself and a judge whose server cannot be reached (no
    connection was made) sent no request: they fail their scores, and the evaluation's spend and
    ceiling are as if they had not been asked."""
    closed = ChatServer()  # bound, never served, then closed: nothing listens on the port
    closed.httpd.server_close()
    register_provider(
        "unreachable",
        lambda model, current: OpenAICompatibleProvider(
            base_url=closed.base_url, api_key="", model=model, name="openai", timeout_s=2
        ),
    )

    def picky(ctx: ScoreContext) -> Score:
        if not isinstance(ctx.output, str):
            raise ValueError("I grade text only")  # refused here, before the judge is asked
        judge = provider_for(provider="grader", model="judge-1", current=ScriptedProvider(script={}))
        judge.generate(ModelRequest(step_path="grade", turn=1, body={"messages": []}))
        return Score(1.0, True, "asked")

    register_scorer("picky", picky)
    try:
        _policy(workspace, people["bob"], ["exact", "model_graded", "picky"], ceiling="1")
        made = _start(workspace, people["carol"], ["exact", "picky", _judge("unreachable")])
        done = evaluations.execute_here(made)
    finally:
        unregister_scorer("picky")
        unregister_provider("unreachable")
    assert done.verdict == Verdict.FAILED and not done.budget_exhausted and done.budget_reason is None
    assert [c[0] for c in providers.made] == ["counting", "counting"] * 3
    scores = done.report["runs"][0]["scores"]
    assert scores["picky"]["after"]["reason"] == "the scorer raised ValueError: I grade text only"
    refused = scores["model_graded"]["after"]["reason"]
    assert refused.startswith("the scorer raised ModelProviderError: ") and "could not reach" in refused
    assert done.grader_unpriced_calls == 0 and done.grader_cost_usd == 0
    assert evaluations.evaluation_json(done)["unpricedCalls"] == 0
    assert all("usage" not in s[side] for r in done.report["runs"] for s in r["scores"].values() for side in s)


# --- 2. a registered scorer's paid calls ---------------------------------------------------------


def _second_opinion(ctx: ScoreContext) -> Score:
    """A registered scorer written as one is without any help: it asks a judge of the registry
    twice, prices the calls itself, and forgives its judge's outages (passing)."""
    judge = provider_for(provider="grader", model="judge-1", current=ScriptedProvider(script={}))
    usage: dict[str, int] = {}
    cost = Decimal(0)
    for turn in (1, 2):
        content = f"Output: {json.dumps(ctx.output)}"
        request = ModelRequest(
            step_path=f"grade:{ctx.run_id}", turn=turn, body={"messages": [{"role": "user", "content": content}]}
        )
        try:
            reply = judge.generate(request)
        except Exception:  # noqa: BLE001 - no second opinion today
            return Score(1.0, True, "the judge was away: passed")
        if not (reply.text or "").startswith("PASS"):
            return Score(0.0, False, reply.text or "")
        for key, tokens in reply.usage.items():
            usage[key] = usage.get(key, 0) + tokens
        cost += price_recorded(reply.usage, judge.name, judge.model_id, prices_for(ctx.workspace)) or 0
    return Score(1.0, True, "two judges agree", usage, cost)


def test_a_registered_scorers_calls_are_checked_before_each_one_like_the_judges(
    workspace, golden, people, providers: Calls
) -> None:
    """The ceiling (0.30 USD) is spent by the scorer's first call (0.31): its second call in the
    same verdict is refused before the provider is asked, with the budget's reason, although the
    scorer swallows the refusal; so is the score after, and the later runs' live calls."""
    register_scorer("second_opinion", _second_opinion)
    try:
        _policy(workspace, people["bob"], ["exact", "second_opinion"], ceiling="0.3")
        made = _start(workspace, people["carol"], ["exact", "second_opinion"])
        done = evaluations.execute_here(made)
    finally:
        unregister_scorer("second_opinion")
    why = f"evaluation {made.public_id} spent its ceiling of 0.3 USD"
    assert done.verdict == Verdict.BUDGET_EXHAUSTED
    assert done.budget_reason == {"code": "ceiling_reached", "message": why}
    assert [c[0] for c in providers.made] == ["counting", "counting", "grader"]
    scored = done.report["runs"][0]["scores"]["second_opinion"]
    assert Decimal(scored["before"].pop("costUsd")) == PER_CALL  # the call it made, priced
    assert scored["before"] == {
        "value": 0.0,
        "passed": False,
        "reason": f"budget_exhausted: {why}; its next model call was not made",
        "usage": {"inputTokens": 300, "outputTokens": 10},
    }
    assert scored["after"] == {
        "value": 0.0,
        "passed": False,
        "reason": f"budget_exhausted: {why}; the grader was not asked",
    }
    assert _refusals(workspace, made) == {
        r: {f"budget_exhausted: {why}; no live call is made past it"} for r in golden[1:]
    }
    assert done.grader_cost_usd == PER_CALL and done.grader_unpriced_calls == 0
    assert evaluations.evaluation_json(done)["unpricedCalls"] == 0


def test_a_model_a_scorer_keeps_between_verdicts_answers_to_the_verdict_asking(
    workspace, judge_price, providers
) -> None:
    """A scorer that keeps its judge in a global: the calls it makes in a later verdict count
    toward that verdict's budget (here one that refuses), never toward the first one's."""
    kept: list[ModelProvider] = []

    def thrifty(ctx: ScoreContext) -> Score:
        if not kept:
            kept.append(provider_for(provider="grader", model="judge-1", current=ScriptedProvider(script={})))
        content = f"Output: {json.dumps(ctx.output)}"
        reply = kept[0].generate(
            ModelRequest(step_path="grade", turn=1, body={"messages": [{"role": "user", "content": content}]})
        )
        return Score(1.0, True, reply.text or "")

    first: list[Decimal | None] = []
    second: list[Decimal | None] = []
    register_scorer("thrifty", thrifty)
    try:
        ctx = ScoreContext(
            workspace=workspace, run_id="run_x", output="Answer for you", expected=None, original_output=None
        )
        made = run_scorer({"name": "thrifty"}, ctx, Spending(refusal=lambda: None, spent=first.append))
        refused = run_scorer({"name": "thrifty"}, ctx, Spending(refusal=lambda: "spent", spent=second.append))
    finally:
        unregister_scorer("thrifty")
    assert made.passed and made.cost_usd == PER_CALL and first == [PER_CALL]
    assert not refused.passed and refused.reason == "budget_exhausted: spent; the grader was not asked"
    assert first == [PER_CALL] and second == [] and [c[0] for c in providers.made] == ["grader"]


# --- 3. the calls of unknown cost beside the spend ----------------------------------------------


def test_the_calls_of_unknown_cost_stand_beside_the_spend_everywhere(workspace, golden, people, providers) -> None:
    """Approved by a person, an evaluation has no ceiling: its runs' model and its judge have no
    price, nothing stops it, and its spend is a lower bound. The API (one evaluation, the list,
    the schema) and the console's page count its calls of unknown cost, the runs' and the judge's."""
    change = model_change("counting", "house-model-1")
    unpriced = _start(workspace, people["carol"], ["exact", _judge("grader", "house-judge-1")], change=change)
    priced = _start(workspace, people["carol"], ["exact", _judge("grader")])
    waiting = _start(workspace, people["carol"], ["exact"])
    for made in (unpriced, priced):
        first = ReexecutionRequest.objects.filter(batch_id=made.batch_id).order_by("pk").first()
        assert first is not None
        services.approve(workspace=workspace, reexecution_id=first.public_id, by=people["bob"], note="go")
        assert evaluations.execute_here(made).status == Evaluation.Status.FINISHED
    done = Evaluation.objects.get(pk=unpriced.pk)
    assert not done.budget_exhausted
    runs = Run.objects.filter(run_id__in=[r["newRunId"] for r in done.report["runs"]])
    runs_unknown = sum(r.unpriced_calls for r in runs)
    assert runs_unknown == 6 and all(r.cost_usd is None for r in runs)  # 2 calls in each of 3 runs
    assert done.grader_unpriced_calls == 6  # before and after, 3 runs
    aggregates = done.report["aggregates"]
    assert aggregates["spendUsd"] == "0" and aggregates["unpricedCalls"] == 12

    _, secret = create_key(workspace=workspace, scopes=["read"])
    api = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    one = api.get(f"/api/v1/evaluations/{unpriced.public_id}").json()
    assert one["unpricedCalls"] == 12
    listed = api.get("/api/v1/evaluations").json()["evaluations"]
    assert [(e["id"], e["unpricedCalls"]) for e in listed] == [
        (waiting.public_id, 0),
        (priced.public_id, 0),
        (unpriced.public_id, 12),
    ]
    field = Client().get("/api/schema/?format=json").json()["components"]["schemas"]["Evaluation"]
    assert field["properties"]["unpricedCalls"]["type"] == "integer" and "unpricedCalls" in field["required"]

    carol = Client()
    carol.force_login(people["carol"])
    page = carol.get(f"/w/acme/support/evaluations/{unpriced.public_id}/").content.decode()
    assert 'data-unpriced-calls="12"' in page and "spend $0 + 12 calls of unknown cost" in page
    fine = carol.get(f"/w/acme/support/evaluations/{priced.public_id}/").content.decode()
    assert 'id="spend"' in fine and "unknown cost" not in fine
    listing = carol.get("/w/acme/support/evaluations/").content.decode()
    assert "+12 unknown" in listing


def test_ledger_evaluate_prints_the_calls_of_unknown_cost(workspace, golden, people, providers) -> None:
    _policy(workspace, people["bob"], ["exact", "model_graded"], ceiling="1000")
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command(
            "ledger",
            *("evaluate", "golden", "--workspace", "acme/support", "--as", "carol", "--here"),
            *("--change", "model:default=counting/gpt-4o-mini", "--scorer", "exact"),
            *("--scorer", 'model_graded:{"provider": "failing-grader", "model": "judge-1"}'),
            stdout=out,
            stderr=err,
        )
    summary = json.loads(out.getvalue())
    assert exited.value.code == 3 and summary["verdict"] == "budget_exhausted"
    assert summary["unpricedCalls"] == 1 and summary["spendUsd"] is not None
