"""The evaluations API over HTTP (docs/api.md "Evaluations"): datasets, policies, the gate with
an `execute` key, JUnit, refusals, and other tenants' 404."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any
from xml.etree import ElementTree

import httpx
import pytest
from django.contrib.auth.models import User
from django.db import transaction

from ledger import log
from ledger.log.leases import acquire_run_lease
from ledger.models import AuditEntry, Evaluation, EvaluationPolicy, Event, ReexecutionRequest, Workspace
from ledger.reexecution import executor
from ledger.tenancy.services import create_key
from tests.conftest import IN_PROCESS, http_client, log_in, named_user
from tests.evaluation_support import Calls, model_change, registered_providers, triage_runs
from tests.runtime_support import every_run_verifies  # noqa: F401  (autouse: ledger verify passes on every run)

pytestmark = [pytest.mark.usefixtures("clock"), pytest.mark.django_db(transaction=True)]


@pytest.fixture
def providers() -> Iterator[Calls]:
    yield from registered_providers()


@pytest.fixture
def sessions(
    admin: User, approver: User, operator: User, viewer: User, other_workspace: Workspace
) -> Iterator[Callable[[str], httpx.Client]]:
    named_user("olga", "approver", tenant="globex")
    opened: list[httpx.Client] = []

    def open_(username: str) -> httpx.Client:
        opened.append(log_in(IN_PROCESS, username, send_csrf=True))
        return opened[-1]

    yield open_
    for client in opened:
        client.close()


def _key(workspace: Workspace, scopes: list[str]) -> httpx.Client:
    _, secret = create_key(workspace=workspace, scopes=scopes)
    return http_client(headers={"Authorization": f"Bearer {secret}"})


def _code(response: httpx.Response) -> str:
    return response.json()["error"]["code"]


POLICY = {
    "dataset": "golden",
    "changeKinds": ["model"],
    "scorers": ["exact"],
    "ceilingPerEvaluationUsd": "1",
    "ceilingPerDayUsd": "5",
    "ttlHours": 24,
    "note": "CI on the golden set",
}


def test_the_gate_over_http_with_an_execute_key(workspace, sessions, providers, caplog) -> None:
    runs = triage_runs(workspace)
    carol, bob, dave, olga = (sessions(n) for n in ("carol", "bob", "dave", "olga"))
    added = carol.post("/api/v1/datasets/golden/runs", json={"runIds": runs})
    assert added.status_code == 201, added.text
    assert added.json()["version"] == 1 and len(added.json()["members"]) == 10
    assert dave.post("/api/v1/datasets/golden/runs", json={"runIds": runs}).status_code == 403
    # The same runs again change nothing: 200 and the version they are in, no version 2.
    held = carol.post("/api/v1/datasets/golden/runs", json={"runIds": runs[:2]})
    assert held.status_code == 200 and held.json() == added.json(), held.text
    assert [d["name"] for d in carol.get("/api/v1/datasets").json()["datasets"]] == ["golden"]
    assert carol.get("/api/v1/datasets/golden?version=1").json()["digest"] == added.json()["digest"]
    assert _code(carol.get("/api/v1/datasets/golden?version=x")) == "invalid_parameter"
    ci = _key(workspace, ["execute", "read"])
    # A key never approves a policy; an operator is no approver.
    assert _code(ci.post("/api/v1/evaluation-policies", json=POLICY)) == "forbidden"
    assert _code(carol.post("/api/v1/evaluation-policies", json=POLICY)) == "forbidden"
    policy = bob.post("/api/v1/evaluation-policies", json=POLICY)
    assert policy.status_code == 201, policy.text
    assert policy.json()["active"] and policy.json()["approvedBy"] == "bob"
    body = {
        "dataset": "golden",
        "change": model_change("counting"),
        "scorers": ["exact"],
        "failIf": "pass_rate < 0.95",
        "reason": "CI: the same model through another route",
    }
    assert _code(_key(workspace, ["read"]).post("/api/v1/evaluations", json=body)) == "insufficient_scope"
    events_before = Event.objects.count()
    for bad in ({**body, "failIf": "pass_rate <<"}, {**body, "scorers": ["nope"]}, {**body, "change": {"kind": "x"}},
                {**body, "reason": ""}, {**body, "dataset": ["x"]},
                {**body, "change": model_change("unregistered")}):  # fmt: skip
        refused = ci.post("/api/v1/evaluations", json=bad)
        assert refused.status_code == 400 and _code(refused) == "invalid_request", refused.text
    assert Event.objects.count() == events_before and not Evaluation.objects.exists()
    started = ci.post("/api/v1/evaluations", json=body)
    assert started.status_code == 201, started.text
    made = started.json()
    assert made["status"] == "running" and made["policyId"] == policy.json()["id"] and made["verdict"] is None
    # The worker's part: its task body per request; the evaluation advances by its hooks alone.
    batch = ReexecutionRequest.objects.filter(batch_id=made["batchId"]).order_by("pk")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        for pk in batch.values_list("pk", flat=True):
            executor.run_request(request_pk=pk)
    assert not [r for r in caplog.records if r.name.startswith("ledger")], caplog.text
    done = ci.get(f"/api/v1/evaluations/{made['id']}").json()
    assert done["status"] == "finished" and done["verdict"] == "passed"
    assert done["report"]["aggregates"]["passRate"] == 1.0 and len(done["report"]["runs"]) == 10
    junit = ci.get(f"/api/v1/evaluations/{made['id']}/junit")
    assert junit.status_code == 200 and junit.headers["content-type"].startswith("application/xml")
    assert ElementTree.fromstring(junit.content).get("failures") == "0"
    assert [e["id"] for e in carol.get("/api/v1/evaluations").json()["evaluations"]] == [made["id"]]
    # Another tenant: 404 on each dataset, policy and evaluation path.
    for url in (
        "/api/v1/datasets/golden",
        f"/api/v1/evaluations/{made['id']}",
        f"/api/v1/evaluations/{made['id']}/junit",
    ):
        assert olga.get(url).status_code == 404, url
    assert olga.post("/api/v1/datasets/golden/runs/remove", json={"runIds": runs[:1]}).status_code == 404
    assert olga.post("/api/v1/datasets/golden/expected", json={"runId": runs[0], "expected": 1}).status_code == 404
    assert olga.post(f"/api/v1/evaluation-policies/{policy.json()['id']}/revoke", json={}).status_code == 404
    assert olga.post("/api/v1/evaluations", json=body).status_code == 404
    assert olga.post("/api/v1/evaluation-policies", json=POLICY).status_code == 404
    assert olga.get("/api/v1/datasets").json() == {"datasets": [], "next": None}
    assert olga.get("/api/v1/evaluation-policies").json() == {"policies": [], "next": None}
    assert olga.get("/api/v1/evaluations").json() == {"evaluations": [], "next": None}
    # Every policy and evaluation action is audited.
    revoked = bob.post(f"/api/v1/evaluation-policies/{policy.json()['id']}/revoke", json={"note": "done"})
    assert revoked.status_code == 200 and revoked.json()["active"] is False
    actions = set(AuditEntry.objects.values_list("action", flat=True))
    assert {"dataset.changed", "evaluation_policy.approved", "evaluation_policy.revoked", "evaluation.started",
            "evaluation.finished"} <= actions  # fmt: skip
    edited = carol.post("/api/v1/datasets/golden/expected", json={"runId": runs[0], "expected": {"reply": "x"}})
    removed = carol.post("/api/v1/datasets/golden/runs/remove", json={"runIds": runs[:2]})
    assert edited.json()["version"] == 2 and removed.json()["version"] == 3 and len(removed.json()["members"]) == 8


def test_an_evaluation_stopped_by_a_judge_of_unknown_cost_says_why(workspace, sessions, providers) -> None:
    """The judge's model has no price: the evaluation says, through the API while it runs and once
    finished, and on its console page, that its ceiling stopped it and why."""
    runs = triage_runs(workspace, count=3)
    carol, bob, olga = sessions("carol"), sessions("bob"), sessions("olga")
    assert carol.post("/api/v1/datasets/golden/runs", json={"runIds": runs}).status_code == 201
    policy = bob.post("/api/v1/evaluation-policies", json={**POLICY, "scorers": ["exact", "model_graded"]})
    assert policy.status_code == 201, policy.text
    ci = _key(workspace, ["execute", "read"])
    judge = {"name": "model_graded", "args": {"provider": "grader", "model": "house-judge-1"}}
    body = {"dataset": "golden", "change": model_change("counting"), "scorers": ["exact", judge], "reason": "judge"}
    started = ci.post("/api/v1/evaluations", json=body)
    assert started.status_code == 201, started.text
    made = started.json()
    assert made["status"] == "running" and made["budgetExhausted"] is False and made["budgetReason"] is None
    why = {
        "code": "cost_unknown",
        "message": f"evaluation {made['id']} cannot keep its ceiling of 1 USD: a grader call has no known cost "
        "(no price for the model, no usage reported, or a failure after the request left)",
    }
    first, *rest = (
        ReexecutionRequest.objects.filter(batch_id=made["batchId"]).order_by("pk").values_list("pk", flat=True)
    )
    executor.run_request(request_pk=first)
    running = ci.get(f"/api/v1/evaluations/{made['id']}").json()
    assert running["status"] == "running" and running["verdict"] is None
    assert running["budgetExhausted"] is True and running["budgetReason"] == why
    for pk in rest:
        executor.run_request(request_pk=pk)
    done = ci.get(f"/api/v1/evaluations/{made['id']}").json()
    assert done["status"] == "finished" and done["verdict"] == "budget_exhausted"
    assert done["budgetReason"] == why and done["report"]["aggregates"]["budgetExhausted"] is True
    assert [c[0] for c in providers.made] == ["counting", "counting", "grader"]
    listed = ci.get("/api/v1/evaluations").json()["evaluations"]
    assert [(e["id"], e["budgetReason"]) for e in listed] == [(made["id"], why)]
    for url in (f"/w/acme/support/evaluations/{made['id']}/", f"/w/acme/support/evaluations/{made['id']}/live/"):
        page = carol.get(url)
        assert page.status_code == 200 and 'data-verdict="budget_exhausted"' in page.text
        assert f'id="budget-reason" data-code="cost_unknown">the spend ceiling stopped the batch: {why["message"]}' in (
            page.text
        )
        assert olga.get(url).status_code == 404
    assert olga.get(f"/api/v1/evaluations/{made['id']}").status_code == 404
    ci.close()


def _external_run(ci: httpx.Client, run_id: str, ticket: str, answer: str) -> None:
    """A run an external harness recorded (its RunStarted names no workflow of this deployment)."""
    events = [
        {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_harness_1", "input": {"ticket": ticket}}},
        {"type": "RunCompleted", "payload": {"output": {"reply": answer}}},
    ]
    response = ci.post(f"/api/v1/runs/{run_id}/events", json={"events": events})
    assert response.status_code == 200, response.text


PROMPT_CHANGE = {"kind": "prompt", "prompts": {"answer": {"system": "Be brief."}}}


def _prompt_evaluation(workspace: Workspace, sessions: Any) -> tuple[httpx.Client, dict[str, Any]]:
    """Two runs an external harness recorded, a dataset of them, a policy for prompt changes, and
    an evaluation of PROMPT_CHANGE started under it with an `execute` key: (that key's client,
    the evaluation)."""
    carol, bob = sessions("carol"), sessions("bob")
    ci = _key(workspace, ["execute", "ingest", "read"])
    for i in range(2):
        _external_run(ci, f"run_ext_{i}", f"ticket {i}", f"Answer {i}")
    assert carol.post("/api/v1/datasets/golden/runs", json={"runIds": ["run_ext_0", "run_ext_1"]}).status_code == 201
    assert bob.post("/api/v1/evaluation-policies", json={**POLICY, "changeKinds": ["prompt"]}).status_code == 201
    body = {"dataset": "golden", "change": PROMPT_CHANGE, "scorers": ["exact"], "failIf": "pass_rate < 0.95"}
    started = ci.post("/api/v1/evaluations", json={**body, "reason": "brief"})
    assert started.status_code == 201, started.text
    made = started.json()
    assert made["status"] == "running" and made["change"] == PROMPT_CHANGE
    return ci, made


class _RolledBack(Exception):
    """What ends the test's transaction, rolling back what was written in it."""


