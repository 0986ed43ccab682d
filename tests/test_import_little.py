"""`ledger import-little DIR --workspace T/W`: a Little Workflow data directory into the ledger with
the same event ids (ledger/interop/little_import.py), on the sample of tests/data/little/."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import sqlite3
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from ledger.canonical import canonical_bytes, digest, event_id
from ledger.errors import RunFinished, RunNotStarted
from ledger.fold import fold
from ledger.log import append, artifacts
from ledger.log.envelopes import log_of
from ledger.models import Artifact, Event, Run, Workspace
from tests.conftest import ev, started
from tests.data.little import make_sample

SAMPLE = Path(__file__).resolve().parent / "data" / "little" / "sample"
VECTORS = json.loads((Path(__file__).resolve().parent / "data" / "vectors.json").read_text(encoding="utf-8"))
RUNS = ["run_7f3a", "run_artifacts", "run_cycle_1", "run_cycle_2", "run_order"]
ARTIFACT = "art_1c38cdc9a16429fa"  # vector V7 of little-workflow.md §1


def ledger(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("ledger", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    except CommandError as exc:  # what manage.py prints on stderr, exit status 1
        code = exc.returncode
        err.write(str(exc))
    return code, out.getvalue(), err.getvalue()


def import_little(directory: Path, workspace: str = "acme/support") -> tuple[int, str, str]:
    return ledger("import-little", str(directory), "--workspace", workspace)


def sample_lines(run_id: str, directory: Path = SAMPLE) -> list[str]:
    return (directory / "events" / f"{run_id}.jsonl").read_text(encoding="utf-8").splitlines()


def copy_of_sample(tmp_path: Path) -> Path:
    target = tmp_path / "little"
    shutil.copytree(SAMPLE, target)
    return target


def only_these_refused(workspace: Workspace, *refused: str) -> bool:
    """The runs named were refused, nothing of them written; every other run of the sample came in."""
    present = set(Run.objects.filter(workspace=workspace, event_count__gt=0).values_list("run_id", flat=True))
    return present == set(RUNS) - set(refused)


def nothing_written(workspace: Workspace) -> bool:
    return (
        not Run.objects.filter(workspace=workspace).exists()
        and not Event.objects.exists()
        and not Artifact.objects.filter(workspace=workspace).exists()
    )


# --- the sample itself ----------------------------------------------------------------------------


def test_the_sample_is_exactly_what_make_sample_writes(tmp_path: Path) -> None:
    make_sample.write(tmp_path / "again")
    written = sorted(p.relative_to(tmp_path / "again") for p in (tmp_path / "again").rglob("*") if p.is_file())
    held = sorted(p.relative_to(SAMPLE) for p in SAMPLE.rglob("*") if p.is_file())
    assert written == held
    for name in held:
        assert (tmp_path / "again" / name).read_bytes() == (SAMPLE / name).read_bytes(), name


def test_every_id_of_the_sample_recomputes() -> None:
    for run_id in RUNS:
        for number, line in enumerate(sample_lines(run_id), start=1):
            env = json.loads(line)
            assert (env["runId"], env["sequence"]) == (run_id, number)
            assert env["eventId"] == event_id(
                run_id=run_id,
                sequence=number,
                type=env["type"],
                payload=env["payload"],
                occurrence_id=env.get("occurrenceId"),
            )
    manifest = json.loads((SAMPLE / "artifacts" / f"{ARTIFACT}.json").read_text())
    blob = (SAMPLE / "artifacts" / "blobs" / f"{ARTIFACT}.bin").read_bytes()
    assert manifest["sha256"] == "sha256:" + hashlib.sha256(blob).hexdigest() and manifest["sizeBytes"] == len(blob)
    identity = {k: manifest[k] for k in ("runId", "stepPath", "name", "contentType", "encoding")}
    assert "art_" + digest({**identity, "payloadHash": manifest["sha256"]})[7:23] == ARTIFACT


def test_the_sample_agrees_with_the_shared_vectors() -> None:
    run_order = [json.loads(line) for line in sample_lines("run_order")]
    vectors = [v for v in VECTORS["events"] if v["runId"] == "run_order"]
    assert [{k: e[k] for k in ("runId", "sequence", "type", "payload", "eventId")} for e in run_order] == vectors
    # V7: the artifact's blob, payload hash and id, as little-workflow.md §1 gives them.
    assert (SAMPLE / "artifacts" / "blobs" / f"{ARTIFACT}.bin").read_bytes() == b'{"name":"Ada","score":98}'
    assert (
        json.loads((SAMPLE / "artifacts" / f"{ARTIFACT}.json").read_text())["sha256"]
        == "sha256:1cd1590cb40a7b43c8f59537eca4911ef1415eecb53bc7d0f97bed1965748e17"
    )
    # V5 (the vectors' run_a event): the id function the sample's occurrenceId events go through.
    v5 = next(v for v in VECTORS["events"] if v["runId"] == "run_a")
    assert (
        event_id(run_id="run_a", sequence=1, type=v5["type"], payload=v5["payload"], occurrence_id=v5["occurrenceId"])
        == v5["eventId"]
    )


# --- importing it ---------------------------------------------------------------------------------


def test_import_keeps_every_envelope_byte_for_byte_and_verify_passes(workspace: Workspace) -> None:
    code, out, err = import_little(SAMPLE)
    assert (code, err) == (0, "")
    assert "5 run(s) imported, 0 continued, 0 skipped, 0 refused; 48 event(s) written, 1 artifact(s) stored" in out
    for run_id in RUNS:
        # `ledger events` prints what `little events` printed: same ids, sequences, recordedAt, payloads.
        code, printed, _ = ledger("events", run_id, "--workspace", "acme/support")
        assert code == 0 and printed.splitlines() == sample_lines(run_id), run_id
    code, out, _ = ledger("verify", "--workspace", "acme/support")
    assert code == 0 and "verified 5 run(s): ok" in out


def test_the_artifact_is_stored_content_addressed_and_re_hashes(workspace: Workspace) -> None:
    import_little(SAMPLE)
    blob = (SAMPLE / "artifacts" / "blobs" / f"{ARTIFACT}.bin").read_bytes()
    stored = Artifact.objects.get(workspace=workspace)
    assert stored.sha256 == hashlib.sha256(blob).hexdigest() and stored.content_type == "application/json"
    assert artifacts.read_bytes(stored) == blob


# Little Workflow's `report --table` of run_7f3a, derived from little-workflow.md §4 and §8:
# rows by localeCompare (classify < extract < summarize); costs from the registry in USD per 1M:
# extract ((20000-16000)*0.15 + 16000*0.075 + 10000*0.6)/1e6 = 0.0078; summarize
# (20000*0.15 + 10000*0.6)/1e6 = 0.009, its session rollup not counted again; classify's
# acme.chat/nope has no price: n/a and `0+1?`; TOTAL 0.0168, cache share 16000/40900 = 39.1%;
# two-space gaps, STEP left-aligned, the rest right-aligned, a closing note for the unpriced call.
# (§8 prints this table with the summarize row left out; its TOTAL counts it.)
RUN_7F3A_TABLE = """\
Run run_7f3a (completed)

