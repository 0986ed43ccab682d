"""The demo's workflows, registered like any other workflow module: `ledger.demo.workflows` is in
the default RUNLEDGER_WORKFLOW_MODULES setting (console/settings.py), so `ledger run`, `ledger
resume` and `ledger demo` find them; the runtime itself never imports the demo.

The models are the built-in scripted provider standing in for named models (provider and model
id are what the price table knows), so the demo's costs are priced like real traffic; one
workflow uses a model the price table does not know, so its cost shows n/a.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from ..runtime.model import ModelProvider
from ..runtime.outer_loop import SuperviseContext, register_supervisor
from ..runtime.providers import ModelRequest, ScriptedProvider, register_provider
from ..runtime.registry import AIGenerate, CodeRun, Decision, Parallel, SubWorkflow, Tool, ToolStep, Workflow, register


class DemoCrash(BaseException):
    """Raised out of the executor where a SIGKILL would land: nothing after it is written, the
    log ends mid-step exactly as a killed process leaves it. (tests/test_runtime.py kills real
    processes; the demo stays in one.)"""


def _n(text: str, spread: int) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % spread


# --- tools ------------------------------------------------------------------------------------

ORDERS = {"A-1": ("shipped", "DHL"), "B-2": ("delayed", "UPS"), "C-3": ("lost", "FedEx"), "D-4": ("delivered", "DPD")}


def lookup_order(args: Any) -> dict[str, Any]:
    status = ORDERS.get(str(args.get("orderId")))
    if status is None:
        raise LookupError(f"no order {args.get('orderId')}")
    return {"orderId": args["orderId"], "status": status[0], "carrier": status[1]}


def search_kb(args: Any) -> dict[str, Any]:
    query = str(args.get("q", ""))
    return {"q": query, "hits": [f"kb-{_n(query + str(i), 900) + 100}" for i in range(1 + _n(query, 3))]}


CRASH_ON_REFUND: set[str] = set()  # order ids whose refund request "leaves" and never comes back


def issue_refund(args: Any) -> dict[str, Any]:
    if str(args.get("orderId")) in CRASH_ON_REFUND:
        CRASH_ON_REFUND.discard(str(args.get("orderId")))
        raise DemoCrash("the executor died while the refund request was out")
    return {"refundId": f"rf-{args.get('orderId')}", "amount": args.get("amount")}


LOOKUP = Tool(
    "lookup_order",
    lookup_order,
    description="Find an order by id",
    parameters={"type": "object", "properties": {"orderId": {"type": "string"}}, "required": ["orderId"]},
)
SEARCH = Tool(
    "search_kb",
    search_kb,
    description="Search the knowledge base",
    parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
)
REFUND = Tool(
    "issue_refund",
    issue_refund,
    description="Refund an order (has an effect)",
    effect="write",
    timeout_s=20,
    parameters={"type": "object", "properties": {"orderId": {"type": "string"}, "amount": {"type": "number"}}},
)


# --- scripted models --------------------------------------------------------------------------

CRASH_ON_TURN: dict[str, int] = {}  # prompt -> the turn at which the demo's executor "dies" once
# A system message holding this makes the scripted model terse, and too terse about a lost parcel
# (order C-3): the prompt change the demo's regressing evaluation makes (ledger/demo/evaluations.py).
TERSE = "Answer in one short sentence."


def _agent_script(tool: str, arg: str) -> Any:
    """Turn 1 asks for one tool call, turn 2 answers; token counts vary with the prompt."""

    def script(request: ModelRequest) -> Mapping[str, Any]:
        prompt = str(request.body["messages"][-1]["content"]) if request.turn == 1 else ""
        first: Mapping[str, Any] = next((m for m in request.body["messages"] if m.get("role") == "user"), {})
        key = str(first.get("content", ""))
        if CRASH_ON_TURN.get(key) == request.turn:
            del CRASH_ON_TURN[key]
            raise DemoCrash(f"the executor died waiting for turn {request.turn}")
        base = 400 + _n(key, 1600)
        if request.turn == 1:
            value = key.split("order ")[-1].rstrip(")") if arg == "orderId" else prompt[:60]
            return {
                "toolCalls": [{"id": "c1", "name": tool, "args": {arg: value}}],
                "usage": {"inputTokens": base, "cachedInputTokens": base // 2, "outputTokens": 30 + _n(key, 40)},
            }
        system = next((str(m.get("content")) for m in request.body["messages"] if m.get("role") == "system"), "")
        if TERSE in system and "(order C-3)" in key:
            return {
                "text": "Sorry, I could not find anything about that.",
                "usage": {"inputTokens": base + 300, "cachedInputTokens": base, "outputTokens": 12},
            }
        return {
            "text": f"Answer for: {key[:80]}",
            "usage": {"inputTokens": base + 300, "cachedInputTokens": base, "outputTokens": 80 + _n(key, 200)},
        }

    return script


def _provider(provider: str, model: str, tool: str, arg: str) -> ScriptedProvider:
    return ScriptedProvider(script=_agent_script(tool, arg), name=provider, model_id=model)


def _weaker(model: str, current: ModelProvider) -> ModelProvider:
    """`demo-weaker`: the slot's own script, except that it fumbles the final answer to a lost
    parcel (order C-3): what the demo's regressing evaluation swaps in (ledger/demo/evaluations.py)."""
    script = current.script if isinstance(current, ScriptedProvider) and callable(current.script) else None

    def answer(request: ModelRequest) -> Mapping[str, Any]:
        entry = dict(script(request)) if script is not None else {"text": "?"}
        first: Mapping[str, Any] = next((m for m in request.body["messages"] if m.get("role") == "user"), {})
        if request.turn == 2 and "(order C-3)" in str(first.get("content", "")):
            entry["text"] = "Sorry, I could not find anything about that."
        return entry

    return ScriptedProvider(script=answer, name=current.name, model_id=model)


