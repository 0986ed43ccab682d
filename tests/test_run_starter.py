"""Who started a run, recorded by the server (docs/security.md § Roles): the write door sets
`Run.started_by` from the key or session that appended the run's RunStarted (OTLP ingest, imports
and the runtime too), in the statement that starts the log, never from the payload. The tool
approvals' "not your own" rule reads it: a key's owner cannot approve a call of a run their key
started, whatever `RunStarted.requestedBy` claims; another approver can. An idempotent retry of
the RunStarted is still a replay (the envelope is the client's, unchanged), and `ledger rebuild`
keeps the column while `ledger verify` stays clean (it is not derived from the log)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from ledger.interop.otlp.ingest import run_id_for
from ledger.log.projection import rebuild
from ledger.log.verify import verify_run
from ledger.models import ApiKey, Event, Run, ToolCall, Workspace
from ledger.reads.attention import args_digest
from ledger.replay import toolapproval
from ledger.runtime.executor import start_run
from ledger.tenancy.services import create_key
from tests.conftest import IN_PROCESS, ev, http_client, log_in, started

pytestmark = pytest.mark.django_db(transaction=True)

ARGS = {"orderId": "B-2", "amount": 25}
DIGEST = args_digest("issue_credit", ARGS)


@pytest.fixture
def clients() -> Iterator[list[httpx.Client]]:
    made: list[httpx.Client] = []
    yield made
    for client in made:
        client.close()


def _keyed(workspace: Workspace, owner: User | None, clients: list[httpx.Client]) -> tuple[ApiKey, httpx.Client]:
    key, secret = create_key(workspace=workspace, scopes=["ingest", "read"], **({"by": owner} if owner else {}))
    client = http_client(IN_PROCESS, headers={"Authorization": f"Bearer {secret}"})
    clients.append(client)
    return key, client


def _session(user: User, clients: list[httpx.Client]) -> httpx.Client:
    client = log_in(IN_PROCESS, user, send_csrf=True)
    clients.append(client)
    return client


def _start_waiting(client: httpx.Client, run_id: str, *, claimed: str = "bob", path: str = "") -> httpx.Response:
    """A harness's run that stops at a call waiting for approval; its RunStarted claims `claimed`."""
    return client.post(
        f"/api/v1/runs/{run_id}/events{path}",
        json={
            "events": [
                {**started(requestedBy=claimed), "idempotencyKey": "start"},
                ev("StepScheduled", stepPath="credit"),
                ev("StepAttemptStarted", stepPath="credit", attempt=1),
                ev(
                    "harness.tool_call.approval_requested",
                    callId="c1",
                    toolName="issue_credit",
                    args=ARGS,
                    argsDigest=DIGEST,
                    stepPath="credit",
                    caller="model",
                ),
            ]
        },
    )


def _decide(client: httpx.Client, run_id: str, verb: str = "approve") -> httpx.Response:
    return client.post(
        f"/api/v1/runs/{run_id}/tool-calls/c1/{verb}", json={"note": "checked the order", "argsDigest": DIGEST}
    )


def test_a_key_s_owner_cannot_approve_what_their_key_started_whatever_the_payload_claims(
    workspace: Workspace, admin: User, approver: User, clients: list[httpx.Client]
) -> None:
    key, harness = _keyed(workspace, admin, clients)  # alice's key
    answer = _start_waiting(harness, "run_own", claimed="bob")  # the payload names bob, not alice
    assert answer.status_code == 200, answer.text
    run = Run.objects.get(workspace=workspace, run_id="run_own")
    assert run.started_by == f"key:{key.prefix}"
    assert ToolCall.objects.get(run=run, call_id="c1").status == toolapproval.WAITING
    # The payload is the client's, untouched: its claim is there, and believed by nothing.
    assert Event.objects.get(run=run, sequence=1).payload == json.dumps(
        {"requestedBy": "bob", "workflowVersionId": "wfver_test"}, separators=(",", ":")
    )
    assert toolapproval.requester_of(run) == f"key:{key.prefix}"

    before = run.last_sequence
    refused = _decide(_session(admin, clients), "run_own")
    assert refused.status_code == 403, refused.text
    assert refused.headers["content-type"].startswith("application/json")
    assert refused.json()["error"]["code"] == "self_approval_forbidden"
    assert Run.objects.get(pk=run.pk).last_sequence == before  # nothing written
    # bob, whom the payload named, is not the requester: he may decide.
    approved = _decide(_session(approver, clients), "run_own")
    assert approved.status_code == 200, approved.text
    assert approved.json()["status"] == "approved"


