"""Retention: the workspace setting (audited) and `ledger prune`, which deletes exactly the runs
(and sub-run trees) whose last activity is past it, with everything that hangs off them, keeps
`ledger verify` green, and never touches another workspace's runs or an artifact still in use."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from ledger import audit, clock
from ledger.interop.otlp.ingest import ingest
from ledger.log import append
from ledger.models import (
    Artifact,
    AuditEntry,
    CostEntry,
    DailyUsage,
    Event,
    Feedback,
    ReexecutionRequest,
    Run,
    Step,
    ToolCall,
    Workspace,
)
from ledger.tenancy import retention
from ledger.tenancy.retention import InvalidRetention, set_retention
from tests.conftest import ev, ledger_cli, started
from tests.otlp_support import json_span, parse_otlp_json
from tests.test_rollup import responded

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 6, 30, 12, 0, tzinfo=UTC)
BIG = {"rows": ["x" * 1000] * 300}  # over the inline limit: stored as an artifact


def at(moment: datetime) -> Any:
    return clock.backdated(moment)


def days_ago(n: float) -> datetime:
    return NOW - timedelta(days=n)


def finished_run(
    workspace: Workspace,
    run_id: str,
    *,
    started_at: datetime,
    ended_at: datetime,
    extra: list[dict[str, Any]] | None = None,
    **start: Any,
) -> Run:
    with at(started_at):
        append(workspace=workspace, run_id=run_id, events=[started(**start), *(extra or [])])
    with at(ended_at):
        append(workspace=workspace, run_id=run_id, events=[ev("RunCompleted", output={"ok": True})])
    return Run.objects.get(workspace=workspace, run_id=run_id)


def last_activity(run: Run) -> datetime:
    return Event.objects.get(run=run, sequence=Run.objects.get(pk=run.pk).last_sequence).recorded_at


def prune(*args: str) -> tuple[int, str]:
    return ledger_cli("prune", *args)


def run_ids(workspace: Workspace) -> set[str]:
    return set(Run.objects.filter(workspace=workspace).values_list("run_id", flat=True))


@pytest.fixture
def thirty_days(workspace: Workspace, admin: Any) -> Workspace:
    set_retention(workspace=workspace, days=30, by=admin, reason="keep a month")
    return workspace


@pytest.fixture(autouse=True)
def _now(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ledger prune` reads the ledger clock; the runs are laid out before it with backdated()."""
    monkeypatch.setattr("ledger.clock.now", lambda: NOW)


# --- the setting ---------------------------------------------------------------------------------


def test_changing_retention_is_audited_with_old_new_and_reason(workspace: Workspace, admin: Any) -> None:
    assert set_retention(workspace=workspace, days=90, by=admin, reason="legal asked for 90 days")
    assert set_retention(workspace=workspace, days=None, by=admin, reason="keep everything again")
    assert not set_retention(workspace=workspace, days=None, by=admin, reason="no change")
    entries = list(audit.entries(tenant=workspace.tenant, action="retention.changed"))
    assert [(e.actor, e.reason, e.details) for e in entries] == [
        ("alice", "legal asked for 90 days", {"oldDays": None, "newDays": 90}),
        ("alice", "keep everything again", {"oldDays": 90, "newDays": None}),
    ]
    assert entries[0].target == "workspace:acme/support"
    workspace.refresh_from_db()
    assert workspace.retention_days is None


@pytest.mark.parametrize("days", [0, -1, 36_501])
def test_retention_out_of_range_is_refused(workspace: Workspace, admin: Any, days: int) -> None:
    with pytest.raises(InvalidRetention):
        set_retention(workspace=workspace, days=days, by=admin, reason="x")
    assert not AuditEntry.objects.filter(action="retention.changed").exists()


def test_retention_change_needs_a_reason(workspace: Workspace, admin: Any) -> None:
    with pytest.raises(InvalidRetention):
        set_retention(workspace=workspace, days=7, by=admin, reason="  ")


# --- which runs go -------------------------------------------------------------------------------


def test_prune_removes_exactly_the_runs_past_retention(thirty_days: Workspace) -> None:
    ws = thirty_days
    finished_run(ws, "run_old", started_at=days_ago(40), ended_at=days_ago(31))
    finished_run(ws, "run_young", started_at=days_ago(40), ended_at=days_ago(29))
    # Finished long ago, but a note was appended to it lately: its last activity is recent.
    noted = finished_run(ws, "run_noted", started_at=days_ago(90), ended_at=days_ago(80))
    with at(days_ago(5)):
        append(workspace=ws, run_id="run_noted", events=[ev("custom.note", text="still looked at")])
    assert noted.finished_at is not None and noted.finished_at < days_ago(30)
    # Started a year ago and never finished: never pruned.
    with at(days_ago(365)):
        append(workspace=ws, run_id="run_stuck", events=[started()])
    with at(days_ago(364)):
        append(workspace=ws, run_id="run_failed", events=[started(), ev("RunFailed", error={"m": "x"})])

    code, out = prune()
    assert code == 0, out
    assert run_ids(ws) == {"run_young", "run_noted", "run_stuck"}
    assert "pruned acme/support run_old" in out and "pruned acme/support run_failed" in out
    assert "pruned in all: runs=2, events=" in out


