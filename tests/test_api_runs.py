"""The runs API through an httpx client, the way an external harness or a browser talks to it, into
Django's whole request handling in the test's process (tests/conftest.py `http_client`): the API
is the subject here; the servers that carry it have their own tests (test_stream, test_body_limit,
test_production, test_readme_first_run)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import User

from ledger.demo.data import _summarize_run
from ledger.log import append
from ledger.log.leases import acquire_run_lease
from ledger.models import Artifact, Run, Workspace
from ledger.reads.subruns import subrun_tree
from ledger.tenancy.services import bootstrap, create_key
from tests.conftest import IN_PROCESS, http_client, log_in, started

pytestmark = pytest.mark.django_db(transaction=True)

V1 = "/api/v1"
RUN_ROUTES = ["", "/events", "/children", "/evidence", "/replay-plan"]


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture
def server() -> str:
    return IN_PROCESS


@pytest.fixture
def client_for(server: str) -> Iterator[Callable[..., httpx.Client]]:
    clients: list[httpx.Client] = []

    def make(workspace: Workspace | None = None, scopes: str = "ingest,read") -> httpx.Client:
        headers = {}
        if workspace is not None:
            _, key = create_key(workspace=workspace, scopes=scopes.split(","))
            headers["Authorization"] = f"Bearer {key}"
        client = http_client(server, headers=headers)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def api(workspace: Workspace, client_for: Callable[..., httpx.Client]) -> httpx.Client:
    return client_for(workspace)


@pytest.fixture
def outsider_api(other_workspace: Workspace, client_for: Callable[..., httpx.Client]) -> httpx.Client:
    return client_for(other_workspace)


def post_events(api: httpx.Client, run_id: str, *events: dict[str, Any], **body: Any) -> httpx.Response:
    return api.post(f"{V1}/runs/{run_id}/events", json={"events": list(events), **body})


def error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]["details"]


@pytest.fixture
def rich_run(workspace: Workspace) -> str:
    """A finished run with a step, two priced model calls, a tool call, an artifact and a sub-run."""
    events = _summarize_run(("openai", "gpt-4o-mini"), finish=True)
    big = {"type": "StepCompleted", "payload": {"stepPath": "attach", "attempt": 1, "output": {"blob": "x" * 300_000}}}
    events[-1:-1] = [
        {"type": "StepScheduled", "payload": {"stepPath": "attach"}},
        {"type": "StepAttemptStarted", "payload": {"stepPath": "attach", "attempt": 1}},
        big,
    ]
    append(workspace=workspace, run_id="run_rich", events=events)
    append(workspace=workspace, run_id="run_rich_child", events=[started("wfver_child", parentRunId="run_rich")])
    return "run_rich"


# --- appends -------------------------------------------------------------------------------


def test_append_returns_envelopes_and_replays_a_retry(api: httpx.Client) -> None:
    first = post_events(api, "run_one", {**started(input={"q": 1}), "idempotencyKey": "start"})
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["lastSequence"] == 1
    [env] = body["events"]
    assert set(env) == {"eventId", "runId", "sequence", "type", "recordedAt", "payload", "replayed"}
    assert env["replayed"] is False and env["eventId"].startswith("evt_") and env["sequence"] == 1

    again = post_events(api, "run_one", {**started(input={"q": 1}), "idempotencyKey": "start"})
    assert again.status_code == 200
    assert again.json()["events"][0] == {**env, "replayed": True}

    step = post_events(
        api,
        "run_one",
        {"type": "StepScheduled", "payload": {"stepPath": "a"}, "occurrenceId": "occ-1"},
        expectedSequence=1,
    )
    assert step.status_code == 200 and step.json()["events"][0]["occurrenceId"] == "occ-1"
    assert step.json()["lastSequence"] == 2


def test_invalid_event_names_index_and_field(api: httpx.Client) -> None:
    response = post_events(api, "run_bad", started(), {"type": "StepScheduled", "payload": {}})
    assert error(response, 400, "invalid_event") == {"index": 1, "field": "payload.stepPath"}
    assert api.get(f"{V1}/runs/run_bad").status_code == 404  # all or nothing


def test_unknown_event_type_is_400(api: httpx.Client) -> None:
    error(post_events(api, "run_x", started(), {"type": "Bogus", "payload": {}}), 400, "unknown_event_type")


def test_recorded_cost_is_refused(api: httpx.Client) -> None:
    responded = {
        "type": "harness.model.responded",
        "payload": {
            "turn": 1,
            "callId": "c1",
            "model": {"provider": "openai", "modelId": "gpt-4o"},
            "response": {"usage": {"inputTokens": 1, "outputTokens": 1, "costUsd": 0.5}},
        },
    }
    details = error(post_events(api, "run_x", started(), responded), 400, "cost_not_allowed")
    assert details["index"] == 1


def test_same_idempotency_key_other_payload_is_conflict(api: httpx.Client) -> None:
    assert post_events(api, "run_i", {**started(), "idempotencyKey": "k"}).status_code == 200
    response = post_events(api, "run_i", {"type": "StepScheduled", "payload": {"stepPath": "a"}, "idempotencyKey": "k"})
    error(response, 409, "idempotency_conflict")


def test_expected_sequence_mismatch_is_conflict_with_expected_and_actual(api: httpx.Client) -> None:
    post_events(api, "run_s", started())
    response = post_events(api, "run_s", {"type": "StepScheduled", "payload": {"stepPath": "a"}}, expectedSequence=5)
    assert error(response, 409, "sequence_conflict") == {"expected": 5, "actual": 1}


def test_stale_or_missing_fencing_token_is_fenced(api: httpx.Client, workspace: Workspace) -> None:
    post_events(api, "run_f", started())
    old = acquire_run_lease(workspace=workspace, run_id="run_f", owner="zombie")
    new = acquire_run_lease(workspace=workspace, run_id="run_f", owner="worker-2", take_over=True)
    step = {"type": "StepScheduled", "payload": {"stepPath": "a"}}
    error(post_events(api, "run_f", step), 409, "fenced")
    error(post_events(api, "run_f", step, fencingToken=str(old.fencing_token)), 409, "fenced")
    assert post_events(api, "run_f", step, fencingToken=str(new.fencing_token)).status_code == 200


def test_lifecycle_conflicts(api: httpx.Client) -> None:
    step = {"type": "StepScheduled", "payload": {"stepPath": "a"}}
    error(post_events(api, "run_l", step), 409, "run_not_started")
    post_events(api, "run_l", started())
    error(post_events(api, "run_l", started()), 409, "run_already_started")
    post_events(api, "run_l", {"type": "RunCompleted", "payload": {"output": 1}})
    error(post_events(api, "run_l", step), 409, "run_finished")
    assert post_events(api, "run_l", {"type": "custom.note", "payload": {"x": 1}}).status_code == 200


def test_body_over_10_mib_is_413(api: httpx.Client) -> None:
    body = json.dumps({"events": [started(blob="x" * (10 * 1024 * 1024 + 10))]})
    response = api.post(f"{V1}/runs/run_big/events", content=body, headers={"Content-Type": "application/json"})
    error(response, 413, "payload_too_large")


@pytest.mark.parametrize("run_id", ["bad.id", "run_", "runx_1", "run_" + "a" * 81, "run_a%20b"])
def test_malformed_run_id_is_400_on_every_route(api: httpx.Client, run_id: str) -> None:
    error(post_events(api, run_id, started()), 400, "invalid_run_id")
    error(api.post(f"{V1}/runs/{run_id}/feedback", json={"rating": 3}), 400, "invalid_run_id")
    for suffix in RUN_ROUTES:
        error(api.get(f"{V1}/runs/{run_id}{suffix}"), 400, "invalid_run_id")


def test_malformed_bodies_are_400_envelopes(api: httpx.Client) -> None:
    url = f"{V1}/runs/run_m/events"
    error(api.post(url, content=b"{not json", headers={"Content-Type": "application/json"}), 400, "invalid_json")
    error(api.post(url, json=[started()]), 400, "invalid_request")
    assert error(api.post(url, json={"events": {"type": "RunStarted"}}), 400, "invalid_event")["field"] == "events"
    assert error(api.post(url, json={}), 400, "invalid_event")["field"] == "events"
    assert (
        error(post_events(api, "run_m", started(), expectedSequence="3"), 400, "invalid_event")["field"]
        == "expectedSequence"
    )


# --- auth ----------------------------------------------------------------------------------


def _every_route(run_id: str, artifact_id: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    return [
        ("POST", f"{V1}/runs/{run_id}/events", {"events": [{"type": "StepScheduled", "payload": {"stepPath": "z"}}]}),
        ("POST", f"{V1}/runs/{run_id}/feedback", {"rating": 5}),
        ("GET", f"{V1}/runs", None),
        *[("GET", f"{V1}/runs/{run_id}{suffix}", None) for suffix in RUN_ROUTES],
        ("GET", f"{V1}/artifacts/{artifact_id}", None),
        ("GET", f"{V1}/artifacts/{artifact_id}/content", None),
        ("GET", f"{V1}/usage", None),
    ]


def _artifact_id(workspace: Workspace) -> str:
    return Artifact.objects.filter(workspace=workspace).get().artifact_id


def test_no_credentials_is_401_everywhere(
    client_for: Callable[..., httpx.Client], rich_run: str, workspace: Workspace
) -> None:
    anonymous = client_for()
    for method, url, body in _every_route(rich_run, _artifact_id(workspace)):
        response = anonymous.request(method, url, json=body)
        error(response, 401, "unauthenticated")
        assert response.headers["www-authenticate"] == "Bearer"
    bogus = anonymous.get(f"{V1}/runs", headers={"Authorization": "Bearer rl_nope_nope"})
    error(bogus, 401, "unauthenticated")


def test_key_without_the_scope_is_403(
    client_for: Callable[..., httpx.Client], rich_run: str, workspace: Workspace
) -> None:
    read_only, ingest_only = client_for(workspace, "read"), client_for(workspace, "ingest")
    for method, url, body in _every_route(rich_run, _artifact_id(workspace)):
        key = read_only if method == "POST" else ingest_only
        details = error(key.request(method, url, json=body), 403, "insufficient_scope")
        assert details["scope"] == ("ingest" if method == "POST" else "read")


def test_another_tenants_objects_are_404_on_every_route(
    outsider_api: httpx.Client, rich_run: str, workspace: Workspace
) -> None:
    artifact_id = _artifact_id(workspace)
    before = Run.objects.get(run_id=rich_run).last_sequence
    for method, url, body in _every_route(rich_run, artifact_id):
        response = outsider_api.request(method, url, json=body)
        if url.endswith("/events") and method == "POST":
            # Run ids are per workspace: to globex this id is simply unused, so the answer is the
            # same as for any never-used id, and acme's run is untouched.
            never = outsider_api.request(method, url.replace(rich_run, "run_never"), json=body)
            error(response, 409, "run_not_started")
            error(never, 409, "run_not_started")
        elif url.endswith("/usage") or url.endswith("/runs"):
            assert response.status_code == 200 and rich_run not in response.text
        else:
            error(response, 404, "not_found")
    assert Run.objects.get(run_id=rich_run).last_sequence == before


# --- reads ---------------------------------------------------------------------------------


RUN_FIELDS = {
    "attention",
    "treeUsage",
    "cancelled",
    "runId",
    "workflowVersionId",
    "status",
    "parentRunId",
    "rootRunId",
    "startedAt",
    "finishedAt",
    "input",
    "output",
    "error",
    "lastSequence",
    "eventCount",
    "usage",
    "replayOf",
    "children",
    "links",
}
USAGE_FIELDS = {
    "inputTokens",
    "outputTokens",
    "cachedInputTokens",
    "reasoningTokens",
    "costUsd",
    "pricedCalls",
    "unpricedCalls",
}


def test_run_object_is_the_documented_shape(api: httpx.Client, rich_run: str) -> None:
    run = api.get(f"{V1}/runs/{rich_run}").json()
    assert set(run) == RUN_FIELDS and set(run["usage"]) == USAGE_FIELDS
    assert run["status"] == "completed" and run["workflowVersionId"] == "wfver_support_summarize"
    assert run["parentRunId"] is None and run["rootRunId"] is None and run["replayOf"] is None
    assert run["input"] == {"ticket": 4711} and run["output"] == {"summary": "Customer cannot log in."}
    assert run["children"] == 1 and run["lastSequence"] == run["eventCount"] == 16
    assert run["startedAt"].endswith("Z") and run["finishedAt"].endswith("Z")
    assert run["usage"]["pricedCalls"] == 2 and run["usage"]["unpricedCalls"] == 0
    assert isinstance(run["usage"]["costUsd"], float) and run["usage"]["costUsd"] > 0
    assert run["links"] == {
        "console": "/w/acme/support/runs/run_rich/",
        "evidence": "/api/v1/runs/run_rich/evidence",
        "events": "/api/v1/runs/run_rich/events",
    }
    assert set(run["treeUsage"]) == USAGE_FIELDS
    child = api.get(f"{V1}/runs/run_rich_child").json()
    assert child["parentRunId"] == "run_rich" and child["rootRunId"] == "run_rich" and child["children"] == 0


def test_unknown_run_is_404(api: httpx.Client) -> None:
    for suffix in RUN_ROUTES:
        assert error(api.get(f"{V1}/runs/run_nope{suffix}"), 404, "not_found")["runId"] == "run_nope"


def test_unpriced_run_reports_null_cost(api: httpx.Client, workspace: Workspace) -> None:
    append(workspace=workspace, run_id="run_unpriced", events=_summarize_run(("acme.chat", "house"), finish=True))
    usage = api.get(f"{V1}/runs/run_unpriced").json()["usage"]
    assert usage["costUsd"] is None and usage["unpricedCalls"] == 2 and usage["pricedCalls"] == 0


def _answer(call_id: str, usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "harness.model.responded",
        "payload": {
            "turn": 1,
            "callId": call_id,
            "stepPath": "ask",
            "model": {"provider": "openai", "modelId": "gpt-4o-mini"},
            "response": {"text": "ok", "usage": usage},
        },
    }


def test_a_call_whose_usage_was_not_reported_is_unpriced_not_free(api: httpx.Client) -> None:
    """A harness that recorded `{}` (its provider reported no usage) spent an unknown amount: the run,
    its step and the usage report count the call unpriced, never as a priced $0."""
    response = post_events(
        api,
        "run_no_usage",
        started("wfver_stream"),
        _answer("c1", {}),
        _answer("c2", {"inputTokens": 10_000, "outputTokens": 2_000}),
        _answer("c3", {"inputTokens": 0, "outputTokens": 0}),  # reported: zero, priced $0
        {"type": "RunCompleted", "payload": {"output": "ok"}},
    )
    assert response.status_code == 200, response.text
    usage = api.get(f"{V1}/runs/run_no_usage").json()["usage"]
    assert (usage["pricedCalls"], usage["unpricedCalls"]) == (2, 1)
    assert usage["costUsd"] == pytest.approx(0.0027) and usage["inputTokens"] == 10_000
    total = api.get(f"{V1}/usage?groupBy=model").json()["total"]
    assert (total["pricedCalls"], total["unpricedCalls"]) == (2, 1)

    post_events(api, "run_only_no_usage", started("wfver_stream"), _answer("c1", {}))
    usage = api.get(f"{V1}/runs/run_only_no_usage").json()["usage"]
    assert (usage["costUsd"], usage["pricedCalls"], usage["unpricedCalls"]) == (None, 0, 1)


def test_runs_list_pages_newest_first_with_a_cursor(api: httpx.Client) -> None:
    for i in range(5):
        post_events(api, f"run_p{i}", started(f"wfver_{i % 2}"))
    seen: list[str] = []
    url: str | None = f"{V1}/runs?limit=2"
    pages = 0
    while url:
        body = api.get(url).json()
        assert set(body) == {"runs", "next"} and len(body["runs"]) <= 2
        seen += [r["runId"] for r in body["runs"]]
        url = f"{V1}/runs?limit=2&cursor={body['next']}" if body["next"] else None
        pages += 1
    assert seen == [f"run_p{i}" for i in reversed(range(5))] and pages == 3
    error(api.get(f"{V1}/runs?limit=0"), 400, "invalid_parameter")
    error(api.get(f"{V1}/runs?limit=501"), 400, "invalid_parameter")
    error(api.get(f"{V1}/runs?cursor=%%%"), 400, "invalid_cursor")
    error(api.get(f"{V1}/runs?cursor=eyJ4IjoxfQ"), 400, "invalid_cursor")  # {"x":1}


def test_runs_list_sorts_by_cost_tokens_duration_on_keyset_pages(api: httpx.Client, workspace: Workspace) -> None:
    for i, (inp, out) in enumerate([(1000, 10), (5000, 10), (3000, 10), (5000, 10)]):
        post_events(
            api,
            f"run_s{i}",
            started(),
            {
                "type": "harness.model.responded",
                "payload": {
                    "turn": 1,
                    "callId": "c1",
                    "model": {"provider": "openai", "modelId": "gpt-4o-mini"},
                    "response": {"text": "ok", "usage": {"inputTokens": inp, "outputTokens": out}},
                },
            },
        )
    post_events(api, "run_unpriced", started())

    def walk(query: str) -> list[str]:
        seen: list[str] = []
        url: str | None = f"{V1}/runs?limit=2&{query}"
        while url:
            response = api.get(url)
            assert response.status_code == 200, response.text
            body = response.json()
            seen += [r["runId"] for r in body["runs"]]
            url = f"{V1}/runs?limit=2&{query}&cursor={body['next']}" if body["next"] else None
        return seen

    # docs/api.md: `-` before the key for descending, a bare key ascending; `order` says it the other way.
    # Ties by the row id, newest first; a run without model calls costs $0 and has 0 tokens.
    most_first = ["run_s3", "run_s1", "run_s2", "run_s0", "run_unpriced"]
    assert walk("sort=-cost") == walk("sort=cost&order=desc") == walk("sort=-cost&order=desc") == most_first
    assert (
        walk("sort=tokens") == walk("sort=tokens&order=asc") == ["run_unpriced", "run_s0", "run_s2", "run_s1", "run_s3"]
    )
    assert walk("sort=-duration") == ["run_unpriced", "run_s3", "run_s2", "run_s1", "run_s0"]  # none finished
    assert walk("sort=duration") == ["run_s0", "run_s1", "run_s2", "run_s3", "run_unpriced"]  # NULLs last either way
    assert walk("sort=-started") == walk("") == walk("order=desc") == list(reversed(walk("sort=started")))
    for bad in ("sort=price", "sort=-price", "sort=-", "sort=--cost", "order=up", "sort=-cost&order=asc"):
        error(api.get(f"{V1}/runs?{bad}"), 400, "invalid_parameter")
    first = api.get(f"{V1}/runs?limit=2&sort=-cost").json()["next"]
    error(api.get(f"{V1}/runs?sort=-tokens&cursor={first}"), 400, "invalid_cursor")  # another sort's cursor
    error(api.get(f"{V1}/runs?sort=cost&cursor={first}"), 400, "invalid_cursor")  # another direction's
    error(api.get(f"{V1}/runs?sort=cost&cursor=eyJrIjoiY29zdCIsInYiOiJOYU4iLCJpZCI6MX0"), 400, "invalid_cursor")


def test_runs_list_filters(api: httpx.Client, rich_run: str) -> None:
    post_events(api, "run_other", started("wfver_other", label="nightly-batch"))

    def ids(query: str) -> list[str]:
        response = api.get(f"{V1}/runs?{query}")
        assert response.status_code == 200, response.text
        return [r["runId"] for r in response.json()["runs"]]

    assert ids("status=completed") == ["run_rich"]
    assert ids("status=running") == ["run_other", "run_rich_child"]
    assert ids("workflow=wfver_child") == ["run_rich_child"]
    assert ids("parentRunId=run_rich") == ["run_rich_child"]
    assert ids("q=NIGHTLY") == ["run_other"]
    assert ids("q=rich_ch") == ["run_rich_child"]
    assert ids("q=summarize") == ["run_rich"]
    error(api.get(f"{V1}/runs?status=done"), 400, "invalid_parameter")


def test_children_lists_direct_sub_runs(api: httpx.Client, rich_run: str) -> None:
    post_events(api, "run_grandchild", started("wfver_g", parentRunId="run_rich_child"))
    body = api.get(f"{V1}/runs/{rich_run}/children").json()
    assert [r["runId"] for r in body["runs"]] == ["run_rich_child"] and body["next"] is None
    assert body["runs"][0]["children"] == 1
    grandchild = api.get(f"{V1}/runs/run_grandchild").json()
    assert grandchild["rootRunId"] == "run_rich"


def test_tree_usage_sums_every_run_below_any_depth(api: httpx.Client, workspace: Workspace) -> None:
    """docs/api.md's `treeUsage`: the run's usage and that of every run below it, on every read of a run
    object (one run, the list, children, the evidence bundle and its sub-runs), equal to the run
    page's *Cost with sub-runs*. An unpriced call in the tree counts as unpriced, not as $0."""
    post_events(api, "run_t_root", started("wfver_t"), _answer("c1", {"inputTokens": 1000, "outputTokens": 100}))
    post_events(
        api,
        "run_t_mid",
        started("wfver_t", parentRunId="run_t_root"),
        _answer("c1", {"inputTokens": 2000, "outputTokens": 200}),
    )
    post_events(api, "run_t_leaf", started("wfver_t", parentRunId="run_t_mid"), _answer("c1", {}))  # unpriced
    post_events(
        api,
        "run_t_side",
        started("wfver_t", parentRunId="run_t_root"),
        _answer("c1", {"inputTokens": 4000, "outputTokens": 400}),
    )
    post_events(api, "run_t_alone", started("wfver_t"), _answer("c1", {"inputTokens": 8000, "outputTokens": 800}))
    runs = {r["runId"]: r for r in api.get(f"{V1}/runs?limit=500").json()["runs"]}

    def tokens(run: dict[str, Any]) -> tuple[int, int, int, int]:
        tree = run["treeUsage"]
        return tree["inputTokens"], tree["outputTokens"], tree["pricedCalls"], tree["unpricedCalls"]

    assert tokens(runs["run_t_root"]) == (7000, 700, 3, 1)
    assert tokens(runs["run_t_mid"]) == (2000, 200, 1, 1)
    assert tokens(runs["run_t_leaf"]) == (0, 0, 0, 1) and runs["run_t_leaf"]["treeUsage"]["costUsd"] is None
    for alone in ("run_t_side", "run_t_alone"):
        assert runs[alone]["treeUsage"] == runs[alone]["usage"]
    root = runs["run_t_root"]
    parts = [runs[r]["usage"]["costUsd"] or 0 for r in ("run_t_root", "run_t_mid", "run_t_side")]
    assert root["treeUsage"]["costUsd"] == pytest.approx(sum(parts)) and root["usage"]["inputTokens"] == 1000
    assert api.get(f"{V1}/runs/run_t_root").json()["treeUsage"] == root["treeUsage"]
    assert api.get(f"{V1}/runs/run_t_mid").json()["treeUsage"] == runs["run_t_mid"]["treeUsage"]
    children = {r["runId"]: r for r in api.get(f"{V1}/runs/run_t_root/children").json()["runs"]}
    assert children["run_t_mid"]["treeUsage"] == runs["run_t_mid"]["treeUsage"]
    bundle = api.get(f"{V1}/runs/run_t_root/evidence").json()
    assert bundle["run"]["treeUsage"] == root["treeUsage"]
    assert {r["runId"]: r["treeUsage"] for r in bundle["subRuns"]} == {
        "run_t_mid": runs["run_t_mid"]["treeUsage"],
        "run_t_side": runs["run_t_side"]["treeUsage"],
    }
    tree = subrun_tree(Run.objects.get(workspace=workspace, run_id="run_t_root")).usage
    assert root["treeUsage"]["costUsd"] == float(tree.cost_usd or 0) and tree.input_tokens == 7000