STEP          IN  CACHED  CACHE%    OUT  CALLS  COST (USD)
---------  -----  ------  ------  -----  -----  ----------
classify     900       0    0.0%    120   0+1?         n/a
extract    20000   16000   80.0%  10000      1    0.007800
summarize  20000       0    0.0%  10000      1    0.009000
---------  -----  ------  ------  -----  -----  ----------
TOTAL      40900   16000   39.1%  20120   2+1?    0.016800

Note: 1 model call(s) had no registry pricing and are excluded from the cost above.
"""

# run_artifacts: step extract made no model call (0 calls cost a true 0); the call without a
# stepPath is the `(unattributed)` row, run total minus the steps' sums (§8): 20000 input
# tokens of gpt-4o-mini = 20000*0.15/1e6 = 0.003 (§9.22).
RUN_ARTIFACTS_TABLE = """\
Run run_artifacts (completed)

STEP               IN  CACHED  CACHE%  OUT  CALLS  COST (USD)
--------------  -----  ------  ------  ---  -----  ----------
extract             0       0    0.0%    0      0    0.000000
(unattributed)  20000       0    0.0%    0      1    0.003000
--------------  -----  ------  ------  ---  -----  ----------
TOTAL           20000       0    0.0%    0      1    0.003000
"""

# run_cycle_2: the paid DeepSeek cycle of §9.27: (10000*0.14 + 2000*0.28)/1e6 = 0.00196.
RUN_CYCLE_2_TABLE = """\
Run run_cycle_2 (completed)

