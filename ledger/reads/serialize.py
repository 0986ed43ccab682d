"""API shapes of the ledger's rows: camelCase, JSON-safe, null (never "") for what is absent.

One function per shape, shared by the REST API, the evidence bundle and share links, so a run
looks the same wherever it is read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from ..fold.pricing import UsageTotals, unpriced_reason
from ..log.envelopes import format_recorded_at
from ..models import Artifact, CostEntry, Feedback, Run, Step, ToolCall, UsageColumns
from .attention import Attention
from .failure import is_cancelled


def when(moment: datetime | str | None) -> str | None:
    """A moment as the API writes it; a str is one PostgreSQL has formatted so already
    (ledger.log.envelopes.formatted_in_sql)."""
    if moment is None or isinstance(moment, str):
        return moment
    return format_recorded_at(moment)


def money(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


def _or_none(value: str) -> str | None:
    return value or None


def usage(row: UsageColumns | UsageTotals) -> dict[str, Any]:
    """`{inputTokens, …, costUsd (number|null), pricedCalls, unpricedCalls}` from usage columns."""
    return {
        "inputTokens": row.input_tokens,
        "outputTokens": row.output_tokens,
        "cachedInputTokens": row.cached_input_tokens,
        "reasoningTokens": row.reasoning_tokens,
        "costUsd": money(row.cost_usd),
        "pricedCalls": row.priced_calls,
        "unpricedCalls": row.unpriced_calls,
    }


def run_links(run: Run) -> dict[str, str]:
    workspace = run.workspace
    api = f"/api/v1/runs/{run.run_id}"
    return {
        "console": f"/w/{workspace.tenant.slug}/{workspace.slug}/runs/{run.run_id}/",
        "evidence": f"{api}/evidence",
        "events": f"{api}/events",
    }


def run(row: Run, *, children: int, attention: Attention | None, tree: UsageTotals) -> dict[str, Any]:
    """docs/api.md's run object. `row` must come with `workspace__tenant` selected; `attention`
    from ledger.reads.attention (for_runs, of_run); `tree` the usage of the run and every run
    below it (ledger.reads.subruns.tree_usages)."""
    return {
        "runId": row.run_id,
        "workflowVersionId": _or_none(row.workflow_version_id),
        "status": row.status,
        "parentRunId": _or_none(row.parent_run_id),
        "rootRunId": _or_none(row.root_run_id),
        "startedAt": when(row.started_at),
        "finishedAt": when(row.finished_at),
        "input": row.input,
        "output": row.output,
        "error": row.error,
        "lastSequence": row.last_sequence,
        "eventCount": row.event_count,
        "usage": usage(row),
        "replayOf": _or_none(row.replay_of),
        "children": children,
        "links": run_links(row),
        "attention": None if attention is None else attention.to_json(),
        "cancelled": is_cancelled(row),
        "treeUsage": usage(tree),
    }


def runs(
    rows: Iterable[Run],
    children: Mapping[str, int],
    attention: Mapping[str, Attention],
    trees: Mapping[str, UsageTotals],
) -> list[dict[str, Any]]:
    return [
        run(r, children=children.get(r.run_id, 0), attention=attention.get(r.run_id), tree=trees[r.run_id])
        for r in rows
    ]


def step(row: Step) -> dict[str, Any]:
    return {
        "stepPath": row.step_path,
        "status": row.status,
        "visit": row.visit,
        "attempts": row.attempts,
        "output": row.output if row.has_output else None,
        "hasOutput": row.has_output,
        "outputRef": _or_none(row.output_ref),
        "artifactRefs": row.artifact_refs,
        "error": row.error,
        "firstSequence": row.first_sequence,
        "lastSequence": row.last_sequence,
        "startedAt": when(row.started_at),
        "finishedAt": when(row.finished_at),
        "usage": usage(row),
    }


def tool_call(row: ToolCall) -> dict[str, Any]:
    return {
        "callId": row.call_id,
        "toolName": _or_none(row.tool_name),
        "args": row.args,
        "caller": _or_none(row.caller),
        "turn": row.turn,
        "stepPath": _or_none(row.step_path),
        "status": row.status,
        "result": row.result,
        "error": row.error,
        "durationMs": row.duration_ms,
        "reconciled": row.reconciled,
        "origin": _or_none(row.origin),
        "startedSequence": row.started_sequence,
        "endedSequence": row.ended_sequence,
    }


def cost(row: CostEntry) -> dict[str, Any]:
    return {
        "sequence": row.sequence,
        "callId": _or_none(row.call_id),
        "stepPath": _or_none(row.step_path),
        "provider": _or_none(row.provider),
        "modelId": _or_none(row.model_id),
        "pricedAs": _or_none(row.priced_as),
        "inputTokens": row.input_tokens,
        "outputTokens": row.output_tokens,
        "cachedInputTokens": row.cached_input_tokens,
        "reasoningTokens": row.reasoning_tokens,
        "costUsd": money(row.cost_usd),
        "unpricedReason": unpriced_reason(row.cost_usd, row.usage_reported),
        "priceTableVersion": row.price_table_version,
        "recordedAt": when(row.recorded_at),
    }


def artifact(row: Artifact) -> dict[str, Any]:
    return {
        "artifactId": row.artifact_id,
        "sha256": row.sha256,
        "size": row.size,
        "contentType": row.content_type,
        "ref": row.ref,
        "createdAt": when(row.created_at),
    }


def feedback(row: Feedback, run_id: str) -> dict[str, Any]:
    """`author` names who rated: a member by username, or an API key by its name (or prefix)."""
    if row.author is not None:
        author: dict[str, Any] | None = {"type": "member", "name": row.author.get_username()}
    elif row.api_key is not None:
        author = {"type": "apiKey", "name": row.api_key.name or f"key {row.api_key.prefix}"}
    else:
        author = None
    return {
        "feedbackId": row.public_id,
        "runId": run_id,
        "rating": row.rating,
        "category": _or_none(row.category),
        "comment": _or_none(row.comment),
        "author": author,
        "createdAt": when(row.created_at),
    }
