"""A recorded chat message in one plain shape, whichever convention wrote it.

Harnesses record `{role, content, toolCalls?}`; OpenTelemetry's GenAI conventions (and what OTLP
ingest makes of OpenInference's flattened messages) record `{role, parts: [...]}`, each part a
`text`, a `tool_call`, a `tool_call_response`, `reasoning` or media; the OpenAI SDK's own
messages nest a tool call's name under `function`. The conversation view reads the plain shape:
`{role, content, toolCalls?, result?}`, tool calls as `{id?, name, args}`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def plain_message(raw: Mapping[str, Any]) -> dict[str, Any]:
    """`raw` as `{role, content, toolCalls?, result?}`; a message already plain is returned as it is."""
    parts = raw.get("parts")
    calls = raw.get("toolCalls", raw.get("tool_calls"))
    if not isinstance(parts, list):
        if isinstance(calls, list) and any(isinstance(c, Mapping) and "function" in c for c in calls):
            return {**raw, "toolCalls": [_openai_call(c) for c in calls]}
        return dict(raw)
    texts: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    results: list[Any] = []
    for part in parts:
        if not isinstance(part, Mapping):
            texts.append(json.dumps(part, ensure_ascii=False))
            continue
        kind = part.get("type")
        if kind in ("text", "reasoning") and isinstance(part.get("content"), str):
            texts.append(part["content"] if kind == "text" else f"(reasoning) {part['content']}")
        elif kind == "tool_call":
            call = {"name": part.get("name", "?"), "args": part.get("arguments")}
            tool_calls.append({"id": part["id"], **call} if isinstance(part.get("id"), str) else call)
        elif kind == "tool_call_response":
            results.append(part.get("response", part.get("result")))
        else:  # media (blob, uri, file) and parts of newer conventions: shown as they are
            texts.append(json.dumps(dict(part), ensure_ascii=False, indent=2))
    out: dict[str, Any] = {"role": raw.get("role", "?"), "content": "\n".join(texts) if texts else None}
    if tool_calls:
        out["toolCalls"] = tool_calls
    if results:
        out["result"] = results[0] if len(results) == 1 else results
    return out


def _openai_call(call: Any) -> Any:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    function = call["function"]
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    out = {"name": function.get("name", "?"), "args": arguments}
    return {"id": call["id"], **out} if isinstance(call.get("id"), str) else out
