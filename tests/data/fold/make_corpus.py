"""Writes tests/data/fold/corpus.json: seeded event logs over every event type (odd and wrong-typed
fields, priced/unpriced/dotted models, replayed origins, token counts past 50 digits) and, for each,
the state the fold gave when the file was made (session 7, before the fold's fast path; frozen
again when a usage with no input or output count became unpriced: two calls of the seeded logs
moved, and every model call and cost entry gained `usageReported`).

    .venv/bin/python tests/data/fold/make_corpus.py   # only to re-freeze after a deliberate change

tests/test_fold_corpus.py folds the logs again, whole and in pieces, and compares with the
frozen states: the fold's meaning must not move when its speed does.
"""

from __future__ import annotations

import json
import random
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
OUT = Path(__file__).with_name("corpus.json")

STEPS = ["plan", "plan", "draft", "draft.visit[0]", "draft.visit[1]", "review", None, "", 7]
MODELS = [
    {"provider": "openai", "modelId": "gpt-4o-mini"},
    {"provider": "openai", "modelId": "gpt-4o-mini"},
    {"provider": "anthropic", "modelId": "claude-sonnet-4-6"},
    {"provider": "openai.responses", "modelId": "gpt-5"},
    {"provider": "OpenAI", "modelId": "GPT-4o"},
    {"provider": "acme", "modelId": "unknown-1"},
    {"provider": 3, "modelId": "gpt-4o"},
    {"modelId": "gpt-4o"},
    "not-an-object",
    None,
]
TOKENS = [0, 1, 7, 1200, 150, 999_999, 10**13, -5, 2.5, True, None, "12", 10**60 + 7, 3 * 10**55]
ORIGINS = [None, None, None, None, "recorded", "simulated", "live", 5, ""]
CALL_IDS = ["c1", "c2", "c3", "c4", None, "", 9]
TOOL_IDS = ["t1", "t2", "t3", None, "", 4]
ROLES = [None, "planner", "coder"]
REFS = ["artifact://a1", "artifact://a2", "artifact://b", "http://x", None, 5]
TIMES = ["2026-12-01T00:00:00.000Z", "2026-12-01T00:00:01.500Z", None, 17]
TYPES = [
    "RunStarted",
    "WorkflowVersionRegistered",
    "RunCompleted",
    "RunFailed",
    "StepScheduled",
    "StepAttemptStarted",
    "StepCompleted",
    "StepFailed",
    "ArtifactCreated",
    "ParallelGroupStarted",
    "ParallelBranchScheduled",
    "ParallelBranchCompleted",
    "ParallelBranchFailed",
    "ParallelGroupCompleted",
    "ParallelGroupFailed",
    "harness.session.started",
    "harness.session.completed",
    "harness.session.failed",
    "harness.model.called",
    "harness.model.responded",
    "harness.model.failed",
    "harness.tool_call.started",
    "harness.tool_call.succeeded",
    "harness.tool_call.failed",
    "harness.tool_call.in_doubt",
    "harness.tool_call.reconciled",
    "harness.tool_call.approval_requested",
    "harness.tool_call.approved",
    "harness.tool_call.rejected",
    "OuterLoopCycleCompleted",
    "harness.replay.diverged",
    "custom.note",
    "SomethingNewer",
    42,
]
HOT = ["harness.model.responded"] * 8 + ["harness.tool_call.started"] * 5 + ["harness.model.called"] * 4


def usage(r: random.Random) -> Any:
    if r.random() < 0.05:
        return r.choice([None, "none", [1, 2]])
    u: dict[str, Any] = {
        "inputTokens": r.choice(TOKENS[:6]) if r.random() < 0.8 else r.choice(TOKENS),
        "outputTokens": r.choice(TOKENS[:6]) if r.random() < 0.8 else r.choice(TOKENS),
    }
    if r.random() < 0.3:
        u["cachedInputTokens"] = r.choice(TOKENS)
    elif r.random() < 0.3:
        u["inputTokenDetails"] = r.choice([{"cacheReadTokens": r.choice(TOKENS)}, None, "x", {}])
    if r.random() < 0.3:
        u["reasoningTokens"] = r.choice(TOKENS)
    elif r.random() < 0.3:
        u["outputTokenDetails"] = r.choice([{"reasoningTokens": r.choice(TOKENS)}, None, 3])
    if r.random() < 0.2:
        u["costUsd"] = 12.5
    for key in list(u):
        if r.random() < 0.05:
            del u[key]
    return u


