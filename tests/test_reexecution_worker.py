"""The built-in executor's queue and worker: an approved request of a registered workflow goes onto
the durable queue (django-tasks-db) in the approval's transaction; one live worker holds it at a
time; a worker that is gone leaves it recoverable; `bin/serve` runs Daphne and the worker as one
command that Ctrl-C stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django_tasks_db.models import DBTaskResult

from ledger.models import AuditEntry, ReexecutionRequest, Workspace
from ledger.reexecution import execution, services, worker
from ledger.runtime.executor import start_run
from tests.runtime_support import every_run_verifies  # noqa: F401  (autouse: ledger verify passes on every run)
from tests.servers import REPO_ROOT, database_url, free_port

# Every test runs on the fake clock (conftest), which a live server's thread reads too.
pytestmark = pytest.mark.usefixtures("clock")

Status = ReexecutionRequest.Status


@pytest.fixture
def people(approver: User, operator: User) -> dict[str, User]:
    return {user.get_username(): user for user in (approver, operator)}


@pytest.fixture
def triage_run(workspace: Workspace) -> str:
    outcome = start_run(
        workspace=workspace, workflow="triage", input={"ticket": "Where is my order?"}, run_id="run_triage"
    )
    assert outcome.status == "completed"
    return outcome.run_id


def _queued(request: ReexecutionRequest) -> int:
    return DBTaskResult.objects.filter(args_kwargs__args=[request.pk]).count()


@pytest.mark.django_db
def test_an_approval_of_a_registered_workflow_is_queued_in_its_own_transaction(workspace, triage_run, people) -> None:
    made = services.request_reexecution(
        workspace=workspace, run_id=triage_run, mode="rerun", reason="flaky", by=people["carol"]
    )
    assert _queued(made) == 0  # nothing runs before approval
    [approved] = services.approve(workspace=workspace, reexecution_id=made.public_id, by=people["bob"], note="ok")
    assert approved.executor == ReexecutionRequest.Executor.BUILTIN and _queued(made) == 1
    simulated = services.request_reexecution(
        workspace=workspace, run_id=triage_run, mode="simulate", reason="reproduce", by=people["carol"]
    )
    assert simulated.status == Status.APPROVED and _queued(simulated) == 1


@pytest.mark.django_db
def test_one_live_worker_holds_a_request_and_a_dead_or_silent_one_loses_it(
    workspace, triage_run, people, clock
) -> None:
    made = services.request_reexecution(
        workspace=workspace, run_id=triage_run, mode="simulate", reason="r", by=people["carol"]
    )
    first = execution.start(request_pk=made.pk, owner="w1")
    assert first is not None and first.status == Status.RUNNING and first.attempts == 1
    assert execution.start(request_pk=made.pk, owner="w2") is None  # held under a live lease
    assert worker.recover_stalled() == []
    # Its process is gone: the next worker takes it at once.
    taken = execution.start(request_pk=made.pk, owner="w2", owner_is_dead=lambda owner: owner == "w1")
    assert taken is not None and taken.attempts == 2 and taken.new_run_id == first.new_run_id
    # The old holder can no longer finish it or renew.
    assert execution.finish(request_pk=made.pk, lease_token=first.lease_token, succeeded=True) is None
    assert not execution.heartbeat(request_pk=made.pk, lease_token=first.lease_token)
    # A holder that stops renewing is stalled once the lease runs out, and queued again.
    clock.moment += execution.lease_ttl() + timedelta(seconds=1)
    before = _queued(made)
    assert worker.recover_stalled() == [made.public_id]
    assert _queued(made) == before + 1
    started = AuditEntry.objects.filter(target=made.public_id, action="reexecution.started")
    assert [e.details["attempt"] for e in started.order_by("pk")] == [1, 2]


@pytest.mark.django_db
def test_a_lost_task_of_an_approved_request_is_queued_again(workspace, triage_run, people, clock) -> None:
    made = services.request_reexecution(
        workspace=workspace, run_id=triage_run, mode="simulate", reason="r", by=people["carol"]
    )
    assert worker.recover_stalled() == []  # just approved: its task is on the queue
    clock.moment += execution.lease_ttl() + timedelta(seconds=1)
    assert worker.recover_stalled() == [made.public_id]


@pytest.mark.django_db
def test_an_owner_of_this_host_whose_process_is_gone_is_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    import socket

    assert worker.owner_is_dead(f"{socket.gethostname()}:{child.pid}:abcd")
    assert not worker.owner_is_dead(worker.new_owner())  # this process
    assert not worker.owner_is_dead("elsewhere:1:abcd")  # another host: only its lease tells


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(p) for p in text)
    return found


@pytest.mark.django_db(transaction=True)
def test_bin_serve_runs_daphne_and_the_worker_and_ctrl_c_stops_both(workspace, tmp_path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        # Its own process group, as in a terminal, where Ctrl-C signals the whole foreground group.
        serve = subprocess.Popen(
            [sys.executable, "bin/serve", "127.0.0.1", str(port)],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        up = False
        while time.monotonic() < deadline and serve.poll() is None and not up:
            try:
                up = httpx.get(f"http://127.0.0.1:{port}/accounts/login/", timeout=1).status_code == 200
            except httpx.TransportError:
                time.sleep(0.2)
        assert up, log.read_text()[-3000:]
        children = _children(serve.pid)
        commands = [Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode() for pid in children]
        assert (
            len(children) == 2 and any("daphne" in c for c in commands) and any("ledger worker" in c for c in commands)
        ), commands
        os.killpg(serve.pid, signal.SIGINT)  # Ctrl-C
        assert serve.wait(timeout=30) == 0, log.read_text()[-3000:]
        for pid in children:
            assert not Path(f"/proc/{pid}").exists() or "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()


# --- execution (the runtime's ledger.runtime.reexecute) -------------------------------------------

DRILL_INPUT = {"cities": ["Oslo", "Lisbon"], "to": "ops"}


@pytest.fixture
def drill(workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A finished run of the test drill workflow (model and tool calls), recorded in-process."""
    from tests.runtime_workflows import INVOCATIONS_ENV, reset_registrations

    monkeypatch.delenv(INVOCATIONS_ENV, raising=False)
    monkeypatch.setenv("RUNLEDGER_WORKFLOW_MODULES", "tests.runtime_workflows")
    reset_registrations()
    outcome = start_run(workspace=workspace, workflow="drill", input=DRILL_INPUT, run_id="run_drill")
    assert outcome.status == "completed"
    yield outcome.run_id
    reset_registrations()


