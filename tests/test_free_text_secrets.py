"""What a person or a key writes is redacted before it is stored (docs/security.md "Free text"):
feedback comments and categories, re-execution reasons and approve/deny notes, a fork's input
override, cancel reasons, key names and revocation reasons, and every audit entry's reason and
details. The secrets typed into all of them through the API are then looked for in a dump of the
whole database, the exports and a share link's JSON: they are nowhere."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from ledger.models import ReexecutionRequest, Workspace
from ledger.tenancy.services import create_key, revoke_key
from tests.conftest import IN_PROCESS, ev, http_client, log_in, started

pytestmark = pytest.mark.usefixtures("clock")

V1 = "/api/v1"
SK = "sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c"
PASSWORD = "Hunter2Sw0rdfish"
AWS = "AKIAIOSFODNN7EXAMPLE"
SPLIT_UP = "sK-PrOj-\u200b9e8d7c6b5a4f3e2d1c0b9a8f"  # case and a zero-width space: still a key
SECRETS = (SK, PASSWORD, AWS, "9e8d7c6b5a4f3e2d1c0b9a8f")


def _typed(what: str) -> str:
    return f"{what}: pasted {SK} with password={PASSWORD} and id_{AWS}, also {SPLIT_UP}"


def _finished(append: Callable[..., Any], run_id: str) -> None:
    append(
        run_id,
        started(input={"ticket": "T-1"}),
        ev("StepScheduled", stepPath="answer"),
        ev("StepAttemptStarted", stepPath="answer", attempt=1),
        ev("StepCompleted", stepPath="answer", attempt=1, output="done"),
        ev("RunCompleted", output="done"),
    )


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


@pytest.mark.django_db(transaction=True)
def test_secrets_typed_into_every_free_text_field_never_reach_the_database(
    workspace: Workspace, append: Callable[..., Any], admin: User, approver: User, operator: User, viewer: User
) -> None:
    _finished(append, "run_done")
    _finished(append, "run_other")
    append("run_live", started())
    ops, boss, reader = (log_in(IN_PROCESS, u, send_csrf=True) for u in (operator, approver, viewer))

    fork = ops.post(
        f"{V1}/runs/run_done/reexecutions",
        json={"mode": "fork", "fromStep": "answer", "input": {"ticket": _typed("input")}, "reason": _typed("reason")},
    )
    assert fork.status_code == 201, fork.text
    denied = ops.post(f"{V1}/runs/run_other/reexecutions", json={"mode": "rerun", "reason": _typed("rerun")})
    assert denied.status_code == 201, denied.text
    assert boss.post(f"{V1}/reexecutions/{fork.json()['id']}/approve", json={"note": _typed("ok")}).status_code == 200
    assert boss.post(f"{V1}/reexecutions/{denied.json()['id']}/deny", json={"note": _typed("no")}).status_code == 200
    rated = reader.post(
        f"{V1}/runs/run_done/feedback", json={"rating": 2, "category": f"id_{AWS}", "comment": _typed("comment")}
    )
    assert rated.status_code == 201, rated.text
    assert ops.post(f"{V1}/runs/run_live/cancel", json={"reason": _typed("cancel")}).status_code == 202
    key, _ = create_key(workspace=workspace, scopes=["read"], name=f"ci {SK}")
    revoke_key(key, by=admin, reason=_typed("revoke"))
    link = ops.post(f"{V1}/runs/run_done/share-links", json={"expiresInHours": 1})
    assert link.status_code == 201, link.text

    # What the requests stored: redacted where it stands, the rest kept.
    request = ReexecutionRequest.objects.get(public_id=fork.json()["id"])
    assert request.reason.startswith("reason: pasted [REDACTED] with password=[REDACTED]")
    assert request.note.startswith("ok: pasted [REDACTED]")
    assert request.input == {"ticket": request.input["ticket"]} and not _leaks(str(request.input))

    dump = io.StringIO()
    call_command("dumpdata", stdout=dump)
    assert _leaks(dump.getvalue()) == []
    assert "[REDACTED]" in dump.getvalue()

    key_client = http_client(headers={"Authorization": f"Bearer {create_key(workspace=workspace, scopes=['read'])[1]}"})
    for kind in ("runs", "events", "costs"):
        exported = key_client.get(f"{V1}/export/{kind}")
        assert exported.status_code == 200 and _leaks(exported.text) == [], kind
    audit = log_in(IN_PROCESS, admin).get(f"{V1}/export/audit")
    assert audit.status_code == 200 and "reexecution.denied" in audit.text and _leaks(audit.text) == []
    shared = http_client().get(urlsplit(link.json()["url"]).path + "evidence.json")
    assert shared.status_code == 200 and _leaks(shared.text) == []
