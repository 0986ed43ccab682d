"""The ids a tenant keeps of feedback and audit entries (`fb_…`, `aud_…`) are random, stored with the
row and never change; they are not the row's primary key, which counts every tenant's rows
(docs/security.md § What ids and cursors reveal). Migration 0040 gave the rows before it theirs."""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from ledger import audit, log
from ledger.models import AuditEntry, Feedback, Run, Workspace
from ledger.replay.feedback import record_feedback
from ledger.tenancy.services import create_key
from tests.conftest import started

FEEDBACK_ID = re.compile(r"fb_[0-9a-f]{32}")
AUDIT_ID = re.compile(r"aud_[0-9a-f]{32}")


def _key_client(workspace: Workspace) -> Client:
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}")


def _busy_other_tenant(workspace: Workspace, rows: int = 25) -> None:
    """What another tenant does between two of ours: ratings and audited actions."""
    run = Run.objects.get(workspace=workspace, run_id="run_theirs")
    for n in range(rows):
        record_feedback(run=run, rating=1 + n % 5)
        with transaction.atomic():
            audit.record(actor="system", tenant=workspace.tenant, action="run.pruned", target=f"run_gone_{n}")


def _not_derived_from_pks(ids: list[str], pks: list[int]) -> None:
    """Random ids: none is or ends with its row's number, and their difference is not the rows'."""
    assert len(set(ids)) == len(ids)
    for public, pk in zip(ids, pks):
        assert public.partition("_")[2] != str(pk) and not public.endswith(f"_{pk}")
    first, last = (int(i.partition("_")[2], 16) for i in (ids[0], ids[-1]))
    assert last - first != pks[-1] - pks[0]


@pytest.mark.django_db
def test_feedback_ids_say_nothing_of_another_tenants_ratings(
    workspace: Workspace, other_workspace: Workspace, append: Any
) -> None:
    append("run_ours", started())
    log.append(workspace=other_workspace, run_id="run_theirs", events=[started()])
    ours = _key_client(workspace)

    def rate(rating: int) -> dict[str, Any]:
        response = ours.post("/api/v1/runs/run_ours/feedback", {"rating": rating}, content_type="application/json")
        assert response.status_code == 201, response.content
        return response.json()

    first = rate(4)
    _busy_other_tenant(other_workspace)
    second = rate(2)

    ids = [first["feedbackId"], second["feedbackId"]]
    assert all(FEEDBACK_ID.fullmatch(i) for i in ids), ids
    pks = [Feedback.objects.get(public_id=i).pk for i in ids]
    assert pks[1] - pks[0] == 26  # the other tenant's 25 ratings are between ours in the table
    _not_derived_from_pks(ids, pks)
    # The same ids, for good: in the evidence, and on a second read.
    for _ in range(2):
        listed = ours.get("/api/v1/runs/run_ours/evidence").json()["feedback"]
        assert [f["feedbackId"] for f in listed] == ids


@pytest.mark.django_db
def test_audit_ids_say_nothing_of_another_tenants_log(
    workspace: Workspace, other_workspace: Workspace, admin: User, client: Client
) -> None:
    log.append(workspace=other_workspace, run_id="run_theirs", events=[started()])
    create_key(workspace=workspace, scopes=["read"], name="before")
    _busy_other_tenant(other_workspace)
    create_key(workspace=workspace, scopes=["read"], name="after")
    client.force_login(admin)

    entries = client.get("/api/v1/audit").json()["entries"]
    keys = [e for e in entries if e["action"] == "api_key.created"]
    ids = [e["id"] for e in keys]
    assert len(ids) == 2 and all(AUDIT_ID.fullmatch(i) for i in ids), ids
    pks = [AuditEntry.objects.get(public_id=i).pk for i in ids]
    assert pks[1] - pks[0] == 26
    _not_derived_from_pks(ids, pks)
    # The API's CSV and the audit export say the same ids.
    rows = list(csv.reader(io.StringIO(client.get("/api/v1/audit?format=csv").content.decode())))
    assert [r[0] for r in rows[1:]] == [e["id"] for e in entries]
    exported = client.get("/api/v1/export/audit?format=jsonl")
    lines = [json.loads(line) for line in b"".join(exported.streaming_content).decode().splitlines()]
    exported_ids = [row["id"] for row in lines[1:-1]]  # and the export's own entry, written first
    assert exported_ids[:-1] == [e["id"] for e in entries] and AUDIT_ID.fullmatch(exported_ids[-1])