def test_events_page_by_sequence(api: httpx.Client, rich_run: str) -> None:
    first = api.get(f"{V1}/runs/{rich_run}/events?limit=5").json()
    assert [e["sequence"] for e in first["events"]] == [1, 2, 3, 4, 5]
    assert first["lastSequence"] == 16 and first["next"] == 5
    collected, after = [], 0
    while after is not None:
        page = api.get(f"{V1}/runs/{rich_run}/events", params={"after": after, "limit": 7}).json()
        collected += page["events"]
        after = page["next"]
    assert [e["sequence"] for e in collected] == list(range(1, 17))
    assert api.get(f"{V1}/runs/{rich_run}/events?after=16").json() == {"events": [], "lastSequence": 16, "next": None}
    # secrets were redacted before storage
    tool = next(e for e in collected if e["type"] == "harness.tool_call.started")
    assert tool["payload"]["headers"]["Authorization"] == "[REDACTED]"
    for bad in ("after=-1", "after=x", "limit=0", "limit=501"):
        error(api.get(f"{V1}/runs/{rich_run}/events?{bad}"), 400, "invalid_parameter")
    assert len(api.get(f"{V1}/runs/{rich_run}/events").json()["events"]) == 16  # default limit 50


def test_events_as_ndjson(api: httpx.Client, rich_run: str) -> None:
    response = api.get(f"{V1}/runs/{rich_run}/events?after=2&limit=3", headers={"Accept": "application/x-ndjson"})
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-ndjson"
    lines = response.text.splitlines()
    assert [json.loads(line)["sequence"] for line in lines] == [3, 4, 5] and response.text.endswith("\n")
    assert response.headers["x-last-sequence"] == "16" and response.headers["x-next-after"] == "5"
    whole = api.get(f"{V1}/runs/{rich_run}/events", headers={"Accept": "application/x-ndjson"})
    assert len(whole.text.splitlines()) == 16 and "x-next-after" not in whole.headers
    failing = api.get(f"{V1}/runs/run_nope/events", headers={"Accept": "application/x-ndjson"})
    error(failing, 404, "not_found")  # errors stay JSON envelopes


