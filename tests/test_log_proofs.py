"""Log proofs (ledger/log/proofs.py): the evidence bundle's integrity section is made once by
reading the whole log, then answered from the proof and the events after it; what it answers is
what the full inspection answers, anything the proof cannot vouch for falls back to the full
inspection, and `ledger verify` checks the proof itself (issue 33, "Big runs stay fast")."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

from ledger.log import append, proofs
from ledger.log import verify as verify_module
from ledger.log.projection import rebuild
from ledger.log.verify import verify_run
from ledger.models import LogProof, Run, Step, Workspace
from ledger.replay.evidence import evidence_bundle
from tests.test_evidence import _run_with

pytestmark = pytest.mark.django_db


def _run(workspace: Workspace, run_id: str = "run_proof") -> Run:
    return Run.objects.select_related("workspace__tenant").get(workspace=workspace, run_id=run_id)


def _more(workspace: Workspace, n: int) -> None:
    append(
        workspace=workspace,
        run_id="run_proof",
        events=[
            {"type": "StepScheduled", "payload": {"stepPath": f"more{n}"}},
            {"type": "StepAttemptStarted", "payload": {"stepPath": f"more{n}", "attempt": 1}},
            {
                "type": "harness.model.responded",
                "payload": {
                    "turn": 1,
                    "callId": f"more{n}-m",
                    "stepPath": f"more{n}",
                    "model": {"provider": "openai", "modelId": "gpt-4o"},
                    "response": {"usage": {"inputTokens": 7, "outputTokens": 3}},
                },
            },
        ],
    )


def _without_full_inspection(monkeypatch: pytest.MonkeyPatch) -> list[Run]:
    """Make a full inspection (reading the whole log) raise, to show a bundle did not need one."""
    called: list[Run] = []

    def refuse(run: Run) -> Any:
        called.append(run)
        raise AssertionError("the whole log was read")

    monkeypatch.setattr(proofs, "inspect_run", refuse)
    return called


def _full_bundle(run: Run) -> dict[str, Any]:
    """The bundle as a server without the proof makes it (and records a new one)."""
    LogProof.objects.filter(run=run).delete()
    return evidence_bundle(run)


def _without_details(bundle: dict[str, Any]) -> dict[str, Any]:
    integrity = bundle["integrity"]
    return {
        **bundle,
        "integrity": {**integrity, "checks": [{**c, "detail": ""} for c in integrity["checks"]]},
    }


def test_the_first_bundle_records_a_proof_and_the_next_is_answered_from_it(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run_with(workspace, "run_proof", 4)
    first = evidence_bundle(run)
    proof = LogProof.objects.get(run=run)
    assert proof.sequence == run.last_sequence and first["integrity"]["ok"]
    assert proof.digest == verify_module.chain(
        run.run_id, run.events.order_by("sequence").values_list("event_id", flat=True)
    )
    _without_full_inspection(monkeypatch)
    second = evidence_bundle(_run(workspace))
    assert second == first  # the same words: two downloads of an unchanged run are byte-equal
    assert {c["name"] for c in second["integrity"]["checks"]} >= {
        "dense_sequence",
        "event_ids",
        "artifact_hashes",
        "projections",
    }
    assert second["replayReady"] == first["replayReady"] and second["artifacts"] == first["artifacts"]


def test_after_appends_the_proof_is_extended_by_the_new_events_only(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run_with(workspace, "run_proof", 3)
    evidence_bundle(run)
    before = LogProof.objects.get(run=run).sequence
    _more(workspace, 1)
    _more(workspace, 2)
    called = _without_full_inspection(monkeypatch)
    run = _run(workspace)
    extended = evidence_bundle(run)
    assert not called
    proof = LogProof.objects.get(run=run)
    assert proof.sequence == run.last_sequence == before + 6
    assert proof.digest == verify_module.chain(
        run.run_id, run.events.order_by("sequence").values_list("event_id", flat=True)
    )
    monkeypatch.undo()
    full = _full_bundle(run)
    assert _without_details(extended) == _without_details(full)  # what a server without the proof says
    assert extended["integrity"]["ok"] and len(extended["costs"]) == len(full["costs"]) == 5


def test_a_proof_is_extended_over_a_run_without_cost_entries(workspace: Workspace) -> None:
    """README's first run: RunStarted alone, its evidence fetched (the proof made), then the run
    cancelled. Extending the proof read the run's cost entries by an empty list of sequences,
    which the ORM refuses to compile: the evidence (JSON, zip, `ledger export-evidence`) was a 500."""
    append(
        workspace=workspace,
        run_id="run_first",
        events=[{"type": "RunStarted", "payload": {"workflowVersionId": "wfver_hello", "input": {"name": "Ada"}}}],
    )
    evidence_bundle(_run(workspace, "run_first"))
    assert LogProof.objects.get(run__run_id="run_first").sequence == 1
    append(
        workspace=workspace,
        run_id="run_first",
        events=[{"type": "RunFailed", "payload": {"error": {"name": "Cancelled", "message": "docs audit"}}}],
    )

    extended = evidence_bundle(_run(workspace, "run_first"))

    assert extended["integrity"]["ok"] and extended["costs"] == []
    assert LogProof.objects.get(run__run_id="run_first").sequence == 2


def test_a_forged_event_after_the_proof_is_reported(workspace: Workspace) -> None:
    run = _run_with(workspace, "run_proof", 2)
    evidence_bundle(run)
    _more(workspace, 1)
    forged = _run(workspace).last_sequence
    with transaction.atomic(), connection.cursor() as cur:  # as only raw database access could
        if connection.vendor == "postgresql":
            cur.execute("SET LOCAL session_replication_role = replica")
        else:
            cur.execute("DROP TRIGGER ledger_event_no_update")
        cur.execute(
            "UPDATE ledger_event SET payload = %s WHERE run_id = %s AND sequence = %s",
            ['{"stepPath":"forged","attempt":1}', run.pk, forged],
        )
        if connection.vendor == "postgresql":
            cur.execute("SET LOCAL session_replication_role = origin")
    bundle = evidence_bundle(_run(workspace))
    checks = {c["name"]: c for c in bundle["integrity"]["checks"]}
    assert not bundle["integrity"]["ok"]
    assert checks["event_ids"]["status"] == "fail" and f"[{forged}]" in checks["event_ids"]["detail"]
    assert LogProof.objects.get(run=run).sequence < forged  # a failing log extends no proof


def test_a_projection_that_differs_after_appends_is_reported(workspace: Workspace) -> None:
    run = _run_with(workspace, "run_proof", 2)
    evidence_bundle(run)
    _more(workspace, 1)
    Step.objects.filter(run=run, step_path="more1").update(status="failed")
    bundle = evidence_bundle(_run(workspace))
    checks = {c["name"]: c for c in bundle["integrity"]["checks"]}
    assert checks["projections"]["status"] == "fail" and "step more1.status" in checks["projections"]["detail"]


def test_a_proof_that_does_not_fit_the_log_is_not_used_and_is_reported(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run_with(workspace, "run_proof", 2)
    first = evidence_bundle(run)
    LogProof.objects.filter(run=run).update(last_event_id="evt_not_this_one")
    called: list[Run] = []
    real = proofs.inspect_run
    monkeypatch.setattr(proofs, "inspect_run", lambda r: called.append(r) or real(r))
    again = evidence_bundle(_run(workspace))
    assert len(called) == 1  # the log read whole again, as without a proof
    checks = {c["name"]: c for c in again["integrity"]["checks"]}
    assert not again["integrity"]["ok"] and checks["event_ids"]["status"] == "pass"
    assert checks["projections"]["status"] == "fail" and "has another id" in checks["projections"]["detail"]
    assert {k: v for k, v in again.items() if k != "integrity"} == {k: v for k, v in first.items() if k != "integrity"}
    rebuild(_run(workspace))  # an operator's way out, once the log is known good: a new proof
    assert evidence_bundle(_run(workspace))["integrity"]["ok"]
    assert LogProof.objects.get(run=run).last_event_id == run.events.get(sequence=run.last_sequence).event_id


def test_verify_checks_the_proof_itself_and_rebuild_throws_it_away(workspace: Workspace) -> None:
    run = _run_with(workspace, "run_proof", 2)
    evidence_bundle(run)
    assert {c.name: c.status for c in verify_run(run)}["projections"] == "pass"
    LogProof.objects.filter(run=run).update(digest="0" * 64)
    check = {c.name: c for c in verify_run(run)}["projections"]
    assert check.status == "fail" and "its chain of event ids differs from the log's" in check.detail
    LogProof.objects.filter(run=run).update(payload_bytes=1, refs=["artifact://art_" + "0" * 64])
    detail = {c.name: c for c in verify_run(run)}["projections"].detail
    assert "its artifact refs differ" in detail and "its payload bytes differ" in detail
    rebuild(run)
    assert not LogProof.objects.filter(run=run).exists()
    assert {c.name: c.status for c in verify_run(run)}["projections"] == "pass"


def test_a_deleted_run_takes_its_proof_with_it(workspace: Workspace) -> None:
    run = _run_with(workspace, "run_proof", 1)
    evidence_bundle(run)
    assert LogProof.objects.filter(run=run).exists()
    Run.objects.filter(pk=run.pk).update(pruning=True)  # as retention does before its deletes
    with connection.cursor() as cur:
        cur.execute("DELETE FROM ledger_event WHERE run_id = %s", [run.pk])
    Run.objects.filter(workspace=workspace, run_id__startswith="run_proof").delete()
    assert not LogProof.objects.exists()


IMMEDIATE = {"default": {"BACKEND": "django_tasks.backends.immediate.ImmediateBackend", "QUEUES": ["default"]}}


def _ended_run(workspace: Workspace, run_id: str, steps: int) -> Run:
    _run_with(workspace, run_id, steps)
    append(workspace=workspace, run_id=run_id, events=[{"type": "RunCompleted", "payload": {"output": {}}}])
    return _run(workspace, run_id)


def test_a_long_run_is_proved_by_the_worker_when_it_ends(
    workspace: Workspace, settings: Any, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    """The run-ended hook queues `prove_run` for a run of PROVE_FROM events or more; the task
    stores the fold snapshots and the proof, so the first evidence bundle reads no whole log."""
    from ledger.log import snapshots
    from ledger.models import FoldSnapshot

    settings.TASKS = IMMEDIATE  # the task runs when the append commits, as the worker would take it
    monkeypatch.setattr(proofs, "PROVE_FROM", 20)
    monkeypatch.setattr(snapshots, "EVERY", 8)
    with django_capture_on_commit_callbacks(execute=True):
        short = _ended_run(workspace, "run_short", 2)
    assert short.last_sequence < 20
    assert not LogProof.objects.filter(run=short).exists()

    with django_capture_on_commit_callbacks(execute=True):
        run = _ended_run(workspace, "run_proof", 4)
    assert run.last_sequence >= 20 and run.status == "completed"
    proof = LogProof.objects.get(run=run)
    assert proof.sequence == run.last_sequence
    assert FoldSnapshot.objects.filter(run=run).exists()

    snapshots.READS.clear()
    called = _without_full_inspection(monkeypatch)
    bundle = evidence_bundle(run)
    assert not called
    assert {c["status"] for c in bundle["integrity"]["checks"]} == {"pass"}
