"""The divergence report (docs/design.md §5 item 5): a re-execution's run against its original, step
by step, computed from the two logs through the fold (never stored: two folds, one comparison).

Sub-run ids are identities, not content: a re-execution's sub-runs have ids of their own, so
values of the new run are compared with the new sub-run ids written as the original's
(ledger/runtime/reexecute.py `sub_run_renames`); the values shown are the recorded ones.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from ..canonical import canonical_bytes, canonical_json, sha256_hex
from ..errors import NotFound
from ..fold import REPLAYED_ORIGINS, RunState, StepState, fold
from ..fold.pricing import UsageTotals, prices_for
from ..log import artifacts
from ..log.envelopes import log_of
from ..models import Run, Workspace


def divergence_report(*, workspace: Workspace, original_run_id: str, new_run_id: str) -> dict[str, Any]:
    """Compare run `new_run_id` with `original_run_id`, both of `workspace` (NotFound otherwise).

    Shape (camelCase JSON)::

        {
          "originalRunId": str, "newRunId": str,
          "firstDivergence": str | null,      # the first step path that is not identical
          "counts": {"identical": int, "changed": int, "new": int, "missing": int},
          "original": Side, "new": Side,     # the runs as a whole (totals)
          "steps": [{
            "stepPath": str,
            "status": "identical" | "changed" | "new" | "missing",
            "changes": [str],                 # of "status", "output", "modelOutputs", "toolResults"
            "original": StepSide | null,      # null when the step is new
            "new": StepSide | null,           # null when the step is missing
            "diff": {"output": str | null, "modelOutputs": str | null, "toolResults": str | null}
          }],
          "divergences": [{stepPath, kind, reason, message, callId?, turn?, toolName?, args?,
                           expected?, actual?, sequence}]   # the new run's harness.replay.diverged
        }
        Side = {"runId", "status", "output", "outputRef", "error", "durationMs", "costUsd",
                "replayedCostUsd", "usage", "replayedUsage", "replayOf", "reexecutionId"}
        StepSide = {"status", "output", "outputRef", "error", "attempts", "durationMs", "costUsd",
                    "replayedCostUsd", "usage", "replayedUsage",
                    "modelCalls": [{callId, turn, status, model, origin, replayOf, text, toolCalls,
                                    error, usage, costUsd, stored}],
                    "toolCalls": [{callId, toolName, caller, args, status, result, error, origin,
                                   replayOf, durationMs, stored}]}

    `stored` names the members the log moved into an artifact ({"text": ref}, {"result": ref}, …;
    docs/operations.md "Large payloads"): their value above is null, and they are compared by
    content (a ref is the sha256 of the bytes) without being read.

    `costUsd`/`usage` are what was spent (live calls only); `replayedCostUsd`/`replayedUsage`
    are the calls served from an original's record, priced for comparison, never spent. A
    `diff` entry is a unified text diff (difflib) of the two sides' texts, null when equal.
    A step is `identical` when its status, output, model outputs (text and tool calls asked
    for) and tool results (name, args, outcome) are equal on both sides; costs and durations
    are shown, not compared.
    """
    original_log, new_log = _log(workspace, original_run_id), _log(workspace, new_run_id)
    prices = prices_for(workspace)
    original = fold(original_log, prices=prices, run_id=original_run_id)
    new = fold(new_log, prices=prices, run_id=new_run_id)
    renames = _renames(original, new)

    steps: list[dict[str, Any]] = []
    counts = {"identical": 0, "changed": 0, "new": 0, "missing": 0}
    for path in _merged_paths(list(original.steps), list(new.steps)):
        before = _step_side(original, original_log, path) if path in original.steps else None
        after = _step_side(new, new_log, path) if path in new.steps else None
        entry = _compare(path, before, after, renames)
        counts[entry["status"]] += 1
        steps.append(entry)
    first = next((s["stepPath"] for s in steps if s["status"] != "identical"), None)
    return {
        "originalRunId": original_run_id,
        "newRunId": new_run_id,
        "firstDivergence": first,
        "counts": counts,
        "original": _run_side(original, original_log),
        "new": _run_side(new, new_log),
        "steps": steps,
        "divergences": list(new.divergences),
    }


def _log(workspace: Workspace, run_id: str) -> list[dict[str, Any]]:
    run = Run.objects.filter(workspace=workspace, run_id=run_id).first()
    if run is None:
        raise NotFound(f"run {run_id} not found", runId=run_id)
    return log_of(run)


def _renames(original: RunState, new: RunState) -> dict[str, str]:
    """{sub-run id in the new run: the original's at the same call}."""
    renames = {}
    for call_id, call in new.tool_calls.items():
        before = original.tool_calls.get(call_id)
        if call.caller != "workflow" or before is None:
            continue
        new_sub, old_sub = (c.args.get("subRunId") if isinstance(c.args, Mapping) else None for c in (call, before))
        if isinstance(new_sub, str) and isinstance(old_sub, str):
            renames[new_sub] = old_sub
    return renames


def _merged_paths(original: list[str], new: list[str]) -> list[str]:
    """Both runs' step paths in execution order: the original's, with the new run's own steps
    placed after the step they follow in the new run."""
    merged = list(original)
    known = set(original)
    anchor = -1
    for path in new:
        if path in known:
            anchor = merged.index(path)
            continue
        anchor += 1
        merged.insert(anchor, path)
        known.add(path)
    return merged


def _duration_ms(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    return round((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds() * 1000, 3)


def _money(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


def _run_side(state: RunState, log: list[dict[str, Any]]) -> dict[str, Any]:
    # The fold keeps no raw RunStarted payload; the re-execution id lives only there.
    started = log[0]["payload"] if log and log[0]["type"] == "RunStarted" else {}
    return {
        "runId": state.run_id,
        "status": state.status,
        "output": state.output,
        "outputRef": state.output_ref,
        "error": state.error,
        "durationMs": _duration_ms(state.started_at, state.finished_at),
        "costUsd": _money(state.usage.cost_usd),
        "replayedCostUsd": _money(state.replayed_usage.cost_usd),
        "usage": state.usage.to_json(),
        "replayedUsage": state.replayed_usage.to_json(),
        "replayOf": state.replay_of,
        "reexecutionId": started.get("reexecutionId") if isinstance(started.get("reexecutionId"), str) else None,
    }


def _step_side(state: RunState, log: list[dict[str, Any]], path: str) -> dict[str, Any]:
    step: StepState = state.steps[path]
    replayed = UsageTotals()
    models = []
    for call in state.model_calls:
        if call.step_path != path:
            continue
        answer = log[call.responded_sequence - 1]["payload"] if call.responded_sequence else {}
        stored = _stored(log, call.responded_sequence)
        response = answer.get("response")
        response = response if isinstance(response, Mapping) else {}
        if call.origin in REPLAYED_ORIGINS and call.usage is not None:
            replayed = replayed.add_call(call.usage, call.cost)
        models.append(
            {
                "callId": call.call_id,
                "turn": call.turn,
                "status": call.status,
                "model": f"{call.provider}/{call.model_id}" if call.provider else None,
                "origin": call.origin or "live",
                "replayOf": call.replay_of,
                "text": response.get("text"),
                "toolCalls": response.get("toolCalls") or [],
                "error": call.error,
                "usage": call.usage.to_json() if call.usage else None,
                "costUsd": _money(call.cost),
                "stored": {name.removeprefix("response."): ref for name, ref in stored.items()},
            }
        )
    tools = [
        {
            "callId": call.call_id,
            "toolName": call.tool_name,
            "caller": call.caller,
            "args": call.args,
            "status": call.status,
            "result": call.result,
            "error": call.error,
            "origin": call.origin or "live",
            "replayOf": call.replay_of,
            "durationMs": call.duration_ms,
            "stored": {**_stored(log, call.started_sequence), **_stored(log, call.ended_sequence)},
        }
        for call in state.tool_calls.values()
        if call.step_path == path
    ]
    return {
        "status": step.status,
        "output": step.output,
        "outputRef": step.output_ref,
        "error": step.error,
        "attempts": len(step.attempts),
        "durationMs": _duration_ms(step.started_at, step.finished_at),
        "costUsd": _money(step.usage.cost_usd),
        "replayedCostUsd": _money(replayed.cost_usd),
        "usage": step.usage.to_json(),
        "replayedUsage": replayed.to_json(),
        "modelCalls": models,
        "toolCalls": tools,
    }


def _stored(log: list[dict[str, Any]], sequence: int | None) -> dict[str, str]:
    """The members of event `sequence` the log moved into an artifact: name -> ref (not read)."""
    if not sequence or not 0 < sequence <= len(log):
        return {}
    env = log[sequence - 1]
    return artifacts.moved_members(env["type"], env["payload"])


def _member(m: Mapping[str, Any], name: str, by_content: bool) -> Any:
    """A compared member as shown, or by content: a moved one's ref, an inline one's would-be ref
    (the same sha256), so a value kept inline on one side and moved on the other is still equal."""
    ref = m["stored"].get(name) or (m["stored"].get("response") if name in ("text", "toolCalls") else None)
    if not by_content:
        return f"(stored as an artifact: {ref})" if ref else m[name]
    if ref:
        return ref
    return None if m[name] is None else artifacts.REF_PREFIX + "art_" + sha256_hex(canonical_bytes(m[name]))


def _behaviour(side: dict[str, Any], *, by_content: bool = False) -> dict[str, Any]:
    """What a step did, the parts the comparison looks at (`by_content`: moved members by ref)."""
    return {
        "status": side["status"],
        "output": {"output": side["output"], "outputRef": side["outputRef"], "error": side["error"]},
        "modelOutputs": [
            {
                "text": _member(m, "text", by_content),
                "toolCalls": _member(m, "toolCalls", by_content),
                "status": m["status"],
            }
            for m in side["modelCalls"]
            if m["status"] != "called"
        ],
        "toolResults": [
            {
                "toolName": t["toolName"],
                "args": _member(t, "args", by_content),
                "status": t["status"],
                "result": _member(t, "result", by_content),
                "error": _member(t, "error", by_content),
            }
            for t in side["toolCalls"]
        ],
    }


def _compare(
    path: str, before: dict[str, Any] | None, after: dict[str, Any] | None, renames: Mapping[str, str]
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "stepPath": path,
        "original": before,
        "new": after,
        "diff": {"output": None, "modelOutputs": None, "toolResults": None},
    }
    if before is None or after is None:
        entry.update(status="new" if before is None else "missing", changes=[])
        return entry
    renamed = rename_runs(after, renames)
    compared = _behaviour(before, by_content=True), _behaviour(renamed, by_content=True)
    changes = [
        name
        for name in ("status", "output", "modelOutputs", "toolResults")
        if canonical_json(compared[0][name]) != canonical_json(compared[1][name])
    ]
    old, new = _behaviour(before), _behaviour(renamed)
    for name in changes:
        if name != "status":
            entry["diff"][name] = _unified(_text(old[name], name), _text(new[name], name), path, name)
    entry.update(status="changed" if changes else "identical", changes=changes)
    return entry


def rename_runs(value: Any, renames: Mapping[str, str]) -> Any:
    """`value` with every string that contains a key of `renames` rewritten to its value (the
    one renaming rule, shared with ledger/runtime/reexecute.py)."""
    if not renames:
        return value
    if isinstance(value, str):
        for new, old in renames.items():
            if new in value:
                value = value.replace(new, old)
        return value
    if isinstance(value, Mapping):
        return {rename_runs(k, renames): rename_runs(v, renames) for k, v in value.items()}
    if isinstance(value, list):
        return [rename_runs(item, renames) for item in value]
    return value


def _text(value: Any, name: str) -> str:
    if name == "modelOutputs":
        # the model's texts as a reader compares them, each turn's tool requests as JSON under it
        lines = []
        for turn, call in enumerate(value, 1):
            lines.append(f"--- turn {turn} ({call['status']})")
            if call["text"] is not None:
                lines.append(str(call["text"]))
            for request in call["toolCalls"]:
                lines.append("tool " + json.dumps(request, sort_keys=True, ensure_ascii=False))
        return "\n".join(lines)
    if name == "output" and isinstance(value.get("output"), str) and not value.get("error"):
        return value["output"]
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _unified(before: str, after: str, path: str, name: str) -> str:
    return "\n".join(
        difflib.unified_diff(
            before.splitlines(),
            after.splitlines(),
            fromfile=f"original/{path}/{name}",
            tofile=f"new/{path}/{name}",
            lineterm="",
        )
    )
