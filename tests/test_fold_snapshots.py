"""Fold snapshots (ledger/log/snapshots.py): a read folds forward from the nearest stored or cached
state, and gets exactly the fold of the log; `ledger verify` catches a snapshot that is not; the
views that read them page what they list (issue 33, "Big runs stay fast")."""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator

import orjson
import pytest
from django.test import Client

from ledger.fold import fold
from ledger.fold.pricing import prices_of
from ledger.log import append, snapshots
from ledger.log.envelopes import log_of
from ledger.log.projection import rebuild
from ledger.log.snapshots import READS, state_after
from ledger.log.verify import verify_run
from ledger.models import FoldSnapshot, Run, Workspace
from ledger.replay.runlog import snapshot
from tests.conftest import ev
from tests.test_console_evidence import _long_chat

pytestmark = pytest.mark.django_db
BASE = "/w/acme/support/runs/run_snap/"


@pytest.fixture
def every_ten(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A snapshot every 10 events, so that a short run has several."""
    monkeypatch.setattr(snapshots, "EVERY", 10)
    yield


def _run(workspace: Workspace, run_id: str = "run_snap") -> Run:
    return Run.objects.select_related("workspace__tenant").get(workspace=workspace, run_id=run_id)


def _full(run: Run, upto: int | None = None) -> object:
    return fold(log_of(run, upto=upto), prices=prices_of(run), run_id=run.run_id)


def test_the_state_from_snapshots_is_the_fold_of_the_log_at_every_point(workspace: Workspace, every_ten: None) -> None:
    _long_chat(workspace, "run_snap", 57)
    run = _run(workspace)
    assert state_after(run) == _full(run)
    stored = list(FoldSnapshot.objects.filter(run=run).order_by("sequence").values_list("sequence", flat=True))
    assert stored == [10, 20, 40, 50]  # the ladder (10, 20, 40) and the rolling one, by the read
    for upto in (1, 9, 10, 11, 33, 50, 56, 57):
        READS.clear()  # from the stored snapshot below it, not from the cached newest state
        assert state_after(run, upto) == _full(run, upto), upto
        assert snapshot(run, upto=upto).state == _full(run, upto)


def test_after_more_appends_the_cached_and_stored_states_fold_forward(workspace: Workspace, every_ten: None) -> None:
    _long_chat(workspace, "run_snap", 25)
    first = state_after(_run(workspace))
    assert first.last_sequence == 25
    _long_chat_more(workspace, 18)
    run = _run(workspace)
    assert state_after(run) == _full(run)  # from the cached state at 25
    assert first.last_sequence == 25  # the cached state handed out before was not changed
    READS.clear()
    assert state_after(run) == _full(run)  # from the stored snapshot at 40
    assert list(FoldSnapshot.objects.filter(run=run).values_list("sequence", flat=True).order_by("sequence")) == [
        10,
        20,
        40,
    ]
    _long_chat_more(workspace, 60, start=20)  # to 103 events: 50 was never stored, the rolling one is 100
    run = _run(workspace)
    assert state_after(run) == _full(run)
    assert list(FoldSnapshot.objects.filter(run=run).values_list("sequence", flat=True).order_by("sequence")) == [
        10,
        20,
        40,
        80,
        100,
    ]
    READS.clear()
    assert state_after(run, 70) == _full(run, 70)  # from the rung at 40


def _long_chat_more(workspace: Workspace, count: int, start: int = 0) -> None:
    events = []
    for n in range(start, start + count // 3):
        events += [
            ev("StepScheduled", stepPath=f"more{n}"),
            ev("StepAttemptStarted", stepPath=f"more{n}", attempt=1),
            ev("StepCompleted", stepPath=f"more{n}", attempt=1, output=n),
        ]
    append(workspace=workspace, run_id="run_snap", events=events)


def test_verify_finds_a_corrupted_snapshot_and_rebuild_throws_them_away(workspace: Workspace, every_ten: None) -> None:
    _long_chat(workspace, "run_snap", 35)
    run = _run(workspace)
    state_after(run)
    assert {c.name: c.status for c in verify_run(run)}["projections"] == "pass"
    row = FoldSnapshot.objects.get(run=run, sequence=20)
    data = orjson.loads(zlib.decompress(bytes(row.state)))
    data["lastSequence"] = 19
    FoldSnapshot.objects.filter(pk=row.pk).update(state=zlib.compress(orjson.dumps(data)))
    check = {c.name: c for c in verify_run(run)}["projections"]
    assert check.status == "fail"
    assert "snapshot at event 20 differs from the fold of events 1..20" in check.detail
    FoldSnapshot.objects.filter(pk=row.pk).update(state=b"not json")
    assert "snapshot at event 20 cannot be read" in {c.name: c for c in verify_run(run)}["projections"].detail
    rebuild(run)
    assert not FoldSnapshot.objects.filter(run=run).exists()
    assert {c.name: c.status for c in verify_run(run)}["projections"] == "pass"


def test_a_deleted_run_takes_its_snapshots_with_it(workspace: Workspace, every_ten: None) -> None:
    _long_chat(workspace, "run_snap", 25)
    run = _run(workspace)
    state_after(run)
    assert FoldSnapshot.objects.filter(run=run).count() == 2
    Run.objects.filter(pk=run.pk).update(pruning=True)  # as retention does before its deletes
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("DELETE FROM ledger_event WHERE run_id = %s", [run.pk])
    Run.objects.filter(workspace=workspace, run_id__startswith="run_snap").delete()
    assert not FoldSnapshot.objects.exists()


# --- the views page what they list ----------------------------------------------------------------


def test_the_conversation_pages_its_sessions(browser: Client, workspace: Workspace) -> None:
    _long_chat(workspace, "run_snap", 400)  # 8 events a session: 50 sessions, two pages
    first = browser.get(BASE + "conversation/").content.decode()
    assert "sessions 1–25 of 50" in first
    second = browser.get(BASE + "conversation/", {"start": 25}).content.decode()
    assert "sessions 26–50 of 50" in second
    step = 'step <span class="mono">s25</span>'
    assert step in second and step not in first


def test_the_waterfall_pages_its_top_level_bars(browser: Client, workspace: Workspace) -> None:
    _long_chat(workspace, "run_snap", 480)  # 60 steps, the kid sub-run linked by parentRunId
    first = browser.get(BASE + "waterfall/").content.decode()
    assert "top-level bars 1–50 of 61" in first
    assert len(re.findall(r'data-kind="step"', first)) == 50
    last = browser.get(BASE + "waterfall/", {"start": 50}).content.decode()
    assert "top-level bars 51–61 of 61" in last
    assert len(re.findall(r'data-kind="step"', last)) == 10
    assert 'data-subrun="run_snap_kid"' in last and 'data-subrun="run_snap_kid"' not in first
    bad = browser.get(BASE + "waterfall/", {"start": "x"})
    assert bad.status_code == 400


def test_an_outsider_gets_404_for_every_page_of_the_paged_views(
    client: Client, workspace: Workspace, outsider: object
) -> None:
    _long_chat(workspace, "run_snap", 80)
    client.force_login(outsider)  # type: ignore[arg-type]
    for url in ("conversation/?start=25", "waterfall/?start=50", "state/?at=40"):
        assert client.get(BASE + url).status_code == 404, url


def test_aggregates_remembered_at_the_head_follow_appends_and_rebuilds(workspace: Workspace, every_ten: None) -> None:
    from ledger.models import Step
    from ledger.reads import selectors

    _long_chat(workspace, "run_snap", 35)
    run = _run(workspace)
    count = selectors.steps_page(run, start=0, size=2)[1]
    assert count == Step.objects.filter(run=run).count() > 2
    assert selectors.costs_by_model(run) == selectors._costs_by_model(run) != []
    _long_chat_more(workspace, 9)  # three more steps: the head moved, the remembered values do not hold
    run = _run(workspace)
    assert selectors.steps_page(run, start=0, size=2)[1] == count + 3
    assert selectors.costs_by_model(run) == selectors._costs_by_model(run)
    assert snapshots.at_head(run, "steps", lambda: -1) == count + 3  # remembered at this head
    rebuild(run)  # the projections rewritten: what was remembered of them is dropped
    assert snapshots.at_head(run, "steps", lambda: -1) == -1


def test_the_state_tab_lists_the_same_steps_from_a_remembered_choice(
    browser: Client, workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from console.pages import at

    monkeypatch.setattr(at, "SHOWN", 4)  # fewer than the state's steps: a choice is made
    _long_chat(workspace, "run_snap", 120)
    run = _run(workspace)
    half = run.last_sequence // 2
    at._STEPS_NEAR.clear()
    assert browser.get(BASE + "state/", {"at": half}).status_code == 200
    assert len(at._STEPS_NEAR) == 1  # the page's choice, remembered for its state
    state = snapshot(run, upto=half).state
    chosen = at._nearest(list(state.steps.values()), lambda s: s.last_sequence, half)
    assert chosen[1] > 0
    assert at._steps_near(state, half) == chosen
    assert len(at._STEPS_NEAR) == 1  # the same state: no second entry
    other = at._nearest(list(state.steps.values()), lambda s: s.last_sequence, half - 1)
    assert at._steps_near(state, half - 1) == other  # another N of the same state is chosen again
