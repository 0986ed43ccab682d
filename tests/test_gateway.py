"""The tool gateway over real HTTP: a live server, httpx, and a clock the tests move by hand."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection, transaction

from ledger.log.artifacts import get_by_ref
from ledger.models import Event, Run, ToolCall, ToolGatewayClaim, Workspace
from ledger.tenancy.services import create_key
from tests.conftest import FakeClock, log_in, started
from tests.runtime_support import round_trips

# Every test runs on the fake clock (conftest), which the live server's thread reads too.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("clock")]

RUN = "run_tools"
BASE = f"/api/v1/runs/{RUN}/tool-calls"


@pytest.fixture
def run(append: Callable[..., Any]) -> str:
    append(RUN, started())
    return RUN


def _key_client(live_server: Any, workspace: Workspace, scopes: list[str]) -> httpx.Client:
    _, key = create_key(workspace=workspace, scopes=scopes)
    return httpx.Client(base_url=live_server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


@pytest.fixture
def api(live_server: Any, workspace: Workspace) -> Iterator[httpx.Client]:
    with _key_client(live_server, workspace, ["ingest", "read"]) as client:
        yield client


@pytest.fixture
def foreign_api(live_server: Any, other_workspace: Workspace) -> Iterator[httpx.Client]:
    with _key_client(live_server, other_workspace, ["ingest", "read", "execute"]) as client:
        yield client


@pytest.fixture
def operator_session(live_server: Any, operator: User) -> Iterator[httpx.Client]:
    client = log_in(live_server.url, operator, send_csrf=True)
    yield client
    client.close()


@pytest.fixture
def viewer_session(live_server: Any, viewer: User) -> Iterator[httpx.Client]:
    client = log_in(live_server.url, viewer, send_csrf=True)
    yield client
    client.close()


def claim_body(**overrides: Any) -> dict[str, Any]:
    return {
        "callId": "call_1",
        "toolName": "search",
        "args": {"q": "runledger"},
        "idempotencyKey": "k1",
        "effect": "write",
        "owner": "worker-1",
        **overrides,
    }


def _claim(api: httpx.Client, **overrides: Any) -> httpx.Response:
    return api.post(BASE, json=claim_body(**overrides))


def _claimed(api: httpx.Client, **overrides: Any) -> dict[str, Any]:
    response = _claim(api, **overrides)
    assert response.status_code == 201, response.text
    return response.json()


def _post(api: httpx.Client, call_id: str, action: str, body: dict[str, Any]) -> httpx.Response:
    return api.post(f"{BASE}/{call_id}/{action}", json=body)


def _error_code(response: httpx.Response) -> str:
    return response.json()["error"]["code"]


def _events(type_prefix: str = "harness.tool_call.") -> list[dict[str, Any]]:
    rows = Event.objects.filter(run__run_id=RUN, type__startswith=type_prefix).order_by("sequence")
    return [{"type": e.type, **json.loads(e.payload)} for e in rows]


def _event_count() -> int:
    return Event.objects.filter(run__run_id=RUN).count()


def _verify_passes() -> None:
    out = io.StringIO()
    call_command("ledger", "verify", RUN, "--workspace", "acme/support", stdout=out)  # exits 1 on failure
    assert "ok" in out.getvalue(), out.getvalue()


def _in_doubt(api: httpx.Client, clock: FakeClock, **overrides: Any) -> str:
    lease = _claimed(api, **overrides)
    call_id = lease["callId"]
    assert _post(api, call_id, "outbound", {"leaseToken": lease["leaseToken"]}).status_code == 200
    clock.advance(61)
    response = _claim(api, **{**overrides, "owner": "worker-2"})
    assert response.status_code == 409 and _error_code(response) == "tool_call_in_doubt"
    return call_id


# --- the three identity outcomes of a claim --------------------------------------------------


def test_a_new_call_is_claimed_with_a_lease_and_a_started_event(api: httpx.Client, run: str, clock: FakeClock) -> None:
    body = _claimed(api)
    assert body["status"] == "claimed" and body["attempt"] == 1 and body["callId"] == "call_1"
    assert body["leaseToken"]
    assert datetime.fromisoformat(body["leaseExpiresAt"]) == clock.moment + timedelta(seconds=60)
    [event] = _events()
    assert event == {
        "type": "harness.tool_call.started",
        "callId": "call_1",
        "caller": "gateway",
        "toolName": "search",
        "args": {"q": "runledger"},
        "effect": "write",
        "attempt": 1,
        "owner": "worker-1",
        "idempotencyKey": "k1",
    }


def test_the_lease_widens_to_the_tool_timeout_plus_ten_seconds(api: httpx.Client, run: str, clock: FakeClock) -> None:
    short = _claimed(api, callId="call_short", idempotencyKey="short", timeoutS=5)
    long = _claimed(api, callId="call_long", idempotencyKey="long", timeoutS=120)
    assert datetime.fromisoformat(short["leaseExpiresAt"]) == clock.moment + timedelta(seconds=60)
    assert datetime.fromisoformat(long["leaseExpiresAt"]) == clock.moment + timedelta(seconds=130)


def test_same_key_and_args_after_completion_replays_the_result_and_appends_nothing(api: httpx.Client, run: str) -> None:
    lease = _claimed(api)
    _post(api, "call_1", "outbound", {"leaseToken": lease["leaseToken"]})
    done = _post(api, "call_1", "complete", {"leaseToken": lease["leaseToken"], "result": {"hits": 3}})
    assert done.status_code == 200 and done.json()["status"] == "succeeded"
    events_before = _event_count()

    # A harness retrying after a crash, even under a fresh callId, gets the recorded answer.
    for call_id in ("call_1", "call_1_retry"):
        replay = _claim(api, callId=call_id, owner="worker-9")
        assert replay.status_code == 200, replay.text
        assert replay.json() == {
            "status": "succeeded",
            "callId": "call_1",
            "attempt": 1,
            "result": {"hits": 3},
            "durationMs": replay.json()["durationMs"],
            "reconciled": False,
            "idempotentReplay": True,
        }
    assert _event_count() == events_before
    assert ToolGatewayClaim.objects.count() == 1


def test_a_failed_call_replays_its_error(api: httpx.Client, run: str) -> None:
    lease = _claimed(api)
    _post(api, "call_1", "complete", {"leaseToken": lease["leaseToken"], "error": {"message": "503"}})
    replay = _claim(api)
    assert replay.status_code == 200
    assert replay.json()["status"] == "failed" and replay.json()["error"] == {"message": "503"}
    assert "result" not in replay.json()
    assert _events()[-1]["type"] == "harness.tool_call.failed"


def test_same_key_other_args_or_tool_is_an_idempotency_conflict(api: httpx.Client, run: str) -> None:
    lease = _claimed(api)
    _post(api, "call_1", "complete", {"leaseToken": lease["leaseToken"], "result": "ok"})
    events_before = _event_count()
    for overrides in ({"args": {"q": "other"}}, {"toolName": "fetch"}, {"callId": "call_2", "args": {"q": "x"}}):
        response = _claim(api, **overrides)
        assert response.status_code == 409 and _error_code(response) == "idempotency_conflict", overrides
    # The same callId under another key is refused too: a callId names one call.
    response = _claim(api, idempotencyKey="k2")
    assert response.status_code == 409 and _error_code(response) == "idempotency_conflict"
    assert _event_count() == events_before


def test_secrets_in_args_are_redacted_before_storage_and_digest(api: httpx.Client, run: str) -> None:
    _claimed(api, args={"q": "x", "api_key": "sk-live-123"})
    assert _events()[0]["args"] == {"q": "x", "api_key": "[REDACTED]"}
    assert ToolGatewayClaim.objects.get().args == {"q": "x", "api_key": "[REDACTED]"}
    assert b"sk-live-123" not in json.dumps(api.get(BASE).json()).encode()


# --- leases ----------------------------------------------------------------------------------


def test_a_live_lease_of_another_owner_is_in_progress(api: httpx.Client, run: str) -> None:
    lease = _claimed(api)
    response = _claim(api, owner="worker-2")
    assert response.status_code == 409 and _error_code(response) == "tool_call_in_progress"
    # Its expiry written as every moment of an answer is (docs/api.md § Conventions): UTC with Z.
    until = response.json()["error"]["details"]["leaseExpiresAt"]
    assert until == lease["leaseExpiresAt"] and until.endswith("Z"), until
    # The holder repeating its claim gets the same lease back; nothing new is written.
    again = _claim(api)
    assert again.status_code == 201 and again.json()["leaseToken"] == lease["leaseToken"]
    assert len(_events()) == 1


def test_two_racing_claimers_of_one_call_get_one_lease(api: httpx.Client, run: str) -> None:
    barrier = threading.Barrier(2)
    answers: list[httpx.Response] = []

    def claimer(owner: str) -> None:
        barrier.wait()
        answers.append(_claim(api, owner=owner))

    threads = [threading.Thread(target=claimer, args=(f"worker-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in answers) == [201, 409]
    assert [_error_code(r) for r in answers if r.status_code == 409] == ["tool_call_in_progress"]
    assert len(_events()) == 1 and ToolGatewayClaim.objects.count() == 1


def test_an_expired_lease_without_outbound_is_claimed_again_as_attempt_2(
    api: httpx.Client, run: str, clock: FakeClock
) -> None:
    first = _claimed(api)
    clock.advance(61)
    second = _claimed(api, owner="worker-2")
    assert second["attempt"] == 2 and second["leaseToken"] != first["leaseToken"]
    assert [e["attempt"] for e in _events()] == [1, 2]

    stale = _post(api, "call_1", "complete", {"leaseToken": first["leaseToken"], "result": "late"})
    assert stale.status_code == 409 and _error_code(stale) == "lease_lost"
    done = _post(api, "call_1", "complete", {"leaseToken": second["leaseToken"], "result": "ok"})
    assert done.status_code == 200 and done.json()["attempt"] == 2
    _verify_passes()
    assert ToolCall.objects.get(call_id="call_1").status == "succeeded"


def test_an_expired_lease_after_outbound_is_in_doubt_and_never_retried(
    api: httpx.Client, run: str, clock: FakeClock
) -> None:
    lease = _claimed(api)
    assert _post(api, "call_1", "outbound", {"leaseToken": lease["leaseToken"]}).json()["outboundAt"]
    clock.advance(61)
    for owner in ("worker-2", "worker-3"):
        response = _claim(api, owner=owner)
        assert response.status_code == 409 and _error_code(response) == "tool_call_in_doubt"
    # The original worker, back from a pause, cannot complete it either.
    late = _post(api, "call_1", "complete", {"leaseToken": lease["leaseToken"], "result": "late"})
    assert late.status_code == 409 and _error_code(late) == "lease_lost"
    assert late.json()["error"]["details"]["status"] == "in_doubt"

    assert [e["type"] for e in _events()] == ["harness.tool_call.started", "harness.tool_call.in_doubt"]
    assert _events()[1]["callId"] == "call_1"
    [row] = api.get(BASE).json()["toolCalls"]
    assert row["status"] == "in_doubt" and row["attempt"] == 1 and row["outboundAt"]
    assert ToolCall.objects.get(call_id="call_1").status == "in_doubt"
    _verify_passes()


def test_complete_with_a_stale_or_foreign_token_is_lease_lost(api: httpx.Client, run: str, clock: FakeClock) -> None:
    lease = _claimed(api)
    wrong = _post(api, "call_1", "complete", {"leaseToken": "not-the-token", "result": 1})
    assert wrong.status_code == 409 and _error_code(wrong) == "lease_lost"
    clock.advance(61)
    expired = _post(api, "call_1", "complete", {"leaseToken": lease["leaseToken"], "result": 1})
    assert expired.status_code == 409 and _error_code(expired) == "lease_lost"
    assert _post(api, "call_1", "outbound", {"leaseToken": lease["leaseToken"]}).status_code == 409
    assert [e["type"] for e in _events()] == ["harness.tool_call.started"]


def test_the_holder_repeating_its_complete_gets_the_same_answer(api: httpx.Client, run: str) -> None:
    lease = _claimed(api)
    body = {"leaseToken": lease["leaseToken"], "result": {"ok": True}}
    assert _post(api, "call_1", "complete", body).json()["idempotentReplay"] is False
    again = _post(api, "call_1", "complete", body)
    assert again.status_code == 200 and again.json()["idempotentReplay"] is True
    other = _post(api, "call_1", "complete", {**body, "result": {"ok": False}})
    assert other.status_code == 409 and _error_code(other) == "lease_lost"
    assert [e["type"] for e in _events()] == ["harness.tool_call.started", "harness.tool_call.succeeded"]


# --- reconcile -------------------------------------------------------------------------------


def test_an_operator_session_reconciles_a_call_in_doubt(
    api: httpx.Client, operator_session: httpx.Client, viewer_session: httpx.Client, run: str, clock: FakeClock
) -> None:
    call_id = _in_doubt(api, clock)
    body = {"outcome": "succeeded", "result": {"charged": True}, "note": "the provider's dashboard shows the charge"}

    as_viewer = _post(viewer_session, call_id, "reconcile", body)
    assert as_viewer.status_code == 403
    as_key = _post(api, call_id, "reconcile", body)
    assert as_key.status_code == 403 and _error_code(as_key) == "forbidden"

    done = _post(operator_session, call_id, "reconcile", body)
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "succeeded" and done.json()["reconciled"] is True
    reconciled = _events()[-1]
    assert reconciled == {
        "type": "harness.tool_call.reconciled",
        "callId": call_id,
        "outcome": "succeeded",
        "result": {"charged": True},
        "note": body["note"],
        "by": "carol",
        "attempt": 1,
    }

    again = _post(operator_session, call_id, "reconcile", body)
    assert again.status_code == 409 and _error_code(again) == "tool_call_not_in_doubt"
    replay = _claim(api, owner="worker-3")
    assert replay.status_code == 200 and replay.json()["result"] == {"charged": True}
    assert replay.json()["reconciled"] is True and replay.json()["idempotentReplay"] is True
    projected = ToolCall.objects.get(call_id=call_id)
    assert projected.status == "succeeded" and projected.reconciled
    _verify_passes()


def test_reconcile_as_failed_records_the_error(
    api: httpx.Client, operator_session: httpx.Client, run: str, clock: FakeClock
) -> None:
    call_id = _in_doubt(api, clock)
    done = _post(
        operator_session,
        call_id,
        "reconcile",
        {"outcome": "failed", "error": {"message": "never arrived"}, "note": "no trace on the provider side"},
    )
    assert done.status_code == 200 and done.json()["error"] == {"message": "never arrived"}
    replay = _claim(api)
    assert replay.status_code == 200 and replay.json()["status"] == "failed"
    _verify_passes()


def test_reconcile_works_only_from_in_doubt(api: httpx.Client, operator_session: httpx.Client, run: str) -> None:
    _claimed(api)
    response = _post(operator_session, "call_1", "reconcile", {"outcome": "failed", "note": "looks stuck"})
    assert response.status_code == 409 and _error_code(response) == "tool_call_not_in_doubt"
    assert response.json()["error"]["details"]["status"] == "claimed"
    bad = _post(operator_session, "call_1", "reconcile", {"outcome": "succeeded", "error": "x", "note": "n"})
    assert bad.status_code == 400 and _error_code(bad) == "invalid_request"


def test_a_lease_that_ran_out_after_outbound_can_be_reconciled_directly(
    api: httpx.Client, operator_session: httpx.Client, run: str, clock: FakeClock
) -> None:
    lease = _claimed(api)
    _post(api, "call_1", "outbound", {"leaseToken": lease["leaseToken"]})
    clock.advance(61)
    done = _post(operator_session, "call_1", "reconcile", {"outcome": "succeeded", "result": 1, "note": "seen"})
    assert done.status_code == 200
    assert [e["type"] for e in _events()][-2:] == ["harness.tool_call.in_doubt", "harness.tool_call.reconciled"]
    _verify_passes()


# --- large results ---------------------------------------------------------------------------


def _complete_large(api: httpx.Client, call_id: str, key: str, text: str) -> str:
    lease = _claimed(api, callId=call_id, idempotencyKey=key)
    done = _post(api, call_id, "complete", {"leaseToken": lease["leaseToken"], "result": {"text": text}})
    assert done.status_code == 200, done.text
    row = next(r for r in api.get(BASE).json()["toolCalls"] if r["callId"] == call_id)
    assert row["result"] is None and row["resultRef"].startswith("artifact://art_")
    return row["resultRef"]


def test_a_large_result_is_kept_as_an_artifact_and_served_back_on_replay(
    api: httpx.Client, workspace: Workspace, run: str
) -> None:
    text = "x" * 9000
    ref = _complete_large(api, "call_big", "big", text)
    assert get_by_ref(workspace, ref).size > 8192
    replay = _claim(api, callId="call_big", idempotencyKey="big")
    assert replay.status_code == 200 and replay.json()["result"] == {"text": text}
    assert ToolCall.objects.get(call_id="call_big").result == {"text": text}  # the log has it too
    _verify_passes()


def test_a_tampered_result_artifact_is_not_served(api: httpx.Client, workspace: Workspace, run: str) -> None:
    ref = _complete_large(api, "call_big", "big", "y" * 9000)
    path = settings.ARTIFACTS_ROOT / get_by_ref(workspace, ref).storage_key
    path.write_bytes(path.read_bytes().replace(b"yyyy", b"zzzz", 1))
    replay = _claim(api, callId="call_big", idempotencyKey="big")
    assert replay.status_code == 500 and _error_code(replay) == "integrity_failure"
    assert "zzzz" not in replay.text


@pytest.mark.parametrize("gone", ["file", "row"])
def test_a_missing_result_artifact_is_an_integrity_failure_naming_it(
    api: httpx.Client, workspace: Workspace, run: str, gone: str
) -> None:
    # Missing, like changed, is the store that is wrong, not the caller's request: never a 404.
    ref = _complete_large(api, "call_big", "big", "m" * 9000)
    artifact = get_by_ref(workspace, ref)
    if gone == "file":
        (settings.ARTIFACTS_ROOT / artifact.storage_key).unlink()
    else:
        artifact.delete()  # the row names it; the workspace no longer holds it

    replay = _claim(api, callId="call_big", idempotencyKey="big")

    assert replay.status_code == 500, replay.text
    error = replay.json()["error"]
    assert error["code"] == "integrity_failure" and error["details"] == {"callId": "call_big", "ref": ref}
    assert artifact.artifact_id in error["message"] and "tool call call_big" in error["message"]
    assert api.get(BASE).json()["toolCalls"][0]["resultRef"] == ref  # the list reads no artifact


def test_a_result_artifact_of_another_call_is_not_served(api: httpx.Client, run: str) -> None:
    _complete_large(api, "call_a", "a", "a" * 9000)
    other_ref = _complete_large(api, "call_b", "b", "b" * 9000)
    ToolGatewayClaim.objects.filter(call_id="call_a").update(outcome_ref=other_ref)
    replay = _claim(api, callId="call_a", idempotencyKey="a")
    assert replay.status_code == 500 and _error_code(replay) == "integrity_failure"
    assert "b" * 64 not in replay.text


# --- the log ---------------------------------------------------------------------------------


def test_the_gateway_events_are_in_the_log_and_verify_passes(
    api: httpx.Client, operator_session: httpx.Client, run: str, clock: FakeClock
) -> None:
    lease = _claimed(api, callId="call_ok", idempotencyKey="ok", turn=1)
    _post(api, "call_ok", "complete", {"leaseToken": lease["leaseToken"], "result": [1, 2]})
    _claimed(api, callId="call_retry", idempotencyKey="retry")
    clock.advance(61)
    again = _claimed(api, callId="call_retry", idempotencyKey="retry", owner="worker-2")
    _post(api, "call_retry", "complete", {"leaseToken": again["leaseToken"], "error": "boom"})
    doubtful = _in_doubt(api, clock, callId="call_doubt", idempotencyKey="doubt")
    _post(operator_session, doubtful, "reconcile", {"outcome": "failed", "error": "gone", "note": "checked"})

    types = [e["type"].rpartition(".")[2] for e in _events()]
    assert types == ["started", "succeeded", "started", "started", "failed", "started", "in_doubt", "reconciled"]
    sequences = list(Event.objects.filter(run__run_id=RUN).order_by("sequence").values_list("sequence", flat=True))
    assert sequences == list(range(1, len(sequences) + 1))
    assert Run.objects.get(run_id=RUN).last_sequence == len(sequences)
    projected = {c.call_id: (c.status, c.reconciled) for c in ToolCall.objects.filter(run__run_id=RUN)}
    assert projected == {
        "call_ok": ("succeeded", False),
        "call_retry": ("failed", False),
        "call_doubt": ("failed", True),
    }
    _verify_passes()


def test_a_finished_run_still_replays_but_refuses_new_calls(
    api: httpx.Client, append: Callable[..., Any], run: str
) -> None:
    lease = _claimed(api)
    _post(api, "call_1", "complete", {"leaseToken": lease["leaseToken"], "result": "ok"})
    append(RUN, {"type": "RunCompleted", "payload": {}})
    assert _claim(api).status_code == 200
    fresh = _claim(api, callId="call_2", idempotencyKey="k2")
    assert fresh.status_code == 409 and _error_code(fresh) == "run_finished"
    assert not ToolGatewayClaim.objects.filter(call_id="call_2").exists()  # rolled back with the append


# --- listing, input, auth and tenancy --------------------------------------------------------


def test_the_list_pages_with_a_cursor_and_never_shows_lease_tokens(api: httpx.Client, run: str) -> None:
    tokens = [_claimed(api, callId=f"call_{i}", idempotencyKey=f"k{i}")["leaseToken"] for i in range(3)]
    first = api.get(BASE, params={"limit": 2}).json()
    assert [r["callId"] for r in first["toolCalls"]] == ["call_0", "call_1"] and first["next"]
    second = api.get(BASE, params={"limit": 2, "cursor": first["next"]}).json()
    assert [r["callId"] for r in second["toolCalls"]] == ["call_2"] and second["next"] is None
    assert not any(t in json.dumps([first, second]) for t in tokens)
    assert api.get(BASE, params={"cursor": "garbage!"}).status_code == 400
    assert api.get(BASE, params={"status": "in_doubt"}).json() == {"toolCalls": [], "next": None}


def test_bad_input_is_a_400_envelope(api: httpx.Client, run: str) -> None:
    for body in (
        {**claim_body(), "effect": "delete"},
        {**claim_body(), "callId": "a/b"},
        {k: v for k, v in claim_body().items() if k != "owner"},
        {**claim_body(), "timeoutS": -1},
    ):
        response = api.post(BASE, json=body)
        assert response.status_code == 400 and _error_code(response) == "invalid_request", body
    lease = _claimed(api)
    both = _post(api, "call_1", "complete", {"leaseToken": lease["leaseToken"], "result": 1, "error": 2})
    assert both.status_code == 400 and _error_code(both) == "invalid_request"
    bad_run = api.post("/api/v1/runs/not-a-run/tool-calls", json=claim_body())
    assert bad_run.status_code == 400 and _error_code(bad_run) == "invalid_run_id"
    missing = api.post("/api/v1/runs/run_missing/tool-calls", json=claim_body())
    assert missing.status_code == 404 and _error_code(missing) == "not_found"
    unknown_call = _post(api, "call_nope", "outbound", {"leaseToken": "x"})
    assert unknown_call.status_code == 404


def test_credentials_and_scopes_are_checked(live_server: Any, workspace: Workspace, run: str) -> None:
    with httpx.Client(base_url=live_server.url) as anonymous:
        assert anonymous.post(BASE, json=claim_body()).status_code == 401
        assert anonymous.get(BASE).status_code == 401
    with _key_client(live_server, workspace, ["read"]) as reader:
        response = reader.post(BASE, json=claim_body())
        assert response.status_code == 403 and _error_code(response) == "insufficient_scope"
        assert reader.get(BASE).status_code == 200


def test_another_tenant_gets_404_on_every_route(
    api: httpx.Client, foreign_api: httpx.Client, live_server: Any, outsider: User, run: str, clock: FakeClock
) -> None:
    call_id = _in_doubt(api, clock)
    lease = _claimed(api, callId="call_live", idempotencyKey="live")
    probes = [
        foreign_api.post(BASE, json=claim_body(callId="call_x", idempotencyKey="x")),
        foreign_api.get(BASE),
        _post(foreign_api, "call_live", "outbound", {"leaseToken": lease["leaseToken"]}),
        _post(foreign_api, "call_live", "complete", {"leaseToken": lease["leaseToken"], "result": 1}),
    ]
    outsider_session = log_in(live_server.url, outsider, send_csrf=True)
    probes.append(_post(outsider_session, call_id, "reconcile", {"outcome": "failed", "note": "mine now"}))
    probes.append(outsider_session.get(BASE))
    outsider_session.close()
    assert [p.status_code for p in probes] == [404] * len(probes)
    assert all(_error_code(p) == "not_found" for p in probes)
    assert not any(re.search(r"call_live|call_1|search", p.text) for p in probes)
    assert ToolGatewayClaim.objects.get(call_id="call_live").outbound_at is None
    assert ToolGatewayClaim.objects.get(call_id=call_id).status == "in_doubt"


def test_settling_expired_claims_writes_calls_in_doubt_once_and_leaves_live_ones(
    api: httpx.Client, run: str, clock: FakeClock, workspace: Workspace
) -> None:
    from ledger.replay.gateway import settle_expired_claims

    out = _claimed(api)
    assert _post(api, out["callId"], "outbound", {"leaseToken": out["leaseToken"]}).status_code == 200
    _claimed(api, callId="call_2", idempotencyKey="k2", args={"q": "not sent yet"})
    clock.advance(30)
    assert settle_expired_claims(workspace=workspace, run_id=RUN) == []
    clock.advance(31)
    assert settle_expired_claims(workspace=workspace, run_id=RUN) == ["call_1"]
    assert settle_expired_claims(workspace=workspace, run_id=RUN) == []
    assert [e["callId"] for e in _events("harness.tool_call.in_doubt")] == ["call_1"]
    assert ToolGatewayClaim.objects.get(call_id="call_2").status == "claimed"
    _verify_passes()


# --- runtime_batch: the runtime's one-commit form (service level, no HTTP) ---------------------


def _claim_kwargs(call_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "call_id": call_id,
        "tool_name": "lookup",
        "args": {"q": call_id},
        "effect": "read",
        "owner": "rt",
        "idempotency_key": f"k-{call_id}",
        "timeout_s": None,
        "caller": "model",
        "turn": 1,
        "step_path": "agent",
        **extra,
    }


def _log(workspace: Workspace, run_id: str = RUN) -> list[Event]:
    return list(Event.objects.filter(run__workspace=workspace, run__run_id=run_id).order_by("sequence"))


# `held` (the claim the caller got) lets the completion skip reading the row: both ways answer alike.
@pytest.mark.parametrize("held", [True, False], ids=["held", "read"])
def test_runtime_batch_commits_an_outcome_events_and_an_outbound_claim_in_one_append(
    workspace: Workspace, run: str, clock: FakeClock, held: bool
) -> None:
    from ledger.replay import gateway

    first = gateway.runtime_batch(workspace=workspace, run_id=run, claim=_claim_kwargs("c1"))
    assert isinstance(first.claimed, gateway.Claimed) and first.last_sequence == 2
    assert ToolGatewayClaim.objects.get(call_id="c1").outbound_at == clock.now()  # outbound in the same commit
    assert first.claimed.outbound_at == clock.now()
    clock.advance(2)

    done = gateway.runtime_batch(
        workspace=workspace,
        run_id=run,
        complete={
            "call_id": "c1",
            "lease_token": first.claimed.lease_token,
            "outcome": "result",
            "value": gateway.prepare_outcome(workspace, "result", {"n": 1}),
            "step_path": "agent",
            **({"held": first.claimed} if held else {}),
        },
        events=[{"type": "custom.note", "payload": {"between": True}}],
        claim=_claim_kwargs("c2"),
    )

    assert done.completed is not None and done.completed.status == "succeeded" and done.completed.duration_ms == 2000
    row = ToolGatewayClaim.objects.get(call_id="c1")
    assert (row.status, row.result, row.duration_ms, row.finished_at) == ("succeeded", {"n": 1}, 2000, clock.now())
    assert row.outcome_digest and row.outcome_ref == ""
    assert isinstance(done.claimed, gateway.Claimed) and done.last_sequence == 5
    log = _log(workspace)
    assert [e.type for e in log[2:]] == ["harness.tool_call.succeeded", "custom.note", "harness.tool_call.started"]
    assert len({e.recorded_at for e in log[2:]}) == 1  # one append, one transaction
    assert Run.objects.get(run_id=run).last_sequence == 5
    assert ToolCall.objects.get(call_id="c1").status == "succeeded"


def _xmin(sql: str, *params: Any) -> str:
    """The transaction that wrote the row `sql` selects (PostgreSQL's xmin)."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return str(cursor.fetchone()[0])


def test_runtime_batch_writes_a_claim_or_a_completion_with_its_events_in_one_round_trip(
    workspace: Workspace, run: str, clock: FakeClock
) -> None:
    """PostgreSQL: the control row rides in the append's statement (no BEGIN, no head lock, no
    separate row statement, no COMMIT of its own): one round trip once the statement's shape is
    prepared (the first call of a shape on a connection adds the Parse's), and the row and its
    events carry one transaction id. Elsewhere the locked way writes the same rows and events."""
    from ledger.replay import gateway

    def claim_and_complete(call_id: str) -> tuple[gateway.Batch, gateway.Batch, list[int], list[int]]:
        with round_trips() as claim_trips:
            claimed = gateway.runtime_batch(
                workspace=workspace,
                run_id=run,
                claim=_claim_kwargs(call_id),
                events=[{"type": "custom.note", "payload": {"before": call_id}}],
            )
        assert isinstance(claimed.claimed, gateway.Claimed)
        if connection.vendor == "postgresql":  # the row and the started event: one transaction
            assert _xmin(f"SELECT xmin FROM ledger_toolgatewayclaim WHERE call_id = '{call_id}'") == _xmin(
                "SELECT xmin FROM ledger_event WHERE sequence = %s", claimed.last_sequence
            )
        clock.advance(1)
        with round_trips() as complete_trips:
            done = gateway.runtime_batch(
                workspace=workspace,
                run_id=run,
                events=[{"type": "custom.note", "payload": {"after": call_id}}],
                complete={
                    "call_id": call_id,
                    "lease_token": claimed.claimed.lease_token,
                    "held": claimed.claimed,
                    "outcome": "result",
                    "value": gateway.prepare_outcome(workspace, "result", {"n": 1}),
                    "step_path": "agent",
                },
            )
        return claimed, done, claim_trips, complete_trips

    claim_and_complete("c0")  # prepares the two shapes on this connection
    first, done, claim_trips, complete_trips = claim_and_complete("c1")

    assert first.last_sequence == 7 and done.last_sequence == 9
    assert done.completed is not None and done.completed.duration_ms == 1000
    assert [e.type for e in _log(workspace)][5:] == [
        "custom.note",
        "harness.tool_call.started",
        "harness.tool_call.succeeded",
        "custom.note",
    ]
    assert isinstance(first.claimed, gateway.Claimed)
    row = ToolGatewayClaim.objects.get(call_id="c1")
    assert (row.status, row.result, row.outbound_at, row.lease_token) == (
        "succeeded",
        {"n": 1},
        first.claimed.outbound_at,
        first.claimed.lease_token,
    )
    _verify_passes()
    if connection.vendor == "postgresql":
        assert (claim_trips, complete_trips) == ([1], [1])
        event = "SELECT xmin FROM ledger_event WHERE sequence = %s"  # the test's one run
        claim = "SELECT xmin FROM ledger_toolgatewayclaim WHERE call_id = 'c1'"
        assert _xmin(event, 8) == _xmin(event, 9) == _xmin(claim)  # c1's succeeded and the row's completion


def test_an_attached_row_change_that_misses_takes_the_events_back_with_it(
    workspace: Workspace, run: str, append: Callable[..., Any], clock: FakeClock
) -> None:
    """The all-or-nothing of `append(..., attached=...)` against a race its conditions did not see: a
    completion that finds no row once the head is taken, a claim whose row appeared meanwhile
    (the unique constraint). Nothing is written, the answer is None (the caller's locked way
    decides), and the run takes the next append as if nothing happened, inside a caller's
    transaction too. (On SQLite the attached append always answers None: the locked way does it all.)"""
    from ledger import log
    from ledger.log import statements
    from ledger.replay import gateway

    first = gateway.runtime_batch(workspace=workspace, run_id=run, claim=_claim_kwargs("c1"))
    assert isinstance(first.claimed, gateway.Claimed)
    gone = statements.Attached(
        name="done",
        condition="TRUE",
        params={},
        sql="UPDATE ledger_toolgatewayclaim SET updated_at = updated_at WHERE false RETURNING 1",
    )
    row, _ = gateway._new_claim(
        clock.now(),
        {
            "call_id": "c1",
            "tool_name": "lookup",
            "args": {},
            "args_digest": "sha256:x",
            "effect": "read",
            "owner": "rt",
            "idempotency_key": "k-other",
            "timeout_s": None,
        },
        outbound=True,
    )
    taken = dataclasses.replace(gateway._attached_claim(row), condition="TRUE")  # blind to the row there
    note = [{"type": "custom.note", "payload": {}}]
    trips: list[list[int]] = []

    def missed(change: statements.Attached) -> None:
        with round_trips() as sent:
            assert log.append(workspace=workspace, run_id=run, events=note, attached=[change]) is None
        trips.append(sent)

    missed(gone)
    assert append(run, {"type": "custom.a", "payload": {}}).last_sequence == 3  # and the head is guessed again
    missed(taken)
    append(run, {"type": "custom.b", "payload": {}})
    with transaction.atomic():  # the failed statement rolls back to its savepoint, not the caller's transaction
        missed(gone)
        assert append(run, {"type": "custom.inside", "payload": {}}).last_sequence == 5
    assert [e.type for e in _log(workspace)] == [
        "RunStarted",
        "harness.tool_call.started",
        "custom.a",
        "custom.b",
        "custom.inside",
    ]
    assert Run.objects.get(run_id=run).last_sequence == 5
    assert list(ToolGatewayClaim.objects.values_list("call_id", "idempotency_key")) == [("c1", "k-c1")]
    assert append(run, {"type": "custom.after", "payload": {}}).last_sequence == 6
    _verify_passes()
    if connection.vendor == "postgresql":  # each statement was sent (and failed), none was spared by a cache miss
        assert all(sent and sent[0] >= 1 for sent in trips), trips


def test_runtime_batch_keeps_a_large_outcome_of_a_held_call_as_an_artifact_and_serves_it_back(
    workspace: Workspace, run: str
) -> None:
    from ledger.replay import gateway

    first = gateway.runtime_batch(workspace=workspace, run_id=run, claim=_claim_kwargs("c1"))
    assert isinstance(first.claimed, gateway.Claimed)
    big = {"text": "x" * 9000}
    gateway.runtime_batch(
        workspace=workspace,
        run_id=run,
        complete={
            "call_id": "c1",
            "lease_token": first.claimed.lease_token,
            "held": first.claimed,
            "outcome": "result",
            "value": gateway.prepare_outcome(workspace, "result", big),
            "step_path": "agent",
        },
    )

    row = ToolGatewayClaim.objects.get(call_id="c1")
    assert row.status == "succeeded" and row.result is None and row.outcome_ref.startswith("artifact://")
    replay = gateway.runtime_batch(workspace=workspace, run_id=run, claim=_claim_kwargs("c1"))
    assert isinstance(replay.claimed, gateway.Finished) and replay.claimed.idempotent_replay
    assert replay.claimed.result == big
    _verify_passes()


def test_runtime_batch_refused_completion_writes_nothing_after_it(workspace: Workspace, run: str) -> None:
    from ledger.replay import gateway

    first = gateway.runtime_batch(workspace=workspace, run_id=run, claim=_claim_kwargs("c1"))
    with pytest.raises(gateway.LeaseLost):
        gateway.runtime_batch(
            workspace=workspace,
            run_id=run,
            complete={"call_id": "c1", "lease_token": "not-the-token", "outcome": "result", "value": 1},
            events=[{"type": "custom.note", "payload": {}}],
            claim=_claim_kwargs("c2"),
        )
    assert [e.type for e in _log(workspace)] == ["RunStarted", "harness.tool_call.started"]
    assert not ToolGatewayClaim.objects.filter(call_id="c2").exists()
    assert first.claimed is not None and ToolGatewayClaim.objects.get(call_id="c1").status == "claimed"


@pytest.mark.parametrize("held", [True, False], ids=["held", "read"])
def test_runtime_batch_commits_the_in_doubt_fact_of_an_expired_outbound_call_then_refuses(
    workspace: Workspace, run: str, clock: FakeClock, held: bool
) -> None:
    from ledger.replay import gateway

    first = gateway.runtime_batch(workspace=workspace, run_id=run, claim=_claim_kwargs("c1"))
    clock.advance(gateway.DEFAULT_LEASE_S + 1)
    with pytest.raises(gateway.LeaseLost):
        gateway.runtime_batch(
            workspace=workspace,
            run_id=run,
            complete={
                "call_id": "c1",
                "lease_token": first.claimed.lease_token,
                "outcome": "result",
                "value": 1,
                **({"held": first.claimed} if held else {}),
            },
            events=[{"type": "custom.note", "payload": {}}],
        )
    assert [e.type for e in _log(workspace)][-1] == "harness.tool_call.in_doubt"
    assert ToolGatewayClaim.objects.get(call_id="c1").status == "in_doubt"


def test_runtime_batch_under_a_stale_fencing_token_writes_nothing(workspace: Workspace, run: str) -> None:
    from ledger.errors import Fenced
    from ledger.log.leases import acquire_run_lease
    from ledger.replay import gateway

    lease = acquire_run_lease(workspace=workspace, run_id=run, owner="executor-a")
    stale = lease.fencing_token + 1
    with pytest.raises(Fenced):
        gateway.runtime_batch(workspace=workspace, run_id=run, fencing_token=stale, claim=_claim_kwargs("c1"))
    assert not ToolGatewayClaim.objects.filter(call_id="c1").exists()
    held = gateway.runtime_batch(
        workspace=workspace, run_id=run, fencing_token=lease.fencing_token, claim=_claim_kwargs("c1")
    )
    replayed_claim = gateway.runtime_batch(
        workspace=workspace, run_id=run, fencing_token=lease.fencing_token, claim=_claim_kwargs("c1")
    )  # the holder's own live claim: no event
    assert held.claimed == replayed_claim.claimed
    with pytest.raises(Fenced):  # even a write that appends nothing answers to the fence
        gateway.runtime_batch(workspace=workspace, run_id=run, fencing_token=stale, claim=_claim_kwargs("c1"))