def test_evidence_bundle(api: httpx.Client, rich_run: str) -> None:
    assert api.post(f"{V1}/runs/{rich_run}/feedback", json={"rating": 4, "category": "accuracy"}).status_code == 201
    bundle = api.get(f"{V1}/runs/{rich_run}/evidence").json()
    assert set(bundle) == {
        "run",
        "steps",
        "toolCalls",
        "artifacts",
        "costs",
        "approvals",
        "feedback",
        "subRuns",
        "usage",
        "integrity",
        "replayReady",
    }
    assert set(bundle["run"]) == RUN_FIELDS and bundle["usage"] == bundle["run"]["usage"]
    assert [s["stepPath"] for s in bundle["steps"]] == ["summarize", "attach"]
    assert all(s["status"] == "completed" for s in bundle["steps"])
    attach = bundle["steps"][1]
    assert attach["output"] is None and attach["outputRef"].startswith("artifact://art_")
    assert bundle["steps"][0]["outputRef"] is None
    assert [c["callId"] for c in bundle["toolCalls"]] == ["summarize-t1"]
    assert bundle["toolCalls"][0]["status"] == "succeeded"
    costs = bundle["costs"]
    assert [c["sequence"] for c in costs] == sorted(c["sequence"] for c in costs) and len(costs) == 2
    assert costs[0]["modelId"] == "gpt-4o-mini" and costs[0]["costUsd"] > 0
    [artifact] = bundle["artifacts"]
    assert artifact["ref"] == attach["outputRef"] and artifact["verified"] is True
    assert set(artifact) == {"artifactId", "sha256", "size", "contentType", "ref", "verified"}
    assert bundle["approvals"] == []
    assert [(f["rating"], f["category"]) for f in bundle["feedback"]] == [(4, "accuracy")]
    assert [r["runId"] for r in bundle["subRuns"]] == ["run_rich_child"]
    assert bundle["integrity"]["ok"] is True
    names = [c["name"] for c in bundle["integrity"]["checks"]]
    assert names == ["dense_sequence", "event_ids", "artifact_hashes", "projections", "manifest_drift"]
    assert all(set(c) == {"name", "status", "detail"} and c["status"] == "pass" for c in bundle["integrity"]["checks"])
    assert bundle["replayReady"] == {"status": "pass", "missing": []}