def test_a_settlement_rolled_back_does_not_stop_the_evaluation_advancing(workspace, sessions) -> None:
    """A transaction that settled a request and then rolled back (the append ended the run, and
    something later in the same transaction failed) leaves nothing behind that keeps the next
    commit from advancing the evaluation: the batch still finishes by itself."""
    ci, made = _prompt_evaluation(workspace, sessions)
    for n in range(2):
        claimed = ci.post("/api/v1/reexecutions/claim", json={"owner": "harness"}).json()
        new_run, request = claimed["newRunId"], claimed["request"]
        started = {"workflowVersionId": "wfver_harness_2", "replayOf": request["runId"], "reexecutionId": request["id"]}
        opened = ci.post(
            f"/api/v1/runs/{new_run}/events", json={"events": [{"type": "RunStarted", "payload": started}]}
        )
        assert opened.status_code == 200, opened.text
        ended = {"events": [{"type": "RunCompleted", "payload": {"output": {"reply": f"Answer {n}"}}}]}
        if n == 0:  # the append's own service, in a transaction of the test's (HTTP closes it)
            with pytest.raises(_RolledBack), transaction.atomic():
                log.append(workspace=workspace, run_id=new_run, events=ended["events"], by="key:ci")
                assert ReexecutionRequest.objects.get(public_id=request["id"]).status == "succeeded"
                raise _RolledBack
        assert ci.post(f"/api/v1/runs/{new_run}/events", json=ended).status_code == 200
    done = ci.get(f"/api/v1/evaluations/{made['id']}").json()
    assert done["status"] == "finished" and done["verdict"] == "passed", done
    ci.close()


