"""Re-execution requests (docs/api.md "Re-execution", docs/design.md §5): who may ask, who may approve,
what an approval binds to, expiry, the external executor's claim, and the API over live HTTP.

Runs here are written through the append path by a harness that is not this deployment's
runtime (their workflow is not registered), so approved requests wait for an external executor
and nothing executes; execution by the built-in worker is tests/test_reexecution_worker.py.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from ledger.errors import NotFound
from ledger.models import AuditEntry, ReexecutionRequest, Workspace
from ledger.reexecution import execution, services
from ledger.reexecution.errors import ApprovalExpired, Forbidden, InvalidReexecution, PlanChanged, SelfApprovalForbidden
from ledger.tenancy.services import bootstrap, create_key
from tests.conftest import IN_PROCESS, ev, http_client, log_in, named_user, started
from tests.runtime_support import every_run_verifies  # noqa: F401  (autouse: ledger verify passes on every run)

# Every test runs on the fake clock (conftest), which a live server's thread reads too.
pytestmark = pytest.mark.usefixtures("clock")

RUN = "run_original"
Status = ReexecutionRequest.Status


def _finished_run(append: Callable[..., Any], run_id: str = RUN) -> str:
    append(
        run_id,
        started(input={"ticket": "T-1"}),
        ev("StepScheduled", stepPath="triage"),
        ev("StepAttemptStarted", stepPath="triage", attempt=1),
        ev("StepCompleted", stepPath="triage", attempt=1, output={"label": "billing"}),
        ev("StepScheduled", stepPath="answer"),
        ev("StepAttemptStarted", stepPath="answer", attempt=1),
        ev("StepCompleted", stepPath="answer", attempt=1, output="Refund sent."),
        ev("RunCompleted", output="Refund sent."),
    )
    return run_id


@pytest.fixture
def run(append: Callable[..., Any]) -> str:
    return _finished_run(append)


@pytest.fixture
def people(admin: User, approver: User, operator: User, viewer: User, other_workspace: Workspace) -> dict[str, User]:
    """The named users by name, and olga as an approver of another tenant."""
    olga = named_user("olga", "approver", tenant="globex")
    return {user.get_username(): user for user in (admin, approver, operator, viewer, olga)}


def _fork(workspace: Workspace, by: Any, **overrides: Any) -> ReexecutionRequest:
    body: dict[str, Any] = {"mode": "fork", "from_step": "answer", "reason": "try the new prompt"}
    body.update(overrides)
    return services.request_reexecution(workspace=workspace, run_id=RUN, by=by, **body)


def _actions(target: str) -> list[str]:
    return list(AuditEntry.objects.filter(target=target).order_by("pk").values_list("action", flat=True))


# --- services ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_fork_waits_for_approval_and_binds_to_the_digest_of_the_exact_request(workspace, run, people) -> None:
    made = _fork(
        workspace, people["carol"], input=None, model_overrides={"main": {"provider": "scripted", "model": "m2"}}
    )
    assert made.status == Status.PENDING_APPROVAL and made.public_id.startswith("rx_")
    assert made.requested_by == "carol" and made.has_input and made.input is None
    assert not made.new_run_id and made.last_sequence == 8
    without_input = _fork(workspace, people["carol"], model_overrides={"main": {"provider": "scripted", "model": "m2"}})
    # "No input override" and "the input null" are different requests.
    assert without_input.digest != made.digest and not without_input.has_input
    assert made.expires_at == made.created_at + timedelta(hours=24)


@pytest.mark.django_db
def test_simulate_needs_no_approval_and_starts_approved_with_its_run_reserved(workspace, run, people) -> None:
    made = services.request_reexecution(
        workspace=workspace, run_id=RUN, mode="simulate", reason="reproduce", by=people["carol"]
    )
    assert made.status == Status.APPROVED and made.new_run_id == f"run_{made.public_id}"
    assert made.executor == ReexecutionRequest.Executor.EXTERNAL  # its workflow is not registered here
    assert _actions(made.public_id) == ["reexecution.requested"]


@pytest.mark.django_db
def test_a_viewer_cannot_request_and_a_reason_is_required(workspace, run, people) -> None:
    with pytest.raises(Forbidden):
        _fork(workspace, people["dave"])
    with pytest.raises(InvalidReexecution) as refused:
        _fork(workspace, people["carol"], reason="  ")
    assert refused.value.details["field"] == "reason"
    with pytest.raises(InvalidReexecution):
        _fork(workspace, people["carol"], from_step="no-such-step")
    with pytest.raises(InvalidReexecution):
        services.request_reexecution(
            workspace=workspace, run_id=RUN, mode="rerun", reason="r", by=people["carol"], from_step="answer"
        )
    assert not ReexecutionRequest.objects.exists()


@pytest.mark.django_db
def test_self_approval_is_refused_and_another_approver_approves(workspace, run, people) -> None:
    bob_asks = _fork(workspace, people["bob"])
    with pytest.raises(SelfApprovalForbidden):
        services.approve(workspace=workspace, reexecution_id=bob_asks.public_id, by=people["bob"], note="mine")
    [approved] = services.approve(
        workspace=workspace, reexecution_id=bob_asks.public_id, by=people["alice"], note="looks right"
    )
    assert approved.status == Status.APPROVED and approved.approver_name == "alice" and approved.note == "looks right"
    assert approved.new_run_id == f"run_{approved.public_id}"
    assert _actions(bob_asks.public_id) == ["reexecution.requested", "reexecution.approved"]


@pytest.mark.django_db
def test_the_requester_cannot_deny_their_own_request_either_and_another_approver_can(workspace, run, people) -> None:
    bob_asks = _fork(workspace, people["bob"])
    with pytest.raises(SelfApprovalForbidden, match="denied by another member"):
        services.deny(workspace=workspace, reexecution_id=bob_asks.public_id, by=people["bob"], note="never mind")
    bob_asks.refresh_from_db()
    assert bob_asks.status == Status.PENDING_APPROVAL and _actions(bob_asks.public_id) == ["reexecution.requested"]
    [denied] = services.deny(workspace=workspace, reexecution_id=bob_asks.public_id, by=people["alice"], note="no")
    assert denied.status == Status.DENIED and denied.approver_name == "alice"


@pytest.mark.django_db(transaction=True)
def test_two_approvers_at_the_same_moment_one_wins_and_the_other_is_told_it_was_decided(
    workspace, append, people
) -> None:
    import threading

    from django.db import connection

    from ledger.reexecution.errors import NotPending

    _finished_run(append)
    made = _fork(workspace, people["carol"])
    barrier, outcomes = threading.Barrier(2), {}

    def decide(name: str, approve: bool) -> None:
        try:
            barrier.wait()
            decide_ = services.approve if approve else services.deny
            outcomes[name] = decide_(workspace=workspace, reexecution_id=made.public_id, by=people[name], note=name)
        except BaseException as exc:  # kept for the assertions below
            outcomes[name] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(n, n == "bob")) for n in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    lost = [o for o in outcomes.values() if isinstance(o, BaseException)]
    won = [o for o in outcomes.values() if not isinstance(o, BaseException)]
    assert len(won) == 1 and len(lost) == 1 and isinstance(lost[0], NotPending), outcomes
    made.refresh_from_db()
    assert made.status in (Status.APPROVED, Status.DENIED) and made.approver_name == won[0][0].approver_name
    assert _actions(made.public_id) == ["reexecution.requested", f"reexecution.{made.status}"]


@pytest.mark.django_db
def test_an_operator_cannot_approve_and_an_approver_of_another_tenant_finds_nothing(workspace, run, people) -> None:
    made = _fork(workspace, people["carol"])
    with pytest.raises(Forbidden):
        services.approve(workspace=workspace, reexecution_id=made.public_id, by=people["carol"], note="x")
    with pytest.raises(NotFound):
        services.approve(workspace=workspace, reexecution_id=made.public_id, by=people["olga"], note="x")
    made.refresh_from_db()
    assert made.status == Status.PENDING_APPROVAL


@pytest.mark.django_db
def test_an_api_key_can_request_but_never_approve(workspace, run, people) -> None:
    key, _ = create_key(workspace=workspace, scopes=["execute"])
    made = _fork(workspace, key)
    assert made.requested_by == f"key:{key.prefix}"
    with pytest.raises(Forbidden):
        services.approve(workspace=workspace, reexecution_id=made.public_id, by=key, note="x")  # type: ignore[arg-type]
    without_scope, _ = create_key(workspace=workspace, scopes=["read", "ingest"])
    with pytest.raises(Forbidden):
        _fork(workspace, without_scope)


@pytest.mark.django_db
def test_an_expired_request_is_refused_written_down_as_expired_and_audited(workspace, run, people, clock) -> None:
    made = _fork(workspace, people["carol"])
    clock.advance(hours=24, seconds=1)
    with pytest.raises(ApprovalExpired) as refused:
        services.approve(workspace=workspace, reexecution_id=made.public_id, by=people["bob"], note="late")
    made.refresh_from_db()
    assert made.status == Status.EXPIRED
    # The moment as every answer writes one (docs/api.md § Conventions), in the message too.
    assert refused.value.message.endswith(f"expired at {refused.value.details['expiresAt']}")
    assert refused.value.details["expiresAt"].endswith("Z")
    assert _actions(made.public_id) == ["reexecution.requested", "reexecution.expired"]
    with pytest.raises(ApprovalExpired):  # and it stays refused
        services.approve(workspace=workspace, reexecution_id=made.public_id, by=people["bob"], note="late")
    assert _actions(made.public_id) == ["reexecution.requested", "reexecution.expired"]


@pytest.mark.django_db
def test_the_expiry_sweep_expires_overdue_requests_only(workspace, run, people, clock, settings) -> None:
    settings.RUNLEDGER_APPROVAL_TTL_HOURS = 1
    old = _fork(workspace, people["carol"])
    clock.advance(minutes=30)
    young = _fork(workspace, people["carol"])
    clock.advance(minutes=31)
    assert execution.expire_overdue() == [old.public_id]
    assert execution.expire_overdue() == []
    young.refresh_from_db()
    assert young.status == Status.PENDING_APPROVAL
    assert AuditEntry.objects.get(target=old.public_id, action="reexecution.expired").actor == "system:expiry"


@pytest.mark.django_db
def test_approval_after_the_run_changed_is_plan_changed(workspace, people, append) -> None:
    append(
        RUN, started(), ev("StepScheduled", stepPath="triage"), ev("StepAttemptStarted", stepPath="triage", attempt=1)
    )
    made = services.request_reexecution(
        workspace=workspace, run_id=RUN, mode="resume", reason="it stopped", by=people["carol"]
    )
    append(RUN, ev("StepCompleted", stepPath="triage", attempt=1, output="ok"))
    with pytest.raises(PlanChanged) as refused:
        services.approve(workspace=workspace, reexecution_id=made.public_id, by=people["bob"], note="go")
    assert refused.value.details["runIds"] == [RUN]
    made.refresh_from_db()
    assert made.status == Status.PENDING_APPROVAL and _actions(made.public_id) == ["reexecution.requested"]


@pytest.mark.django_db
def test_resume_keeps_the_run_id_and_a_finished_run_cannot_be_resumed(workspace, people, append, run) -> None:
    from ledger.errors import RunFinished

    with pytest.raises(RunFinished):
        services.request_reexecution(workspace=workspace, run_id=RUN, mode="resume", reason="r", by=people["carol"])
    append("run_open", started(), ev("StepScheduled", stepPath="a"))
    made = services.request_reexecution(
        workspace=workspace, run_id="run_open", mode="resume", reason="r", by=people["carol"]
    )
    [approved] = services.approve(workspace=workspace, reexecution_id=made.public_id, by=people["bob"], note="ok")
    assert approved.new_run_id == "run_open"


@pytest.mark.django_db
def test_deny_needs_a_note_and_ends_the_request(workspace, run, people) -> None:
    made = _fork(workspace, people["carol"])
    with pytest.raises(InvalidReexecution):
        services.deny(workspace=workspace, reexecution_id=made.public_id, by=people["bob"], note=" ")
    [denied] = services.deny(workspace=workspace, reexecution_id=made.public_id, by=people["bob"], note="not now")
    assert denied.status == Status.DENIED and denied.approver_name == "bob" and not denied.new_run_id
    from ledger.reexecution.errors import NotPending

    with pytest.raises(NotPending):
        services.approve(workspace=workspace, reexecution_id=made.public_id, by=people["alice"], note="anyway")
    assert _actions(made.public_id) == ["reexecution.requested", "reexecution.denied"]


@pytest.mark.django_db
def test_an_evaluate_batch_is_decided_by_one_approval(workspace, people, append) -> None:
    for run_id in ("run_case_1", "run_case_2", "run_case_3"):
        _finished_run(append, run_id)
    batch_id, made = services.request_batch(
        workspace=workspace,
        run_ids=["run_case_1", "run_case_2", "run_case_3"],
        reason="new model on the cases",
        by=people["carol"],
        model_overrides={"main": {"provider": "scripted", "model": "m2"}},
    )
    assert batch_id.startswith("rxb_") and {r.batch_id for r in made} == {batch_id}
    approved = services.approve(workspace=workspace, reexecution_id=made[1].public_id, by=people["bob"], note="go")
    assert [r.status for r in approved] == [Status.APPROVED] * 3
    assert len({r.new_run_id for r in approved}) == 3
    assert AuditEntry.objects.filter(action="reexecution.approved").count() == 3


@pytest.mark.django_db
def test_a_batch_whose_run_changed_is_refused_whole(workspace, people, append) -> None:
    append("run_case_1", started(), ev("StepScheduled", stepPath="a"))
    _finished_run(append, "run_case_2")
    _, made = services.request_batch(
        workspace=workspace, run_ids=["run_case_1", "run_case_2"], reason="eval", by=people["carol"]
    )
    append("run_case_1", ev("StepAttemptStarted", stepPath="a", attempt=1))
    with pytest.raises(PlanChanged):
        services.approve(workspace=workspace, reexecution_id=made[0].public_id, by=people["bob"], note="go")
    assert set(ReexecutionRequest.objects.values_list("status", flat=True)) == {Status.PENDING_APPROVAL}


@pytest.mark.django_db
def test_the_external_executor_claims_appends_the_new_run_and_its_end_settles_the_request(
    workspace, run, people, append, clock
) -> None:
    key, _ = create_key(workspace=workspace, scopes=["execute", "ingest"])
    made = _fork(workspace, people["carol"])
    assert execution.claim_next(api_key=key) is None  # pending approval: nothing to claim
    services.approve(workspace=workspace, reexecution_id=made.public_id, by=people["bob"], note="go")
    claimed = execution.claim_next(api_key=key, owner="harness-7")
    assert claimed is not None and claimed.public_id == made.public_id and claimed.status == Status.RUNNING
    assert execution.claim_next(api_key=key) is None  # held under a live lease
    append(claimed.new_run_id, started(replayOf=RUN, reexecutionId=made.public_id))
    append(claimed.new_run_id, ev("RunCompleted", output="Refund sent, again."))
    made.refresh_from_db()
    assert made.status == Status.SUCCEEDED and made.finished_at is not None
    assert _actions(made.public_id) == [
        "reexecution.requested",
        "reexecution.approved",
        "reexecution.claimed",
        "reexecution.finished",
    ]
    assert AuditEntry.objects.get(target=made.public_id, action="reexecution.finished").actor == f"key:{key.prefix}"


@pytest.mark.django_db
def test_a_claim_whose_lease_ran_out_is_handed_out_again_for_the_same_new_run(workspace, run, people, clock) -> None:
    first, _ = create_key(workspace=workspace, scopes=["execute"])
    second, _ = create_key(workspace=workspace, scopes=["execute"])
    made = _fork(workspace, people["carol"])
    services.approve(workspace=workspace, reexecution_id=made.public_id, by=people["bob"], note="go")
    held = execution.claim_next(api_key=first)
    assert held is not None
    clock.advance(seconds=60)
    execution.renew_lease(workspace=workspace, reexecution_id=made.public_id, lease_token=held.lease_token)
    clock.advance(seconds=100)
    assert execution.claim_next(api_key=second) is None  # renewed: still held
    clock.advance(seconds=30)
    again = execution.claim_next(api_key=second)
    assert again is not None and again.new_run_id == held.new_run_id and again.attempts == 2
    from ledger.reexecution.errors import LeaseLost

    with pytest.raises(LeaseLost):
        execution.renew_lease(workspace=workspace, reexecution_id=made.public_id, lease_token=held.lease_token)


@pytest.mark.django_db
def test_the_evidence_lists_the_runs_requests_and_decisions(workspace, run, people) -> None:
    from ledger.reads.selectors import get_run
    from ledger.replay.evidence import approvals

    made = _fork(workspace, people["carol"])
    services.deny(workspace=workspace, reexecution_id=made.public_id, by=people["bob"], note="no")
    [listed] = approvals(get_run(workspace, RUN))
    assert listed["id"] == made.public_id and listed["status"] == "denied"
    assert listed["requestedBy"] == "carol" and listed["approver"] == "bob" and listed["note"] == "no"


# --- over HTTP ------------------------------------------------------------------------------------


@pytest.fixture
def sessions(people: dict[str, User]) -> Iterator[Callable[[str], httpx.Client]]:
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


@pytest.mark.django_db(transaction=True)
def test_over_http_request_approve_deny_and_every_refusal(workspace, append, sessions) -> None:
    _finished_run(append)
    carol, bob, dave, olga = (sessions(n) for n in ("carol", "bob", "dave", "olga"))
    url = f"/api/v1/runs/{RUN}/reexecutions"
    assert dave.post(url, json={"mode": "rerun", "reason": "r"}).status_code == 403
    assert _code(carol.post(url, json={"mode": "rerun"})) == "invalid_request"
    assert olga.post(url, json={"mode": "rerun", "reason": "r"}).status_code == 404
    made = carol.post(url, json={"mode": "fork", "fromStep": "answer", "input": None, "reason": "new prompt"})
    assert made.status_code == 201, made.text
    rx = made.json()
    assert rx["status"] == "pending_approval" and rx["input"] is None and rx["newRunId"] is None
    approve = f"/api/v1/reexecutions/{rx['id']}/approve"
    assert _code(carol.post(approve, json={"note": "mine"})) == "forbidden"  # an operator
    assert olga.post(approve, json={"note": "x"}).status_code == 404  # an approver of another tenant
    assert olga.get(f"/api/v1/reexecutions/{rx['id']}/divergence").status_code == 404
    assert _code(bob.post(approve, json={})) == "invalid_request"
    approved = bob.post(approve, json={"note": "looks right"})
    assert approved.status_code == 200, approved.text
    [decided] = approved.json()["reexecutions"]
    assert decided["status"] == "approved" and decided["approver"] == "bob" and decided["newRunId"] == f"run_{rx['id']}"
    assert _code(bob.post(f"/api/v1/reexecutions/{rx['id']}/deny", json={"note": "no"})) == "reexecution_not_pending"
    listed = carol.get(url).json()["reexecutions"]
    assert [r["id"] for r in listed] == [rx["id"]]
    assert olga.get(url).status_code == 404
    bob_asks = bob.post(url, json={"mode": "rerun", "reason": "flaky"}).json()
    assert (
        _code(bob.post(f"/api/v1/reexecutions/{bob_asks['id']}/approve", json={"note": "mine"}))
        == "self_approval_forbidden"
    )
    assert carol.get("/api/v1/reexecutions?status=pending_approval").json()["reexecutions"][0]["id"] == bob_asks["id"]


@pytest.mark.django_db(transaction=True)
def test_over_http_a_model_override_this_deployment_cannot_honour_is_refused_when_asked(workspace, sessions) -> None:
    """The run's workflow (the demo's triage) is registered here, so the built-in worker would
    execute it: a slot it lacks or a provider nobody registered is refused at once, single or in a
    batch, as the console's form refuses it, not queued to fail after an approval."""
    from ledger.runtime.executor import start_run

    start_run(workspace=workspace, workflow="triage", input={"ticket": "Where is my order?"}, run_id="run_triage")
    carol = sessions("carol")
    before = AuditEntry.objects.count()
    for overrides, field in (
        ({"nosuch": {"provider": "scripted", "model": "gpt-4o"}}, "modelOverrides.nosuch"),
        ({"default": {"provider": "nope", "model": "gpt-4o"}}, "modelOverrides.default.provider"),
    ):
        single = carol.post(
            "/api/v1/runs/run_triage/reexecutions",
            json={"mode": "evaluate", "reason": "other model", "modelOverrides": overrides},
        )
        batch = carol.post(
            "/api/v1/reexecutions/batches",
            json={"runIds": ["run_triage"], "mode": "evaluate", "reason": "other model", "modelOverrides": overrides},
        )
        for refused in (single, batch):
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["code"] == "invalid_request"
            assert refused.json()["error"]["details"]["field"] == field
    assert not ReexecutionRequest.objects.exists() and AuditEntry.objects.count() == before
    made = carol.post(
        "/api/v1/runs/run_triage/reexecutions",
        json={
            "mode": "evaluate",
            "reason": "other model",
            "modelOverrides": {"default": {"provider": "scripted", "model": "gpt-4o"}},
        },
    )
    assert made.status_code == 201, made.text