def test_evidence_reports_a_tampered_artifact(api: httpx.Client, rich_run: str, workspace: Workspace) -> None:
    artifact = Artifact.objects.get(workspace=workspace)
    (Path(settings.ARTIFACTS_ROOT) / artifact.storage_key).write_bytes(b"tampered")
    bundle = api.get(f"{V1}/runs/{rich_run}/evidence").json()
    assert bundle["artifacts"][0]["verified"] is False
    assert bundle["integrity"]["ok"] is False
    assert {c["name"]: c["status"] for c in bundle["integrity"]["checks"]}["artifact_hashes"] == "fail"
    assert bundle["replayReady"]["status"] == "fail"


def test_replay_plan(api: httpx.Client, workspace: Workspace) -> None:
    append(workspace=workspace, run_id="run_crashed", events=_summarize_run(("openai", "gpt-4o"), finish=False))
    plan = api.get(f"{V1}/runs/run_crashed/replay-plan").json()
    assert set(plan) == {
        "runId",
        "steps",
        "completedStepPaths",
        "pendingStepPaths",
        "sessions",
        "integrity",
        "replayReady",
    }
    assert plan["runId"] == "run_crashed" and plan["pendingStepPaths"] == ["summarize"]
    assert plan["steps"][0]["shouldRun"] is True
    assert [c["action"] for c in plan["sessions"][0]["calls"]] == ["replay", "replay", "replay"]