def test_an_external_executors_batch_is_scored_and_judged_when_it_finishes(workspace, sessions) -> None:
    """No --wait, no worker and no later change: the append that ends the last new run settles
    its request, scores it and gives the verdict, so the page shows it by itself. The claim hands
    the harness the evaluation's prompt change to apply."""
    ci, made = _prompt_evaluation(workspace, sessions)
    change = made["change"]
    for answer in ("Answer 0", "Short."):
        claimed = ci.post("/api/v1/reexecutions/claim", json={"owner": "harness"})
        assert claimed.status_code == 200, claimed.text
        request = claimed.json()["request"]
        assert request["promptOverrides"] == change["prompts"] and request["mode"] == "evaluate"
        events = [
            {
                "type": "RunStarted",
                "payload": {
                    "workflowVersionId": "wfver_harness_2",
                    "replayOf": request["runId"],
                    "reexecutionId": request["id"],
                    "input": {"ticket": "t"},
                },
            },
        ]
        new_run = claimed.json()["newRunId"]
        assert ci.post(f"/api/v1/runs/{new_run}/events", json={"events": events}).status_code == 200
        # The second harness holds the run's lease, as one built on the runtime does, and keeps it
        # past its terminal append: the scores are written beside it with its token.
        body: dict[str, Any] = {"events": [{"type": "RunCompleted", "payload": {"output": {"reply": answer}}}]}
        if answer == "Short.":
            body["fencingToken"] = acquire_run_lease(workspace=workspace, run_id=new_run, owner="harness").fencing_token
        appended = ci.post(f"/api/v1/runs/{new_run}/events", json=body)
        assert appended.status_code == 200, appended.text
    # Nothing else happened: the evaluation is finished, scored and judged.
    done = ci.get(f"/api/v1/evaluations/{made['id']}").json()
    assert done["status"] == "finished" and done["verdict"] == "failed", done
    aggregates = done["report"]["aggregates"]
    assert aggregates["passRate"] == 0.5 and aggregates["changed"] == 1
    assert all(r["scores"]["exact"]["after"] is not None for r in done["report"]["runs"])
    scored = Event.objects.filter(type="custom.evaluation.scored", run__run_id__startswith="run_rx_")
    assert scored.count() == 2
    page = sessions("carol").get(f"/w/acme/support/evaluations/{made['id']}/live/")
    assert page.status_code == 200 and 'data-verdict="failed"' in page.text
    ci.close()