def test_a_console_session_that_starts_a_run_is_its_requester(
    workspace: Workspace, admin: User, approver: User, clients: list[httpx.Client]
) -> None:
    bob = _session(approver, clients)
    answer = _start_waiting(bob, "run_bobs", claimed="alice", path="?workspace=acme/support")
    assert answer.status_code == 200, answer.text
    run = Run.objects.get(workspace=workspace, run_id="run_bobs")
    assert run.started_by == "bob"
    # The payload names alice; bob started it: bob is refused, alice decides.
    assert _decide(bob, "run_bobs").json()["error"]["code"] == "self_approval_forbidden"
    assert _decide(_session(admin, clients), "run_bobs", "deny").status_code == 200


def test_an_idempotent_retry_of_run_started_is_still_a_replay_and_changes_no_starter(
    workspace: Workspace, admin: User, approver: User, clients: list[httpx.Client]
) -> None:
    key, harness = _keyed(workspace, admin, clients)
    first = harness.post("/api/v1/runs/run_retry/events", json={"events": [{**started(), "idempotencyKey": "go"}]})
    assert first.status_code == 200 and first.json()["events"][0]["replayed"] is False
    retry = harness.post("/api/v1/runs/run_retry/events", json={"events": [{**started(), "idempotencyKey": "go"}]})
    assert retry.status_code == 200, retry.text
    assert retry.json()["events"][0]["replayed"] is True
    assert retry.json()["events"][0]["eventId"] == first.json()["events"][0]["eventId"]
    # The same retry from someone else (another key, a session) is a replay too, and the run's
    # starter stays who appended it first.
    _, other = _keyed(workspace, approver, clients)
    again = other.post("/api/v1/runs/run_retry/events", json={"events": [{**started(), "idempotencyKey": "go"}]})
    assert again.status_code == 200 and again.json()["events"][0]["replayed"] is True
    assert Run.objects.get(workspace=workspace, run_id="run_retry").started_by == f"key:{key.prefix}"
    assert Event.objects.filter(run__run_id="run_retry").count() == 1


def test_rebuild_keeps_the_starter_and_verify_stays_clean(workspace: Workspace, admin: User, clients: list) -> None:
    key, harness = _keyed(workspace, admin, clients)
    assert _start_waiting(harness, "run_rebuilt").status_code == 200
    run = Run.objects.get(workspace=workspace, run_id="run_rebuilt")
    assert {check.status for check in verify_run(run)} == {"pass"}, verify_run(run)
    rebuild(run)
    call_command("ledger", "rebuild", "--workspace", "acme/support", stdout=io.StringIO(), stderr=io.StringIO())
    run.refresh_from_db()
    assert run.started_by == f"key:{key.prefix}"
    assert {check.status for check in verify_run(run)} == {"pass"}
    # A head whose column differs from every fold is still clean: verify does not compare it.
    Run.objects.filter(pk=run.pk).update(started_by="someone-else")
    run.refresh_from_db()
    assert {check.status for check in verify_run(run)} == {"pass"}


def test_otlp_ingest_records_the_key_that_sent_the_trace(workspace: Workspace, clients: list) -> None:
    key, harness = _keyed(workspace, None, clients)
    trace = "5b8efff798038103d269b633813fc60d"
    span = {
        "traceId": trace,
        "spanId": "eee19b7ec3c1b174",
        "name": "invoke_agent",
        "kind": 1,
        "startTimeUnixNano": "1764547200000000000",
        "endTimeUnixNano": "1764547201000000000",
        "attributes": [{"key": "requestedBy", "value": {"stringValue": "bob"}}],
        "status": {},
    }
    body = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {"name": "t"}, "spans": [span]}]}]}
    answer = harness.post("/api/v1/otlp/v1/traces", json=body)
    assert answer.status_code == 200, answer.text
    assert Run.objects.get(workspace=workspace, run_id=run_id_for(trace)).started_by == f"key:{key.prefix}"