# --- artifacts -----------------------------------------------------------------------------


def test_artifact_metadata_and_verified_content(api: httpx.Client, rich_run: str, workspace: Workspace) -> None:
    artifact = Artifact.objects.get(workspace=workspace)
    meta = api.get(f"{V1}/artifacts/{artifact.artifact_id}").json()
    assert meta["sha256"] == artifact.sha256 and meta["size"] == artifact.size
    assert meta["ref"] == f"artifact://{artifact.artifact_id}" and meta["contentType"] == "application/json"
    content = api.get(f"{V1}/artifacts/{artifact.artifact_id}/content")
    assert content.status_code == 200 and content.headers["content-type"] == "application/json"
    assert hashlib.sha256(content.content).hexdigest() == artifact.sha256
    assert json.loads(content.content) == {"blob": "x" * 300_000}
    assert content.headers["etag"] == f'"{artifact.sha256}"'
    binary = api.get(f"{V1}/artifacts/{artifact.artifact_id}/content", headers={"Accept": "application/octet-stream"})
    assert binary.status_code == 200 and binary.content == content.content
    error(api.get(f"{V1}/artifacts/art_{'0' * 64}"), 404, "not_found")
    error(api.get(f"{V1}/artifacts/not-an-id/content"), 404, "not_found")