def test_bad_changes_over_http_get_the_error_envelope_and_leave_nothing(workspace, sessions) -> None:
    runs = triage_runs(workspace, count=2)
    carol = sessions("carol")
    assert carol.post("/api/v1/datasets/golden/runs", json={"runIds": runs}).status_code == 201
    ci = _key(workspace, ["execute", "read"])
    events_before = Event.objects.count()
    body = {"dataset": "golden", "scorers": ["exact"], "reason": "try"}
    for change in (
        {"kind": "prompt", "prompts": {"confirm": {"system": "x"}}},
        {"kind": "prompt", "prompts": {"draft": {"system": 1}}},
        {"kind": "prompt", "prompts": {"draft": {"system": "x" * 100_001}}},
        {"kind": "input", "inputs": {"run_elsewhere": {}}},
        {"kind": "input", "mergePatch": "x"},
        {"kind": "input", "mergePatch": {}, "inputs": {}},
        {"kind": "workflow", "workflow": "support.nope"},
        {"kind": "workflow", "workflow": "support.triage", "version": "wfver_support.triage_000000000000"},
        {"kind": "workflow", "workflow": ["x"]},
        {"kind": "model", "modelOverrides": {"default": {"provider": "scripted", "model": "m"}}, "prompts": {}},
    ):
        refused = ci.post("/api/v1/evaluations", json={**body, "change": change})
        assert refused.status_code == 400 and _code(refused) == "invalid_request", (change, refused.text)
        assert refused.json()["error"]["details"]["field"] == "change"
    assert Event.objects.count() == events_before
    assert not Evaluation.objects.exists() and not ReexecutionRequest.objects.exists()
    ci.close()