@pytest.mark.django_db
def test_the_database_gives_each_row_its_id_whoever_inserts_it(workspace: Workspace, append: Any) -> None:
    """A process of the release before this one, still running while a deploy migrates, inserts
    rows without a public id: the column's default makes one (deploy/README.md § The order)."""
    append("run_raw", started())
    run = Run.objects.get(workspace=workspace, run_id="run_raw")
    with connection.cursor() as cur:
        for rating in (3, 5):
            cur.execute(
                "INSERT INTO ledger_feedback (run_id, rating, category, comment, created_at) "
                "VALUES (%s, %s, '', '', CURRENT_TIMESTAMP)",
                [run.pk, rating],
            )
    made = list(Feedback.objects.filter(run=run).values_list("public_id", flat=True))
    assert len(made) == 2 and len(set(made)) == 2 and all(FEEDBACK_ID.fullmatch(i) for i in made), made


# --- migration 0040 ------------------------------------------------------------------------------


def _mine(executor: MigrationExecutor) -> tuple[str, str]:
    """This migration and the one before it, by name (a number may change when branches merge)."""
    (mine,) = [key for key in executor.loader.disk_migrations if key[1].endswith("_feedback_and_audit_public_ids")]
    return mine


@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_the_rows_before_it_random_ids_once() -> None:
    executor = MigrationExecutor(connection)
    mine = _mine(executor)
    (before,) = [p for p in executor.loader.graph.node_map[mine].parents if p.key[0] == "ledger"]
    latest = executor.loader.graph.leaf_nodes("ledger")
    executor.migrate([before.key])
    try:
        old = executor.loader.project_state([before.key]).apps
        tenant = old.get_model("ledger", "Tenant").objects.create(slug="acme", name="acme")
        space = old.get_model("ledger", "Workspace").objects.create(tenant=tenant, slug="support", name="support")
        run = old.get_model("ledger", "Run").objects.create(workspace=space, run_id="run_old")
        rated = [old.get_model("ledger", "Feedback").objects.create(run=run, rating=r).pk for r in (1, 2, 3)]
        entry = old.get_model("ledger", "AuditEntry")
        audited = [
            entry.objects.create(
                tenant=tenant, actor="system", action="run.pruned", target=f"run_{n}", at=run.created_at
            ).pk
            for n in range(3)
        ]
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(latest)

    feedback_ids = dict(Feedback.objects.filter(pk__in=rated).values_list("pk", "public_id"))
    audit_ids = dict(AuditEntry.objects.filter(pk__in=audited).values_list("pk", "public_id"))
    assert all(FEEDBACK_ID.fullmatch(i) for i in feedback_ids.values()) and len(set(feedback_ids.values())) == 3
    assert all(AUDIT_ID.fullmatch(i) for i in audit_ids.values()) and len(set(audit_ids.values())) == 3
    _not_derived_from_pks([feedback_ids[pk] for pk in rated], rated)
    _not_derived_from_pks([audit_ids[pk] for pk in audited], audited)
    # The audit log is append-only again once the migration is done (its triggers are back).
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cur:
        cur.execute("UPDATE ledger_auditentry SET reason = 'tampered' WHERE id = %s", [audited[0]])
    # And what the API shows is what was stored: the same id on every read.
    shown = audit.as_dict(AuditEntry.objects.select_related("tenant").get(pk=audited[0]))
    assert shown["id"] == audit_ids[audited[0]]
