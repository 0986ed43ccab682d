"""Retries with backoff and enforced timeouts (issue 15).

Retries: a step's `retries=N, backoff=Backoff(…)` records each failed attempt as StepFailed with
`error.retriable` and `error.retryAt` (the jittered moment the next attempt may start) and starts
the next attempt no earlier; a model slot's ModelPolicy does the same per call, on
harness.model.failed. A kill during the wait is in tests/test_runtime_kill.py.

Timeouts: a tool's declared timeout interrupts the wait for it: a read tool's call is recorded as
failed (ToolTimeout) and the step's retries retry it; a write tool's call becomes in doubt and the
run stops until an operator reconciles it; a model slot's timeout fails the call like a provider
error. The tools here block on an event the test sets only afterwards, so a call that returns in
time is impossible, whatever the machine's load."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from django.utils.dateparse import parse_datetime

from ledger.fold import fold
from ledger.models import Workspace
from ledger.replay import gateway
from ledger.replay.gateway import ToolCallInDoubt
from ledger.runtime.executor import resume_run, start_run
from ledger.runtime.providers import ModelRequest, ScriptedProvider
from ledger.runtime.registry import AIGenerate, Backoff, CodeRun, ModelPolicy, Tool, ToolCall, Workflow
from tests.runtime_support import (
    assert_verified as _verified,
)
from tests.runtime_support import (  # noqa: F401  (every_run_verifies is an autouse fixture)
    every_run_verifies,
)
from tests.runtime_support import (
    run_events as _events,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def released() -> Iterator[threading.Event]:
    """Set at the end of the test: what the abandoned tool and model calls wait for."""
    event = threading.Event()
    yield event
    event.set()


# --- backoff --------------------------------------------------------------------------------------


def test_backoff_grows_exponentially_up_to_its_cap_with_equal_jitter() -> None:
    backoff = Backoff(initial_s=1.0, factor=2.0, max_s=5.0, jitter=0.5)

    assert [backoff.delay_s(n, 0.0) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 2.5]
    assert [backoff.delay_s(n, 0.999999) for n in (1, 2, 3, 4)] == pytest.approx([1.0, 2.0, 4.0, 5.0])
    assert Backoff(initial_s=0.2, jitter=0.0).delay_s(3, 0.7) == pytest.approx(0.8)
    with pytest.raises(ValueError):
        Backoff(jitter=1.5)


def test_a_step_retried_with_backoff_records_when_each_retry_may_start_and_waits_for_it(workspace: Workspace) -> None:
    tries: list[int] = []

    def flaky(run_input: Any, outputs: Mapping[str, Any]) -> Any:
        tries.append(1)
        if len(tries) < 3:
            raise ConnectionError(f"try {len(tries)} refused")
        return "third time"

    wf = Workflow(
        name="retry_backoff",
        steps=(CodeRun("flaky", flaky, retries=2, backoff=Backoff(initial_s=0.05, factor=2.0, jitter=0.5)),),
    )
    outcome = start_run(workspace=workspace, workflow=wf, input={})

    assert outcome.status == "completed" and outcome.output == "third time"
    events = _events(workspace, outcome.run_id)
    failed = [e for e in events if e["type"] == "StepFailed"]
    started = [e for e in events if e["type"] == "StepAttemptStarted"]
    assert [e["payload"]["attempt"] for e in failed] == [1, 2] and len(started) == 3
    for failure, retry in zip(failed, started[1:]):
        error = failure["payload"]["error"]
        assert error["retriable"] is True and error["name"] == "ConnectionError"
        retry_at = parse_datetime(error["retryAt"])
        assert retry_at is not None and retry_at > parse_datetime(failure["recordedAt"])
        # the next attempt started no earlier than the recorded moment, in a commit after the failure's
        assert parse_datetime(retry["recordedAt"]) >= retry_at
        assert retry["sequence"] > failure["sequence"]
    # the second retry's moment is chosen after the first one's passed (the curve itself: the test above)
    first, second = (parse_datetime(f["payload"]["error"]["retryAt"]) for f in failed)
    assert first is not None and second is not None and second > first
    _verified(workspace, outcome.run_id)


def test_the_last_failure_is_not_retriable_and_has_no_retry_moment(workspace: Workspace) -> None:
    def broken(run_input: Any, outputs: Mapping[str, Any]) -> Any:
        raise ValueError("always")

    wf = Workflow(name="retry_out", steps=(CodeRun("broken", broken, retries=1, backoff=Backoff(initial_s=0.01)),))
    outcome = start_run(workspace=workspace, workflow=wf, input={})

    assert outcome.status == "failed"
    errors = [e["payload"]["error"] for e in _events(workspace, outcome.run_id) if e["type"] == "StepFailed"]
    assert [(e["retriable"], "retryAt" in e) for e in errors] == [(True, True), (False, False)]


def test_a_model_slot_retries_failed_calls_with_backoff_recorded_on_each_failure(workspace: Workspace) -> None:
    calls: list[int] = []

    def script(request: ModelRequest) -> dict[str, Any]:
        calls.append(request.turn)
        if len(calls) < 3:
            raise ConnectionError("503 from the provider")
        return {"text": "answered"}

    wf = Workflow(
        name="model_retry",
        steps=(AIGenerate("ask", "hello"),),
        models={"default": ScriptedProvider(script=script)},
        model_policies={"default": ModelPolicy(retries=2, backoff=Backoff(initial_s=0.02))},
    )
    outcome = start_run(workspace=workspace, workflow=wf, input={})

    assert outcome.status == "completed" and outcome.output == "answered"
    events = _events(workspace, outcome.run_id)
    failed = [e["payload"] for e in events if e["type"] == "harness.model.failed"]
    assert [(f["callId"], f["willRetry"], f["error"]["name"]) for f in failed] == [
        ("ask:turn1", True, "ConnectionError"),
        ("ask:turn1:retry1", True, "ConnectionError"),
    ]
    called = [e for e in events if e["type"] == "harness.model.called"]
    for failure, retry in zip(failed, called[1:]):
        assert failure["retryAt"] == failure["error"]["retryAt"]
        assert parse_datetime(retry["recordedAt"]) >= parse_datetime(failure["retryAt"])
    _verified(workspace, outcome.run_id)


# --- timeouts -------------------------------------------------------------------------------------

# The retried call must answer within the same timeout, on a thread of its own: a second, not 0.2 s,
# which a loaded 2-core machine can spend before that thread is even scheduled.
TIMEOUT_S = 1.0


def _waiting_tool(name: str, effect: str, released: threading.Event, calls: list[Any]) -> Tool:
    def wait(args: Any) -> dict[str, Any]:
        calls.append(args)
        if len(calls) == 1:
            released.wait(120)  # the first call outlives any timeout: nothing sets this before the end
        return {"ok": len(calls)}

    return Tool(name, wait, effect=effect, timeout_s=TIMEOUT_S)


def test_a_read_tool_that_outlives_its_timeout_fails_and_the_step_retries_it(
    workspace: Workspace, released: threading.Event
) -> None:
    calls: list[Any] = []
    wf = Workflow(
        name="read_timeout",
        steps=(ToolCall("look", "lookup", {"q": "x"}, retries=1),),
        tools={"lookup": _waiting_tool("lookup", "read", released, calls)},
    )

    outcome = start_run(workspace=workspace, workflow=wf, input={})

    assert outcome.status == "completed" and outcome.output == {"ok": 2}
    events = _events(workspace, outcome.run_id)
    failed = next(e["payload"] for e in events if e["type"] == "harness.tool_call.failed")
    assert failed["callId"] == "look:call" and failed["error"]["name"] == "ToolTimeout"
    assert f"timeout of {TIMEOUT_S:g} s" in failed["error"]["message"]
    step_failed = next(e["payload"] for e in events if e["type"] == "StepFailed")
    assert step_failed["error"]["retriable"] is True and step_failed["attempt"] == 1
    assert len(calls) == 2
    _verified(workspace, outcome.run_id)


def test_a_write_tool_that_outlives_its_timeout_is_in_doubt_and_never_retried(
    workspace: Workspace, released: threading.Event
) -> None:
    calls: list[Any] = []
    wf = Workflow(
        name="write_timeout",
        steps=(ToolCall("send", "send", {"to": "ops"}, retries=3),),
        tools={"send": _waiting_tool("send", "write", released, calls)},
    )

    with pytest.raises(ToolCallInDoubt, match="outlived its timeout"):
        start_run(workspace=workspace, workflow=wf, input={}, run_id="run_write_late")

    events = _events(workspace, "run_write_late")
    assert events[-1]["type"] == "harness.tool_call.in_doubt"
    assert events[-1]["payload"]["reason"] == "timeout" and events[-1]["payload"]["callId"] == "send:call"
    state = fold(events)
    assert state.tool_calls["send:call"].status == "in_doubt" and state.status == "running"
    assert "StepFailed" not in [e["type"] for e in events]  # not retried, not failed: in doubt
    # a resume refuses until an operator reconciles it; then the run goes on without calling again
    with pytest.raises(ToolCallInDoubt):
        resume_run(workspace=workspace, run_id="run_write_late", workflow=wf)
    gateway.reconcile_tool_call(
        workspace=workspace,
        run_id="run_write_late",
        call_id="send:call",
        outcome="succeeded",
        value={"ok": "sent"},
        note="the mail went out",
        by="ops@acme",
    )
    outcome = resume_run(workspace=workspace, run_id="run_write_late", workflow=wf)
    assert outcome.status == "completed" and outcome.output == {"ok": "sent"}
    assert len(calls) == 1
    _verified(workspace, "run_write_late")


def test_a_model_call_that_outlives_its_slot_timeout_fails_and_is_made_again(
    workspace: Workspace, released: threading.Event
) -> None:
    calls: list[int] = []

    def script(request: ModelRequest) -> dict[str, Any]:
        calls.append(request.turn)
        if len(calls) == 1:
            released.wait(120)
        return {"text": f"answer {len(calls)}"}

    wf = Workflow(
        name="model_timeout",
        steps=(AIGenerate("ask", "hello"),),
        models={"default": ScriptedProvider(script=script)},
        model_policies={"default": ModelPolicy(timeout_s=TIMEOUT_S, retries=1)},
    )
    outcome = start_run(workspace=workspace, workflow=wf, input={})

    assert outcome.status == "completed" and outcome.output == "answer 2"
    failed = [e["payload"] for e in _events(workspace, outcome.run_id) if e["type"] == "harness.model.failed"]
    assert [(f["callId"], f["error"]["name"], f["willRetry"]) for f in failed] == [
        ("ask:turn1", "ModelCallTimeout", True)
    ]
    _verified(workspace, outcome.run_id)
