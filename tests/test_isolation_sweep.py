"""Isolation sweep: every route that exists, every object type, every caller that must be refused
(tests/isolation_sweep.py says how), through a live Daphne; and proof that the sweep fails when a
route without a check is added (tests/leaky_urls.py, served by a second Daphne)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.db.models import Sum

from ledger.demo import load_demo
from ledger.log.artifacts import store_bytes
from ledger.models import ApiKey, Dataset, Evaluation, EvaluationPolicy, ReexecutionRequest, Run, ToolGatewayClaim
from ledger.reexecution.services import request_batch
from ledger.runtime.outer_loop import start_outer_loop
from ledger.tenancy import sharing
from ledger.tenancy.access import workspace_by_path
from ledger.tenancy.services import create_key, revoke_key
from tests.isolation_sweep import ROUTES, Caller, Route, Sweep, csrf_client, http_routes, websocket_routes
from tests.live_support import session_id
from tests.servers import Daphne, start_daphne

pytestmark = pytest.mark.django_db(transaction=True)

ROLES = {"dave": "viewer", "carol": "operator", "bob": "approver", "alice": "admin"}


@pytest.fixture(scope="module")
def leaky_server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daphne]:
    daphne = start_daphne(
        tmp_path_factory.mktemp("daphne"), "leaky", {"DJANGO_SETTINGS_MODULE": "tests.leaky_settings"}
    )
    yield daphne
    daphne.stop()


def _events() -> int:
    return Run.objects.aggregate(n=Sum("last_sequence"))["n"] or 0


def _sweep(base_url: str, *, evaluations: bool = True) -> Sweep:
    """The demo's tenants, one object of every type in acme/support, and everyone who must be refused
    (without the demo's evaluations for the tests that sweep one made-up route)."""
    load_demo(history_runs=0, evaluations_too=evaluations)
    support = workspace_by_path("acme/support")
    globex = workspace_by_path("globex/main")
    alice = User.objects.get(username="alice")
    run = Run.objects.get(workspace=support, run_id="run_demo_in_doubt")
    call = ToolGatewayClaim.objects.filter(run=run).first()
    assert call is not None
    artifact = store_bytes(support, b'{"swept": true}')
    request = ReexecutionRequest.objects.filter(workspace=support).first()
    assert request is not None
    batch_id, _ = request_batch(workspace=support, run_ids=["run_demo_triage"], reason="sweep", by=alice)
    link, token = sharing.create_link(workspace=support, run=run, by=alice, expires_in_hours=1)
    revoked_link, revoked_token = sharing.create_link(workspace=support, run=run, by=alice, expires_in_hours=1)
    sharing.revoke_link(revoked_link, by=alice)
    key, _ = create_key(workspace=support, scopes=["read"])
    loop = start_outer_loop(
        workspace=support,
        workflow="research.refine",
        input={"topic": "sweep"},
        max_cycles=3,
        supervise="research.editor",
        outer_loop_id="ol_swept",
    )
    values = {
        "outer_loop_id": loop.outer_loop_id,
        "tenant": "acme",
        "workspace": "support",
        "run_id": run.run_id,
        "call_id": call.call_id,
        "artifact_id": artifact.artifact_id,
        "reexecution_id": request.public_id,
        "batch_id": batch_id,
        "link_id": link.public_id,
        "prefix": key.prefix,
        "tab": "evidence",
        "rest": "anything",
        # The demo's dataset, policy and evaluation (ledger/demo/evaluations.py).
        "name": Dataset.objects.filter(workspace=support).values_list("name", flat=True).first() or "",
        "policy_id": EvaluationPolicy.objects.filter(workspace=support).values_list("public_id", flat=True).first()
        or "",
        "evaluation_id": Evaluation.objects.filter(workspace=support).values_list("public_id", flat=True).first() or "",
    }
    assert not evaluations or (values["name"] and values["policy_id"] and values["evaluation_id"]), "no evaluation"
    no_token = "tok_" + "x" * 40
    other_run = "run_demo_triage"  # acme's too, but not what the link shares
    share_values = [
        {"why": "unknown token", "token": no_token, "run_id": run.run_id, "rest": "anything"},
        {"why": "revoked token", "token": revoked_token, "run_id": run.run_id, "rest": "anything", "gone": "1"},
        {"why": "a run the link does not share", "token": token, "run_id": other_run, "needs": "run_id"},
        {"why": "a path the link does not serve", "token": token, "rest": "anything", "needs": "rest"},
    ]
    callers = [Caller("anonymous", csrf_client(base_url), "anonymous")]
    sessions: dict[str, str] = {}
    gina = session_id(User.objects.get(username="gina"))
    sessions["outsider"] = gina
    callers.append(Caller("another tenant's admin (session)", csrf_client(base_url, gina), "outsider"))
    _, outsider_key = create_key(workspace=globex, scopes=list(ApiKey.SCOPES))
    callers.append(
        Caller("another tenant's key (all scopes)", csrf_client(base_url, key=outsider_key), "outsider", scope="all")
    )
    for username, role in ROLES.items():
        member = session_id(User.objects.get(username=username))
        callers.append(Caller(f"{username} ({role})", csrf_client(base_url, member), "member", role=role))
    for scope in ApiKey.SCOPES:
        _, secret = create_key(workspace=support, scopes=[scope])
        callers.append(Caller(f"a key with scope {scope} only", csrf_client(base_url, key=secret), "key", scope=scope))
    revoked, revoked_secret = create_key(workspace=support, scopes=list(ApiKey.SCOPES))
    revoke_key(revoked)
    callers.append(Caller("a revoked key", csrf_client(base_url, key=revoked_secret), "revoked"))
    ours = [r.run_id for r in Run.objects.filter(workspace__tenant__slug="acme")]
    ours += [r.public_id for r in ReexecutionRequest.objects.filter(workspace__tenant__slug="acme")]
    ours += [artifact.artifact_id, link.public_id, key.prefix, loop.outer_loop_id]
    unknown = {
        **values,
        "tenant": "nobody",
        "workspace": "nowhere",
        "run_id": "run_never_swept",
        "call_id": "never:turn1:c1",
        "artifact_id": "art_" + "0" * 64,
        "reexecution_id": "rx_" + "0" * 16,
        "batch_id": "rxb_" + "0" * 16,
        "outer_loop_id": "ol_" + "0" * 16,
        "link_id": "shl_" + "0" * 16,
        "prefix": "0" * 12,
    }
    return Sweep(
        base_url=base_url,
        values=values,
        unknown=unknown,
        share_values=share_values,
        callers=callers,
        ours=ours,
        session_cookies=sessions,
    )


def test_every_route_refuses_everyone_it_must(server: Daphne) -> None:
    sweep = _sweep(server.url)
    before = _events()
    routes, sockets = http_routes(), websocket_routes()
    violations = sweep.run(routes, sockets)
    print(f"isolation sweep: {len(routes)} routes, {len(sockets)} websocket routes, {sweep.requests} requests")
    assert not violations, "\n".join(violations)
    assert _events() == before, "a refused request wrote to the log"
    # Every declared route exists: the table does not keep routes that were removed.
    assert set(ROUTES) == set(routes)
    assert len(routes) >= 60 and sweep.requests > 1000


@pytest.mark.backend_independent  # the sweep's own machinery: its reports, not the product's checks
def test_the_sweep_fails_on_a_route_without_a_check(leaky_server: Daphne) -> None:
    """tests/leaky_urls.py adds a page that lists a workspace's runs to anyone who asks: undeclared,
    the sweep names it; declared as a viewer's page, the sweep reports another tenant reading it."""
    from tests.leaky_urls import LEAK

    sweep = _sweep(leaky_server.url, evaluations=False)
    assert LEAK in http_routes("tests.leaky_urls")
    undeclared = sweep.run([LEAK], [])
    assert undeclared == [
        f"route {LEAK!r} is not declared in the isolation sweep (tests/isolation_sweep.py ROUTES): say who may use it"
    ]
    sweep.violations = []
    table: dict[str, Route] = {LEAK: Route("page", {"GET": (None, "viewer")})}
    declared = sweep.run([LEAK], [], table)
    assert any("as anonymous: 200" in v for v in declared), declared
    assert any("another tenant's admin (session): 200" in v for v in declared), declared


@pytest.mark.backend_independent  # the sweep's own machinery: its reports, not the product's checks
def test_the_sweep_fails_on_a_socket_without_a_check(server: Daphne) -> None:
    sweep = _sweep(server.url, evaluations=False)
    assert sweep.run([], ["ws/some/new/route/"]) == [
        "websocket route 'ws/some/new/route/' is not declared in the isolation sweep (WEBSOCKETS)"
    ]
