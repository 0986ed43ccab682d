"""`ledger import-little` takes what Little Workflow's own code writes (issue 35), on SQLite and
PostgreSQL: each log below is made with our canonicalizer following Little Workflow's storage rules,
and the rule each shape follows is cited beside it (Little Workflow's source,
samuelch727/little-workflow, packages/little-workflow/src/):

- world.ts `appendEvent` validates no payload and no type: whatever the caller hands it is stored,
  `JSON.stringify(JSON.parse(canonicalJson(payload)))`, and hashed over its canonical JSON; the
  `little events` line is `JSON.stringify(envelope)` (numbers in ECMAScript form: `ecma_dumps`).
- Numbers are doubles: an integer of 2**53 or more is written as the shortest digits of its double
  (canonical.ts, ECMAScript Number::toString): `1152921504606847000`, `1e+21`, `6.02214076e+23`.
- harness/event-names.ts LEGACY_HARNESS_EVENT_TYPES: `HarnessModelResponded` … are the current
  names to run-state.ts `applyEvent` (normalizeHarnessEventType), which its recorder also applies
  on the way in; a log written through the world directly keeps the legacy name.
- harness/event-recorder.ts validates `response.text` only when defined and `promptHash` only
  through the recorder; a world-level append keeps `text: null` and a call without `promptHash`.
- run-state.ts: StepAttemptStarted / StepCompleted read `attempt` when present (StepCompleted
  synthesizes `attempt_1`); `harness.session.completed.usage` is skipped, its `costUsd` never read;
  legacy `ModelCallCompleted` counts its `usage` and `model`; token counts are the numbers recorded.
- Strings are JSON strings: U+0000 is `\\u0000` in canonicalJson (canonical.ts escapes every control
  character below U+0020 as `\\u00xx`) and in the store's JSON text.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from ledger.canonical import canonical_bytes, ecma_dumps, event_id
from ledger.models import Event, Run, Step, Workspace

pytestmark = pytest.mark.django_db

AT = "2026-05-19T18:43:11.452Z"
MINI = {"provider": "openai", "modelId": "gpt-4o-mini"}


def ledger(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("ledger", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    except CommandError as exc:
        code = exc.returncode
        err.write(str(exc))
    return code, out.getvalue(), err.getvalue()


def js_line(run_id: str, sequence: int, type_: str, payload: dict[str, Any]) -> bytes:
    """One line of `little events RUN`: JSON.stringify of the envelope, the payload as the store
    keeps it (keys in canonical order), the id over the canonical JSON."""
    env = {
        "eventId": event_id(run_id=run_id, sequence=sequence, type=type_, payload=payload),
        "runId": run_id,
        "sequence": sequence,
        "type": type_,
        "recordedAt": AT,
        "payload": __import__("json").loads(canonical_bytes(payload)),
    }
    return ecma_dumps(env)


def write_log(root: Path, run_id: str, items: list[tuple[str, dict[str, Any]]]) -> list[bytes]:
    lines = [js_line(run_id, n, t, p) for n, (t, p) in enumerate(items, start=1)]
    (root / "events").mkdir(parents=True, exist_ok=True)
    (root / "events" / f"{run_id}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return lines


EDGES: list[tuple[str, dict[str, Any]]] = [
    # Numbers as doubles: a nanosecond timestamp, a 64-bit id, 1e16, 1e21, Avogadro, 5e-7.
    (
        "RunStarted",
        {
            "workflowVersionId": "wfver_edges",
            "input": {"nanos": 1152921504606847000, "id": 9007199254740993.0, "e16": 1e16, "big": 1e21},
        },
    ),
    ("StepScheduled", {"stepPath": "draft", "stepId": "draft", "uses": "ai.generate"}),
    ("StepAttemptStarted", {"stepPath": "draft", "stepId": "draft"}),  # no attempt
    (
        "HarnessModelCalled",  # legacy name, no promptHash
        {"turn": 1, "stepPath": "draft", "request": {"model": "gpt-4o-mini", "messages": [], "tools": []}},
    ),
    (
        "HarnessModelResponded",  # legacy name, text null, fractional tokens
        {
            "callId": "call_1",
            "turn": 1,
            "stepPath": "draft",
            "model": MINI,
            "response": {"text": None, "usage": {"inputTokens": 1000.5, "outputTokens": 200}},
        },
    ),
    (
        "ModelCallCompleted",  # legacy: counts its usage and model
        {
            "stepPath": "draft",
            "model": {"provider": "openai", "modelId": "gpt-4o"},
            "usage": {"inputTokens": 1000, "outputTokens": 100},
        },
    ),
    (
        "harness.session.completed",  # a session rollup with its own costUsd: never read
        {"runId": "run_edges", "usage": {"inputTokens": 2000, "outputTokens": 300, "costUsd": 0.25}},
    ),
    ("StepCompleted", {"stepPath": "draft", "stepId": "draft", "output": "nul\u0000inside"}),  # no attempt
    ("StepScheduled", {"stepPath": "check", "stepId": "check", "uses": "code.run"}),
    ("StepAttemptStarted", {"stepPath": "check", "stepId": "check", "attempt": 1, "attemptId": "attempt_1"}),
    (
        "StepFailed",
        {
            "stepPath": "check",
            "stepId": "check",
            "attempt": 1,
            "error": {"message": "m", "mole": 6.02214076e23, "rate": 5e-7},
        },
    ),
    ("RunCompleted", {"workflowVersionId": "wfver_edges", "output": {"text": "a\u0000b", "big": 1e21}}),
]

# Little Workflow's `report --table` of run_edges (run-report.ts, §8 of the reference notes): the
# draft row counts the legacy HarnessModelResponded (gpt-4o-mini: (1000.5*0.15 + 200*0.6)/1e6 =
# 0.000270075) and the legacy ModelCallCompleted (gpt-4o: (1000*2.5 + 100*10)/1e6 = 0.0035), not
# the session rollup: 0.003770075, toFixed(6) 0.003770; its tokens as recorded, 1000.5 + 1000.
EDGES_TABLE = """\
Run run_edges (completed)