STEP      IN  CACHED  CACHE%   OUT  CALLS  COST (USD)
-----  -----  ------  ------  ----  -----  ----------
draft  10000       0    0.0%  2000      1    0.001960
-----  -----  ------  ------  ----  -----  ----------
TOTAL  10000       0    0.0%  2000      1    0.001960
"""


@pytest.mark.parametrize(
    ("run_id", "table"),
    [("run_7f3a", RUN_7F3A_TABLE), ("run_artifacts", RUN_ARTIFACTS_TABLE), ("run_cycle_2", RUN_CYCLE_2_TABLE)],
)
def test_report_prints_little_workflows_table(workspace: Workspace, run_id: str, table: str) -> None:
    import_little(SAMPLE)
    code, out, _ = ledger("report", run_id, "--table")
    assert (code, out) == (0, table)


def test_outer_loop_cycles_come_in_with_their_runs(workspace: Workspace) -> None:
    _, out, _ = import_little(SAMPLE)
    assert (
        "outer loop ol_sample: 2 of at most 3 cycle(s) (run_cycle_1, run_cycle_2), done; "
        'goal: "Summarize until the supervisor is satisfied"'
    ) in out
    for number in (1, 2):
        run = Run.objects.get(workspace=workspace, run_id=f"run_cycle_{number}")
        state = fold(log_of(run), run_id=run.run_id)
        assert state.status == "completed" and state.outer_loop_id == "ol_sample"
        assert state.workflow_version_id == f"wfver_cycle_{number}"
        assert [(c.outer_loop_id, c.cycle_number) for c in state.outer_loop_cycles] == [("ol_sample", number)]
    last = fold(log_of(Run.objects.get(run_id="run_cycle_2")), run_id="run_cycle_2").outer_loop_cycles[0]
    assert last.supervise == {"kind": "done", "finalOutput": "short summary"}


def test_importing_again_skips_the_runs_already_present(workspace: Workspace) -> None:
    import_little(SAMPLE)
    before = list(Event.objects.order_by("pk").values_list("pk", "event_id"))
    code, out, _ = import_little(SAMPLE)
    assert code == 0
    assert "0 run(s) imported, 0 continued, 5 skipped, 0 refused; 0 event(s) written, 0 artifact(s) stored" in out
    assert "skipped run_7f3a: already present (19 events)" in out
    assert f"artifact {ARTIFACT} (run run_artifacts, extract/profile, 25 bytes) already stored" in out
    assert list(Event.objects.order_by("pk").values_list("pk", "event_id")) == before


def test_a_run_imported_part_way_gets_the_rest_of_its_log(workspace: Workspace, tmp_path: Path) -> None:
    early = copy_of_sample(tmp_path)
    lines = sample_lines("run_7f3a")
    (early / "events" / "run_7f3a.jsonl").write_text("\n".join(lines[:7]) + "\n", encoding="utf-8")
    assert import_little(early)[0] == 0
    code, out, _ = import_little(SAMPLE)
    assert code == 0 and "continued run_7f3a: events 8..19" in out
    assert ledger("events", "run_7f3a")[1].splitlines() == lines
    assert ledger("verify", "run_7f3a")[0] == 0


def test_the_store_events_db_imports_like_the_jsonl_logs(workspace: Workspace, tmp_path: Path) -> None:
    """little-workflow.md §1: `events/events.db`, table `events`, payload as JSON text."""
    target = tmp_path / "little"
    shutil.copytree(SAMPLE, target, ignore=shutil.ignore_patterns("*.jsonl"))
    con = sqlite3.connect(target / "events" / "events.db")
    con.execute(
        "CREATE TABLE events (run_id TEXT NOT NULL, sequence INTEGER NOT NULL, event_id TEXT NOT NULL, "
        "type TEXT NOT NULL, occurrence_id TEXT NULL, recorded_at TEXT NOT NULL, payload TEXT NOT NULL, "
        "PRIMARY KEY (run_id, sequence))"
    )
    for run_id in RUNS:
        for line in sample_lines(run_id):
            e = json.loads(line)
            con.execute(
                "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    e["runId"],
                    e["sequence"],
                    e["eventId"],
                    e["type"],
                    e.get("occurrenceId"),
                    e["recordedAt"],
                    canonical_bytes(e["payload"]).decode(),
                ),
            )
    con.commit()
    con.close()
    code, out, err = import_little(target)
    assert (code, err) == (0, "") and "5 run(s) imported" in out
    for run_id in RUNS:
        assert ledger("events", run_id)[1].splitlines() == sample_lines(run_id)


# --- refusals: exit 1, every problem named, the run refused whole, the other runs imported ----------


def test_a_tampered_event_is_refused_naming_the_first_bad_event(workspace: Workspace, tmp_path: Path) -> None:
    corrupt = copy_of_sample(tmp_path)
    lines = sample_lines("run_7f3a")
    tampered = json.loads(lines[3])  # sequence 4: extract's model call; its eventId is left as it was
    tampered["payload"]["response"]["usage"]["inputTokens"] = 2_000
    lines[3] = json.dumps(tampered, ensure_ascii=False, separators=(",", ":"))
    later = json.loads(lines[6])  # sequence 7, also changed: only the first is named
    later["payload"]["stepPath"] = "elsewhere"
    lines[6] = json.dumps(later, ensure_ascii=False, separators=(",", ":"))
    (corrupt / "events" / "run_7f3a.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    recomputed = event_id(run_id="run_7f3a", sequence=4, type=tampered["type"], payload=tampered["payload"])

    code, out, err = import_little(corrupt)
    assert code == 1
    assert "refused run_7f3a: nothing of it written" in out
    assert "4 run(s) imported, 0 continued, 0 skipped, 1 refused; 29 event(s) written" in out
    assert (
        f"events/run_7f3a.jsonl:4: run run_7f3a, sequence 4: eventId expected {recomputed} (recomputed from "
        f"the event's content), found {tampered['eventId']}"
    ) in err
    assert "sequence 7" not in err and out.rstrip().endswith("; 1 problem(s)")
    assert only_these_refused(workspace, "run_7f3a")
    assert ledger("verify", "--workspace", "acme/support")[0] == 0


def problems_of(directory: Path) -> str:
    code, _, err = import_little(directory)
    assert code == 1
    return err


def rewrite(path: Path, change: Any) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def test_malformed_logs_are_named_by_file_and_line(workspace: Workspace, tmp_path: Path) -> None:
    bad = copy_of_sample(tmp_path)
    lines = sample_lines("run_order")
    (bad / "events" / "run_order.jsonl").write_text(lines[0] + "\n{not json\n", encoding="utf-8")
    gap = sample_lines("run_cycle_1")
    (bad / "events" / "run_cycle_1.jsonl").write_text("\n".join(gap[:2] + gap[3:]) + "\n", encoding="utf-8")
    shape = sample_lines("run_artifacts")
    broken = json.loads(shape[1])
    del broken["sequence"]
    shape[1] = json.dumps(broken)
    (bad / "events" / "run_artifacts.jsonl").write_text("\n".join(shape) + "\n", encoding="utf-8")

    err = problems_of(bad)
    assert "events/run_order.jsonl:2: not a JSON envelope" in err
    assert "events/run_cycle_1.jsonl:3: run run_cycle_1: sequence 4 where 3 was expected" in err
    assert "events/run_artifacts.jsonl:2: envelope field sequence must be a positive integer" in err
    # A log file stops at its first bad line, its run is not read; a gap refuses its run.
    assert only_these_refused(workspace, "run_order", "run_cycle_1", "run_artifacts")


def test_a_directory_that_is_not_little_workflows_is_refused(workspace: Workspace, tmp_path: Path) -> None:
    assert "not a Little Workflow data directory" in problems_of(tmp_path)
    assert "not a directory" in problems_of(tmp_path / "missing")
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "events.db").write_bytes(b"this is not sqlite, it is long enough to be read" * 4)
    assert "events/events.db: not a Little Workflow event store" in problems_of(tmp_path)
    assert nothing_written(workspace)


def test_artifacts_are_checked_against_their_manifests(workspace: Workspace, tmp_path: Path) -> None:
    bad = copy_of_sample(tmp_path)
    eve = b'{"name":"Eve","score":98}'  # the same size, other bytes
    (bad / "artifacts" / "blobs" / f"{ARTIFACT}.bin").write_bytes(eve)
    err = problems_of(bad)
    assert (
        f"artifacts/{ARTIFACT}.json:1: artifacts/blobs/{ARTIFACT}.bin hashes to "
        f"sha256:{hashlib.sha256(eve).hexdigest()}, the manifest says sha256:1cd1590c"
    ) in err
    # A manifest whose blob is gone leaves the events that reference it dangling: both are named.
    (bad / "artifacts" / "blobs" / f"{ARTIFACT}.bin").unlink()
    err = problems_of(bad)
    assert f"its bytes (artifacts/blobs/{ARTIFACT}.bin) are missing" in err
    assert (
        f"events/run_artifacts.jsonl:5: run run_artifacts, sequence 5: references artifact://{ARTIFACT}, "
        "which artifacts/ does not hold"
    ) in err
    assert only_these_refused(workspace, "run_artifacts") and not Artifact.objects.exists()


def test_an_artifact_id_that_does_not_match_its_identity_is_refused(workspace: Workspace, tmp_path: Path) -> None:
    bad = copy_of_sample(tmp_path)
    rewrite(bad / "artifacts" / f"{ARTIFACT}.json", lambda m: m.update(name="renamed"))
    err = problems_of(bad)
    assert f"artifacts/{ARTIFACT}.json:1: artifactId {ARTIFACT} does not match its identity" in err
    assert only_these_refused(workspace, "run_artifacts")


def test_outer_loop_manifests_must_agree_with_the_logs(workspace: Workspace, tmp_path: Path) -> None:
    bad = copy_of_sample(tmp_path)
    manifest = bad / "outer-loops" / "ol_sample.json"
    # A manifest that disagrees with the logs refuses the cycles' runs it lists; the rest come in.
    (bad / "events" / "run_cycle_2.jsonl").unlink()
    assert (
        "outer-loops/ol_sample.json:1: cycle 2's run run_cycle_2 is neither in events/ nor in the workspace"
        in problems_of(bad)
    )
    assert only_these_refused(workspace, "run_cycle_1", "run_cycle_2")
    shutil.copy(SAMPLE / "events" / "run_cycle_2.jsonl", bad / "events")
    # A manifest that cannot be read is named (exit 1); it holds no events, the runs stand alone.
    rewrite(manifest, lambda m: m.update(cycles=[]))
    assert (
        "outer-loops/ol_sample.json:1: outer_loop_manifest_corrupt — existing outer loop 'ol_sample' has "
        "result.kind='done' but cycles is empty."
    ) in problems_of(bad)
    shutil.copy(SAMPLE / "outer-loops" / "ol_sample.json", manifest)
    rewrite(manifest, lambda m: m.update(outerLoopId="ol_other"))
    assert "outerLoopId 'ol_other' must start with ol_ and name the file" in problems_of(bad)
    manifest.write_text('{"outerLoopId": "ol_sample",\n  "cycles": [,]}', encoding="utf-8")
    assert "outer-loops/ol_sample.json:2: not JSON" in problems_of(bad)
    # A key named twice: refused as the API refuses it, not read as its last value.
    manifest.write_text('{"outerLoopId": "ol_sample", "outerLoopId": "ol_other"}', encoding="utf-8")
    assert 'outer-loops/ol_sample.json:1: not JSON the ledger takes (the key "outerLoopId" appears twice' in (
        problems_of(bad)
    )


def test_a_payload_the_workspace_would_redact_is_refused(workspace: Workspace) -> None:
    """Redaction happens before hashing: an event it would change cannot keep its id."""
    workspace.redact_keys = ["ticket"]
    workspace.save()
    err = problems_of(SAMPLE)
    assert (
        "events/run_7f3a.jsonl:1: run run_7f3a, sequence 1: the workspace's redaction rules would rewrite this payload"
    ) in err
    assert only_these_refused(workspace, "run_7f3a", "run_cycle_1", "run_cycle_2")  # each holds a ticket
    assert (
        "outer loop ol_sample: not complete here, a cycle's run was refused"
        in ledger("import-little", str(SAMPLE), "--workspace", "acme/support")[1]
    )


def test_a_run_present_with_other_events_is_refused(workspace: Workspace) -> None:
    append(workspace=workspace, run_id="run_order", events=[started("wfver_other")])
    err = problems_of(SAMPLE)
    assert "events/run_order.jsonl:1: run run_order is already in the workspace with other events (sequence 1:" in err
    assert Event.objects.filter(run__run_id="run_order").count() == 1
    assert only_these_refused(workspace)  # run_order holds its own one event, the others came in


def test_imports_land_in_the_named_workspace_only(workspace: Workspace, other_workspace: Workspace) -> None:
    assert import_little(SAMPLE, "globex/main")[0] == 0
    assert not Run.objects.filter(workspace=workspace).exists()
    assert Run.objects.filter(workspace=other_workspace).count() == 5
    code, _, err = import_little(SAMPLE, "nobody/here")
    assert code == 1 and "workspace nobody/here not found" in err


# --- the write path keeps docs/api.md's lifecycle for everyone else --------------------------------------


def test_only_an_import_may_put_compile_events_before_run_started(workspace: Workspace) -> None:
    compile_event = ev("OrchestrationRequested", requestId="req_1")
    with pytest.raises(RunNotStarted):
        append(workspace=workspace, run_id="run_api", events=[compile_event])
    written = append(workspace=workspace, run_id="run_imp", events=[compile_event, started()], imported=True)
    assert [e["sequence"] for e in written.events] == [1, 2]
    assert Run.objects.get(run_id="run_imp").status == "running"


def test_only_an_import_may_append_an_outer_loop_cycle_after_the_end(workspace: Workspace) -> None:
    cycle = ev("OuterLoopCycleCompleted", outerLoopId="ol_x", cycleNumber=1, supervise={"kind": "continue"})
    for run_id in ("run_api", "run_imp"):
        append(workspace=workspace, run_id=run_id, events=[started(), ev("RunCompleted", output=1)])
    with pytest.raises(RunFinished):
        append(workspace=workspace, run_id="run_api", events=[cycle])
    assert append(workspace=workspace, run_id="run_imp", events=[cycle], imported=True).last_sequence == 3
    with pytest.raises(RunFinished):  # nothing else follows the end, imported or not
        append(workspace=workspace, run_id="run_imp", events=[ev("StepScheduled", stepPath="s")], imported=True)


# --- the imported artifact stays checked: verify, evidence, replay plan, retention -----------------


def test_verify_and_the_evidence_re_hash_the_artifact_behind_a_little_ref(workspace: Workspace, settings: Any) -> None:
    from ledger.replay.evidence import evidence_bundle

    import_little(SAMPLE)
    run = Run.objects.select_related("workspace__tenant").get(workspace=workspace, run_id="run_artifacts")
    evidence = evidence_bundle(run)
    stored = Artifact.objects.get(workspace=workspace)
    assert evidence["artifacts"] == [
        {
            "artifactId": stored.artifact_id,
            "sha256": stored.sha256,
            "size": 25,
            "contentType": "application/json",
            "ref": f"artifact://{ARTIFACT}",
            "verified": True,
        }
    ]
    assert evidence["integrity"]["ok"] and evidence["replayReady"] == {"status": "pass", "missing": []}

    # The stored bytes changed behind the ledger's back: every reader says so.
    (Path(settings.ARTIFACTS_ROOT) / stored.storage_key).write_bytes(b'{"name":"Eve","score":98}')
    code, out, _ = ledger("verify", "run_artifacts")
    assert code == 1 and f"FAIL acme/support/run_artifacts artifact_hashes: artifact://{ARTIFACT} mismatch" in out
    evidence = evidence_bundle(run)
    assert evidence["artifacts"][0]["verified"] is False and not evidence["integrity"]["ok"]


def test_a_little_ref_nothing_resolves_fails_verify(workspace: Workspace) -> None:
    """A client that writes a Little-style ref without importing its bytes gets no pass."""
    append(
        workspace=workspace,
        run_id="run_api",
        events=[started(), ev("StepCompleted", stepPath="s", attempt=1, outputRef=f"artifact://{ARTIFACT}")],
    )
    code, out, _ = ledger("verify", "run_api")
    assert code == 1 and f"artifact://{ARTIFACT} missing" in out
    from ledger.replay.evidence import evidence_bundle

    evidence = evidence_bundle(Run.objects.select_related("workspace__tenant").get(run_id="run_api"))
    assert evidence["artifacts"] == [
        {
            "artifactId": ARTIFACT,
            "sha256": None,
            "size": None,
            "contentType": None,
            "ref": f"artifact://{ARTIFACT}",
            "verified": False,
        }
    ]


def test_pruning_an_imported_run_takes_its_artifact_along(workspace: Workspace) -> None:
    from datetime import datetime

    from ledger.models import ImportedArtifact
    from ledger.tenancy import retention

    import_little(SAMPLE)
    now = datetime(2026, 8, 1, tzinfo=UTC)  # the sample was recorded on 2026-05-19
    pruned = {tree.root_run_id for tree in retention.prune_workspace(workspace, days=30, now=now)}
    assert pruned == set(RUNS)
    assert not ImportedArtifact.objects.exists() and not Artifact.objects.filter(workspace=workspace).exists()


def test_a_log_the_write_path_would_refuse_is_named_before_anything_is_written(
    workspace: Workspace, tmp_path: Path
) -> None:
    """A bare harness session's log has no RunStarted: the ledger's lifecycle would refuse it, so
    the import names it up front and writes none of the other runs either."""
    bad = copy_of_sample(tmp_path)
    payload = {
        "runId": "run_session",
        "role": "worker.code-run",
        "task": {"kind": "execute_step"},
        "manifest": {},
        "manifestHash": digest({}),
    }
    env = {
        "eventId": event_id(run_id="run_session", sequence=1, type="harness.session.started", payload=payload),
        "runId": "run_session",
        "sequence": 1,
        "type": "harness.session.started",
        "recordedAt": "2026-05-19T18:09:00.000Z",
        "payload": payload,
    }
    (bad / "events" / "run_session.jsonl").write_text(json.dumps(env) + "\n", encoding="utf-8")
    err = problems_of(bad)
    assert (
        "events/run_session.jsonl:1: run run_session, sequence 1: run run_session has no events; its first "
        "event must be RunStarted"
    ) in err
    assert only_these_refused(workspace) and not Run.objects.filter(run_id="run_session").exists()


def test_a_null_occurrence_id_is_no_occurrence_id(workspace: Workspace, tmp_path: Path) -> None:
    nulls = copy_of_sample(tmp_path)
    lines = [json.loads(line) for line in sample_lines("run_order")]
    (nulls / "events" / "run_order.jsonl").write_text(
        "\n".join(json.dumps({**e, "occurrenceId": None}) for e in lines) + "\n", encoding="utf-8"
    )
    code, _, err = import_little(nulls)
    assert (code, err) == (0, "")
    assert ledger("events", "run_order")[1].splitlines() == sample_lines("run_order")


def test_the_lifecycle_is_checked_before_writing(workspace: Workspace, tmp_path: Path) -> None:
    """An event after the run's end that Little Workflow never writes there is named up front."""
    bad = copy_of_sample(tmp_path)
    lines = sample_lines("run_order")
    extra = {"stepPath": "late"}
    env = {
        "eventId": event_id(run_id="run_order", sequence=4, type="StepScheduled", payload=extra),
        "runId": "run_order",
        "sequence": 4,
        "type": "StepScheduled",
        "recordedAt": "2026-05-19T18:01:02.000Z",
        "payload": extra,
    }
    (bad / "events" / "run_order.jsonl").write_text("\n".join([*lines, json.dumps(env)]) + "\n", encoding="utf-8")
    err = problems_of(bad)
    assert "events/run_order.jsonl:4: run run_order, sequence 4: run run_order is completed; only custom.* " in err
    assert only_these_refused(workspace, "run_order")