@pytest.mark.django_db(transaction=True)
def test_over_http_an_evaluations_prompt_or_workflow_change_is_refused_not_dropped(workspace, append, sessions) -> None:
    """Sent to a request or a batch, `promptOverrides` (or `workflow`, `inputs`) was dropped in
    silence: the runs were evaluated without the change that was the point of asking."""
    _finished_run(append)
    carol = sessions("carol")
    change = {"promptOverrides": {"answer": {"system": "Be brief."}}}
    single = carol.post(
        f"/api/v1/runs/{RUN}/reexecutions", json={"mode": "evaluate", "reason": "shorter answers", **change}
    )
    batch = carol.post(
        "/api/v1/reexecutions/batches",
        json={"runIds": [RUN], "mode": "evaluate", "reason": "shorter answers", "workflow": "triage"},
    )
    for refused, field in ((single, "promptOverrides"), (batch, "workflow")):
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "invalid_request" and error["details"]["field"] == field
        assert "POST /api/v1/evaluations" in error["details"]["fields"][field][0]
    assert not ReexecutionRequest.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_over_http_a_key_requests_claims_and_renews_but_never_approves(workspace, append, sessions) -> None:
    _finished_run(append)
    bob, alice = sessions("bob"), sessions("alice")
    executor = _key(workspace, ["execute", "ingest", "read"])
    reader = _key(workspace, ["read"])
    foreign = _key(bootstrap(tenant="globex", workspace="main"), ["execute", "read"])
    made = executor.post(f"/api/v1/runs/{RUN}/reexecutions", json={"mode": "rerun", "reason": "nightly"})
    assert made.status_code == 201, made.text
    rx_id = made.json()["id"]
    assert made.json()["requestedBy"].startswith("key:")
    assert _code(executor.post(f"/api/v1/reexecutions/{rx_id}/approve", json={"note": "x"})) == "forbidden"
    assert _code(reader.post(f"/api/v1/reexecutions/{rx_id}/approve", json={"note": "x"})) == "insufficient_scope"
    assert foreign.get(f"/api/v1/reexecutions/{rx_id}").status_code == 404
    assert executor.post("/api/v1/reexecutions/claim", json={}).status_code == 204
    assert made.json()["unownedKey"] is True  # a key made without --owner: only an admin may approve
    refused = bob.post(f"/api/v1/reexecutions/{rx_id}/approve", json={"note": "ok"})
    assert (_code(refused), refused.json()["error"]["details"]["role"]) == ("forbidden", "admin")
    assert alice.post(f"/api/v1/reexecutions/{rx_id}/approve", json={"note": "ok"}).status_code == 200
    assert reader.post("/api/v1/reexecutions/claim", json={}).status_code == 403
    assert foreign.post("/api/v1/reexecutions/claim", json={}).status_code == 204
    claimed = executor.post("/api/v1/reexecutions/claim", json={"owner": "nightly-harness"})
    assert claimed.status_code == 200, claimed.text
    body = claimed.json()
    assert body["request"]["id"] == rx_id and body["request"]["status"] == "running"
    assert body["newRunId"] == f"run_{rx_id}"
    renewed = executor.post(f"/api/v1/reexecutions/{rx_id}/lease", json={"leaseToken": body["leaseToken"]})
    assert renewed.status_code == 200, renewed.text
    assert _code(executor.post(f"/api/v1/reexecutions/{rx_id}/lease", json={"leaseToken": "0" * 32})) == "lease_lost"
    new_run = body["newRunId"]
    events = [
        {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_test", "replayOf": RUN, "reexecutionId": rx_id}},
        {"type": "RunFailed", "payload": {"error": {"name": "Boom", "message": "tool down"}}},
    ]
    assert executor.post(f"/api/v1/runs/{new_run}/events", json={"events": events}).status_code == 200
    [shown] = executor.get(f"/api/v1/runs/{RUN}/reexecutions").json()["reexecutions"]
    assert shown["status"] == "failed" and shown["error"]["name"] == "Boom"
    assert foreign.get(f"/api/v1/runs/{RUN}/reexecutions").status_code == 404
    for client in (executor, reader, foreign):
        client.close()
    out = io.StringIO()
    call_command("ledger", "verify", stdout=out)


@pytest.mark.django_db(transaction=True)
def test_over_http_an_evaluate_batch_is_requested_and_approved_at_once(workspace, append, sessions) -> None:
    for run_id in ("run_case_1", "run_case_2"):
        _finished_run(append, run_id)
    carol, bob, olga = (sessions(n) for n in ("carol", "bob", "olga"))
    body = {
        "runIds": ["run_case_1", "run_case_2"],
        "mode": "evaluate",
        "reason": "new model on the cases",
        "modelOverrides": {"main": {"provider": "scripted", "model": "m2"}},
    }
    assert olga.post("/api/v1/reexecutions/batches", json=body).status_code == 404
    assert _code(carol.post("/api/v1/reexecutions/batches", json={**body, "mode": "rerun"})) == "invalid_request"
    made = carol.post("/api/v1/reexecutions/batches", json=body)
    assert made.status_code == 201, made.text
    batch = made.json()
    assert batch["status"] == "pending_approval" and len(batch["reexecutions"]) == 2
    assert olga.get(f"/api/v1/reexecutions/batches/{batch['batchId']}").status_code == 404
    second = batch["reexecutions"][1]["id"]
    decided = bob.post(f"/api/v1/reexecutions/{second}/approve", json={"note": "go"})
    assert decided.status_code == 200, decided.text
    assert [r["status"] for r in decided.json()["reexecutions"]] == ["approved", "approved"]
    shown = carol.get(f"/api/v1/reexecutions/batches/{batch['batchId']}").json()
    assert shown["status"] == "approved" and {r["batchId"] for r in shown["reexecutions"]} == {batch["batchId"]}


@pytest.mark.django_db(transaction=True)
def test_over_http_a_request_shows_its_plan_digest_and_decision(workspace, append, sessions) -> None:
    _finished_run(append)
    carol, bob, olga = (sessions(n) for n in ("carol", "bob", "olga"))
    made = carol.post(
        f"/api/v1/runs/{RUN}/reexecutions", json={"mode": "fork", "fromStep": "answer", "reason": "new prompt"}
    ).json()
    bob.post(f"/api/v1/reexecutions/{made['id']}/approve", json={"note": "fine"})
    shown = carol.get(f"/api/v1/reexecutions/{made['id']}")
    assert shown.status_code == 200, shown.text
    body = shown.json()
    assert body["status"] == "approved" and body["approver"] == "bob" and body["note"] == "fine"
    assert body["digest"] == made["digest"] and body["digest"].startswith("sha256:")
    assert body["newRunId"] == f"run_{made['id']}" and "input" not in body
    assert body["plan"]["mode"] == "fork" and "liveWriteTools" in body["plan"]
    assert olga.get(f"/api/v1/reexecutions/{made['id']}").status_code == 404


@pytest.mark.django_db
def test_an_operator_requests_from_the_terminal_and_a_viewer_cannot(workspace, run, people) -> None:
    out = io.StringIO()
    call_command(
        "ledger",
        "reexecute",
        RUN,
        "--mode",
        "fork",
        "--from-step",
        "answer",
        "--input",
        "null",
        "--reason",
        "from the shell",
        "--as",
        "carol",
        stdout=out,
    )
    public_id, status = out.getvalue().split()
    made = ReexecutionRequest.objects.get(public_id=public_id)
    assert status == "pending_approval" and made.requested_by == "carol" and made.has_input and made.input is None
    from django.core.management.base import CommandError

    with pytest.raises(CommandError):
        call_command("ledger", "reexecute", RUN, "--mode", "rerun", "--reason", "r", "--as", "dave")
    assert _actions(public_id) == ["reexecution.requested"]
