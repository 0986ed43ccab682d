"""A long batch written in parts whose statements overlap the preparing of the next part
(ledger/log/strategies.py `pipelined`, ledger/log/statements.py `pipeline`): one transaction, so the
batch is still all or nothing, and every refusal is the one the usual way gives.

Transactional tests: the parts are taken only on a guess from the process's state cache, which
commits fill. On SQLite every append takes the locked path; the outcomes asserted are the same,
and the tests that the parts were taken check it only on PostgreSQL.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections

from ledger.errors import Fenced, IdempotencyConflict, InvalidEvent, SequenceConflict
from ledger.fold import fold
from ledger.fold.pricing import prices_for
from ledger.log import append, rollup, statements, states
from ledger.log import strategies as append_module
from ledger.log.envelopes import log_of
from ledger.log.leases import acquire_run_lease, new_owner
from ledger.log.projection import differences
from ledger.log.strategies import PIPELINE_FROM, PIPELINE_PART
from ledger.models import CostEntry, Event, Run, ToolCall, Workspace
from ledger.tenancy.services import bootstrap
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db(transaction=True)

LONG = PIPELINE_FROM + PIPELINE_PART  # three parts


@pytest.fixture
def ws() -> Workspace:
    return bootstrap(tenant="acme", workspace="support")


@pytest.fixture
def parts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of events of every part statement sent (a spy: the statements still run)."""
    sent: list[int] = []
    update_head = statements.Pipeline.update_head

    def spy(self: statements.Pipeline, run_pk: int, before: int, events: Any, *args: Any) -> None:
        sent.append(len(events))
        update_head(self, run_pk, before, events, *args)

    monkeypatch.setattr(statements.Pipeline, "update_head", spy)
    return sent


def _work(n: int, tag: str, start_turn: int = 1) -> list[dict[str, Any]]:
    """A harness's long batch: model answers (usage, a step, cost entries) and tool calls that
    start in one part and end in the next."""
    items: list[dict[str, Any]] = []
    for i in range(n):
        turn = start_turn + i
        if i % 3 == 0:
            items.append(
                ev(
                    "harness.model.responded",
                    turn=turn,
                    callId=f"m{tag}{i}",
                    stepPath="s",
                    model={"provider": "openai", "modelId": "gpt-4o-mini"},
                    response={"text": f"answer {i}", "usage": {"inputTokens": 10, "outputTokens": 5}},
                )
            )
        elif i % 3 == 1:
            items.append(
                ev(
                    "harness.tool_call.started",
                    callId=f"t{tag}{i}",
                    caller="agent",
                    toolName="lookup",
                    args={"n": i},
                    turn=turn,
                )
            )
        else:
            items.append(ev("harness.tool_call.succeeded", callId=f"t{tag}{i - 1}", result={"n": i}, durationMs=3))
    return items


def _sequences(run_id: str) -> list[int]:
    return list(Event.objects.filter(run__run_id=run_id).order_by("sequence").values_list("sequence", flat=True))


def _projections_equal_the_fold(ws: Workspace, run_id: str) -> None:
    run = Run.objects.get(workspace=ws, run_id=run_id)
    log = log_of(run)
    assert differences(run, fold(log, prices=prices_for(ws), run_id=run_id), log) == []


def _cached_run(ws: Workspace, run_id: str) -> None:
    append(workspace=ws, run_id=run_id, events=[started()])
    append(workspace=ws, run_id=run_id, events=[ev("custom.warm")])  # the cache holds the run


def _pipelined(parts: list[int], expected: list[int]) -> None:
    if connection.vendor == "postgresql":
        assert parts == expected
    else:
        assert parts == []


def test_a_long_batch_lands_whole_with_its_projections(ws: Workspace, parts: list[int]) -> None:
    _cached_run(ws, "run_p")
    items = _work(LONG, "a")

    result = append(workspace=ws, run_id="run_p", events=items)

    _pipelined(parts, [PIPELINE_PART, PIPELINE_PART, LONG - 2 * PIPELINE_PART])
    assert result.last_sequence == 2 + LONG
    assert [e["sequence"] for e in result.events] == list(range(3, 3 + LONG))
    assert not any(e["replayed"] for e in result.events)
    assert _sequences("run_p") == list(range(1, 3 + LONG))
    stored = list(
        Event.objects.filter(run__run_id="run_p", sequence__gt=2)
        .order_by("sequence")
        .values_list("event_id", flat=True)
    )
    assert stored == [e["eventId"] for e in result.events]
    run = Run.objects.get(run_id="run_p")
    assert (run.last_sequence, run.event_count) == (2 + LONG, 2 + LONG)
    assert ToolCall.objects.filter(run=run, status="succeeded").count() == LONG // 3
    assert CostEntry.objects.filter(run=run).count() == (LONG + 2) // 3
    _projections_equal_the_fold(ws, "run_p")
    # The cache followed the batch: the next append's guess is right.
    assert append(workspace=ws, run_id="run_p", events=[ev("custom.after")]).last_sequence == 3 + LONG