register_provider("demo-weaker", _weaker)


# --- support ----------------------------------------------------------------------------------


def normalize(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"ticket": str(run_input.get("ticket", "")).strip(), "orderId": str(run_input.get("orderId", "A-1"))}


def triage_prompt(run_input: Any, outputs: Mapping[str, Any]) -> str:
    return f"Customer says: {outputs['normalize']['ticket']} (order {outputs['normalize']['orderId']})"


def confirm_args(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"orderId": outputs["normalize"]["orderId"]}


def triage_output(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"reply": outputs["draft"], "order": outputs["confirm"]}


def _triage(name: str, provider: str, model: str) -> Workflow:
    return register(
        Workflow(
            name=name,
            steps=(
                CodeRun("normalize", normalize),
                AIGenerate("draft", triage_prompt, system="You answer support tickets.", tools=("lookup_order",)),
                ToolStep("confirm", "lookup_order", confirm_args),
            ),
            tools={"lookup_order": LOOKUP},
            models={"default": _provider(provider, model, "lookup_order", "orderId")},
            output=triage_output,
        )
    )


SUPPORT_TRIAGE = _triage("support.triage", "openai", "gpt-4o-mini")
SUPPORT_TRIAGE_PREMIUM = _triage("support.triage-premium", "anthropic", "claude-sonnet-4-6")

# The README's first run: `manage.py ledger run triage --input '{"ticket": "...", "orderId": "A-1"}'`.
TRIAGE = register(
    Workflow(
        name="triage",
        steps=(
            CodeRun("normalize", normalize),
            AIGenerate("draft", triage_prompt, system="You answer support tickets.", tools=("lookup_order",)),
            ToolStep("confirm", "lookup_order", confirm_args),
            CodeRun("summarize", triage_output),
        ),
        tools={"lookup_order": LOOKUP},
        models={
            "default": ScriptedProvider(
                script={
                    "draft": [
                        {
                            "toolCalls": [{"id": "c1", "name": "lookup_order", "args": {"orderId": "A-1"}}],
                            "usage": {"inputTokens": 120, "outputTokens": 15},
                        },
                        {
                            "text": "Your order A-1 has shipped with DHL.",
                            "usage": {"inputTokens": 180, "outputTokens": 12},
                        },
                    ]
                },
                model_id="scripted-1",
            )
        },
    )
)


def refund_args(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"orderId": outputs["normalize"]["orderId"], "amount": run_input.get("amount", 10)}


