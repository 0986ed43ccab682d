"""The audit log (docs/api.md "Audit"): append-only in code and in the database, one entry per
privileged action written with the action, and GET /api/v1/audit for a tenant's admins."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, transaction

from ledger import audit
from ledger.models import ApiKey, AuditEntry, Workspace
from ledger.replay import gateway
from ledger.tenancy.services import create_key, create_user, remove_member, revoke_key
from tests.conftest import IN_PROCESS, FakeClock, http_client, log_in, named_user, started
from tests.runtime_support import every_run_verifies  # noqa: F401  (autouse: ledger verify passes on every run)

# Every test runs on the fake clock (conftest), which a live server's thread reads too.
pytestmark = pytest.mark.usefixtures("clock")


@pytest.fixture
def entry(workspace: Workspace) -> AuditEntry:
    with transaction.atomic():
        return audit.record(
            actor="alice",
            tenant=workspace.tenant,
            workspace=workspace,
            action=audit.Action.RETENTION_CHANGED,
            target="workspace:acme/support",
            reason="90 days",
        )


def _actions(**filters: Any) -> list[tuple[str, str, str]]:
    return list(AuditEntry.objects.filter(**filters).order_by("pk").values_list("action", "actor", "target"))


@pytest.mark.django_db
def test_entries_refuse_change_and_delete_in_code(entry: AuditEntry) -> None:
    entry.reason = "tampered"
    with pytest.raises(TypeError):
        entry.save()
    with pytest.raises(TypeError):
        entry.delete()
    with pytest.raises(TypeError):
        AuditEntry.objects.filter(pk=entry.pk).update(reason="tampered")
    with pytest.raises(TypeError):
        AuditEntry.objects.all().delete()


@pytest.mark.django_db
def test_the_database_refuses_update_and_delete_of_an_entry(entry: AuditEntry) -> None:
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cur:
        cur.execute("UPDATE ledger_auditentry SET reason = 'tampered' WHERE id = %s", [entry.pk])
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cur:
        cur.execute("DELETE FROM ledger_auditentry WHERE id = %s", [entry.pk])
    assert AuditEntry.objects.get(pk=entry.pk).reason == "90 days"


@pytest.mark.django_db(transaction=True)
def test_an_entry_is_written_only_inside_the_transaction_of_its_action(workspace: Workspace) -> None:
    with pytest.raises(RuntimeError):
        audit.record(actor="alice", tenant=workspace.tenant, action=audit.Action.MEMBER_ADDED, target="user:x")


@pytest.mark.django_db
def test_keys_and_members_are_audited_once_per_change(workspace: Workspace) -> None:
    key, _ = create_key(workspace=workspace, scopes=["read"], name="ci")
    revoke_key(key)
    revoke_key(ApiKey.objects.get(pk=key.pk))  # already revoked: nothing changes, nothing is written
    create_user(username="erin", tenant="acme", role="viewer", password="pw-erin-1234")
    create_user(username="erin", tenant="acme", role="viewer", password="pw-erin-5678")  # same role, a new password
    create_user(username="erin", tenant="acme", role="operator", password=None)
    remove_member(username="erin", tenant="acme")
    assert _actions() == [
        ("api_key.created", "system:cli", f"key:{key.prefix}"),
        ("api_key.revoked", "system:cli", f"key:{key.prefix}"),
        ("member.added", "system:cli", "user:erin"),
        ("member.password_reset", "system:cli", "user:erin"),  # the operator set a password: audited
        ("member.changed", "system:cli", "user:erin"),
        ("member.removed", "system:cli", "user:erin"),
    ]
    changed = AuditEntry.objects.get(action="member.changed")
    assert changed.details == {"role": "operator", "previousRole": "viewer"}


@pytest.mark.django_db
def test_a_reconciled_tool_call_is_audited_with_its_note(workspace: Workspace, append: Any, clock: FakeClock) -> None:
    append("run_tools", started())
    claimed = gateway.claim_tool_call(
        workspace=workspace,
        run_id="run_tools",
        call_id="c1",
        tool_name="refund",
        args={"order": "A-1"},
        effect="write",
        owner="w1",
    )
    gateway.mark_outbound(workspace=workspace, run_id="run_tools", call_id="c1", lease_token=claimed.lease_token)
    clock.moment += timedelta(minutes=5)
    gateway.reconcile_tool_call(
        workspace=workspace,
        run_id="run_tools",
        call_id="c1",
        outcome="succeeded",
        value={"refund": "R-9"},
        note="seen in the payment console",
        by="carol",
    )
    [entry] = AuditEntry.objects.filter(action="tool_call.reconciled")
    assert (entry.actor, entry.target, entry.reason) == ("carol", "run_tools/c1", "seen in the payment console")
    assert entry.workspace_id == workspace.pk and entry.details["outcome"] == "succeeded"


# --- GET /api/v1/audit ---------------------------------------------------------------------------


@pytest.fixture
def clients(
    workspace: Workspace, admin: User, approver: User, other_workspace: Workspace
) -> Iterator[dict[str, httpx.Client]]:
    globex = other_workspace
    named_user("gina", "admin", tenant="globex")
    create_key(workspace=globex, scopes=["read"], name="globex-ci")
    _, secret = create_key(workspace=workspace, scopes=["read", "execute"], name="acme-ci")
    opened = {name: log_in(IN_PROCESS, name) for name in ("alice", "bob", "gina")}
    opened["key"] = http_client(headers={"Authorization": f"Bearer {secret}"})
    yield opened
    for client in opened.values():
        client.close()


@pytest.mark.django_db(transaction=True)
def test_admins_read_their_tenants_log_and_nobody_else_does(clients: dict[str, httpx.Client]) -> None:
    alice, bob, gina, key = clients["alice"], clients["bob"], clients["gina"], clients["key"]
    page = alice.get("/api/v1/audit")
    assert page.status_code == 200, page.text
    entries = page.json()["entries"]
    assert [(e["action"], e["target"]) for e in entries] == [
        ("member.added", "user:alice"),
        ("member.added", "user:bob"),
        ("api_key.created", entries[2]["target"]),
    ]
    assert entries[2]["workspace"] == "acme/support" and entries[0]["workspace"] is None
    assert {e["tenant"] for e in entries} == {"acme"}
    assert set(entries[0]) >= {"id", "at", "actor", "action", "tenant", "workspace", "target", "reason"}
    theirs = gina.get("/api/v1/audit").json()["entries"]
    assert [(e["action"], e["tenant"]) for e in theirs] == [("member.added", "globex"), ("api_key.created", "globex")]
    assert theirs[1]["target"] != entries[2]["target"]
    assert gina.get("/api/v1/audit?tenant=acme").status_code == 404
    assert bob.get("/api/v1/audit").json()["error"]["code"] == "forbidden"
    assert key.get("/api/v1/audit").status_code == 403
    assert http_client().get("/api/v1/audit").status_code == 401


@pytest.mark.django_db(transaction=True)
def test_the_log_filters_pages_and_exports_csv(clients: dict[str, httpx.Client], clock: FakeClock) -> None:
    alice = clients["alice"]
    added = alice.get("/api/v1/audit?action=member.added").json()["entries"]
    assert [e["target"] for e in added] == ["user:alice", "user:bob"]
    assert alice.get("/api/v1/audit?actor=nobody").json()["entries"] == []
    assert alice.get("/api/v1/audit?action=no.such").json()["error"]["code"] == "invalid_parameter"
    assert alice.get("/api/v1/audit?from=yesterday").json()["error"]["code"] == "invalid_parameter"
    today = clock.moment.date()  # the entries' day (the clock's, not the wall's: midnight may pass meanwhile)
    assert len(alice.get(f"/api/v1/audit?from={today}&to={today}").json()["entries"]) == 3
    assert alice.get(f"/api/v1/audit?to={today - timedelta(days=1)}").json()["entries"] == []
    first = alice.get("/api/v1/audit?limit=2").json()
    second = alice.get(f"/api/v1/audit?limit=2&cursor={first['next']}").json()
    assert len(first["entries"]) == 2 and len(second["entries"]) == 1 and second["next"] is None
    exported = alice.get("/api/v1/audit?format=csv")
    assert exported.status_code == 200 and exported.headers["content-type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(exported.text)))
    assert rows[0] == ["id", "at", "actor", "action", "tenant", "workspace", "target", "reason"]
    assert [r[3] for r in rows[1:]] == ["member.added", "member.added", "api_key.created"]
