"""The replay plan (docs/design.md §5, item 4): what a resume or re-execution would do, without doing it.

Pure, like the fold. Artifact hashes are the one thing a plan cannot see from the events, so
the caller re-hashes the blobs and passes the outcome in `artifact_checks`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..canonical import NotCanonicalizable, canonical_json, digest
from ..fold import (
    HarnessSession,
    ModelCall,
    RunState,
    RunStateMismatch,
    StepState,
    ToolCallState,
    apply_unchecked,
    check_events,
)
from ..fold.pricing import PriceTable, load_default_prices
from ..reads.report import UNATTRIBUTED, locale_sort_key


class CapabilityDriftError(Exception):
    """A harness session's capabilities differ from what the run recorded; resume refuses."""

    def __init__(self, run_id: str, changes: Sequence[str]) -> None:
        self.run_id = run_id
        self.changes = list(changes)
        lines = "\n".join(f"- {change}" for change in self.changes)
        super().__init__(f"run '{run_id}' manifest changed:\n{lines}")


def manifest_drift(old_manifest: Any, new_manifest: Any) -> list[str]:
    """`$.path: old -> new` for every leaf that differs, paths sorted; absent reads `undefined`."""
    old, new = _flatten(old_manifest), _flatten(new_manifest)
    changes = []
    for path in sorted(old.keys() | new.keys(), key=locale_sort_key):
        before, after = old.get(path, "undefined"), new.get(path, "undefined")
        if before != after:
            changes.append(f"{path}: {before} -> {after}")
    return changes


def _flatten(value: Any, path: str = "$", out: dict[str, str] | None = None) -> dict[str, str]:
    out = {} if out is None else out
    if isinstance(value, list):
        if not value:
            out[path] = "[]"
        for index, item in enumerate(value):
            _flatten(item, f"{path}[{index}]", out)
    elif isinstance(value, Mapping):
        if not value:
            out[path] = "{}"
        for key in sorted(value, key=locale_sort_key):
            _flatten(value[key], f"{path}.{key}", out)
    else:
        try:
            out[path] = canonical_json(value)  # strings come out JSON-quoted, as in Little Workflow
        except NotCanonicalizable:
            out[path] = str(value)
    return out


def replay_plan(
    events: Sequence[Mapping[str, Any]],
    *,
    artifact_checks: Mapping[str, str] | None = None,
    prices: PriceTable | None = None,
) -> dict[str, Any]:
    """docs/api.md's replay plan for one run's events.

    A broken log is reported (integrity `dense_sequence` fails), not refused: the plan is
    what tells an operator that the log is broken.
    """
    if not events:
        raise ValueError("a replay plan needs the run's events")
    run_id = events[0].get("runId")
    if not isinstance(run_id, str):
        raise ValueError("the first event has no runId")
    table = prices if prices is not None else load_default_prices()
    state = apply_unchecked(RunState(run_id=run_id), events, table)
    return plan_of_state(state, _dense_check(run_id, events), artifact_checks)