SUPPORT_REFUND = register(
    Workflow(
        name="support.refund",
        steps=(
            CodeRun("normalize", normalize),
            AIGenerate("assess", triage_prompt, system="Decide whether a refund is due.", tools=("lookup_order",)),
            ToolStep("refund", "issue_refund", refund_args),
        ),
        tools={"lookup_order": LOOKUP, "issue_refund": REFUND},
        models={"default": _provider("openai", "gpt-4o", "lookup_order", "orderId")},
    )
)


def send_goodwill_credit(args: Any) -> dict[str, Any]:
    return {"creditId": f"gc-{args.get('orderId')}", "amount": args.get("amount")}


# A write tool every call of which waits for an approver (ledger/replay/toolapproval.py).
GOODWILL = Tool(
    "send_goodwill_credit",
    send_goodwill_credit,
    description="Credit the customer's account",
    effect="write",
    approval="required",
    parameters={"type": "object", "properties": {"orderId": {"type": "string"}, "amount": {"type": "number"}}},
)


def goodwill_args(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"orderId": outputs["normalize"]["orderId"], "amount": run_input.get("amount", 20)}


SUPPORT_GOODWILL = register(
    Workflow(
        name="support.goodwill",
        steps=(
            CodeRun("normalize", normalize),
            ToolStep("credit", "send_goodwill_credit", goodwill_args),
            CodeRun("confirm", lambda run_input, outputs: {"credited": outputs["credit"]["creditId"]}),
        ),
        tools={"send_goodwill_credit": GOODWILL},
    )
)


# --- research ---------------------------------------------------------------------------------


def brief_prompt(run_input: Any, outputs: Mapping[str, Any]) -> str:
    return f"Write a short brief on {run_input.get('topic', 'nothing')}"


def _brief(name: str, provider: str, model: str) -> Workflow:
    return register(
        Workflow(
            name=name,
            steps=(AIGenerate("brief", brief_prompt, system="You write research briefs.", tools=("search_kb",)),),
            tools={"search_kb": SEARCH},
            models={"default": _provider(provider, model, "search_kb", "q")},
        )
    )


RESEARCH_BRIEF = _brief("research.brief", "google", "gemini-2.5-flash")
RESEARCH_HOUSE_MODEL = _brief("research.house-model", "acme.chat", "house-model-2")  # not in the price table