def test_the_boundary_is_strict_a_run_exactly_at_the_cutoff_stays(
    thirty_days: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = finished_run(thirty_days, "run_edge", started_at=days_ago(40), ended_at=days_ago(31))
    edge = last_activity(run) + timedelta(days=30)
    monkeypatch.setattr("ledger.clock.now", lambda: edge)
    assert prune()[0] == 0
    assert run_ids(thirty_days) == {"run_edge"}
    monkeypatch.setattr("ledger.clock.now", lambda: edge + timedelta(microseconds=1000))
    assert prune()[0] == 0
    assert run_ids(thirty_days) == set()


def _trace_ending(trace: str, end: datetime) -> Any:
    """An OTLP export of one root span (tests/otlp_support.py) ending at `end`, as its host's clock said."""
    nanos = int(end.timestamp()) * 1_000_000_000
    return parse_otlp_json(
        {
            "resourceSpans": [
                {"scopeSpans": [{"spans": [json_span("eee19b7ec3c1b174", "request", nanos - 1, nanos, "", trace)]}]}
            ]
        }
    )


def test_a_run_whose_writer_dated_its_end_in_the_future_is_pruned_by_its_last_activity(
    thirty_days: Workspace,
) -> None:
    """An OpenTelemetry root span from a host whose clock is ahead ends its run in the future: the
    run's finishedAt is the span's, and a run was pruned only once that end was past retention, so
    a clock years ahead (or an end of 2554, the most OTLP's nanoseconds hold) kept it forever."""
    ws = thirty_days
    ahead, far, lately = "a" * 32, "b" * 32, "c" * 32
    with at(days_ago(40)):
        ingest(workspace=ws, request=_trace_ending(ahead, NOW + timedelta(days=365)))
        ingest(workspace=ws, request=_trace_ending(far, datetime(2554, 7, 21, tzinfo=UTC)))
    with at(days_ago(5)):
        ingest(workspace=ws, request=_trace_ending(lately, NOW + timedelta(days=365)))
    assert Run.objects.get(workspace=ws, run_id=f"run_otel_{far}").finished_at.year == 2554
    code, out = prune()
    assert code == 0, out
    assert run_ids(ws) == {f"run_otel_{lately}"}
    assert "pruned in all: runs=2, events=" in out


def test_a_run_with_an_open_reexecution_request_is_kept(thirty_days: Workspace) -> None:
    finished_run(thirty_days, "run_asked", started_at=days_ago(60), ended_at=days_ago(50))
    request = ReexecutionRequest.objects.create(
        public_id="rx_open",
        workspace=thirty_days,
        original_run_id="run_asked",
        mode="rerun",
        reason="again",
        requested_by="carol",
        digest="sha256:x",
        last_sequence=2,
        plan_digest="sha256:y",
        status="pending_approval",
        expires_at=NOW + timedelta(hours=1),
        created_at=NOW,
        updated_at=NOW,
    )
    prune()
    assert run_ids(thirty_days) == {"run_asked"}
    ReexecutionRequest.objects.filter(pk=request.pk).update(status="denied")
    prune()
    assert run_ids(thirty_days) == set()
    assert ReexecutionRequest.objects.filter(pk=request.pk).exists()  # what was asked outlives the run


def test_sub_runs_go_with_their_parent_only_when_the_whole_tree_is_past(thirty_days: Workspace) -> None:
    ws = thirty_days
    finished_run(ws, "run_parent", started_at=days_ago(70), ended_at=days_ago(20))
    finished_run(ws, "run_child", started_at=days_ago(69), ended_at=days_ago(68), parentRunId="run_parent")
    assert Run.objects.get(run_id="run_child").root_run_id == "run_parent"
    prune()
    assert run_ids(ws) == {"run_parent", "run_child"}  # the parent is young: its old child stays

    finished_run(ws, "run_root", started_at=days_ago(70), ended_at=days_ago(40))
    finished_run(ws, "run_leaf", started_at=days_ago(69), ended_at=days_ago(41), parentRunId="run_root")
    code, out = prune()
    assert run_ids(ws) == {"run_parent", "run_child"}
    assert "pruned acme/support run_root (+1 sub-run(s))" in out
    entry = AuditEntry.objects.get(action="run.pruned", target="run:run_root")
    assert sorted(entry.details["runs"]) == ["run_leaf", "run_root"]
    assert entry.details["counts"]["runs"] == 2 and entry.actor == "system:prune"


def test_another_workspace_without_retention_is_untouched(thirty_days: Workspace, other_workspace: Workspace) -> None:
    finished_run(thirty_days, "run_old", started_at=days_ago(400), ended_at=days_ago(399))
    finished_run(other_workspace, "run_old", started_at=days_ago(400), ended_at=days_ago(399))
    assert prune()[0] == 0
    assert run_ids(thirty_days) == set()
    assert run_ids(other_workspace) == {"run_old"}
    code, out = prune("--workspace", "globex/main")
    assert code == 0 and "no retention set" in out
    assert run_ids(other_workspace) == {"run_old"}


def test_older_than_overrides_the_setting_for_the_workspaces_named(
    workspace: Workspace, other_workspace: Workspace
) -> None:
    finished_run(workspace, "run_a", started_at=days_ago(20), ended_at=days_ago(10))
    finished_run(other_workspace, "run_b", started_at=days_ago(20), ended_at=days_ago(10))
    assert prune("--workspace", "acme/support", "--older-than", "7")[0] == 0
    assert run_ids(workspace) == set() and run_ids(other_workspace) == {"run_b"}


# --- what goes with a run ------------------------------------------------------------------------


def _table_counts() -> dict[str, int]:
    return {
        m.__name__: m.objects.count() for m in (Run, Event, Step, CostEntry, DailyUsage, Artifact, Feedback, AuditEntry)
    }


def test_dry_run_lists_what_would_go_and_changes_nothing(thirty_days: Workspace) -> None:
    finished_run(
        thirty_days,
        "run_old",
        started_at=days_ago(50),
        ended_at=days_ago(45),
        extra=[ev("StepScheduled", stepPath="s"), responded("c1", "openai", "gpt-4o-mini", step="s")],
    )
    finished_run(thirty_days, "run_young", started_at=days_ago(5), ended_at=days_ago(4))
    before = _table_counts()
    code, out = prune("--dry-run")
    assert code == 0
    assert "would prune acme/support run_old" in out and "run_young" not in out
    assert "runs=1, events=4, costEntries=1" in out and "dry run: nothing changed" in out
    assert _table_counts() == before


def test_prune_deletes_every_row_of_the_run_and_verify_still_passes(thirty_days: Workspace, admin: Any) -> None:
    ws = thirty_days
    day = days_ago(45)
    calls = [
        ev("StepScheduled", stepPath="s"),
        responded("c1", "openai", "gpt-4o-mini", step="s"),
        responded("c2", "openai", "gpt-4o", step="s"),
    ]
    # Two runs spend in the same cells on the same day: pruning one must leave the other's share.
    finished_run(ws, "run_old", started_at=day, ended_at=day + timedelta(minutes=5), extra=calls)
    finished_run(ws, "run_kept", started_at=day, ended_at=days_ago(2), extra=calls)
    old_pk = Run.objects.get(run_id="run_old").pk
    Feedback.objects.create(run_id=old_pk, rating=4, author=admin)
    assert ledger_cli("verify")[0] == 0
    cells_before = DailyUsage.objects.filter(workspace=ws).count()

    code, out = prune("--batch-size", "1")
    assert code == 0, out
    assert run_ids(ws) == {"run_kept"}
    # By the run's pk, not through a join to it: these rows have no foreign key in the database
    # (tests/test_run_reference.py), so nothing but the prune itself deletes them.
    assert not any(model.objects.filter(run_id=old_pk).exists() for model in (Event, Step, ToolCall, CostEntry))
    assert Step.objects.filter(run__workspace=ws).count() == 1
    assert CostEntry.objects.filter(run__workspace=ws).count() == 2
    assert not Feedback.objects.exists()
    assert DailyUsage.objects.filter(workspace=ws).count() == cells_before
    assert sum(DailyUsage.objects.filter(workspace=ws).values_list("calls", flat=True)) == 2
    code, verified = ledger_cli("verify")
    assert code == 0, verified

    # The kept run goes too once it is old enough: its cells go with its last cost entries.
    finished_run(ws, "run_young", started_at=days_ago(1), ended_at=days_ago(0.5))
    ledger_cli("prune", "--older-than", "1")
    assert run_ids(ws) == {"run_young"}
    assert not DailyUsage.objects.filter(workspace=ws).exists()
    assert ledger_cli("verify")[0] == 0


def test_triggers_still_refuse_deleting_events_outside_prune(thirty_days: Workspace) -> None:
    finished_run(thirty_days, "run_old", started_at=days_ago(50), ended_at=days_ago(45))
    kept = finished_run(thirty_days, "run_young", started_at=days_ago(5), ended_at=days_ago(4))
    prune()
    assert not Run.objects.filter(pruning=True).exists()  # the mark never outlives its transaction
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cur:
        cur.execute("DELETE FROM ledger_event WHERE run_id = %s", [kept.pk])
    assert Event.objects.filter(run=kept).count() == 2


def test_artifacts_shared_with_a_kept_run_survive_and_the_others_go(
    thirty_days: Workspace, django_capture_on_commit_callbacks: Any
) -> None:
    ws = thirty_days
    own = {"rows": ["only-old"] + ["y" * 1000] * 300}
    finished_run(
        ws,
        "run_old",
        started_at=days_ago(50),
        ended_at=days_ago(45),
        extra=[
            ev("StepCompleted", stepPath="a", attempt=1, output=BIG),
            ev("StepCompleted", stepPath="b", attempt=1, output=own),
        ],
    )
    finished_run(
        ws,
        "run_kept",
        started_at=days_ago(5),
        ended_at=days_ago(4),
        extra=[ev("StepCompleted", stepPath="a", attempt=1, output=BIG)],
    )
    assert Artifact.objects.filter(workspace=ws).count() == 2
    root = Path(settings.ARTIFACTS_ROOT)
    files = {a.sha256: root / a.storage_key for a in Artifact.objects.all()}
    assert all(p.exists() for p in files.values())

    with django_capture_on_commit_callbacks(execute=True):  # the files go after the commit
        code, out = prune()
    assert code == 0 and "artifacts=1" in out
    left = list(Artifact.objects.filter(workspace=ws))
    assert len(left) == 1
    assert files[left[0].sha256].exists()
    gone = next(sha for sha in files if sha != left[0].sha256)
    assert not files[gone].exists()
    assert ledger_cli("verify")[0] == 0


def test_prune_writes_plain_lines_when_not_on_a_terminal(thirty_days: Workspace) -> None:
    finished_run(thirty_days, "run_old", started_at=days_ago(50), ended_at=days_ago(45))
    out, err = io.StringIO(), io.StringIO()
    call_command("ledger", "prune", stdout=out, stderr=err)
    assert "\r" not in out.getvalue() + err.getvalue()
    assert out.getvalue().splitlines()[0].startswith("pruned acme/support run_old last activity ")


def test_prune_refuses_bad_flags(thirty_days: Workspace) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError):
        call_command("ledger", "prune", "--older-than", "0", stdout=io.StringIO())
    with pytest.raises(CommandError):
        call_command("ledger", "prune", "--batch-size", "0", stdout=io.StringIO())
    with pytest.raises(CommandError):
        call_command("ledger", "prune", "--workspace", "nope/none", stdout=io.StringIO())