def _worker(env: dict[str, str], log: Path) -> subprocess.CompletedProcess[bytes]:
    environment = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "RUNLEDGER_WORKFLOW_MODULES": "tests.runtime_workflows",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        **env,
    }
    with log.open("ab") as out:
        return subprocess.run(
            [sys.executable, "manage.py", "ledger", "worker", "--batch", "--interval", "0.1"],
            cwd=REPO_ROOT,
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=300,
        )


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_execution_leaves_the_request_recoverable_and_it_is_never_run_twice(
    workspace, drill, people, tmp_path, monkeypatch
) -> None:
    from django.utils import timezone

    from ledger.models import Run
    from ledger.runtime.testing import KILL_AFTER_ENV, KILL_RUN_ENV
    from tests.runtime_support import invocation_counts
    from tests.runtime_workflows import INVOCATIONS_ENV

    monkeypatch.setattr("ledger.clock.now", timezone.now)  # the subprocesses read the real clock
    made = services.request_reexecution(
        workspace=workspace, run_id=drill, mode="rerun", reason="nightly check", by=people["carol"]
    )
    assert not Run.objects.filter(run_id__startswith="run_rx").exists()  # nothing runs before approval
    [approved] = services.approve(workspace=workspace, reexecution_id=made.public_id, by=people["bob"], note="ok")
    new_run_id, invocations, log = approved.new_run_id, tmp_path / "invocations.jsonl", tmp_path / "worker.log"

    killed = _worker({KILL_AFTER_ENV: "14", KILL_RUN_ENV: new_run_id, INVOCATIONS_ENV: str(invocations)}, log)
    assert killed.returncode == -signal.SIGKILL, log.read_text()[-3000:]
    approved.refresh_from_db()
    assert approved.status == Status.RUNNING and worker.owner_is_dead(approved.lease_owner)
    assert 14 <= Run.objects.get(run_id=new_run_id).last_sequence < Run.objects.get(run_id=drill).last_sequence

    assert worker.recover_stalled() == [made.public_id]
    finished = _worker({INVOCATIONS_ENV: str(invocations)}, log)
    assert finished.returncode == 0, log.read_text()[-3000:]

    approved.refresh_from_db()
    assert approved.status == Status.SUCCEEDED and approved.attempts == 2
    assert set(Run.objects.values_list("run_id", flat=True)) == {drill, new_run_id}  # one new run, not two
    new, original = Run.objects.get(run_id=new_run_id), Run.objects.get(run_id=drill)
    assert new.status == "completed" and new.output == original.output
    counts = invocation_counts(invocations)
    assert counts and set(counts.values()) == {1}, counts  # no call was made twice
    assert [
        a for a in AuditEntry.objects.filter(target=made.public_id).order_by("pk").values_list("action", flat=True)
    ] == [
        "reexecution.requested",
        "reexecution.approved",
        "reexecution.started",
        "reexecution.started",
        "reexecution.finished",
    ]


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_after_a_write_call_left_fails_the_request_in_doubt_and_never_sends_it_twice(
    workspace, people, tmp_path, monkeypatch
) -> None:
    from django.utils import timezone

    from ledger.models import Run, ToolGatewayClaim
    from ledger.runtime.testing import KILL_BEFORE_ENV, KILL_RUN_ENV
    from tests.runtime_support import invocation_counts
    from tests.runtime_workflows import INVOCATIONS_ENV, reset_registrations

    monkeypatch.setattr("ledger.clock.now", timezone.now)  # the subprocesses read the real clock
    monkeypatch.delenv(INVOCATIONS_ENV, raising=False)
    reset_registrations()
    original = start_run(workspace=workspace, workflow="rt_mailer", input={"to": "ops"}, run_id="run_mail")
    assert original.status == "completed"
    made = services.request_reexecution(
        workspace=workspace, run_id="run_mail", mode="rerun", reason="send it again?", by=people["carol"]
    )
    [approved] = services.approve(workspace=workspace, reexecution_id=made.public_id, by=people["bob"], note="ok")
    new_run_id, invocations, log = approved.new_run_id, tmp_path / "invocations.jsonl", tmp_path / "worker.log"

    # Killed after the mail left and before its outcome was committed (the new run's sequence 8).
    killed = _worker({KILL_BEFORE_ENV: "8", KILL_RUN_ENV: new_run_id, INVOCATIONS_ENV: str(invocations)}, log)
    assert killed.returncode == -signal.SIGKILL, log.read_text()[-3000:]
    sent = {'tool send {"to":"ops"}': 1}
    assert invocation_counts(invocations) == sent

    # The sweep hands it to the next worker at once, well inside the dead claim's 60-s lease.
    assert worker.recover_stalled() == [made.public_id]
    finished = _worker({INVOCATIONS_ENV: str(invocations)}, log)
    assert finished.returncode == 0, log.read_text()[-3000:]

    approved.refresh_from_db()
    assert approved.status == Status.FAILED and approved.error["code"] == "tool_call_in_doubt", approved.error
    assert invocation_counts(invocations) == sent  # the mail left once
    assert ToolGatewayClaim.objects.get(run__run_id=new_run_id).status == "in_doubt"
    assert Run.objects.get(run_id=new_run_id).status == "running"  # waiting for an operator to reconcile
    reset_registrations()


