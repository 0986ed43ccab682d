"""The timeline with time in it: each row's offset from the run's start (the absolute time on
hover), a marked row where the run was silent longer than GAP_SECONDS (and why, when the log says
so), a one-line summary of each payload, and the two events of one call grouped.

Computed for a page of rows from the envelopes it shows and the run's row: nothing more is read.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ledger.fold.state import occurred_at
from ledger.models import Run

from .format import duration, utc

GAP_SECONDS = 60  # a silence longer than this is a marked row
OPEN_CALLS = ("harness.model.called", "harness.tool_call.started", "StepAttemptStarted")


def _when(envelope: dict[str, Any]) -> datetime | None:
    payload = envelope["payload"]
    text = occurred_at(payload, envelope["recordedAt"]) if isinstance(payload, dict) else envelope["recordedAt"]
    try:
        return datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _tokens(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else "?"


def summary(event_type: str, payload: Any) -> str:
    """One line of what an event says: model and tokens, tool and outcome, step and attempt; a
    model call reported after its run ended (docs/otlp.md) says so."""
    if not isinstance(payload, dict):
        return ""
    if event_type.startswith("harness.model.") and payload.get("late") is True:
        return f"late call, after the run ended · {_summary(event_type, payload)}"
    return _summary(event_type, payload)


def _summary(event_type: str, payload: dict[str, Any]) -> str:
    step = payload.get("stepPath")
    attempt = payload.get("attempt")
    where = f"step {step}" if isinstance(step, str) else ""
    if isinstance(attempt, int) and where:
        where += f" · attempt {attempt}"
    if event_type == "harness.model.called":
        request = payload.get("request") if isinstance(payload.get("request"), dict) else {}
        model = request.get("model") if isinstance(request, dict) else None
        return f"turn {payload.get('turn', '?')} asked" + (f" of {model}" if isinstance(model, str) else "")
    if event_type == "harness.model.responded":
        model = payload.get("model") if isinstance(payload.get("model"), dict) else {}
        name = "/".join(str(model[k]) for k in ("provider", "modelId") if isinstance(model, dict) and model.get(k))
        response = payload.get("response")
        usage = response.get("usage") if isinstance(response, dict) else None
        usage = usage if isinstance(usage, dict) else {}
        tokens = f"{_tokens(usage.get('inputTokens'))} in / {_tokens(usage.get('outputTokens'))} out tokens"
        return f"turn {payload.get('turn', '?')} answered by {name or 'a model'} · {tokens}"
    if event_type == "harness.model.failed":
        return f"turn {payload.get('turn', '?')} failed: {_message(payload.get('error'))}"
    if event_type.startswith("harness.tool_call."):
        outcome = event_type.removeprefix("harness.tool_call.").replace("_", " ")
        tool = payload.get("toolName")
        name = f"{tool} " if isinstance(tool, str) else ""
        text = f"tool {name}{payload.get('callId', '')} {outcome}"
        return text + (f": {_message(payload.get('error'))}" if outcome == "failed" else "")
    if event_type.startswith("Step") and where:
        verb = event_type.removeprefix("Step").removeprefix("Attempt").lower()  # "· attempt 2 started"
        error = f": {_message(payload.get('error'))}" if event_type == "StepFailed" else ""
        return f"{where} {verb}{error}"
    if event_type == "RunStarted":
        workflow = payload.get("workflowVersionId")
        text = f"run started: {workflow}" if isinstance(workflow, str) else "run started"
        label, parent = payload.get("label"), payload.get("parentRunId")
        text += f" · {label}" if isinstance(label, str) and label else ""
        return text + (f" · sub-run of {parent}" if isinstance(parent, str) and parent else "")
    if event_type == "RunCompleted":
        return "run completed" + (" · output in an artifact" if "outputRef" in payload else "")
    if event_type == "RunFailed":
        return f"run failed: {_message(payload.get('error'))}"
    if event_type == "OuterLoopCycleCompleted":
        return f"outer loop cycle {payload.get('cycleNumber', '?')} completed"
    if event_type.startswith("custom."):
        names = sorted(str(k) for k in payload)
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        return f"custom event · {shown}" if names else "custom event"
    if event_type.startswith("harness.session."):
        role = payload.get("role")
        return f"session {event_type.rsplit('.', 1)[-1]}" + (f" ({role})" if isinstance(role, str) else "")
    return where


def _message(error: Any) -> str:
    if isinstance(error, dict):
        for key in ("message", "name", "code"):
            if isinstance(error.get(key), str):
                return str(error[key])[:120]
    return str(error)[:120] if error is not None else "?"


def _gap_reason(before: dict[str, Any], after: dict[str, Any], resumed: bool) -> str:
    """Why the run was silent, as far as the two events around the silence say."""
    if before["type"] == "harness.tool_call.approval_requested":
        return "waiting for a tool approval"
    if after["type"] == "harness.tool_call.reconciled" or before["type"] == "harness.tool_call.in_doubt":
        return "a tool call in doubt, until an operator reconciled it"
    if resumed and before["type"] in OPEN_CALLS:
        # The run's lease was taken over (its fencing token is past 1: a second executor resumed
        # it), and the silence began with a call or attempt left open: the executor that opened it
        # stopped there, and the one that resumed the run wrote what follows.
        return "executor died, resumed"
    return ""


def annotate(rows: list[dict[str, Any]], envelopes: list[dict[str, Any]], run: Run, *, gaps: bool = True) -> None:
    """Add to each row its offset, summary, call pairing and the gap before it (on this page)."""
    start = run.started_at
    resumed = (run.fencing_token or 0) > 1  # a second executor took the run's lease over
    previous: dict[str, Any] | None = None
    previous_at: datetime | None = None
    for row, envelope in zip(rows, envelopes, strict=True):
        at = _when(envelope)
        payload = envelope["payload"]
        row["summary"] = summary(envelope["type"], payload)
        call = payload.get("callId") if isinstance(payload, dict) else None
        row["call"] = call if isinstance(call, str) and envelope["type"].startswith("harness.") else ""
        if start is not None and at is not None:
            row["offset"] = "+" + duration(max((at - start).total_seconds(), 0.0))
            row["occurred_at"] = at
            row["absolute"] = utc(at, milliseconds=True)
        if gaps and previous is not None and previous_at is not None and at is not None:
            silent = (at - previous_at).total_seconds()
            if silent > GAP_SECONDS:
                reason = _gap_reason(previous, envelope, resumed)
                row["gap"] = f"{duration(silent)} without events" + (f" — {reason}" if reason else "")
        if row["call"] and previous is not None:
            prior = previous["payload"].get("callId") if isinstance(previous["payload"], dict) else None
            row["pair_end"] = prior == row["call"]
        previous, previous_at = envelope, at
