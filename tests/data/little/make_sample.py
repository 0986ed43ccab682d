"""Writes tests/data/little/sample/, a small Little Workflow data directory, from the formats of
Little Workflow's documentation (docs/operations.md § Importing Little Workflow data), with every id
computed by our own canonicalizer (ledger/canonical.py). tests/test_import_little.py checks that the
files are exactly what this writes, that their ids recompute, and that they agree with
tests/data/vectors.json.

    .venv/bin/python tests/data/little/make_sample.py

Runs (each an `events/<runId>.jsonl` log, one `JSON.stringify(envelope)` per line, as
`little events RUN` prints it):
- run_order: the three `run_order` events of tests/data/vectors.json (the ids must be the vectors').
- run_7f3a: the run of the reference's report (§8): extract (gpt-4o-mini, 16k of 20k cached),
  summarize (gpt-4o-mini, inside a harness session whose rollup repeats the tokens), classify
  (a model without registry pricing, and a tool call with an occurrenceId).
- run_artifacts: the artifact of vector V7 (art_1c38cdc9a16429fa) as the output of step extract,
  and one model call without a stepPath (the report's `(unattributed)` row).
- run_cycle_1, run_cycle_2: the two cycles of outer loop ol_sample (manifest in outer-loops/),
  each log opening with the compile events Little Workflow writes before RunStarted and closing
  with OuterLoopCycleCompleted after the run's end; cycle 2 pays DeepSeek (§9.27: $0.00196).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from ledger.canonical import canonical_bytes, digest, event_id  # noqa: E402

SAMPLE = HERE / "sample"
MINI = {"provider": "openai", "modelId": "gpt-4o-mini"}


def _js_envelope(
    run_id: str, sequence: int, type_: str, payload: dict[str, Any], at: str, occurrence_id: str | None = None
) -> dict[str, Any]:
    """The envelope in Little Workflow's key order; the payload as its store keeps it:
    JSON.parse(canonicalJson(payload)), so keys in canonical order."""
    env: dict[str, Any] = {
        "eventId": event_id(run_id=run_id, sequence=sequence, type=type_, payload=payload, occurrence_id=occurrence_id),
        "runId": run_id,
        "sequence": sequence,
        "type": type_,
    }
    if occurrence_id is not None:
        env["occurrenceId"] = occurrence_id
    env["recordedAt"] = at
    env["payload"] = json.loads(canonical_bytes(payload))
    return env


def _log(run_id: str, minute: int, items: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    out = []
    for sequence, item in enumerate(items, start=1):
        type_, payload, *rest = item
        # Two events share a millisecond now and then, as they do in a real store.
        at = f"2026-05-19T18:{minute:02d}:{sequence // 2:02d}.{452 + sequence // 2:03d}Z"
        out.append(_js_envelope(run_id, sequence, type_, payload, at, rest[0] if rest else None))
    return out


def _model(step: str | None, call: str, usage: dict[str, int], model: dict[str, str] = MINI) -> tuple[Any, ...]:
    payload: dict[str, Any] = {"callId": call, "turn": 1, "model": model, "response": {"text": "ok", "usage": usage}}
    if step is not None:
        payload["stepPath"] = step
    return ("harness.model.responded", payload)


def _completed(
    path: str, output: Any, output_ref: str | None = None, artifact_refs: list[str] | None = None
) -> tuple[Any, ...]:
    payload: dict[str, Any] = {
        "stepPath": path,
        "stepId": path,
        "attempt": 1,
        "output": output,
        "artifactRefs": artifact_refs or [],
        "metadata": {"uses": "ai.generate"},
    }
    if output_ref is not None:
        payload["outputRef"] = output_ref
    return ("StepCompleted", payload)


def _plain_step(path: str, *inner: tuple[Any, ...], output: Any = "ok") -> list[tuple[Any, ...]]:
    return [
        ("StepScheduled", {"stepPath": path, "stepId": path, "uses": "ai.generate"}),
        ("StepAttemptStarted", {"stepPath": path, "stepId": path, "attempt": 1, "attemptId": "attempt_1"}),
        *inner,
        _completed(path, output),
    ]


def artifact(run_id: str, step_path: str, name: str, value: Any, created_at: str) -> tuple[dict[str, Any], bytes]:
    """§7: a JSON value's blob is its canonical JSON; the id hashes its identity and the blob's hash."""
    blob = canonical_bytes(value)
    payload_hash = "sha256:" + hashlib.sha256(blob).hexdigest()
    identity = {
        "runId": run_id,
        "stepPath": step_path,
        "name": name,
        "contentType": "application/json",
        "encoding": "json",
        "payloadHash": payload_hash,
    }
    aid = "art_" + digest(identity)[7:23]
    manifest = {
        "artifactId": aid,
        "artifactRef": f"artifact://{aid}",
        "runId": run_id,
        "stepPath": step_path,
        "name": name,
        "contentType": "application/json",
        "encoding": "json",
        "sha256": payload_hash,
        "sizeBytes": len(blob),
        "createdAt": created_at,
    }
    return manifest, blob


def runs() -> tuple[dict[str, list[dict[str, Any]]], list[tuple[dict[str, Any], bytes]], dict[str, Any]]:
    logs: dict[str, list[dict[str, Any]]] = {}
    logs["run_order"] = _log(
        "run_order",
        1,
        [
            ("RunStarted", {"workflowVersionId": "wfver_123"}),
            ("StepScheduled", {"stepPath": "summarize"}),
            ("RunCompleted", {"output": {"ok": True}}),
        ],
    )

    manifest = {"harnessId": "little-harness", "tools": ["search"], "model": MINI}
    request = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Summarize the ticket"}], "tools": []}
    logs["run_7f3a"] = _log(
        "run_7f3a",
        2,
        [
            ("RunStarted", {"workflowVersionId": "wfver_7f3a", "input": {"ticket": "T-1"}, "label": "report sample"}),
            *_plain_step(
                "extract",
                _model(
                    "extract",
                    "mc_extract",
                    {"inputTokens": 20_000, "cachedInputTokens": 16_000, "outputTokens": 10_000},
                ),
            ),
            *_plain_step(
                "summarize",
                (
                    "harness.session.started",
                    {
                        "runId": "run_7f3a",
                        "role": "worker.ai-generate",
                        "stepPath": "summarize",
                        "task": {"kind": "execute_step"},
                        "manifest": manifest,
                        "manifestHash": digest(manifest),
                    },
                ),
                (
                    "harness.model.called",
                    {
                        "callId": "mc_summarize",
                        "turn": 1,
                        "stepPath": "summarize",
                        "promptHash": digest(request),
                        "request": request,
                    },
                ),
                _model("summarize", "mc_summarize", {"inputTokens": 20_000, "outputTokens": 10_000}),
                # The rollup restates the call: Little Workflow's report skips it (§4), so must we.
                (
                    "harness.session.completed",
                    {
                        "runId": "run_7f3a",
                        "stepPath": "summarize",
                        "output": "ok",
                        "usage": {"inputTokens": 20_000, "outputTokens": 10_000},
                    },
                ),
            ),
            *_plain_step(
                "classify",
                (
                    "harness.tool_call.started",
                    {
                        "callId": "call_1",
                        "caller": "model",
                        "turn": 1,
                        "toolName": "search",
                        "args": {"q": "café € 😀", "limit": 1.5e21},
                        "stepPath": "classify",
                    },
                    "occ_1",
                ),
                (
                    "harness.tool_call.succeeded",
                    {"callId": "call_1", "result": {"hits": 1}, "durationMs": 12.5, "stepPath": "classify"},
                    "occ_1",
                ),
                _model(
                    "classify",
                    "mc_classify",
                    {"inputTokens": 900, "outputTokens": 120},
                    model={"provider": "acme.chat", "modelId": "nope"},
                ),
            ),
            ("RunCompleted", {"workflowVersionId": "wfver_7f3a", "output": "ok", "terminalStepPath": "classify"}),
        ],
    )

    profile, profile_blob = artifact(
        "run_artifacts", "extract", "profile", {"name": "Ada", "score": 98}, "2026-05-19T18:03:01.455Z"
    )
    ref = profile["artifactRef"]
    logs["run_artifacts"] = _log(
        "run_artifacts",
        3,
        [
            ("RunStarted", {"workflowVersionId": "wfver_art", "input": {"who": "Ada"}}),
            ("StepScheduled", {"stepPath": "extract", "stepId": "extract", "uses": "ai.generate"}),
            (
                "StepAttemptStarted",
                {"stepPath": "extract", "stepId": "extract", "attempt": 1, "attemptId": "attempt_1"},
            ),
            _model(None, "mc_router", {"inputTokens": 20_000, "outputTokens": 0}),
            (
                "ArtifactCreated",
                {"stepPath": "extract", "artifactRef": ref, "name": "profile", "contentType": "application/json"},
            ),
            ("StepOutputValidated", {"stepPath": "extract", "outputRef": ref, "outputMode": "object"}),
            _completed("extract", {"name": "Ada", "score": 98}, output_ref=ref),
            (
                "RunCompleted",
                {
                    "workflowVersionId": "wfver_art",
                    "output": {"name": "Ada", "score": 98},
                    "outputRef": ref,
                    "terminalStepPath": "extract",
                },
            ),
        ],
    )

    goal = {
        "workflowDefinitionHash": digest({"id": "support.summarize", "version": 1}),
        "description": "Summarize until the supervisor is satisfied",
    }
    cycles = []
    for number, (decision, usage, model) in enumerate(
        [
            ({"kind": "continue", "promptNote": "shorter, please"}, {"inputTokens": 1_000, "outputTokens": 200}, MINI),
            (
                {"kind": "done", "finalOutput": "short summary"},
                {"inputTokens": 10_000, "outputTokens": 2_000},
                {"provider": "deepseek", "modelId": "deepseek-v4-flash"},
            ),
        ],
        start=1,
    ):
        run_id = f"run_cycle_{number}"
        version = f"wfver_cycle_{number}"
        output = "long summary" if number == 1 else "short summary"
        logs[run_id] = _log(
            run_id,
            3 + number,
            [
                (
                    "OrchestrationRequested",
                    {
                        "requestId": f"req_{number}",
                        "workflowId": "support.summarize",
                        "workflowDefinitionHash": goal["workflowDefinitionHash"],
                    },
                ),
                (
                    "WorkflowVersionRegistered",
                    {"workflowVersionId": version, "workflowVersionHash": digest({"version": version})},
                ),
                (
                    "RunStarted",
                    {
                        "workflowVersionId": version,
                        "input": {"ticket": "T-2"},
                        "outerLoopId": "ol_sample",
                        "label": "outer loop sample",
                    },
                ),
                *_plain_step("draft", _model("draft", f"mc_draft_{number}", usage, model), output=output),
                ("RunCompleted", {"workflowVersionId": version, "output": output, "terminalStepPath": "draft"}),
                ("OuterLoopCycleCompleted", {"outerLoopId": "ol_sample", "cycleNumber": number, "supervise": decision}),
            ],
        )
        cycle: dict[str, Any] = {
            "cycleNumber": number,
            "runId": run_id,
            "workflowVersionId": version,
            "status": "completed",
            "output": output,
        }
        if decision.get("promptNote"):
            cycle["summary"] = decision["promptNote"]
        cycles.append(cycle)
    outer_loop = {
        "outerLoopId": "ol_sample",
        "goal": goal,
        "maxCycles": 3,
        "cycles": cycles,
        "result": {"kind": "done", "finalOutput": "short summary"},
    }
    return logs, [(profile, profile_blob)], outer_loop


def write(target: Path = SAMPLE) -> None:
    logs, arts, outer_loop = runs()
    if target.exists():
        shutil.rmtree(target)
    (target / "events").mkdir(parents=True)
    (target / "artifacts" / "blobs").mkdir(parents=True)
    (target / "outer-loops").mkdir(parents=True)
    for run_id, log in logs.items():
        lines = [json.dumps(env, ensure_ascii=False, separators=(",", ":")) for env in log]
        (target / "events" / f"{run_id}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for manifest, blob in arts:
        # Little Workflow writes its manifests as canonical JSON and a newline (§6, §7).
        (target / "artifacts" / f"{manifest['artifactId']}.json").write_bytes(canonical_bytes(manifest) + b"\n")
        (target / "artifacts" / "blobs" / f"{manifest['artifactId']}.bin").write_bytes(blob)
    (target / "outer-loops" / f"{outer_loop['outerLoopId']}.json").write_bytes(canonical_bytes(outer_loop) + b"\n")


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else SAMPLE)