def plan_of_state(
    state: RunState, dense: dict[str, str], artifact_checks: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The replay plan of a folded state whose log's `dense_sequence` check said `dense` (a state
    from a fold snapshot is dense by construction: `dense_check_of(state)`)."""
    run_id = state.run_id
    sessions, missing_calls = _sessions(state)
    artifacts_check, missing_artifacts = _artifact_check(state, artifact_checks)
    checks = [dense, artifacts_check, _drift_check(state)]
    missing = (
        [
            f"step:{path}:output"
            for path, step in state.steps.items()
            if step.status == "completed" and not step.has_output and step.output_ref is None
        ]
        + missing_calls
        + missing_artifacts
    )

    plan = {
        "runId": run_id,
        "steps": [_plan_step(step) for step in state.steps.values()],
        "completedStepPaths": [p for p, s in state.steps.items() if s.status == "completed"],
        "pendingStepPaths": [p for p, s in state.steps.items() if s.status != "completed"],
        "sessions": sessions,
        "integrity": {"ok": all(c["status"] == "pass" for c in checks), "checks": checks},
        "replayReady": {"status": "fail" if missing else "pass", "missing": missing},
    }
    waiting = _waiting_approval(state)
    if waiting:  # only present while a call waits: every other plan keeps its shape (and digest)
        plan["waitingApproval"] = waiting
    return plan


def _waiting_approval(state: RunState) -> list[dict[str, Any]]:
    """The tool calls a resume would stop at until an approver decides (ledger/replay/toolapproval.py)."""
    return [
        {
            "callId": c.call_id,
            "toolName": c.tool_name,
            "stepPath": c.step_path,
            "args": c.args,
            "argsDigest": c.approval.get("argsDigest") if isinstance(c.approval, dict) else None,
        }
        for c in state.tool_calls.values()
        if c.status == "waiting_approval"
    ]


def _plan_step(step: StepState) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "stepPath": step.step_path,
        "status": step.status,
        "shouldRun": step.status != "completed",
    }
    if step.visit is not None:
        entry["visit"] = step.visit
    if step.has_output:
        entry["output"] = step.output
    if step.output_ref is not None:
        entry["outputRef"] = step.output_ref
    entry["artifactRefs"] = list(step.artifact_refs)
    return entry


def _sessions(state: RunState) -> tuple[list[dict[str, Any]], list[str]]:
    """Per harness session, which calls fast-forward from the record and which run again."""
    live_models = [c for i, c in enumerate(state.model_calls) if not superseded(state.model_calls, i)]
    calls: list[tuple[int, int | None, str | None, dict[str, Any]]] = []
    missing: list[str] = []
    for call in live_models:
        answered = call.status == "responded"
        entry: dict[str, Any] = {"kind": "model"}
        if call.turn is not None:
            entry["turn"] = call.turn
        if call.call_id is not None:
            entry["callId"] = call.call_id
        entry["action"] = "replay" if answered else "reinvoke"
        calls.append((first_sequence(call), call.session, call.step_path, entry))
        if not answered:
            turn = "?" if call.turn is None else call.turn
            missing.append(f"model:{call.step_path or UNATTRIBUTED}:turn{turn}:response")
    for tool in state.tool_calls.values():
        entry = {"kind": "tool"}
        if tool.turn is not None:
            entry["turn"] = tool.turn
        entry["callId"] = tool.call_id
        # An in-doubt call is never re-invoked (docs/design.md §5): once an operator reconciles
        # it, its outcome is replayed like any other; until then replayReady fails.
        entry["action"] = "reinvoke" if tool.status == "started" else "replay"
        calls.append((first_sequence(tool), tool.session, tool.step_path, entry))
        if tool.status == "in_doubt":
            missing.append(f"tool:{tool.call_id}:in_doubt")
        elif tool.status == "started":
            missing.append(f"tool:{tool.call_id}:result")
    calls.sort(key=lambda item: item[0])

    groups: list[tuple[int, dict[str, Any]]] = []
    for index, session in enumerate(state.sessions):
        own = [entry for _, owner, _, entry in calls if owner == index]
        groups.append((session.sequence, _session_entry(session, own)))
    orphans: dict[str | None, tuple[int, list[dict[str, Any]]]] = {}
    for sequence, owner, step_path, entry in calls:
        if owner is None:
            orphans.setdefault(step_path, (sequence, []))[1].append(entry)
    for step_path, (first, entries) in orphans.items():
        groups.append((first, {"stepPath": step_path, "role": None, "calls": entries}))
    groups.sort(key=lambda item: item[0])
    return [entry for _, entry in groups], missing


def _session_entry(session: HarnessSession, calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"stepPath": session.step_path, "role": session.role, "calls": calls}


def superseded(model_calls: list[ModelCall], index: int) -> bool:
    """A failed call that the harness retried: the retry, not the failure, is what replays."""
    call = model_calls[index]
    return call.status == "failed" and any(
        later.session == call.session and later.step_path == call.step_path and later.turn == call.turn
        for later in model_calls[index + 1 :]
    )


def first_sequence(call: ModelCall | ToolCallState) -> int:
    """The sequence of a call's first event (the console's conversation and waterfall order by it)."""
    if isinstance(call, ModelCall):
        candidates = [call.called_sequence, call.responded_sequence, call.failed_sequence]
    else:
        candidates = [call.started_sequence, call.ended_sequence]
    return min(s for s in candidates if s is not None)


def dense_check_of(state: RunState) -> dict[str, str]:
    """The `dense_sequence` check of a state the checked fold made (it refuses a gap)."""
    n = state.last_sequence
    return {"name": "dense_sequence", "status": "pass", "detail": f"{n} events, sequences 1..{n}"}


def _dense_check(run_id: str, events: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    try:
        check_events(run_id, events)
    except RunStateMismatch as exc:
        return {"name": "dense_sequence", "status": "fail", "detail": str(exc)}
    return {"name": "dense_sequence", "status": "pass", "detail": f"{len(events)} events, sequences 1..{len(events)}"}


def _artifact_check(state: RunState, artifact_checks: Mapping[str, str] | None) -> tuple[dict[str, str], list[str]]:
    checks = dict(artifact_checks or {})
    refs = list(state.artifacts) + [ref for ref in checks if ref not in state.artifacts]
    if not refs:
        return {"name": "artifact_hashes", "status": "pass", "detail": "no artifacts referenced"}, []
    # A ref nobody re-hashed is not vouched for: fail closed rather than report a pass.
    outcomes = {ref: checks.get(ref, "unchecked") for ref in refs}
    bad = {ref: outcome for ref, outcome in outcomes.items() if outcome != "ok"}
    missing = [f"artifact:{ref}" for ref, outcome in bad.items() if outcome in ("missing", "mismatch")]
    if bad:
        detail = "; ".join(f"{ref}: {outcome}" for ref, outcome in bad.items())
        return {"name": "artifact_hashes", "status": "fail", "detail": detail}, missing
    return {"name": "artifact_hashes", "status": "pass", "detail": f"{len(refs)} artifact(s) ok"}, []


def _scope(session: HarnessSession) -> tuple[str | None, str | None]:
    role = session.role or ""
    if role == "fixer" or role == "worker" or role.startswith("worker."):
        step_path = session.step_path
        if step_path is None and isinstance(session.manifest, Mapping):
            manifest_step = session.manifest.get("stepPath")
            step_path = manifest_step if isinstance(manifest_step, str) else None
        return session.role, step_path
    return session.role, None


def _drift_check(state: RunState) -> dict[str, str]:
    if not state.sessions:
        return {"name": "manifest_drift", "status": "pass", "detail": "no harness sessions"}
    failures = []
    first_of_scope: dict[tuple[str | None, str | None], HarnessSession] = {}
    for session in state.sessions:
        try:
            actual = digest(session.manifest)
        except NotCanonicalizable:
            actual = "(not canonicalizable)"
        if session.manifest_hash != actual:
            failures.append(
                f"session at sequence {session.sequence} ({session.role}): manifestHash "
                f"{session.manifest_hash} is not the digest of its manifest ({actual})"
            )
        scope = _scope(session)
        first = first_of_scope.setdefault(scope, session)
        if first is not session:
            changes = manifest_drift(first.manifest, session.manifest)
            if changes:
                failures.append(f"CapabilityDriftError: {CapabilityDriftError(state.run_id, changes)}")
    if failures:
        return {"name": "manifest_drift", "status": "fail", "detail": "\n".join(failures)}
    return {
        "name": "manifest_drift",
        "status": "pass",
        "detail": f"{len(state.sessions)} session(s), manifests match their hashes and scopes",
    }