def test_a_fail_if_nested_too_deep_or_with_no_number_is_refused_not_a_500(workspace, sessions) -> None:
    """`failIf` within its 500 characters: parentheses 499 deep were a RecursionError (500), and
    `nan` or `inf` read as numbers, making a gate that can never fail; each is a 400 now."""
    runs = triage_runs(workspace, count=1)
    assert sessions("carol").post("/api/v1/datasets/golden/runs", json={"runIds": runs}).status_code == 201
    ci = _key(workspace, ["execute", "read"])
    body = {"dataset": "golden", "change": model_change("scripted"), "scorers": ["exact"], "reason": "try"}
    for condition in ("(" * 499, "not " * 120 + "(" * 20, "pass_rate < nan", "pass_rate < inf", "changed > Infinity"):
        refused = ci.post("/api/v1/evaluations", json={**body, "failIf": condition})
        assert refused.status_code == 400 and _code(refused) == "invalid_request", (condition, refused.text)
        assert refused.json()["error"]["details"]["field"] == "failIf"
    nested = "(" * 30 + "pass_rate < 0.95" + ")" * 30
    assert ci.post("/api/v1/evaluations", json={**body, "failIf": nested}).status_code == 201
    assert Evaluation.objects.count() == 1
    ci.close()


def test_a_ceiling_past_12_decimal_places_is_refused_not_a_dead_policy(workspace, sessions) -> None:
    """Ceilings are kept to 12 decimal places: one with more was stored rounded (0.0000000000001
    as 0), so the policy's terms no longer hashed to its digest and it was born inactive (shown as
    expired, covering nothing) while the answer said `active: true`. It is a 400 now."""
    runs = triage_runs(workspace, count=1)
    bob = sessions("bob")
    assert bob.post("/api/v1/datasets/golden/runs", json={"runIds": runs}).status_code == 201
    for field in ("ceilingPerEvaluationUsd", "ceilingPerDayUsd"):
        refused = bob.post("/api/v1/evaluation-policies", json={**POLICY, field: "0.0000000000001"})
        assert refused.status_code == 400 and refused.json()["error"]["details"]["field"] == field, refused.text
    assert not EvaluationPolicy.objects.exists()
    made = bob.post("/api/v1/evaluation-policies", json={**POLICY, "ceilingPerEvaluationUsd": "0.123456789012"})
    assert made.status_code == 201 and made.json()["active"] is True
    listed = bob.get("/api/v1/evaluation-policies").json()["policies"]
    assert [(p["ceilingPerEvaluationUsd"], p["active"]) for p in listed] == [("0.123456789012", True)]