def test_tampered_artifact_bytes_are_never_served(api: httpx.Client, rich_run: str, workspace: Workspace) -> None:
    artifact = Artifact.objects.get(workspace=workspace)
    (Path(settings.ARTIFACTS_ROOT) / artifact.storage_key).write_bytes(b'{"blob":"evil"}')
    response = api.get(f"{V1}/artifacts/{artifact.artifact_id}/content")
    assert error(response, 500, "integrity_failure")["artifactId"] == artifact.artifact_id
    assert b"evil" not in response.content
    (Path(settings.ARTIFACTS_ROOT) / artifact.storage_key).unlink()
    error(api.get(f"{V1}/artifacts/{artifact.artifact_id}/content"), 500, "integrity_failure")


# --- feedback ------------------------------------------------------------------------------


def test_feedback_with_an_ingest_key(api: httpx.Client, rich_run: str) -> None:
    response = api.post(f"{V1}/runs/{rich_run}/feedback", json={"rating": 5, "comment": "spot on"})
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["rating"] == 5 and body["comment"] == "spot on" and body["category"] is None
    assert body["runId"] == rich_run and body["author"]["type"] == "apiKey" and body["feedbackId"].startswith("fb_")
    for bad in ({"rating": 0}, {"rating": 6}, {"rating": "five"}, {}, {"rating": 3, "category": "x" * 101}):
        details = error(api.post(f"{V1}/runs/{rich_run}/feedback", json=bad), 400, "invalid_request")
        assert "fields" in details
    error(api.post(f"{V1}/runs/run_nope/feedback", json={"rating": 3}), 404, "not_found")