def export_rows(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    # Large on purpose: over the 256,000-byte inline limit, so the output is stored as an artifact.
    rows = [
        {"row": i, "topic": run_input.get("topic"), "text": f"finding {i:05d} " + "x" * 48}
        for i in range(int(run_input.get("rows", 4000)))
    ]
    return {"rows": rows, "count": len(rows)}


def export_summary(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"count": outputs["export"]["count"], "first": outputs["export"]["rows"][0]}


def export_output(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return outputs["export"]


RESEARCH_EXPORT = register(
    Workflow(
        name="research.export",
        steps=(CodeRun("export", export_rows), CodeRun("summary", export_summary)),
        output=export_output,
    )
)


# --- an orchestrator with five sub-runs, one of which fails -----------------------------------


def _text_provider(provider: str, model: str) -> ScriptedProvider:
    def script(request: ModelRequest) -> Mapping[str, Any]:
        prompt = str(request.body["messages"][-1].get("content", ""))
        return {
            "text": f"[{request.step_path}] {prompt[:120]}",
            "usage": {"inputTokens": 600 + _n(prompt, 900), "outputTokens": 120 + _n(prompt, 300)},
        }

    return ScriptedProvider(script=script, name=provider, model_id=model)


def fetch_sources(args: Any) -> dict[str, Any]:
    topic = str(args.get("topic", ""))
    if "restricted" in topic:
        raise PermissionError(f"sources for {topic!r} are behind a licence we do not hold")
    return {"topic": topic, "sources": [f"doc-{_n(topic + str(i), 9000) + 1000}" for i in range(3)]}


def sources_args(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"topic": run_input["topic"]}


def topic_prompt(run_input: Any, outputs: Mapping[str, Any]) -> str:
    return f"Summarise {run_input['topic']} from {', '.join(outputs['sources']['sources'])}"


RESEARCH_TOPIC = register(
    Workflow(
        name="research.topic",
        steps=(
            ToolStep("sources", "fetch_sources", sources_args),
            AIGenerate("summary", topic_prompt, system="You summarise sources."),
        ),
        tools={
            "fetch_sources": Tool(
                "fetch_sources",
                fetch_sources,
                description="Licensed sources for a topic",
                parameters={"type": "object", "properties": {"topic": {"type": "string"}}},
            )
        },
        models={"default": _text_provider("google", "gemini-2.5-flash")},
    )
)


def plan_topics(run_input: Any, outputs: Mapping[str, Any]) -> list[str]:
    return list(run_input["topics"])


def topic_input(item: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"topic": item}


def synthesis_prompt(run_input: Any, outputs: Mapping[str, Any]) -> str:
    done = [o for o in outputs["fan"] if isinstance(o, str)]
    failed = [o["subRunId"] for o in outputs["fan"] if isinstance(o, dict) and o.get("status") == "failed"]
    return f"Combine {len(done)} summaries; {len(failed)} topic(s) failed: {', '.join(failed)}"


RESEARCH_ORCHESTRATOR = register(
    Workflow(
        name="research.orchestrator",
        steps=(
            CodeRun("plan", plan_topics),
            Parallel(
                "fan",
                plan_topics,
                SubWorkflow("topic", "research.topic", topic_input, allow_failure=True),
                max_branches=8,
            ),
            AIGenerate("synthesize", synthesis_prompt, system="You write the final report."),
        ),
        models={"default": _text_provider("anthropic", "claude-sonnet-4-6")},
    )
)


# --- a decision loop that takes three visits --------------------------------------------------


def escalation_prompt(run_input: Any, outputs: Mapping[str, Any]) -> str:
    previous = outputs.get("review") or {}
    return f"Draft an escalation reply to: {run_input['ticket']} (pass {previous.get('pass', 0) + 1})"


def review_draft(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    passes = (outputs.get("review") or {}).get("pass", 0) + 1
    return {"pass": passes, "approved": passes >= int(run_input.get("passesNeeded", 3))}


def gate(run_input: Any, outputs: Mapping[str, Any]) -> str | None:
    return None if outputs["review"]["approved"] else "draft"


def send_reply(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"sent": outputs["draft"], "passes": outputs["review"]["pass"]}


SUPPORT_ESCALATION = register(
    Workflow(
        name="support.escalation",
        steps=(
            AIGenerate("draft", escalation_prompt, system="You write careful escalation replies."),
            CodeRun("review", review_draft),
            Decision("gate", gate, max_visits=3, loop_to="draft"),
            CodeRun("send", send_reply),
        ),
        models={"default": _text_provider("openai", "gpt-4o")},
    )
)


# --- an outer loop: a summary refined over three cycles until the editor is satisfied ----------


def refine_prompt(run_input: Any, outputs: Mapping[str, Any]) -> str:
    note = run_input.get("promptNote") or "a first draft"
    before = (run_input.get("previousOutput") or {}).get("draft", "")
    return (
        f"{run_input['goal']}. Topic: {run_input['input']['topic']}. Cycle {run_input['cycleNumber']}: "
        f"{note}. Previous draft: {before[:80] or 'none'}"
    )


def refine_measure(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"draft": outputs["draft"], "words": len(str(outputs["draft"]).split()), "cycle": run_input["cycleNumber"]}


RESEARCH_REFINE = register(
    Workflow(
        name="research.refine",
        steps=(
            AIGenerate("draft", refine_prompt, system="You write tight, cited summaries."),
            CodeRun("measure", refine_measure),
        ),
        models={"default": _text_provider("openai", "gpt-4o")},
    )
)

# The editor's notes, cycle by cycle: two rounds of changes, then the draft is accepted.
EDITOR_NOTES = {1: "cite two of the sources by name", 2: "cut it to 120 words and lead with the finding"}


def editor(ctx: SuperviseContext) -> dict[str, Any]:
    """The demo loop's supervise adapter: asks for changes twice, then takes the third draft."""
    note = EDITOR_NOTES.get(ctx.cycle_number)
    if note is not None and ctx.status == "completed":
        return {"kind": "continue", "promptNote": note}
    return {"kind": "done", "finalOutput": {"summary": (ctx.output or {}).get("draft"), "cycles": ctx.cycle_number}}


register_supervisor("research.editor", editor)