def test_a_long_batch_waits_for_the_server_once(
    ws: Workspace, parts: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """BEGIN goes out with the first part and COMMIT behind the last: the batch's one wait for
    the server is the pipeline's end, which reads every answer (a sync point each wait)."""
    from psycopg._pipeline_base import BasePipeline

    _cached_run(ws, "run_w")
    syncs: list[int] = []
    enqueue_sync = BasePipeline._enqueue_sync

    def counted(self: BasePipeline) -> None:
        syncs.append(len(parts))
        enqueue_sync(self)

    monkeypatch.setattr(BasePipeline, "_enqueue_sync", counted)

    result = append(workspace=ws, run_id="run_w", events=_work(LONG, "w"))

    _pipelined(parts, [PIPELINE_PART, PIPELINE_PART, LONG - 2 * PIPELINE_PART])
    assert syncs == ([3] if connection.vendor == "postgresql" else [])  # after the third part, once
    assert result.last_sequence == 2 + LONG
    assert _sequences("run_w") == list(range(1, 3 + LONG))
    _projections_equal_the_fold(ws, "run_w")


def test_the_batchs_run_step_and_usage_rows_are_written_once_and_exact(
    ws: Workspace, parts: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parts before the last write their events, tool calls and cost entries; the run's
    projected columns, the steps and the usage cells are written by the last part as they stand
    after the whole batch (PostgreSQL). A step touched only in the first part, a step whose usage
    moves in a later one, two models' cells: all equal the fold, the cells a fresh count."""
    _cached_run(ws, "run_u")
    items = _work(LONG, "u")
    items[1]["payload"]["stepPath"] = "only_first"  # a tool call's step, touched in the first part only
    for i in range(-(-2 * PIPELINE_PART // 3) * 3, LONG, 3):  # the last part's answers: another model's cell
        items[i]["payload"]["model"] = {"provider": "anthropic", "modelId": "claude-3-5-haiku"}
    sent: list[tuple[dict[str, Any], int, int]] = []
    update_head = statements.Pipeline.update_head

    def spy(
        self: statements.Pipeline, run_pk: int, before: int, events: Any, at: Any, changes: Any, guard: Any
    ) -> None:
        sent.append((dict(changes.run), len(changes.steps), len(changes.daily_usage)))
        update_head(self, run_pk, before, events, at, changes, guard)

    monkeypatch.setattr(statements.Pipeline, "update_head", spy)

    append(workspace=ws, run_id="run_u", events=items)

    if connection.vendor == "postgresql":
        assert [set(run) for run, _, _ in sent[:-1]] == [{"last_sequence"}, {"last_sequence"}]
        assert [(steps, cells) for _, steps, cells in sent[:-1]] == [(0, 0), (0, 0)]
        run, steps, cells = sent[-1]
        assert run["last_sequence"] == 2 + LONG and "input_tokens" in run and "event_count" in run
        assert (steps, cells) == (2, 2)  # "s" and "only_first"; one cell per model
    _projections_equal_the_fold(ws, "run_u")
    assert rollup.differences(ws.pk) == []
    stored = Run.objects.get(workspace=ws, run_id="run_u")
    assert stored.input_tokens == 10 * CostEntry.objects.filter(run=stored).count()


def test_answers_without_reported_usage_are_unpriced_in_every_part(ws: Workspace, parts: list[int]) -> None:
    _cached_run(ws, "run_n")
    items = _work(LONG, "n")
    for i in range(0, LONG, 6):  # every other answer, in each part: its provider reported no usage
        items[i]["payload"]["response"]["usage"] = {}

    append(workspace=ws, run_id="run_n", events=items)

    _pipelined(parts, [PIPELINE_PART, PIPELINE_PART, LONG - 2 * PIPELINE_PART])
    run = Run.objects.get(workspace=ws, run_id="run_n")
    entries = CostEntry.objects.filter(run=run)
    unreported = entries.filter(usage_reported=False)
    assert unreported.count() == len(range(0, LONG, 6)) and not unreported.exclude(cost_usd=None).exists()
    assert (run.priced_calls, run.unpriced_calls) == (entries.count() - unreported.count(), unreported.count())
    _projections_equal_the_fold(ws, "run_n")
    assert rollup.differences(ws.pk) == []


def test_an_invalid_item_in_a_later_part_writes_nothing(ws: Workspace, parts: list[int]) -> None:
    _cached_run(ws, "run_i")
    items = _work(LONG, "b")
    bad = PIPELINE_PART + 7
    items[bad] = {"type": "custom.bad", "payload": {"text": "nul \u0000 here"}}

    with pytest.raises(InvalidEvent) as refused:
        append(workspace=ws, run_id="run_i", events=items)

    assert refused.value.details["index"] == bad
    _pipelined(parts, [PIPELINE_PART])  # the first part went out and was rolled back
    assert _sequences("run_i") == [1, 2]
    assert Run.objects.get(run_id="run_i").last_sequence == 2
    assert not ToolCall.objects.filter(run__run_id="run_i").exists()
    assert not CostEntry.objects.filter(run__run_id="run_i").exists()
    _projections_equal_the_fold(ws, "run_i")
    assert append(workspace=ws, run_id="run_i", events=_work(LONG, "b")).last_sequence == 2 + LONG


def test_a_stale_guess_rolls_every_part_back_and_the_locked_path_appends(
    ws: Workspace, parts: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    _cached_run(ws, "run_s")
    from ledger.log.states import STATES

    stale = STATES.take(ws.pk, "run_s", prices_for(ws).version)
    assert stale is not None
    append(workspace=ws, run_id="run_s", events=[ev("custom.elsewhere")])  # another process
    STATES.put(ws.pk, "run_s", stale)

    result = append(workspace=ws, run_id="run_s", events=_work(LONG, "c"))

    if connection.vendor == "postgresql":
        # Sent, then missed: the first part fails the batch's transaction, and the parts after it
        # stop as soon as its answer is read (while one of them is sent, or at the end).
        assert parts[0] == PIPELINE_PART and len(parts) <= 3
    # A miss is an ordinary race: the failed pipeline's answers are not logged as warnings.
    assert not [r for r in caplog.records if r.name.startswith("psycopg")]
    assert result.last_sequence == 3 + LONG
    assert _sequences("run_s") == list(range(1, 4 + LONG))
    _projections_equal_the_fold(ws, "run_s")
    # The same connection takes the next long batch in parts again: the statements the failed
    # pipeline prepared or skipped are not taken for prepared when they are not.
    sent = len(parts)
    again = append(workspace=ws, run_id="run_s", events=_work(LONG, "c2"))
    _pipelined(parts[sent:], [PIPELINE_PART, PIPELINE_PART, LONG - 2 * PIPELINE_PART])
    assert again.last_sequence == 3 + 2 * LONG
    _projections_equal_the_fold(ws, "run_s")


def test_a_fenced_run_refuses_a_long_batch_without_its_token(ws: Workspace) -> None:
    _cached_run(ws, "run_f")
    lease = acquire_run_lease(workspace=ws, run_id="run_f", owner=new_owner())

    with pytest.raises(Fenced):
        append(workspace=ws, run_id="run_f", events=_work(LONG, "d"))
    with pytest.raises(Fenced):
        append(workspace=ws, run_id="run_f", events=_work(LONG, "d"), fencing_token=lease.fencing_token - 1)
    assert _sequences("run_f") == [1, 2]

    done = append(workspace=ws, run_id="run_f", events=_work(LONG, "d"), fencing_token=lease.fencing_token)
    assert done.last_sequence == 2 + LONG
    _projections_equal_the_fold(ws, "run_f")


def test_expected_sequence_guards_a_long_batch(ws: Workspace) -> None:
    _cached_run(ws, "run_e")

    with pytest.raises(SequenceConflict):
        append(workspace=ws, run_id="run_e", events=_work(LONG, "e"), expected_sequence=1)
    for wrong in (True, -1, "2", 2.0):  # True == 1 and 2.0 == 2 in Python: refused before any guess
        with pytest.raises(InvalidEvent):
            append(workspace=ws, run_id="run_e", events=_work(LONG, "e"), expected_sequence=wrong)
    assert _sequences("run_e") == [1, 2]
    done = append(workspace=ws, run_id="run_e", events=_work(LONG, "e"), expected_sequence=2)

    assert done.last_sequence == 2 + LONG


def test_idempotency_keys_across_parts(ws: Workspace, parts: list[int]) -> None:
    _cached_run(ws, "run_k")
    items = [{**item, "idempotencyKey": f"k{i}"} for i, item in enumerate(_work(LONG, "f"))]
    # The same key twice in one batch, in different parts: one event, the second a replay.
    items[PIPELINE_PART + 1] = dict(items[1])

    first = append(workspace=ws, run_id="run_k", events=items)

    assert first.events[PIPELINE_PART + 1]["replayed"] is True
    assert first.events[PIPELINE_PART + 1]["eventId"] == first.events[1]["eventId"]
    assert first.last_sequence == 2 + LONG - 1
    assert _sequences("run_k") == list(range(1, 2 + LONG))
    parts.clear()

    again = append(workspace=ws, run_id="run_k", events=items)
    assert all(e["replayed"] for e in again.events)
    assert [e["eventId"] for e in again.events] == [e["eventId"] for e in first.events]
    assert Run.objects.get(run_id="run_k").last_sequence == 2 + LONG - 1

    changed = [dict(item) for item in items]
    changed[PIPELINE_PART * 2] = {**changed[PIPELINE_PART * 2], "payload": {"other": True}, "type": "custom.x"}
    with pytest.raises(IdempotencyConflict):
        append(workspace=ws, run_id="run_k", events=changed)
    assert _sequences("run_k") == list(range(1, 2 + LONG))
    _projections_equal_the_fold(ws, "run_k")


def test_a_batch_that_moves_the_run_takes_the_usual_way(ws: Workspace, parts: list[int]) -> None:
    _cached_run(ws, "run_c")
    items = [*_work(LONG, "g"), ev("RunCompleted", output={"ok": True})]

    done = append(workspace=ws, run_id="run_c", events=items)

    assert parts == []
    assert done.last_sequence == 3 + LONG
    assert Run.objects.get(run_id="run_c").status == "completed"
    _projections_equal_the_fold(ws, "run_c")


def test_a_part_reads_back_the_calls_a_compacted_state_left_out(
    ws: Workspace, parts: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(states, "COMPACT_AT", 4)
    states.STATES.clear()
    _cached_run(ws, "run_r")
    opened = [
        ev("harness.tool_call.started", callId=f"open{i}", caller="agent", toolName="lookup", args={"i": i})
        for i in range(LONG)
    ]
    append(workspace=ws, run_id="run_r", events=opened)  # cached compacted: the calls left out
    parts.clear()
    # Every part ends calls the cache no longer holds: each reads them back inside the pipeline.
    closing = [ev("harness.tool_call.succeeded", callId=f"open{i}", result={"i": i}, durationMs=1) for i in range(LONG)]

    done = append(workspace=ws, run_id="run_r", events=closing)

    _pipelined(parts, [PIPELINE_PART, PIPELINE_PART, LONG - 2 * PIPELINE_PART])
    assert done.last_sequence == 2 + 2 * LONG
    assert ToolCall.objects.filter(run__run_id="run_r", status="succeeded").count() == LONG
    _projections_equal_the_fold(ws, "run_r")
    states.STATES.clear()


def test_concurrent_long_batches_leave_a_dense_log(ws: Workspace) -> None:
    _cached_run(ws, "run_w")
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for k in range(3):
                append(workspace=ws, run_id="run_w", events=[ev("custom.w", writer=n, k=k, i=i) for i in range(LONG)])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    assert errors == []
    assert _sequences("run_w") == list(range(1, 3 + 9 * LONG))
    # Every batch is contiguous: its events were numbered together, in its order.
    rows = (
        Event.objects.filter(run__run_id="run_w", sequence__gt=2).order_by("sequence").values_list("payload", flat=True)
    )
    import json

    payloads = [json.loads(p) for p in rows]
    for at in range(0, len(payloads), LONG):
        batch = payloads[at : at + LONG]
        assert {(p["writer"], p["k"]) for p in batch} == {(batch[0]["writer"], batch[0]["k"])}
        assert [p["i"] for p in batch] == list(range(LONG))
    _projections_equal_the_fold(ws, "run_w")
    assert append_module.PIPELINE_FROM <= LONG