def test_the_runtime_records_whom_ledger_run_names_and_else_itself(workspace: Workspace) -> None:
    assert start_run(workspace=workspace, workflow="support.goodwill", input={
        "ticket": "Late twice.", "orderId": "B-2", "amount": 25
    }, run_id="run_named", requested_by="carol").status == "waiting_approval"  # fmt: skip
    assert Run.objects.get(workspace=workspace, run_id="run_named").started_by == "carol"
    assert start_run(workspace=workspace, workflow="support.goodwill", input={
        "ticket": "Late twice.", "orderId": "B-3", "amount": 5
    }, run_id="run_nameless").status == "waiting_approval"  # fmt: skip
    run = Run.objects.get(workspace=workspace, run_id="run_nameless")
    assert run.started_by == "system:runtime"
    assert toolapproval.requester_of(run) == "system:runtime"  # nobody's: no person is kept out


def test_an_imported_run_is_started_by_the_import(workspace: Workspace) -> None:
    from ledger.interop.little_import import IMPORTER

    sample = Path(__file__).resolve().parent / "data" / "little" / "sample"
    call_command("ledger", "import-little", str(sample), "--workspace", "acme/support", stdout=io.StringIO())
    imported = Run.objects.filter(workspace=workspace)
    assert imported.exists()
    assert set(imported.values_list("started_by", flat=True)) == {IMPORTER}


def test_migration_0030_gives_older_runs_the_requester_their_payload_claimed(workspace: Workspace) -> None:
    """Runs from before the column get what the rule believed until then (so nothing refused
    before is allowed after): RunStarted's `requestedBy` (a string, by the vocabulary), cut to the column's size, else nothing."""
    import importlib

    from django.db import connection

    from ledger import log

    for run_id, extra in [
        ("run_carol", {"requestedBy": "carol"}),
        ("run_none", {}),
        ("run_long", {"requestedBy": "x" * 200}),
    ]:
        log.append(workspace=workspace, run_id=run_id, events=[started(**extra)], by="system:test")
    Run.objects.update(started_by="")  # as the migration finds them

    class Editor:
        def __init__(self) -> None:
            self.connection = connection

        def execute(self, sql: str) -> None:
            with connection.cursor() as cursor:
                cursor.execute(sql)

    importlib.import_module("ledger.migrations.0030_run_started_by").fill_from_payloads(None, Editor())
    assert dict(Run.objects.values_list("run_id", "started_by")) == {
        "run_carol": "carol",
        "run_none": "",
        "run_long": "x" * 160,  # the column's size
    }


def test_a_run_an_unowned_key_started_is_approved_only_by_an_admin_with_a_warning(
    workspace: Workspace, admin: User, approver: User, clients: list[httpx.Client]
) -> None:
    """No person answers for a key made without an owner: as for its re-execution requests, only
    an admin may approve its run's calls, and the Approvals page says why."""
    _, harness = _keyed(workspace, None, clients)  # made by the command line: nobody's
    assert _start_waiting(harness, "run_nobodys").status_code == 200
    bob = _session(approver, clients)
    page = bob.get("/w/acme/support/approvals/")
    assert page.status_code == 200
    card = page.text[page.text.index('data-run="run_nobodys"') :]
    card = card[: card.index("</article>")]
    assert "belongs to nobody" in card and 'class="approve"' not in card and 'class="deny"' in card
    refused = _decide(bob, "run_nobodys")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert refused.json()["error"]["details"]["role"] == "admin"
    alice = _session(admin, clients)
    admin_page = alice.get("/w/acme/support/approvals/").text
    assert 'class="approve"' in admin_page[admin_page.index('data-run="run_nobodys"') :]
    assert _decide(alice, "run_nobodys").status_code == 200