def payload(r: random.Random, kind: Any, i: int) -> Any:
    if r.random() < 0.02:
        return r.choice([None, [1], "text"])
    p: dict[str, Any] = {}
    step = r.choice(STEPS)
    if step is not None:
        p["stepPath"] = step
    pick = r.choice
    for key, values in [
        ("callId", CALL_IDS if "model" in str(kind) else TOOL_IDS),
        ("turn", [1, 2, 3, None, "2", True]),
        ("origin", ORIGINS),
        ("replayOf", [None, None, "run_orig", 3]),
        ("role", ROLES),
        ("attempt", [1, 2, None, "1"]),
        ("output", [{"ok": i}, None, "done"]),
        ("outputRef", REFS),
        ("artifactRefs", [["artifact://a1", "artifact://c", 4], "artifact://a1", None]),
        ("artifactRef", REFS),
        ("error", [{"message": "boom"}, None]),
        ("toolName", ["bash", "search", "", None, 1]),
        ("caller", ["model", "agent", None]),
        ("args", [{"q": i}, None, [1]]),
        ("result", [{"r": i}, None]),
        ("durationMs", [12, 3.5, True, "7", None]),
        ("outcome", ["succeeded", "failed", "maybe", None]),
        ("branchPath", ["b0", "b1", None, 2]),
        ("branchIndex", [0, 1, None]),
        ("itemKey", ["k", None]),
        ("branchCount", [2, 3, None]),
        ("maxConcurrency", [1, None]),
        ("failureMode", ["fail_fast", None]),
        ("fanInOrder", [["b0", "b1"], None]),
        ("cycleNumber", [1, 2, 2, None, "3"]),
        ("outerLoopId", ["ol", None]),
        ("supervise", [{"s": 1}, None]),
        ("metadata", [{"m": 1}, None, "x"]),
        ("stepId", ["sid", None, ""]),
        ("workflowVersionId", ["wfv_1", None, 3]),
        ("workflow", ["wf", None]),
        ("input", [{"x": 1}, None]),
        ("inputRef", REFS),
        ("label", ["lbl", None]),
        ("tags", [["a"], None]),
        ("parentRunId", ["run_p", None]),
        ("task", ["do it", None]),
        ("manifest", [{"m": 1}, None]),
        ("manifestHash", ["sha256:x", None]),
        ("argsDigest", ["sha256:d", None]),
        ("by", ["alice", None]),
        ("promptHash", ["sha256:p", None]),
        ("name", ["out.txt", None]),
        ("contentType", ["text/plain", None]),
        ("workflowVersionHash", ["h", None]),
    ]:
        if r.random() < 0.35:
            value = pick(values)
            if value is not None or r.random() < 0.3:
                p[key] = value
    if kind in ("harness.model.responded", "harness.model.failed"):
        if r.random() < 0.9:
            p["model"] = pick(MODELS)
        if r.random() < 0.93:
            p["response"] = {"text": f"answer {i}", "usage": usage(r)} if r.random() < 0.95 else pick([None, "x"])
        if r.random() < 0.6:
            p["callId"] = pick(CALL_IDS)
        if r.random() < 0.7:
            p["turn"] = pick([1, 2, 3])
    return p


def log(seed: int, n: int) -> list[dict[str, Any]]:
    r = random.Random(seed)
    run_id = f"run_corpus_{seed}"
    events = []
    for i in range(n):
        kind = r.choice(TYPES) if r.random() < 0.55 else r.choice(HOT)
        event: dict[str, Any] = {
            "runId": run_id,
            "sequence": i + 1,
            "eventId": f"evt_{seed}_{i}",
            "type": kind,
            "payload": payload(r, kind, i),
        }
        at = r.choice(TIMES)
        if at is not None:
            event["recordedAt"] = at
        if r.random() < 0.02:
            del event["type"]
        events.append(event)
    return events


def hot_log(n: int) -> list[dict[str, Any]]:
    """bench/ingest.py's mix: model responses and tool calls alternating, as envelopes."""
    sys.path.insert(0, str(ROOT))
    from bench.ingest import make_events

    return [
        {
            "runId": "run_hot",
            "sequence": i + 1,
            "eventId": f"evt_hot_{i}",
            "type": e["type"],
            "recordedAt": "2026-12-01T00:00:00.000Z",
            "payload": e["payload"],
        }
        for i, e in enumerate(make_events(n, "h"))
    ]


def decimals(value: Any, path: str = "") -> dict[str, str]:
    """Every Decimal in a state, as str(): the exponent as well as the value (to_json normalizes)."""
    from dataclasses import fields, is_dataclass

    found: dict[str, str] = {}
    if isinstance(value, Decimal):
        found[path] = str(value)
    elif is_dataclass(value):
        for f in fields(value):
            found.update(decimals(getattr(value, f.name), f"{path}.{f.name}"))
    elif isinstance(value, dict):
        for key, item in value.items():
            found.update(decimals(item, f"{path}[{key!r}]"))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.update(decimals(item, f"{path}[{index}]"))
    return found


def frozen(state: Any) -> dict[str, Any]:
    return {"state": state.to_json(), "decimals": decimals(state)}


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from ledger.fold import apply_unchecked, fold
    from ledger.fold.pricing import load_default_prices
    from ledger.fold.state import RunState

    vectors = json.loads((ROOT / "tests" / "data" / "vectors.json").read_text())["events"]
    by_run: dict[str, list[dict[str, Any]]] = {}
    for event in vectors:
        by_run.setdefault(event["runId"], []).append(event)
    logs = {f"seed{seed}": log(seed, n) for seed, n in [(1, 250), (2, 250), (3, 200), (4, 150), (5, 100), (6, 60)]}
    logs["hot"] = hot_log(120)
    logs.update({f"vectors:{run}": events for run, events in by_run.items()})
    table = load_default_prices()
    cases = []
    for name, events in logs.items():
        try:
            state = fold(events, prices=table)
        except Exception:  # vectors whose logs are not dense from 1: the readers' path
            state = apply_unchecked(RunState(run_id=events[0]["runId"]), events, table)
        cases.append({"name": name, "events": events, "expected": frozen(state)})
    OUT.write_text(json.dumps({"about": __doc__, "cases": cases}, indent=None, separators=(",", ":")) + "\n")
    print(f"{OUT}: {len(cases)} logs, {sum(len(c['events']) for c in cases)} events, {OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main()