def test_progress_counts_every_candidate(thirty_days: Workspace) -> None:
    for i in range(3):
        finished_run(thirty_days, f"run_{i}", started_at=days_ago(50), ended_at=days_ago(45))
    seen: list[tuple[int, int]] = []
    progress = retention.Progress(total=3, listener=lambda p: seen.append((p.examined, p.total)))
    pruned = list(retention.prune_workspace(thirty_days, days=30, batch_size=2, progress=progress))
    assert [t.root_run_id for t in pruned] == ["run_0", "run_1", "run_2"]
    assert seen == [(1, 3), (2, 3), (3, 3)]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_prune_draws_a_progress_bar(thirty_days: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(2):
        finished_run(thirty_days, f"run_{i}", started_at=days_ago(50), ended_at=days_ago(45))
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    out = io.StringIO()
    call_command("ledger", "prune", stdout=out, stderr=io.StringIO())
    drawn = terminal.getvalue()
    assert "\racme/support [" in drawn and "] 1/2 runs examined" in drawn and "] 2/2 runs examined" in drawn
    assert drawn.endswith("\n")
    assert out.getvalue().splitlines() == ["pruned in all: runs=2, events=4, costEntries=0, artifacts=0"]


def test_a_share_link_to_a_pruned_run_answers_410_and_its_record_stays(
    thirty_days: Workspace, operator: Any, client: Any
) -> None:
    from ledger.models import ShareLink
    from ledger.tenancy.sharing import create_link

    old = finished_run(thirty_days, "run_old", started_at=days_ago(50), ended_at=days_ago(45))
    link, token = create_link(workspace=thirty_days, run=old, by=operator, expires_in_hours=24)
    assert client.get(f"/s/{token}/").status_code == 200
    prune()
    gone = client.get(f"/s/{token}/")
    assert gone.status_code == 410 and "deleted" in gone.content.decode()
    assert ShareLink.objects.filter(pk=link.pk).exists()