# --- the console session, from the browser side --------------------------------------------


def test_session_reads_and_writes_only_with_the_csrf_token(server: str, rich_run: str, viewer: User) -> None:
    browser = log_in(server, viewer)
    try:
        assert browser.get(f"{V1}/runs/{rich_run}").json()["runId"] == rich_run
        assert browser.get(f"{V1}/runs").status_code == 200
        url = f"{V1}/runs/{rich_run}/feedback"
        refused = browser.post(url, json={"rating": 2})
        assert error(refused, 403, "forbidden") == {}
        assert "CSRF" in refused.json()["error"]["message"]
        accepted = browser.post(url, json={"rating": 2}, headers={"X-CSRFToken": browser.cookies["csrftoken"]})
        assert accepted.status_code == 201, accepted.text
        assert accepted.json()["author"] == {"type": "member", "name": "dave"}
        # a viewer may rate but not append: appending stands in for the ingest scope (operator)
        step = {"events": [{"type": "custom.note", "payload": {}}]}
        error(
            browser.post(
                f"{V1}/runs/{rich_run}/events", json=step, headers={"X-CSRFToken": browser.cookies["csrftoken"]}
            ),
            403,
            "forbidden",
        )
    finally:
        browser.close()


def test_session_outsider_gets_404(server: str, rich_run: str, workspace: Workspace, outsider: User) -> None:
    browser = log_in(server, outsider)
    try:
        csrf = {"X-CSRFToken": browser.cookies["csrftoken"]}
        for method, url, body in _every_route(rich_run, _artifact_id(workspace)):
            response = browser.request(method, url, json=body, headers=csrf)
            if url.endswith("/usage") or url.endswith("/runs"):
                assert response.status_code == 200 and rich_run not in response.text
            elif url.endswith("/events") and method == "POST":
                error(response, 409, "run_not_started")  # in globex/main this id is simply unused
            else:
                error(response, 404, "not_found")
    finally:
        browser.close()


# --- usage ---------------------------------------------------------------------------------


@pytest.fixture
def usage_runs(workspace: Workspace) -> None:
    research = bootstrap(tenant="acme", workspace="research")
    append(workspace=workspace, run_id="run_u1", events=_summarize_run(("openai", "gpt-4o-mini"), finish=True))
    append(workspace=workspace, run_id="run_u2", events=_summarize_run(("acme.chat", "house"), finish=True))
    append(workspace=research, run_id="run_u3", events=_summarize_run(("openai", "gpt-4o"), finish=True))