@pytest.fixture
def immediate_tasks(settings: Any) -> None:
    """The immediate backend runs a task when the transaction that queued it commits."""
    settings.TASKS = {
        "default": {
            "BACKEND": "django_tasks.backends.immediate.ImmediateBackend",
            "QUEUES": ["default", "reexecutions"],
        }
    }


@pytest.mark.django_db
def test_a_simulation_needs_no_approval_and_is_executed_at_once(
    workspace, drill, people, immediate_tasks, django_capture_on_commit_callbacks
) -> None:
    from ledger.models import Run

    with django_capture_on_commit_callbacks(execute=True):
        made = services.request_reexecution(
            workspace=workspace, run_id=drill, mode="simulate", reason="reproduce", by=people["carol"]
        )
    made.refresh_from_db()
    assert made.status == Status.SUCCEEDED and made.approver_name == ""
    new, original = Run.objects.get(run_id=made.new_run_id), Run.objects.get(run_id=drill)
    assert new.status == "completed" and new.output == original.output and new.replay_of == drill
    assert list(AuditEntry.objects.filter(target=made.public_id).order_by("pk").values_list("action", flat=True)) == [
        "reexecution.requested",
        "reexecution.started",
        "reexecution.finished",
    ]


@pytest.mark.django_db
def test_a_rerun_whose_run_waits_for_a_tool_approval_stays_running_and_finishes_after_the_decision(
    workspace, people, approver, admin, immediate_tasks, django_capture_on_commit_callbacks
) -> None:
    from ledger.models import Run, ToolCall
    from ledger.reexecution import toolapprovals
    from ledger.replay import toolapproval
    from ledger.runtime.executor import resume_run
    from tests.runtime_support import run_events

    original = start_run(
        workspace=workspace,
        workflow="support.goodwill",
        input={"orderId": "B-2", "amount": 25},
        run_id="run_credit",
        requested_by="carol",
    )
    call = ToolCall.objects.get(run__run_id="run_credit", status="waiting_approval")
    toolapproval.decide(
        workspace=workspace,
        run_id="run_credit",
        call_id=call.call_id,
        approve=True,
        seen_digest=toolapproval.pending_digest(call),
        note="ok",
        by=approver,
    )
    assert original.status == "waiting_approval"
    assert resume_run(workspace=workspace, run_id="run_credit").status == "completed"
    made = services.request_reexecution(
        workspace=workspace, run_id="run_credit", mode="rerun", reason="credit again", by=people["carol"]
    )
    with django_capture_on_commit_callbacks(execute=True):
        services.approve(workspace=workspace, reexecution_id=made.public_id, by=people["bob"], note="ok")
    made.refresh_from_db()
    # Its run stopped for the credit's approver: the request has not failed, it waits with its run.
    assert made.status == Status.RUNNING and made.error is None, made.error
    assert Run.objects.get(run_id=made.new_run_id).status == "running"
    assert made.public_id not in worker.recover_stalled()  # nobody should be running it now

    waiting = ToolCall.objects.get(run__run_id=made.new_run_id, status="waiting_approval")
    with django_capture_on_commit_callbacks(execute=True):
        toolapprovals.decide(
            workspace=workspace,
            run_id=made.new_run_id,
            call_id=waiting.call_id,
            approve=True,
            seen_digest=toolapproval.pending_digest(waiting),
            note="ok again",
            by=admin,
        )
    made.refresh_from_db()
    assert made.status == Status.SUCCEEDED, (made.status, made.error)
    new = Run.objects.get(run_id=made.new_run_id)
    assert new.status == "completed" and new.output == {"credited": "gc-B-2"}
    # Executed again under the re-execution's rules: the call it made is marked live.
    done = [e for e in run_events(workspace, made.new_run_id) if e["type"] == "harness.tool_call.succeeded"]
    assert [e["payload"].get("origin") for e in done] == ["live"]


@pytest.mark.django_db
def test_a_request_the_runtime_refuses_fails_with_its_reason(
    workspace, drill, people, immediate_tasks, django_capture_on_commit_callbacks
) -> None:
    from ledger.runtime.providers import register_provider, unregister_provider

    # A provider registered when the request was made and gone by the time it executes (the
    # deployment changed in between): the runtime refuses the override.
    register_provider("retired", lambda model, current: current)
    try:
        made = services.request_reexecution(
            workspace=workspace,
            run_id=drill,
            mode="evaluate",
            reason="other model",
            by=people["carol"],
            model_overrides={"default": {"provider": "retired", "model": "x"}},
        )
    finally:
        unregister_provider("retired")
    with django_capture_on_commit_callbacks(execute=True):
        services.approve(workspace=workspace, reexecution_id=made.public_id, by=people["bob"], note="try")
    made.refresh_from_db()
    assert made.status == Status.FAILED and made.error["code"] == "unknown_model_provider", made.error
    assert AuditEntry.objects.get(target=made.public_id, action="reexecution.finished").details["status"] == "failed"
