"""Another tenant's object is 404 whoever asks, even on an operation its caller could never do
(docs/api.md § Conventions): a key on an operation for people (reconcile, deciding a
re-execution, revoking a share link or a policy), a person on one for keys (renewing a lease),
a key without the scope. Only a caller who may see the object hears 403. Such callers once got
403 before the object was looked up, which told them nothing, but answered otherwise than the
contract and than a session does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from ledger.evaluation import datasets, policies
from ledger.models import AuditEntry, Event, Workspace
from ledger.reexecution import services
from ledger.tenancy import sharing
from ledger.tenancy.services import create_key
from tests.conftest import ev, named_user, started
from tests.evaluation_support import registered_providers, triage_runs

RUN = "run_acme"


@pytest.fixture
def acme(workspace: Workspace, append: Callable[..., Any], operator: User, approver: User) -> dict[str, str]:
    """One object of each kind in acme/support, the tenant the others must not find."""
    append(
        RUN,
        started(input={"ticket": "T-1"}),
        ev("StepScheduled", stepPath="answer"),
        ev("StepAttemptStarted", stepPath="answer", attempt=1),
        ev("StepCompleted", stepPath="answer", attempt=1, output="done"),
        ev("RunCompleted", output="done"),
    )
    asked = services.request_reexecution(workspace=workspace, run_id=RUN, mode="rerun", reason="r", by=operator)
    link, _ = sharing.create_link(
        workspace=workspace, run=workspace.runs.get(run_id=RUN), by=operator, expires_in_hours=2
    )
    for _ in registered_providers():
        runs = triage_runs(workspace, count=1)
    datasets.add_runs(workspace=workspace, name="golden", run_ids=runs, by="carol")
    policy = policies.approve_policy(
        workspace=workspace,
        dataset="golden",
        change_kinds=["model"],
        scorers=["exact"],
        ceiling_per_evaluation_usd="1",
        ceiling_per_day_usd="5",
        ttl_hours=24,
        by=approver,
    )
    return {"rx": asked.public_id, "link": link.public_id, "policy": policy.public_id}


def _key(workspace: Workspace, scopes: list[str]) -> Client:
    _, secret = create_key(workspace=workspace, scopes=scopes)
    return Client(HTTP_AUTHORIZATION=f"Bearer {secret}", raise_request_exception=False)


def _session(user: User) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def _ask(client: Client, method: str, path: str, objects: dict[str, str]) -> tuple[int, str]:
    url = "/api/v1/" + path.format(**objects)
    if method == "DELETE":
        response = client.delete(url)
    else:
        response = client.post(
            url, data={"note": "n", "outcome": "failed", "leaseToken": "t"}, content_type="application/json"
        )
    return response.status_code, response.json()["error"]["code"]


# Operations a key may never do (a person decides), and the one a person may never do.
FOR_PEOPLE = [
    ("POST", "runs/" + RUN + "/tool-calls/c1/reconcile"),
    ("POST", "reexecutions/{rx}/approve"),
    ("POST", "reexecutions/{rx}/deny"),
    ("DELETE", "share-links/{link}"),
    ("POST", "evaluation-policies/{policy}/revoke"),
    ("POST", "runs/" + RUN + "/tool-calls/c1/approve"),
    ("POST", "runs/" + RUN + "/share-links"),
]
FOR_KEYS = [("POST", "reexecutions/{rx}/lease")]


@pytest.mark.django_db
@pytest.mark.parametrize(("method", "path"), FOR_PEOPLE)
def test_another_tenants_key_finds_nothing_where_only_people_act(
    acme: dict[str, str], other_workspace: Workspace, method: str, path: str
) -> None:
    theirs = _key(other_workspace, ["ingest", "read", "execute"])
    before = (Event.objects.count(), AuditEntry.objects.count())
    assert _ask(theirs, method, path, acme) == (404, "not_found")
    assert (Event.objects.count(), AuditEntry.objects.count()) == before


@pytest.mark.django_db
@pytest.mark.parametrize(("method", "path"), FOR_PEOPLE)
def test_our_own_key_is_refused_where_only_people_act(
    acme: dict[str, str], workspace: Workspace, method: str, path: str
) -> None:
    assert _ask(_key(workspace, ["ingest", "read", "execute"]), method, path, acme) == (403, "forbidden")


@pytest.mark.django_db
@pytest.mark.parametrize(("method", "path"), FOR_KEYS)
def test_another_tenants_person_finds_nothing_where_only_keys_act(
    acme: dict[str, str], other_workspace: Workspace, method: str, path: str
) -> None:
    gina = named_user("gina", "admin", tenant="globex")
    assert _ask(_session(gina), method, path, acme) == (404, "not_found")


@pytest.mark.django_db
@pytest.mark.parametrize(("method", "path"), FOR_KEYS)
def test_our_own_people_are_refused_where_only_keys_act(
    acme: dict[str, str], viewer: User, method: str, path: str
) -> None:
    assert _ask(_session(viewer), method, path, acme) == (403, "forbidden")


@pytest.mark.django_db
def test_a_key_without_the_scope_finds_another_tenants_run_no_more_than_any_other(
    acme: dict[str, str], workspace: Workspace, other_workspace: Workspace
) -> None:
    theirs, ours = _key(other_workspace, ["read"]), _key(workspace, ["read"])
    for path in (f"runs/{RUN}/cancel", f"runs/{RUN}/reexecutions", "reexecutions/{rx}/lease"):
        assert _ask(theirs, "POST", path, acme) == (404, "not_found")
        assert _ask(ours, "POST", path, acme) == (403, "insufficient_scope")
