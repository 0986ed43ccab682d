"""The append on a guessed head (ledger/log/statements.py): a guess the database does not confirm
writes nothing and the locked path answers, so every guarantee holds whatever the guess.

Transactional tests: the process's state cache is filled only by commits, and the guesses are
made from it. On SQLite every append takes the locked path; the outcomes asserted are the same.
"""

from __future__ import annotations

from typing import Any

import pytest

from ledger.errors import Fenced, IdempotencyConflict, RunFinished, SequenceConflict
from ledger.fold import fold
from ledger.fold.pricing import prices_for
from ledger.log import append
from ledger.log.envelopes import log_of
from ledger.log.leases import acquire_run_lease, new_owner
from ledger.log.projection import differences
from ledger.log.states import STATES
from ledger.models import Event, Run, Workspace
from ledger.tenancy.services import bootstrap
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ws() -> Workspace:
    return bootstrap(tenant="acme", workspace="support")


def _sequences(run_id: str) -> list[int]:
    return list(Event.objects.filter(run__run_id=run_id).order_by("sequence").values_list("sequence", flat=True))


def _projections_equal_the_fold(ws: Workspace, run_id: str) -> None:
    run = Run.objects.get(workspace=ws, run_id=run_id)
    log = log_of(run)
    assert differences(run, fold(log, prices=prices_for(ws), run_id=run_id), log) == []


def _answer(call_id: str = "c1") -> dict[str, Any]:
    """A priced model answer: it moves the run's usage, a step and a cost entry."""
    return ev(
        "harness.model.responded",
        turn=1,
        callId=call_id,
        stepPath="s",
        model={"provider": "openai", "modelId": "gpt-4o-mini"},
        response={"text": "hi", "usage": {"inputTokens": 10, "outputTokens": 5}},
    )


def test_a_stale_guess_writes_nothing_and_the_locked_path_appends(ws: Workspace) -> None:
    append(workspace=ws, run_id="run_a", events=[started()])
    append(workspace=ws, run_id="run_a", events=[_answer()])
    stale = STATES.take(ws.pk, "run_a", prices_for(ws).version)
    assert stale is not None and stale.state.last_sequence == 2
    # Another process appends: this process's cache does not hear of it.
    append(workspace=ws, run_id="run_a", events=[ev("custom.elsewhere")])
    STATES.put(ws.pk, "run_a", stale)

    result = append(workspace=ws, run_id="run_a", events=[_answer("c2")])

    assert result.last_sequence == 4
    assert _sequences("run_a") == [1, 2, 3, 4]
    assert Run.objects.get(run_id="run_a").last_sequence == 4
    _projections_equal_the_fold(ws, "run_a")


def test_a_leased_run_refuses_a_writer_without_its_token(ws: Workspace) -> None:
    append(workspace=ws, run_id="run_l", events=[started()])
    append(workspace=ws, run_id="run_l", events=[ev("custom.warm")])  # the cache holds the run
    lease = acquire_run_lease(workspace=ws, run_id="run_l", owner=new_owner())

    with pytest.raises(Fenced):
        append(workspace=ws, run_id="run_l", events=[ev("custom.no_token")])
    with pytest.raises(Fenced):
        append(workspace=ws, run_id="run_l", events=[ev("custom.old_token")], fencing_token=lease.fencing_token - 1)
    done = append(workspace=ws, run_id="run_l", events=[ev("custom.holder")], fencing_token=lease.fencing_token)

    assert done.last_sequence == 3
    assert _sequences("run_l") == [1, 2, 3]


def test_a_key_already_in_the_log_is_replayed_or_refused(ws: Workspace) -> None:
    append(workspace=ws, run_id="run_k", events=[started()])
    first = append(workspace=ws, run_id="run_k", events=[{**ev("custom.a", n=1), "idempotencyKey": "k1"}])
    append(workspace=ws, run_id="run_k", events=[ev("custom.b")])

    again = append(workspace=ws, run_id="run_k", events=[{**ev("custom.a", n=1), "idempotencyKey": "k1"}])
    with pytest.raises(IdempotencyConflict):
        append(workspace=ws, run_id="run_k", events=[{**ev("custom.a", n=2), "idempotencyKey": "k1"}])

    assert again.events[0]["replayed"] is True
    assert again.events[0]["eventId"] == first.events[0]["eventId"]
    assert _sequences("run_k") == [1, 2, 3]
    assert append(workspace=ws, run_id="run_k", events=[ev("custom.c")]).last_sequence == 4


def test_expected_sequence_is_checked_against_the_log(ws: Workspace) -> None:
    append(workspace=ws, run_id="run_e", events=[started()])
    append(workspace=ws, run_id="run_e", events=[ev("custom.a")])

    with pytest.raises(SequenceConflict):
        append(workspace=ws, run_id="run_e", events=[ev("custom.b")], expected_sequence=1)
    done = append(workspace=ws, run_id="run_e", events=[ev("custom.b")], expected_sequence=2)

    assert done.last_sequence == 3


def test_a_refused_batch_leaves_no_half_applied_state(ws: Workspace) -> None:
    append(workspace=ws, run_id="run_r", events=[started()])
    append(workspace=ws, run_id="run_r", events=[ev("custom.a")])

    with pytest.raises(RunFinished):  # the second half of the batch is refused: nothing is written
        append(
            workspace=ws,
            run_id="run_r",
            events=[_answer(), ev("RunCompleted", output={"ok": True}), ev("StepScheduled", stepPath="late")],
        )
    done = append(workspace=ws, run_id="run_r", events=[_answer("c9")])

    assert done.last_sequence == 3
    assert Run.objects.get(run_id="run_r").status == "running"
    _projections_equal_the_fold(ws, "run_r")


def test_a_first_batch_that_finishes_the_run_projects_it(ws: Workspace) -> None:
    append(workspace=ws, run_id="run_f", events=[started(), _answer(), ev("RunCompleted", output={"answer": 42})])

    run = Run.objects.get(run_id="run_f")
    assert (run.status, run.output, run.last_sequence, run.event_count) == ("completed", {"answer": 42}, 3, 3)
    _projections_equal_the_fold(ws, "run_f")


def test_the_state_cache_stays_bounded(ws: Workspace) -> None:
    size = STATES.size
    STATES.size = 3
    try:
        for n in range(6):
            append(workspace=ws, run_id=f"run_b{n}", events=[started()])
            append(workspace=ws, run_id=f"run_b{n}", events=[ev("custom.a")])
        version = prices_for(ws).version
        kept = [n for n in range(6) if STATES.take(ws.pk, f"run_b{n}", version) is not None]
    finally:
        STATES.size = size
    assert kept == [3, 4, 5]
