"""Run leases renewed while an executor works, tool calls left in doubt stopping a resume until
an operator reconciles them, and the CLI refusing bad input before it creates anything."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from ledger.errors import Fenced
from ledger.log.leases import acquire_run_lease, renew_run_lease
from ledger.models import Run, Workspace
from ledger.replay import gateway
from ledger.replay.gateway import ToolCallInDoubt
from ledger.runtime.executor import resume_run, start_run
from ledger.runtime.providers import ScriptedProvider
from ledger.runtime.registry import CodeRun, SubWorkflow, Tool, ToolCall, Workflow
from tests.conftest import FakeClock
from tests.runtime_support import (  # noqa: F401  (every_run_verifies is an autouse fixture)
    Crash,
    every_run_verifies,
)
from tests.runtime_support import (
    assert_verified as _verified,
)
from tests.runtime_support import (
    run_events as _events,
)
from tests.runtime_workflows import SCRIPT, build_drill

# --- leases -----------------------------------------------------------------------------------


def test_a_renewed_lease_keeps_its_token_and_a_taken_over_one_cannot_be_renewed(
    workspace: Workspace, clock: FakeClock, append: Any
) -> None:
    append("run_lease", {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_x"}})
    lease = acquire_run_lease(workspace=workspace, run_id="run_lease", owner="a", ttl_s=300)
    assert not lease.due_for_renewal(clock.now())
    clock.advance(151)
    assert lease.due_for_renewal(clock.now())

    renewed = renew_run_lease(workspace=workspace, lease=lease)

    assert renewed.fencing_token == lease.fencing_token
    assert renewed.expires_at == clock.now() + timedelta(seconds=300)
    assert Run.objects.get(workspace=workspace, run_id="run_lease").lease_expires_at == renewed.expires_at
    acquire_run_lease(workspace=workspace, run_id="run_lease", owner="b", take_over=True)
    with pytest.raises(Fenced):
        renew_run_lease(workspace=workspace, lease=renewed)


def test_a_write_carries_the_renewal_of_its_writer_s_lease_and_a_taken_over_one_writes_nothing(
    workspace: Workspace, clock: FakeClock, append: Any
) -> None:
    from ledger.replay import gateway

    append("run_ride", {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_x"}})
    lease = acquire_run_lease(workspace=workspace, run_id="run_ride", owner="a", ttl_s=300)
    clock.advance(151)

    batch = gateway.runtime_batch(
        workspace=workspace,
        run_id="run_ride",
        fencing_token=lease.fencing_token,
        events=[{"type": "custom.note", "payload": {}}],
        renew=lease,
    )

    assert batch.lease is not None and batch.lease.fencing_token == lease.fencing_token
    assert batch.lease.expires_at == clock.now() + timedelta(seconds=300)
    row = Run.objects.get(workspace=workspace, run_id="run_ride")
    assert (row.lease_expires_at, row.last_sequence) == (batch.lease.expires_at, 2)
    acquire_run_lease(workspace=workspace, run_id="run_ride", owner="b", take_over=True)
    with pytest.raises(Fenced, match="taken over"):
        gateway.runtime_batch(
            workspace=workspace,
            run_id="run_ride",
            fencing_token=lease.fencing_token,
            events=[{"type": "custom.note", "payload": {}}],
            renew=batch.lease,
        )
    assert Run.objects.get(workspace=workspace, run_id="run_ride").last_sequence == 2


def test_the_executor_renews_its_lease_once_half_of_it_has_passed(workspace: Workspace, clock: FakeClock) -> None:
    seen: dict[str, Any] = {}

    def slow(run_input: Any, outputs: Any) -> str:
        seen["token"] = Run.objects.get(workspace=workspace, run_id="run_renew").fencing_token
        clock.advance(200)  # a long step: more than half of the 300 s lease
        return "done"

    def peek(run_input: Any, outputs: Any) -> str:
        row = Run.objects.get(workspace=workspace, run_id="run_renew")
        seen["expires"], seen["token_after"] = row.lease_expires_at, row.fencing_token
        return "peeked"

    wf = Workflow(name="renewing", steps=(CodeRun("slow", slow), CodeRun("peek", peek)))
    start = clock.now()
    outcome = start_run(workspace=workspace, workflow=wf, input={}, run_id="run_renew")

    assert outcome.status == "completed"
    assert seen["expires"] == start + timedelta(seconds=500)  # renewed at +200 s for another 300 s
    assert seen["token_after"] == seen["token"]
    _verified(workspace, "run_renew")


def test_a_sub_run_s_writes_renew_its_parent_s_lease(
    workspace: Workspace, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledger.runtime import registry

    seen: dict[str, Any] = {}

    def slow(run_input: Any, outputs: Any) -> str:
        clock.advance(200)  # the parent writes nothing while its sub-run works
        return "slow done"

    def peek_parent(run_input: Any, outputs: Any) -> str:  # after the sub-run's next writes
        seen["expires"] = Run.objects.get(workspace=workspace, run_id="run_parent").lease_expires_at
        return "peeked"

    # Load the configured modules into the real registry first: imported for the first time into the
    # copy, their workflows would vanish with it (a module registers once, on import).
    registry.load_modules()
    monkeypatch.setattr(registry, "_WORKFLOWS", dict(registry._WORKFLOWS))
    registry.register(Workflow(name="slow_child", steps=(CodeRun("slow", slow), CodeRun("peek", peek_parent))))
    wf = Workflow(name="parent", steps=(SubWorkflow("sub", "slow_child", {}),))
    start = clock.now()
    outcome = start_run(workspace=workspace, workflow=wf, input={}, run_id="run_parent")

    assert outcome.status == "completed"
    assert seen["expires"] == start + timedelta(seconds=500)  # renewed by the sub-run's write at +200 s


def test_an_executor_paused_past_its_lease_is_fenced_when_it_renews_and_the_log_stays_dense(
    workspace: Workspace, clock: FakeClock
) -> None:
    def paused(run_input: Any, outputs: Any) -> str:
        clock.advance(400)  # the lease ran out while this executor slept...
        acquire_run_lease(workspace=workspace, run_id="run_paused", owner="executor-b", ttl_s=300)  # ...and b took it
        return "late"

    wf = Workflow(name="paused", steps=(CodeRun("nap", paused), CodeRun("after", lambda i, o: 1)))
    with pytest.raises(Fenced, match="taken over"):
        start_run(workspace=workspace, workflow=wf, input={}, run_id="run_paused")

    events = _events(workspace, "run_paused")
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["type"] == "StepAttemptStarted"
    _verified(workspace, "run_paused")


# --- tool calls in doubt ----------------------------------------------------------------------


def _mailer(sent: Counter[str], crash: dict[str, bool]) -> Workflow:
    def send(args: Any) -> Any:
        sent["send"] += 1
        if crash.pop("armed", False):
            raise Crash()  # the request left; the executor died before the answer was recorded
        return {"sent": True, "to": args["to"]}

    return Workflow(
        name="mailer",
        steps=(ToolCall("send", "send", {"to": "ops"}), CodeRun("done", lambda i, o: {"mail": o["send"]})),
        tools={"send": Tool("send", send, effect="write", timeout_s=5)},
    )


def test_resume_refuses_a_tool_call_in_doubt_and_writes_nothing(workspace: Workspace, clock: FakeClock) -> None:
    sent: Counter[str] = Counter()
    with pytest.raises(Crash):
        start_run(workspace=workspace, workflow=_mailer(sent, {"armed": True}), input={}, run_id="run_doubt")
    clock.advance(61)  # the call's lease ran out after it went outbound
    before = Run.objects.get(workspace=workspace, run_id="run_doubt").last_sequence

    with pytest.raises(ToolCallInDoubt) as refused:
        resume_run(workspace=workspace, run_id="run_doubt", workflow=_mailer(sent, {}))

    assert (
        "send:call" in refused.value.message
        and "/api/v1/runs/run_doubt/tool-calls/send:call/reconcile" in refused.value.message
    )
    run = Run.objects.get(workspace=workspace, run_id="run_doubt")
    assert (run.last_sequence, run.lease_owner) == (before, "")
    assert sent["send"] == 1


def test_cli_resume_names_the_call_in_doubt_and_exits_non_zero(
    workspace: Workspace, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledger.runtime import registry

    sent: Counter[str] = Counter()
    with pytest.raises(Crash):
        start_run(workspace=workspace, workflow=_mailer(sent, {"armed": True}), input={}, run_id="run_doubt_cli")
    monkeypatch.setitem(registry._WORKFLOWS, "mailer", _mailer(sent, {}))
    clock.advance(61)

    with pytest.raises(CommandError) as refused:
        call_command("ledger", "resume", "run_doubt_cli", stdout=StringIO(), stderr=StringIO())

    assert refused.value.returncode != 0
    assert str(refused.value).startswith("ToolCallInDoubt: run run_doubt_cli cannot continue: tool call send:call")
    assert "/tool-calls/send:call/reconcile" in str(refused.value)
    assert sent["send"] == 1


@pytest.mark.parametrize(
    ("outcome", "value", "expected"),
    [
        ("succeeded", {"sent": True, "to": "ops", "checked": "by hand"}, "completed"),
        ("failed", {"name": "Bounced", "message": "mailbox full"}, "failed"),
    ],
)
def test_after_reconciliation_resume_continues_with_the_reconciled_outcome(
    workspace: Workspace, clock: FakeClock, outcome: str, value: Any, expected: str
) -> None:
    sent: Counter[str] = Counter()
    with pytest.raises(Crash):
        start_run(workspace=workspace, workflow=_mailer(sent, {"armed": True}), input={}, run_id="run_recon")
    clock.advance(61)
    gateway.reconcile_tool_call(
        workspace=workspace,
        run_id="run_recon",
        call_id="send:call",
        outcome=outcome,
        value=value,
        note="checked the mail server log",
        by="carol",
    )

    done = resume_run(workspace=workspace, run_id="run_recon", workflow=_mailer(sent, {}))

    assert done.status == expected
    if expected == "completed":
        assert done.output == {"mail": value}
    else:
        assert "mailbox full" in done.error["message"]
    assert sent["send"] == 1  # never sent again
    types = [e["type"] for e in _events(workspace, "run_recon")]
    assert "harness.tool_call.in_doubt" in types and "harness.tool_call.reconciled" in types
    reconciled = next(e for e in _events(workspace, "run_recon") if e["type"] == "harness.tool_call.reconciled")
    assert reconciled["payload"]["stepPath"] == "send"
    _verified(workspace, "run_recon")


# --- gateway events and the CLI ---------------------------------------------------------------


def test_the_gateway_stamps_the_step_on_a_call_s_outcome(workspace: Workspace) -> None:
    outcome = start_run(
        workspace=workspace,
        workflow=build_drill(provider=ScriptedProvider(script=SCRIPT)),
        input={"cities": ["Oslo", "Lisbon"], "to": "ops"},
    )

    ends = [
        e["payload"]
        for e in _events(workspace, outcome.run_id)
        if e["type"] in ("harness.tool_call.succeeded", "harness.tool_call.failed")
    ]
    assert [p["stepPath"] for p in ends] == ["research", "research", "research", "notify"]


def test_cli_run_refuses_invalid_json_input_before_creating_anything(workspace: Workspace) -> None:
    out = StringIO()
    with pytest.raises(CommandError, match="--input is not JSON"):
        call_command(
            "ledger",
            "run",
            "triage",
            "--input",
            "{not json",
            "--workspace",
            "acme/support",
            stdout=out,
            stderr=StringIO(),
        )
    with pytest.raises(CommandError, match="no workflow named 'nope'"):
        call_command(
            "ledger", "run", "nope", "--input", "{}", "--workspace", "acme/support", stdout=out, stderr=StringIO()
        )

    assert out.getvalue() == ""
    assert not Run.objects.exists()
