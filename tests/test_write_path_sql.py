"""Every SQL statement the write path sends, in order, held against a golden file per database.

The write path's speed rests on the exact statements it sends (one statement per append when the
guess of the head holds, prepared once per connection by shape, no lock of its own). A change of
layout must not change them: each scenario below drives one door into the log (an API batch, a
replay, refusals, a fenced run, a long pipelined batch, a cache miss, an append inside a caller's
transaction, the tool gateway, the runtime, a simulation, a cancel) and records every statement
text the connection sends, through Django's cursor and through the raw psycopg cursors of the
one-statement append. `UPDATE_GOLDEN_SQL=1` rewrites the files (after a deliberate change of
the statements, reviewed in the diff).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

from ledger.errors import LedgerError
from ledger.models import Workspace
from ledger.runtime.executor import start_run
from ledger.runtime.providers import ScriptedProvider
from tests.conftest import FakeClock, ev, started
from tests.runtime_workflows import SCRIPT, build_drill, reset_registrations

GOLDEN = Path(__file__).parent / "data" / "write_path_sql"
_SAVEPOINT = re.compile(r'"s\d+_x\d+"')


@contextmanager
def _statements() -> Iterator[list[str]]:
    """The statement texts this thread's connection sends inside the block, in order."""
    sent: list[str] = []

    def through_django(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    raw_execute = psycopg.RawCursor.execute

    def through_raw(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        sent.append(query.decode() if isinstance(query, bytes) else str(query))
        return raw_execute(self, query, params, **kwargs)

    psycopg.RawCursor.execute = through_raw  # type: ignore[method-assign]
    try:
        with connection.execute_wrapper(through_django):
            yield sent
    finally:
        psycopg.RawCursor.execute = raw_execute  # type: ignore[method-assign]


def _normalized(statements: list[str]) -> list[str]:
    return [_SAVEPOINT.sub('"s_x"', " ".join(s.split())) for s in statements]


def _refused(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except LedgerError as exc:
        return exc.code
    raise AssertionError("not refused")


def _api_batches(workspace: Workspace, clock: FakeClock) -> None:
    from ledger import log
    from ledger.log.leases import acquire_run_lease, release_run_lease

    def append(events: list[dict[str, Any]], **kwargs: Any) -> Any:
        return log.append(workspace=workspace, run_id="run_golden", events=events, **kwargs)

    def keyed(key: str, event: dict[str, Any]) -> dict[str, Any]:
        return {**event, "idempotencyKey": key}

    append([keyed("s", started()), keyed("a", ev("StepScheduled", stepPath="a"))])
    append([keyed("b", ev("StepAttemptStarted", stepPath="a", attempt=1))], expected_sequence=2)
    append(
        [
            ev(
                "harness.model.responded",
                turn=1,
                callId="m1",
                stepPath="a",
                model={"provider": "openai", "modelId": "gpt-4o-mini"},
                response={"text": "hi", "usage": {"inputTokens": 10, "outputTokens": 2}},
            )
        ]
    )
    append([keyed("b", ev("StepAttemptStarted", stepPath="a", attempt=1))])  # a replay
    assert (
        _refused(lambda: append([keyed("b", ev("StepAttemptStarted", stepPath="a", attempt=2))]))
        == "idempotency_conflict"
    )
    assert (
        _refused(lambda: append([ev("StepCompleted", stepPath="a", attempt=1)], expected_sequence=1))
        == "sequence_conflict"
    )
    lease = acquire_run_lease(workspace=workspace, run_id="run_golden", owner="golden")
    assert _refused(lambda: append([ev("custom.note")])) == "fenced"
    append([ev("StepCompleted", stepPath="a", attempt=1, output={"n": 1})], fencing_token=lease.fencing_token)
    release_run_lease(workspace=workspace, lease=lease)
    append([ev("RunCompleted", output={"done": True})])
    assert _refused(lambda: append([ev("StepScheduled", stepPath="b")])) == "run_finished"
    append([ev("custom.after")])


def _pipelined(workspace: Workspace, clock: FakeClock) -> None:
    from ledger.log import append

    append(workspace=workspace, run_id="run_long", events=[started()])
    append(
        workspace=workspace,
        run_id="run_long",
        events=[{**ev("custom.tick", n=n), "idempotencyKey": f"t{n}"} for n in range(450)],
    )


def _cache_miss_and_transaction(workspace: Workspace, clock: FakeClock) -> None:
    from ledger.log import append
    from ledger.log.states import STATES

    append(workspace=workspace, run_id="run_miss", events=[started()])
    STATES.clear()
    append(workspace=workspace, run_id="run_miss", events=[ev("StepScheduled", stepPath="a")])
    with transaction.atomic():
        append(
            workspace=workspace,
            run_id="run_miss",
            events=[{**ev("StepAttemptStarted", stepPath="a", attempt=1), "idempotencyKey": "k1"}],
        )
        append(workspace=workspace, run_id="run_miss", events=[ev("StepCompleted", stepPath="a", attempt=1)])


def _gateway(workspace: Workspace, clock: FakeClock) -> None:
    from ledger.log import append
    from ledger.replay import gateway

    append(workspace=workspace, run_id="run_tools", events=[started()])
    claimed = gateway.claim_tool_call(
        workspace=workspace,
        run_id="run_tools",
        call_id="c1",
        tool_name="search",
        args={"q": "x"},
        idempotency_key="k-c1",
        effect="read",
        owner="w1",
    )
    gateway.mark_outbound(workspace=workspace, run_id="run_tools", call_id="c1", lease_token=claimed.lease_token)
    gateway.complete_tool_call(
        workspace=workspace,
        run_id="run_tools",
        call_id="c1",
        lease_token=claimed.lease_token,
        outcome="result",
        value={"hits": 1},
    )
    again = gateway.claim_tool_call(
        workspace=workspace,
        run_id="run_tools",
        call_id="c1",
        tool_name="search",
        args={"q": "x"},
        idempotency_key="k-c1",
        effect="read",
        owner="w2",
    )
    assert getattr(again, "idempotent_replay", False)
    pay = gateway.claim_tool_call(
        workspace=workspace,
        run_id="run_tools",
        call_id="c2",
        tool_name="pay",
        args={"amount": 3},
        effect="write",
        owner="w1",
    )
    gateway.mark_outbound(workspace=workspace, run_id="run_tools", call_id="c2", lease_token=pay.lease_token)
    clock.advance(seconds=120)
    assert gateway.settle_expired_claims(workspace=workspace, run_id="run_tools") == ["c2"]
    gateway.reconcile_tool_call(
        workspace=workspace,
        run_id="run_tools",
        call_id="c2",
        outcome="succeeded",
        value={"paid": True},
        note="checked the ledger",
        by="carol",
    )


def _runtime_and_simulation(workspace: Workspace, clock: FakeClock) -> None:
    from ledger.runtime.reexecute import execute_reexecution

    reset_registrations()
    outcome = start_run(
        workspace=workspace,
        workflow=build_drill(provider=ScriptedProvider(script=SCRIPT)),
        input={"cities": ["Oslo", "Lisbon"], "to": "ops"},
        run_id="run_drill",
    )
    assert outcome.status == "completed"
    execute_reexecution(
        workspace=workspace,
        original_run_id="run_drill",
        mode="simulate",
        new_run_id="run_drill_sim",
        reexecution_id="rx_golden",
    )


def _cancel(workspace: Workspace, clock: FakeClock) -> None:
    from ledger.log import append
    from ledger.replay.cancellation import cancel_run

    append(workspace=workspace, run_id="run_cancel", events=[started(), ev("StepScheduled", stepPath="a")])
    cancel_run(workspace=workspace, run_id="run_cancel", reason="no longer needed", by="carol")


SCENARIOS: dict[str, Callable[[Workspace, FakeClock], None]] = {
    "api_batches": _api_batches,
    "pipelined": _pipelined,
    "cache_miss_and_transaction": _cache_miss_and_transaction,
    "gateway": _gateway,
    "runtime_and_simulation": _runtime_and_simulation,
    "cancel": _cancel,
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_write_path_sends_the_golden_statements(scenario: str, workspace: Workspace, clock: FakeClock) -> None:
    from ledger.log.states import STATES

    STATES.clear()
    connection.close()  # a new connection: every shape is prepared (and seen) afresh
    with _statements() as sent:
        SCENARIOS[scenario](workspace, clock)
    got = "\n".join(_normalized(sent)) + "\n"
    golden = GOLDEN / connection.vendor / f"{scenario}.sql"
    if os.environ.get("UPDATE_GOLDEN_SQL"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(got)
    assert got == golden.read_text()


@pytest.mark.postgres_only  # the production path: SQLite's writes go through the ORM and bulk helpers
@pytest.mark.django_db(transaction=True)
def test_a_model_call_enters_each_module_of_the_log_at_most_twice(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit of a model call's response with the claim of the tool it asks for, followed from
    the door down: every call from one function of the log into another module of the log is a
    way into that module, counted once per calling function (a call made again for each event of
    the batch is the same way in). Each module is entered by at most two; the door by the gateway."""
    import sys

    from ledger.replay import gateway
    from ledger.runtime.providers import ModelRequest
    from ledger.runtime.registry import AIGenerate, Tool, Workflow

    def model(request: ModelRequest) -> dict[str, Any]:
        if request.turn == 1:
            return {
                "toolCalls": [{"id": "t1", "name": "lookup", "args": {"n": 1}}],
                "usage": {"inputTokens": 5, "outputTokens": 1},
            }
        return {"text": "done"}

    workflow = Workflow(
        name="one_lookup",
        steps=(AIGenerate("agent", "Look it up.", tools=("lookup",), max_turns=2),),
        tools={"lookup": Tool("lookup", lambda args: {"found": True})},
        models={"default": ScriptedProvider(script=model)},
    )
    start_run(workspace=workspace, workflow=workflow, input={})  # the head is guessed from here on
    ways_in: dict[str, set[str]] = {}
    real = gateway.runtime_batch

    def traced(**kwargs: Any) -> Any:
        if kwargs.get("claim") is None or ways_in:
            return real(**kwargs)

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event != "call" or frame.f_back is None:
                return
            callee, caller = frame.f_globals.get("__name__", ""), frame.f_back.f_globals.get("__name__", "")
            if (
                callee.startswith("ledger.log")
                and caller != callee
                and (caller.startswith("ledger.log") or callee == "ledger.log")
            ):
                ways_in.setdefault(callee, set()).add(f"{caller}.{frame.f_back.f_code.co_name}")

        sys.setprofile(profile)
        try:
            return real(**kwargs)
        finally:
            sys.setprofile(None)

    monkeypatch.setattr(gateway, "runtime_batch", traced)
    assert start_run(workspace=workspace, workflow=workflow, input={}).status == "completed"

    assert ways_in["ledger.log"] == {"ledger.replay.gateway._in_one_statement"}
    assert {module: sorted(callers) for module, callers in ways_in.items() if len(callers) > 2} == {}