def test_usage_grouped_by_model_day_workflow_and_workspace(api: httpx.Client, usage_runs: None) -> None:
    by_model = api.get(f"{V1}/usage?groupBy=model").json()
    assert set(by_model) == {"rows", "total", "next"}
    rows = {r["key"]: r for r in by_model["rows"]}
    assert list(rows) == ["acme.chat/house", "openai/gpt-4o-mini"]  # ordered by key; research not included
    assert rows["acme.chat/house"]["costUsd"] is None and rows["acme.chat/house"]["unpricedCalls"] == 2
    priced = rows["openai/gpt-4o-mini"]
    assert set(priced) == {"key"} | USAGE_FIELDS
    assert priced["pricedCalls"] == 2 and priced["inputTokens"] == 2800 and priced["cachedInputTokens"] == 2000
    expected = ((1200 - 800) * 0.15 + 800 * 0.075 + 150 * 0.6 + (1600 - 1200) * 0.15 + 1200 * 0.075 + 220 * 0.6) / 1e6
    assert priced["costUsd"] == pytest.approx(expected)
    total = by_model["total"]
    assert total["pricedCalls"] == 2 and total["unpricedCalls"] == 2 and total["costUsd"] == pytest.approx(expected)
    assert total["inputTokens"] == 5600

    [today] = api.get(f"{V1}/usage?groupBy=day").json()["rows"]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", today["key"]) and today["pricedCalls"] + today["unpricedCalls"] == 4
    workflows = api.get(f"{V1}/usage?groupBy=workflow").json()["rows"]
    assert [w["key"] for w in workflows] == ["wfver_support_summarize"]
    assert [w["key"] for w in api.get(f"{V1}/usage?groupBy=workspace").json()["rows"]] == ["acme/support"]

    day = today["key"]
    empty = api.get(f"{V1}/usage", params={"from": "2001-01-01", "to": "2001-01-31"}).json()
    assert empty["rows"] == [] and empty["total"]["costUsd"] == 0 and empty["total"]["pricedCalls"] == 0
    assert len(api.get(f"{V1}/usage", params={"from": day, "to": day}).json()["rows"]) == 1
    paged = api.get(f"{V1}/usage?groupBy=model&limit=1").json()
    assert len(paged["rows"]) == 1 and paged["next"]
    rest = api.get(f"{V1}/usage", params={"groupBy": "model", "limit": 1, "cursor": paged["next"]}).json()
    assert [r["key"] for r in paged["rows"] + rest["rows"]] == list(rows) and rest["next"] is None


def test_usage_as_csv(api: httpx.Client, usage_runs: None) -> None:
    response = api.get(f"{V1}/usage?groupBy=model&format=csv")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
    assert "attachment" in response.headers["content-disposition"]
    lines = response.text.splitlines()
    assert (
        lines[0] == "key,inputTokens,outputTokens,cachedInputTokens,reasoningTokens,costUsd,pricedCalls,unpricedCalls"
    )
    assert lines[1] == "acme.chat/house,2800,370,2000,0,,0,2"
    key, *numbers = lines[2].split(",")
    json_row = api.get(f"{V1}/usage?groupBy=model").json()["rows"][1]
    assert key == "openai/gpt-4o-mini" and float(numbers[4]) == pytest.approx(json_row["costUsd"])
    assert api.get(f"{V1}/usage?groupBy=model", headers={"Accept": "text/csv"}).text == response.text


def test_usage_bad_parameters_are_400(api: httpx.Client) -> None:
    for query in (
        "groupBy=year",
        "from=2026-13-01",
        "to=yesterday",
        "from=2026-02-02&to=2026-02-01",
        "scope=galaxy",
        "format=xml",
        "from=20260101",
    ):
        error(api.get(f"{V1}/usage?{query}"), 400, "invalid_parameter")


def test_usage_across_the_tenant_is_for_admins_in_a_session(
    server: str, api: httpx.Client, usage_runs: None, admin: User, viewer: User
) -> None:
    error(api.get(f"{V1}/usage?scope=tenant"), 403, "forbidden")
    as_admin, as_viewer = log_in(server, admin), log_in(server, viewer)
    try:
        rows = as_admin.get(f"{V1}/usage?scope=tenant&groupBy=workspace").json()["rows"]
        assert [r["key"] for r in rows] == ["acme/research", "acme/support"]
        error(as_viewer.get(f"{V1}/usage?scope=tenant"), 403, "forbidden")
        # without scope=tenant a member with two workspaces names one
        error(as_viewer.get(f"{V1}/usage"), 400, "workspace_required")
        mine = as_viewer.get(f"{V1}/usage?groupBy=workspace&workspace=acme/research").json()["rows"]
        assert [r["key"] for r in mine] == ["acme/research"]
    finally:
        as_admin.close()
        as_viewer.close()


# --- the schema ----------------------------------------------------------------------------


def test_schema_documents_every_route_and_its_errors(api: httpx.Client) -> None:
    response = api.get("/api/schema/", headers={"Accept": "application/json"})
    assert response.status_code == 200
    paths = response.json()["paths"]
    for route, method in [
        ("/api/v1/runs/{runId}/events", "post"),
        ("/api/v1/runs/{runId}/events", "get"),
        ("/api/v1/runs", "get"),
        ("/api/v1/runs/{runId}", "get"),
        ("/api/v1/runs/{runId}/children", "get"),
        ("/api/v1/runs/{runId}/evidence", "get"),
        ("/api/v1/runs/{runId}/replay-plan", "get"),
        ("/api/v1/runs/{runId}/feedback", "post"),
        ("/api/v1/artifacts/{artifactId}", "get"),
        ("/api/v1/artifacts/{artifactId}/content", "get"),
        ("/api/v1/usage", "get"),
    ]:
        operation = paths[route][method]
        assert "401" in operation["responses"], route
        assert any(code.startswith("2") for code in operation["responses"]), route
    append_errors = paths["/api/v1/runs/{runId}/events"]["post"]["responses"]
    assert {"400", "401", "403", "409", "413"} <= set(append_errors)
    assert "sequence_conflict" in append_errors["409"]["description"]