def test_scorer_args_of_any_size_are_refused_past_their_limit(workspace, sessions) -> None:
    """A regex scorer's pattern of 200 000 characters was taken (201) and echoed whole in every
    run's reason, before and after: kept on the evaluation, in each scored event and in the
    report page's titles. Args are at most 10 000 characters of JSON."""
    runs = triage_runs(workspace, count=1)
    assert sessions("carol").post("/api/v1/datasets/golden/runs", json={"runIds": runs}).status_code == 201
    ci = _key(workspace, ["execute", "read"])
    body = {"dataset": "golden", "change": model_change("scripted"), "reason": "try"}
    for scorer in (
        {"name": "regex", "args": {"pattern": "a" * 200_000}},
        {"name": "model_graded", "args": {"provider": "scripted", "model": "m", "rubric": "x" * 10_001}},
        {"name": "json_fields", "args": {"fields": [f"f{n}" for n in range(5000)]}},
    ):
        refused = ci.post("/api/v1/evaluations", json={**body, "scorers": [scorer]})
        assert refused.status_code == 400 and _code(refused) == "invalid_request", refused.text
        assert refused.json()["error"]["details"]["field"] == "scorers"
    assert not Evaluation.objects.exists()
    ci.close()


def test_datasets_policies_and_evaluations_list_in_cursor_pages(workspace, approver: User, providers) -> None:
    """Lists page as every list of the API does: `{<things>: [...], next}`, `?limit=` and `?cursor=`."""
    from ledger.evaluation import datasets, policies

    runs = triage_runs(workspace, count=2)
    for name in ("gamma", "alpha", "delta", "beta", "epsilon"):
        datasets.add_runs(workspace=workspace, name=name, run_ids=runs, by="carol")
    made = [
        policies.approve_policy(
            workspace=workspace,
            dataset="alpha",
            change_kinds=["model"],
            scorers=["exact"],
            ceiling_per_evaluation_usd="1",
            ceiling_per_day_usd="5",
            ttl_hours=24,
            by=approver,
        ).public_id
        for _ in range(3)
    ]
    ci = _key(workspace, ["read"])

    def walk(path: str, things: str) -> list[str]:
        seen: list[str] = []
        url: str | None = f"{path}?limit=2"
        while url:
            body = ci.get(url).json()
            assert set(body) == {things, "next"} and len(body[things]) <= 2, body
            seen += [row.get("name") or row["id"] for row in body[things]]
            url = f"{path}?limit=2&cursor={body['next']}" if body["next"] else None
        return seen

    assert walk("/api/v1/datasets", "datasets") == ["alpha", "beta", "delta", "epsilon", "gamma"]
    assert walk("/api/v1/evaluation-policies", "policies") == list(reversed(made))
    assert walk("/api/v1/evaluations", "evaluations") == []
    for path in ("datasets", "evaluation-policies", "evaluations"):
        for bad, code in (("limit=0", "invalid_parameter"), ("limit=-1", "invalid_parameter"),
                          ("limit=abc", "invalid_parameter"), ("cursor=!!", "invalid_cursor"),
                          ("cursor=eyJuYW1lIjoxfQ", "invalid_cursor")):  # fmt: skip
            refused = ci.get(f"/api/v1/{path}?{bad}")
            assert refused.status_code == 400 and _code(refused) == code, (path, bad, refused.text)
