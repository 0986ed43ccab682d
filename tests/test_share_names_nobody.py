"""A share link names nobody (docs/security.md "Share links"): its page and its evidence.json, as
an anonymous reader gets them, hold none of the identifiers the database keeps about the tenant —
tenant and workspace slugs and names, usernames, API key prefixes and names, re-execution ids and
the runs they made, other share links, runs outside the link — nor a pending re-execution, a
reason, a note, a comment, or (when the workspace hides inputs) a fork's input override."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User

from ledger import log
from ledger.models import ApiKey, ReexecutionRequest, Run, ShareLink, Tenant, Workspace
from ledger.reexecution import services as reexecution
from ledger.replay.feedback import record_feedback
from ledger.tenancy import sharing
from ledger.tenancy.services import bootstrap, create_key, create_user
from tests.conftest import PASSWORD, ev, http_client, started

pytestmark = pytest.mark.usefixtures("clock")

ROOT, SUB = "run_zqroot", "run_zqsub"


def _finished(ws: Workspace, run_id: str, **start: Any) -> None:
    log.append(
        workspace=ws,
        run_id=run_id,
        events=[
            started(input={"ticket": "T-1"}, **start),
            ev("StepScheduled", stepPath="answer"),
            ev("StepAttemptStarted", stepPath="answer", attempt=1),
            ev("StepCompleted", stepPath="answer", attempt=1, output="done"),
            ev("RunCompleted", output="done"),
        ],
    )


@pytest.fixture
def tenant_world(transactional_db: None) -> Iterator[dict[str, Any]]:
    ws = bootstrap(tenant="zqtenant", workspace="zqspace")
    Tenant.objects.filter(pk=ws.tenant_id).update(name="Zq Tenant Inc")
    Workspace.objects.filter(pk=ws.pk).update(name="Zq Space Name")
    people = {
        name: create_user(username=name, tenant="zqtenant", role=role, password=PASSWORD).membership.user
        for name, role in (("zqalice", "admin"), ("zqbob", "approver"), ("zqcarol", "operator"))
    }
    key, _ = create_key(workspace=ws, scopes=["ingest", "execute", "read"], name="zqkeyname")
    _finished(ws, "run_zqearlier")
    _finished(ws, ROOT, replayOf="run_zqearlier")
    _finished(ws, SUB, parentRunId=ROOT)
    approved = reexecution.request_reexecution(
        workspace=ws,
        run_id=ROOT,
        mode="fork",
        from_step="answer",
        input={"override": "zqoverride"},
        reason="zqreason",
        by=people["zqcarol"],
    )
    reexecution.approve(workspace=ws, reexecution_id=approved.public_id, by=people["zqbob"], note="zqnote-ok")
    denied = reexecution.request_reexecution(workspace=ws, run_id=ROOT, mode="rerun", reason="zqwhy", by=key)
    reexecution.deny(workspace=ws, reexecution_id=denied.public_id, by=people["zqbob"], note="zqnote-no")
    reexecution.request_reexecution(
        workspace=ws, run_id=ROOT, mode="evaluate", reason="zqpending", by=people["zqcarol"]
    )
    run = Run.objects.get(run_id=ROOT)
    record_feedback(run=run, rating=4, category="accuracy", comment="zqcomment", author=people["zqalice"])
    record_feedback(run=run, rating=2, comment="zqkeycomment", api_key=key)
    sharing.set_share_policy(workspace=ws, hides_inputs=True, by=people["zqalice"])
    ws.refresh_from_db()
    _, other = sharing.create_link(workspace=ws, run=run, by=people["zqcarol"], expires_in_hours=1)
    _, token = sharing.create_link(
        workspace=ws, run=run, by=people["zqcarol"], expires_in_hours=1, include_sub_runs=True
    )
    yield {"workspace": ws, "token": token, "people": people}


def _identifiers(shown_runs: set[str]) -> set[str]:
    """Every identifier the database holds about tenants, people, keys, requests and links, and
    every run id a link's reader has no business seeing."""
    names: set[str] = set()
    for tenant in Tenant.objects.all():
        names |= {tenant.slug, tenant.name}
    for ws in Workspace.objects.all():
        names |= {ws.slug, ws.name}
    names |= set(User.objects.values_list("username", flat=True))
    for key in ApiKey.objects.all():
        names |= {key.prefix, key.name}
    for rx in ReexecutionRequest.objects.all():
        names |= {rx.public_id, rx.reason, rx.note, rx.digest, rx.plan_digest, rx.new_run_id}
    names |= set(ShareLink.objects.values_list("public_id", flat=True))
    names |= set(Run.objects.exclude(run_id__in=shown_runs).values_list("run_id", flat=True))
    names |= {"zqcomment", "zqkeycomment", "zqoverride", "zqpending"}
    return {n for n in names if n}


@pytest.mark.django_db(transaction=True)
def test_the_anonymous_page_and_json_hold_none_of_the_tenants_identifiers(tenant_world: dict[str, Any]) -> None:
    anonymous = http_client()
    base = sharing.share_path(tenant_world["token"])
    identifiers = _identifiers({ROOT, SUB})
    assert {"zqtenant", "zqspace", "zqbob", "run_zqearlier", "zqnote-ok"} <= identifiers
    fetched = {
        path: anonymous.get(path)
        for path in (base, f"{base}evidence.json", f"{base}runs/{SUB}/", f"{base}runs/{SUB}/evidence.json")
    }
    for path, answer in fetched.items():
        assert answer.status_code == 200, path
        assert sorted(n for n in identifiers if n in answer.text) == [], path

    bundle = fetched[f"{base}evidence.json"].json()
    # What stays: that there were decisions and ratings, by role, without words or names.
    assert sorted((a["mode"], a["status"], a["approver"]) for a in bundle["approvals"]) == [
        ("fork", "approved", "an approver"),
        ("rerun", "denied", "an approver"),
    ]
    assert {a["requestedBy"] for a in bundle["approvals"]} == {"a member", "an API key"}
    assert [a["input"] for a in bundle["approvals"] if a["mode"] == "fork"] == ["[HIDDEN]"]
    assert sorted((f["rating"], f["author"]["type"], f.get("comment")) for f in bundle["feedback"]) == [
        (2, "apiKey", None),
        (4, "member", None),
    ]
    assert bundle["run"]["input"] == "[HIDDEN]" and bundle["run"]["replayOf"] is None
    assert [s["runId"] for s in bundle["subRuns"]] == [SUB]


@pytest.mark.django_db(transaction=True)
def test_a_tampered_token_and_a_run_outside_the_link_are_404(tenant_world: dict[str, Any]) -> None:
    token = tenant_world["token"]
    tampered = ("A" if token[0] != "A" else "B") + token[1:]
    assert http_client().get(f"{sharing.share_path(tampered)}evidence.json").status_code == 404
    assert http_client().get(f"/s/{token}/runs/run_zqearlier/evidence.json").status_code == 404
