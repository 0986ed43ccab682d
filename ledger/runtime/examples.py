"""A built-in example workflow, runnable with `manage.py ledger run triage --input '{"ticket": "..."}'`.

Everything is deterministic: the model is the scripted provider, the tool a lookup table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .providers import ScriptedProvider
from .registry import AIGenerate, CodeRun, Tool, ToolCall, Workflow, register

_ORDERS = {"A-1": {"status": "shipped", "carrier": "DHL"}, "B-2": {"status": "delayed", "carrier": "UPS"}}


def lookup_order(args: Any) -> dict[str, Any]:
    order = _ORDERS.get(str(args.get("orderId")))
    if order is None:
        raise LookupError(f"no order {args.get('orderId')}")
    return {"orderId": args["orderId"], **order}


def normalize(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"ticket": str(run_input.get("ticket", "")).strip(), "orderId": str(run_input.get("orderId", "A-1"))}


def ask(run_input: Any, outputs: Mapping[str, Any]) -> str:
    return f"Customer says: {outputs['normalize']['ticket']} (order {outputs['normalize']['orderId']})"


def confirm_args(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"orderId": outputs["normalize"]["orderId"]}


def summarize(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"reply": outputs["draft"], "order": outputs["confirm"]}


TRIAGE = register(Workflow(
    name="triage",
    steps=(
        CodeRun("normalize", normalize),
        AIGenerate("draft", ask, system="You answer support tickets.", tools=("lookup_order",)),
        ToolCall("confirm", "lookup_order", confirm_args),
        CodeRun("summarize", summarize),
    ),
    tools={"lookup_order": Tool("lookup_order", lookup_order, description="Find an order by id",
                                parameters={"type": "object", "properties": {"orderId": {"type": "string"}}})},
    models={"default": ScriptedProvider(script={"draft": [
        {"toolCalls": [{"id": "c1", "name": "lookup_order", "args": {"orderId": "A-1"}}],
         "usage": {"inputTokens": 120, "outputTokens": 15}},
        {"text": "Your order A-1 has shipped with DHL.", "usage": {"inputTokens": 180, "outputTokens": 12}},
    ]}, model_id="scripted-1")},
))
