"""`ledger demo`: the demo tenants, members and runs (idempotent: what exists is left alone).

- tenants `acme` (workspaces `support`, `research`) and `globex` (`main`); members alice (admin),
  bob (approver), carol (operator), dave (viewer) in acme, gina (admin) in globex.
- runs an external harness appended through the API's write path (`DEMO_RUNS`), one still open;
- a run whose step failed and waits for its scheduled retry (an external harness's);
- runs the runtime executed (ledger/demo/workflows.py): a run that crashed mid-step and was
  resumed (its log shows the fast-forward), a tool call left in doubt for an operator to
  reconcile, a goodwill credit waiting for an approver, a run cancelled with its reason, a model the price table does not know (cost n/a), an output large enough to be an
  artifact, the orchestrator and decision loop of ledger/demo/workflows.py;
- re-executions of run_demo_triage in every state (ledger/demo/reexecution.py): a fork waiting
  for approval, an approved fork whose output changed, a simulation that reproduced its original,
  a denied rerun;
- one share link of run_demo_orchestrator (with its sub-runs) by carol, its token not kept;
- `history_runs` runs spread over the last 30 days (backdated with ledger.clock.backdated) for
  the usage report, a few of them failed, some rated.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from .. import clock
from ..canonical import digest
from ..log import append
from ..log.envelopes import format_recorded_at
from ..models import Run, Workspace
from ..replay.cancellation import cancel_run
from ..replay.feedback import record_feedback
from ..replay.gateway import ToolCallInDoubt, settle_expired_claims
from ..runtime.executor import resume_run, start_run
from ..runtime.outer_loop import start_outer_loop
from ..tenancy import sharing
from ..tenancy.services import bootstrap, create_user
from . import evaluations, reexecution, workflows

DEMO_PASSWORD = "runledger-demo"
USERS = [("alice", "admin"), ("bob", "approver"), ("carol", "operator"), ("dave", "viewer")]
HISTORY_RUNS = 300
# Who the demo's hand-written runs were started by (Run.started_by).
DEMO = "system:demo"
WORKSPACES = [("acme", "support"), ("acme", "research"), ("globex", "main")]


def _model_turn(step: str, turn: int, model: tuple[str, str], tokens: tuple[int, int, int]) -> list[dict[str, Any]]:
    request = {"model": model[1], "messages": [{"role": "user", "content": f"{step} turn {turn}"}]}
    return [
        {
            "type": "harness.model.called",
            "payload": {"turn": turn, "stepPath": step, "promptHash": digest(request), "request": request},
        },
        {
            "type": "harness.model.responded",
            "payload": {
                "turn": turn,
                "callId": f"{step}-m{turn}",
                "stepPath": step,
                "model": {"provider": model[0], "modelId": model[1]},
                "response": {
                    "text": f"answer for {step}",
                    "usage": {"inputTokens": tokens[0], "cachedInputTokens": tokens[1], "outputTokens": tokens[2]},
                },
            },
        },
    ]


def _summarize_run(model: tuple[str, str], finish: bool) -> list[dict[str, Any]]:
    """The events an external harness sends for one summarize run (the API's write path)."""
    manifest = {"harnessId": "runledger.demo", "modelSlot": model[1], "tools": ["search"]}
    events: list[dict[str, Any]] = [
        {
            "type": "RunStarted",
            "payload": {
                "workflowVersionId": "wfver_support_summarize",
                "input": {"ticket": 4711},
                "label": "support.summarize",
            },
        },
        {"type": "StepScheduled", "payload": {"stepPath": "summarize"}},
        {"type": "StepAttemptStarted", "payload": {"stepPath": "summarize", "attempt": 1}},
        {
            "type": "harness.session.started",
            "payload": {
                "stepPath": "summarize",
                "role": "worker.ai-generate",
                "task": {"kind": "execute_step"},
                "manifest": manifest,
                "manifestHash": digest(manifest),
            },
        },
        *_model_turn("summarize", 1, model, (1200, 800, 150)),
        {
            "type": "harness.tool_call.started",
            "payload": {
                "callId": "summarize-t1",
                "caller": "model",
                "turn": 1,
                "toolName": "search",
                "args": {"q": "ticket 4711"},
                "stepPath": "summarize",
                "headers": {"Authorization": "Bearer sk-demo-secret"},
            },
        },
        {
            "type": "harness.tool_call.succeeded",
            "payload": {"callId": "summarize-t1", "result": {"hits": 3}, "durationMs": 42, "stepPath": "summarize"},
        },
        *_model_turn("summarize", 2, model, (1600, 1200, 220)),
    ]
    if finish:
        events += [
            {"type": "harness.session.completed", "payload": {"stepPath": "summarize"}},
            {
                "type": "StepCompleted",
                "payload": {"stepPath": "summarize", "attempt": 1, "output": {"summary": "Customer cannot log in."}},
            },
            {"type": "RunCompleted", "payload": {"output": {"summary": "Customer cannot log in."}}},
        ]
    return events


DEMO_RUNS: list[tuple[str, str, str, list[dict[str, Any]]]] = [
    ("acme", "support", "run_demo_summarize", _summarize_run(("openai", "gpt-4o-mini"), finish=True)),
    ("acme", "support", "run_demo_in_progress", _summarize_run(("anthropic", "claude-sonnet-4-6"), finish=False)),
    ("acme", "research", "run_demo_unpriced", _summarize_run(("acme.chat", "house-model"), finish=True)),
    ("globex", "main", "run_demo_globex", _summarize_run(("openai", "gpt-4o"), finish=True)),
]


def _demo_password(username: str) -> str | None:
    """The demo password for a person who lacks it (new, or who changed it), else None: setting it
    again would be a password reset, audited, that ends their sessions — every `make run` would
    log the demo's people out of their browsers."""
    user = User.objects.filter(username=username).first()
    return None if user is not None and user.check_password(DEMO_PASSWORD) else DEMO_PASSWORD


def load_demo(*, history_runs: int = HISTORY_RUNS, evaluations_too: bool = True) -> str:
    """`ledger demo`'s tenants, people and runs (`history_runs` more in the runs list); with
    `evaluations_too` False, without the dataset, policy and two evaluations (three quarters of
    the work: twenty re-executions), for the tests of views that do not show them."""
    workspaces = {f"{t}/{w}": bootstrap(tenant=t, workspace=w) for t, w in WORKSPACES}
    for username, tenant, role in [*((u, "acme", r) for u, r in USERS), ("gina", "globex", "admin")]:
        create_user(username=username, tenant=tenant, role=role, password=_demo_password(username))
    existing = set(Run.objects.filter(workspace__in=workspaces.values()).values_list("workspace_id", "run_id"))
    before = len(existing)

    def missing(ws: Workspace, run_id: str) -> bool:
        return (ws.pk, run_id) not in existing

    for tenant, workspace, run_id, events in DEMO_RUNS:
        ws = workspaces[f"{tenant}/{workspace}"]
        if missing(ws, run_id):
            append(workspace=ws, run_id=run_id, events=events, by=DEMO)
    _showcase(workspaces, missing)
    reexecution.lay_out(workspaces["acme/support"])
    if evaluations_too:
        evaluations.lay_out(workspaces["acme/support"])
    _share_link(workspaces["acme/research"])
    _history(workspaces, missing, history_runs)
    created = Run.objects.filter(workspace__in=workspaces.values()).count() - before
    return f"{created} run(s) created, {before} already present"


def _showcase(workspaces: dict[str, Workspace], missing: Any) -> None:
    support, research = workspaces["acme/support"], workspaces["acme/research"]
    now = timezone.now()
    if missing(support, "run_demo_triage"):
        start_run(
            workspace=support,
            workflow="support.triage",
            run_id="run_demo_triage",
            input={"ticket": "Where is my parcel?", "orderId": "A-1"},
        )
    if missing(support, "run_demo_crashed_resumed"):
        run_input = {"ticket": "My order is late, again.", "orderId": "B-2"}
        workflows.CRASH_ON_TURN[f"Customer says: {run_input['ticket']} (order B-2)"] = 2
        with clock.backdated(now - timedelta(minutes=20)):
            try:
                start_run(
                    workspace=support, workflow="support.triage", run_id="run_demo_crashed_resumed", input=run_input
                )
            except workflows.DemoCrash:
                pass  # the log now ends with turn 2's harness.model.called and no response
        resume_run(workspace=support, run_id="run_demo_crashed_resumed", input=run_input)
    if missing(support, "run_demo_in_doubt"):
        workflows.CRASH_ON_REFUND.add("C-3")
        with clock.backdated(now - timedelta(hours=2)):
            try:
                start_run(
                    workspace=support,
                    workflow="support.refund",
                    run_id="run_demo_in_doubt",
                    input={"ticket": "Parcel lost, refund please.", "orderId": "C-3", "amount": 49.9},
                )
            except workflows.DemoCrash:
                pass  # the refund request left; its lease has long expired since
        settle_expired_claims(workspace=support, run_id="run_demo_in_doubt")
        try:
            resume_run(workspace=support, run_id="run_demo_in_doubt")
        except ToolCallInDoubt:
            pass  # refused before writing: the run waits for an operator to reconcile the call
    if missing(support, "run_demo_awaiting_approval"):
        # A goodwill credit waits for an approver other than carol, who asked for it (Approvals page).
        start_run(
            workspace=support,
            workflow="support.goodwill",
            run_id="run_demo_awaiting_approval",
            input={"ticket": "Late twice, a gesture please.", "orderId": "B-2", "amount": 25},
            requested_by="carol",
        )
    if missing(support, "run_demo_cancelled"):
        with clock.backdated(now - timedelta(minutes=45)):
            start_run(
                workspace=support,
                workflow="support.goodwill",
                run_id="run_demo_cancelled",
                input={"ticket": "Credit me for order D-4.", "orderId": "D-4", "amount": 500},
                requested_by="carol",
            )
            cancel_run(
                workspace=support,
                run_id="run_demo_cancelled",
                by=User.objects.get(username="carol"),
                reason="order D-4 was delivered on time: no credit is due",
            )
    if missing(support, "run_demo_retry_scheduled"):
        # An external harness's sync whose first attempt failed; its next attempt is recorded for
        # two hours after the demo was loaded (the runs list's "retry scheduled").
        _retry_scheduled(support, now)
    if missing(research, "run_demo_orchestrator"):
        start_run(
            workspace=research,
            workflow="research.orchestrator",
            run_id="run_demo_orchestrator",
            input={
                "topics": [
                    "pricing pages",
                    "churn signals",
                    "restricted market data",
                    "onboarding funnels",
                    "support backlog",
                ]
            },
        )
    if missing(support, "run_demo_escalation"):
        start_run(
            workspace=support,
            workflow="support.escalation",
            run_id="run_demo_escalation",
            input={"ticket": "Third outage this month, we want a call.", "passesNeeded": 3},
        )
    if missing(research, "run_demo_house_model"):
        start_run(
            workspace=research,
            workflow="research.house-model",
            run_id="run_demo_house_model",
            input={"topic": "internal model evaluation"},
        )
    if missing(research, "run_ol_demo_refine"):  # the outer loop's record: three cycles, each a run
        start_outer_loop(
            workspace=research,
            workflow="research.refine",
            input={"topic": "churn signals"},
            goal="A tight, cited summary of churn signals",
            max_cycles=5,
            supervise="research.editor",
            outer_loop_id="ol_demo_refine",
        )
    if missing(research, "run_demo_export"):
        start_run(
            workspace=research,
            workflow="research.export",
            run_id="run_demo_export",
            input={"topic": "churn signals", "rows": 4000},
        )


def _retry_scheduled(support: Workspace, now: datetime) -> None:
    with clock.backdated(now - timedelta(minutes=3)):
        append(
            workspace=support,
            by=DEMO,
            run_id="run_demo_retry_scheduled",
            events=[
                {
                    "type": "RunStarted",
                    "payload": {
                        "workflowVersionId": "wfver_support_crm_sync",
                        "input": {"since": "2026-11-30"},
                        "label": "support.crm-sync",
                    },
                },
                {"type": "StepScheduled", "payload": {"stepPath": "push-contacts"}},
                {"type": "StepAttemptStarted", "payload": {"stepPath": "push-contacts", "attempt": 1}},
                {
                    "type": "StepFailed",
                    "payload": {
                        "stepPath": "push-contacts",
                        "attempt": 1,
                        "error": {
                            "name": "UpstreamUnavailable",
                            "message": "the CRM answered 503: maintenance window",
                            "retriable": True,
                            "retryAt": format_recorded_at(now + timedelta(hours=2)),
                        },
                    },
                },
            ],
        )


def _share_link(research: Workspace) -> None:
    """One share link of the orchestrator and its sub-runs, made by carol, so the run page's share
    panel has a row to show and revoke. Its token is thrown away (it is shown once, to whoever
    creates a link): make a new one from the panel to open a shared page."""
    run = (
        Run.objects.select_related("workspace__tenant")
        .filter(workspace=research, run_id="run_demo_orchestrator")
        .first()
    )
    if run is None or sharing.links_of_run(research, run.run_id).exists():
        return
    carol = User.objects.get(username="carol")
    sharing.create_link(
        workspace=research, run=run, by=carol, expires_in_hours=sharing.MAX_EXPIRY_HOURS, include_sub_runs=True
    )


_HISTORY_MIX = [
    ("acme/support", "support.triage"),
    ("acme/support", "support.triage"),
    ("acme/support", "support.triage-premium"),
    ("acme/research", "research.brief"),
    ("acme/research", "research.brief"),
    ("acme/research", "research.house-model"),
    ("globex/main", "support.triage"),
]
_TICKETS = [
    "Where is my parcel?",
    "Wrong size delivered",
    "Refund status?",
    "Tracking link broken",
    "Package damaged",
    "Change delivery address",
    "Invoice missing",
]
_TOPICS = ["pricing pages", "churn signals", "onboarding funnels", "support backlog", "model costs", "search quality"]
_CATEGORIES = ["accuracy", "tone", "speed", "cost"]


HISTORY_SPAN = timedelta(days=30)
# Each history run starts up to ten hours after its day's slot, so the slots end that much (and a
# margin for the runs' own seconds) before now: no run of the past starts in the future.
SCATTER = timedelta(minutes=600 + 5)


def _history(workspaces: dict[str, Workspace], missing: Any, count: int) -> None:
    """`count` runs over the last 30 days, oldest first; every 19th fails (unknown order)."""
    now = timezone.now()
    raters = list(User.objects.filter(username__in=["alice", "bob", "carol", "dave"]).order_by("username"))
    for i in range(count):
        ws_key, workflow = _HISTORY_MIX[i % len(_HISTORY_MIX)]
        ws = workspaces[ws_key]
        run_id = f"run_hist_{i:04d}"
        if not missing(ws, run_id):
            continue
        at: datetime = (
            now - HISTORY_SPAN + (HISTORY_SPAN - SCATTER) * (i / max(count, 1)) + timedelta(minutes=(i * 37) % 600)
        )
        if workflow.startswith("research."):
            run_input: dict[str, Any] = {"topic": f"{_TOPICS[i % len(_TOPICS)]} #{i}"}
        else:
            order = "Z-9" if i % 19 == 7 else sorted(workflows.ORDERS)[i % 4]
            run_input = {"ticket": f"{_TICKETS[i % len(_TICKETS)]} (#{i})", "orderId": order}
        with clock.backdated(at):
            start_run(workspace=ws, workflow=workflow, run_id=run_id, input=run_input)
        if i % 5 == 0 and ws.tenant.slug == "acme" and raters:
            run = Run.objects.get(workspace=ws, run_id=run_id)
            record_feedback(
                run=run,
                rating=1 + (i * 7) % 5,
                category=_CATEGORIES[i % len(_CATEGORIES)],
                comment=f"demo rating {i}",
                author=raters[i % len(raters)],
            )