STEP       IN  CACHED  CACHE%  OUT  CALLS  COST (USD)
-----  ------  ------  ------  ---  -----  ----------
check       0       0    0.0%    0      0    0.000000
draft  2000.5       0    0.0%  300      2    0.003770
-----  ------  ------  ------  ---  -----  ----------
TOTAL  2000.5       0    0.0%  300      2    0.003770
"""


def test_every_shape_little_writes_imports_verifies_and_reports_as_little(workspace: Workspace, tmp_path: Path) -> None:
    lines = write_log(tmp_path, "run_edges", EDGES)
    code, out, err = ledger("import-little", str(tmp_path), "--workspace", "acme/support")
    assert (code, err) == (0, ""), err
    assert "1 run(s) imported, 0 continued, 0 skipped, 0 refused; 12 event(s) written" in out
    # `ledger events` prints what `little events` printed, byte for byte (ECMAScript numbers).
    code, printed, _ = ledger("events", "run_edges")
    assert printed.encode().splitlines() == lines
    assert b'"nanos":1152921504606847000' in lines[0] and b'"big":1e+21' in lines[0]
    assert b'"rate":5e-7' in lines[10] and b'"mole":6.02214076e+23' in lines[10]
    code, out, _ = ledger("verify", "run_edges")
    assert code == 0 and "ok" in out, out
    code, out, _ = ledger("report", "run_edges", "--table")
    assert (code, out) == (0, EDGES_TABLE)
    # The projections keep the numbers; U+0000 reads back as U+FFFD there (the log keeps it).
    run = Run.objects.get(run_id="run_edges")
    assert run.input["nanos"] == 1152921504606847000 and run.output == {"text": "a\ufffdb", "big": 1e21}
    assert Step.objects.get(run=run, step_path="check").error["mole"] == 6.02214076e23
    assert Event.objects.get(run=run, sequence=12).payload == canonical_bytes(EDGES[-1][1]).decode()


def test_a_bad_run_is_refused_by_file_run_and_sequence_while_the_good_ones_import(
    workspace: Workspace, tmp_path: Path
) -> None:
    write_log(tmp_path, "run_edges", EDGES)
    good = [("RunStarted", {"workflowVersionId": "wfver_ok"}), ("RunCompleted", {"output": 1})]
    write_log(tmp_path, "run_fine", good)
    # An integer that is not its double's shortest form: no JavaScript writer wrote it, and its
    # id cannot be recomputed the way Little Workflow hashed.
    bad = tmp_path / "events" / "run_bad.jsonl"
    first = js_line("run_bad", 1, "RunStarted", {"workflowVersionId": "wfver_bad"})
    second = js_line("run_bad", 2, "StepScheduled", {"stepPath": "s"}).replace(
        b'"stepPath":"s"', b'"n":1152921504606846976,"stepPath":"s"'
    )
    bad.write_bytes(first + b"\n" + second + b"\n")
    code, out, err = ledger("import-little", str(tmp_path), "--workspace", "acme/support")
    assert code == 1
    assert (
        "events/run_bad.jsonl:2: run run_bad, sequence 2: payload has no canonical JSON form "
        "(1152921504606846976 is not the shortest form of a JSON (double) number (the double nearest it "
        "is written 1152921504606847000))"
    ) in err
    assert "refused run_bad: nothing of it written" in out
    assert out.rstrip().endswith(
        "2 run(s) imported, 0 continued, 0 skipped, 1 refused; 14 event(s) written, 0 artifact(s) stored, "
        "into acme/support; 1 problem(s)"
    )
    assert set(Run.objects.filter(workspace=workspace).values_list("run_id", flat=True)) == {"run_edges", "run_fine"}
    assert ledger("verify", "--workspace", "acme/support")[0] == 0


def test_a_nul_in_a_column_the_projection_keeps_as_text_is_refused(workspace: Workspace, tmp_path: Path) -> None:
    write_log(
        tmp_path,
        "run_nul",
        [("RunStarted", {"workflowVersionId": "w"}), ("StepScheduled", {"stepPath": "a\u0000b"})],
    )
    code, _, err = ledger("import-little", str(tmp_path), "--workspace", "acme/support")
    assert code == 1
    assert (
        "events/run_nul.jsonl:2: run run_nul, sequence 2: payload.stepPath may not contain the NUL character"
    ) in err
    assert not Run.objects.filter(run_id="run_nul").exists()