def test_a_writer_racing_the_import_stops_it_and_a_second_import_continues(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks passed, then another writer appended to a run first: that append is refused
    (expectedSequence), the runs written before it stay, and importing again finishes the job."""
    from ledger.interop import little_import

    original = little_import._write_run

    def racing(space: Workspace, run_id: str, log: list[Any]) -> None:
        if run_id == "run_cycle_1":
            append(
                workspace=space,
                run_id=run_id,
                events=[
                    ev(
                        "OrchestrationRequested",
                        requestId="req_1",
                        workflowId="support.summarize",
                        workflowDefinitionHash=log[0].payload["workflowDefinitionHash"],
                    )
                ],
                imported=True,
            )
        original(space, run_id, log)

    # The other writer's append lands, for real, just before the import's first one for that run.
    monkeypatch.setattr(little_import, "_write_run", racing)
    with pytest.raises(little_import.ImportRefused) as refused:
        little_import.import_data_dir(SAMPLE, workspace)
    monkeypatch.undo()
    assert "the import stopped at run run_cycle_1 sequence 1" in refused.value.message
    assert set(Run.objects.filter(workspace=workspace).values_list("run_id", flat=True)) == {
        "run_7f3a",
        "run_artifacts",
        "run_cycle_1",
    }
    # The racing writer's event is the log's own first event (same content, same id): the rest follows.
    code, out, _ = import_little(SAMPLE)
    assert code == 0 and "continued run_cycle_1: events 2..9" in out
    assert ledger("verify", "--workspace", "acme/support")[0] == 0


def test_the_run_pages_of_an_imported_run_link_its_artifact_by_our_id(
    browser: Any, outsider: Any, workspace: Workspace
) -> None:
    from django.test import Client

    import_little(SAMPLE)
    stored = Artifact.objects.get(workspace=workspace)
    base = "/w/acme/support/runs/run_artifacts/"
    for tab in ("evidence/", "conversation/", "timeline/"):
        assert browser.get(base + tab).status_code == 200, tab
    html = browser.get(base + "evidence/").content.decode()
    assert f"/api/v1/artifacts/{stored.artifact_id}/content?workspace=acme/support" in html
    assert f"/api/v1/artifacts/{ARTIFACT}/" not in html  # the foreign id has nothing to download
    content = browser.get(f"/api/v1/artifacts/{stored.artifact_id}/content", {"workspace": "acme/support"})
    assert b"".join(content.streaming_content) == b'{"name":"Ada","score":98}'  # type: ignore[attr-defined]
    other = Client()
    other.force_login(outsider)
    assert other.get(base + "evidence/").status_code == 404
