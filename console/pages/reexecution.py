"""Re-execution in the console (docs/design.md §5, fifth of the replay family): the run page's
"Re-execute…" form with the mode's plan, and the divergence report of a re-execution.

The form is one template served three ways: the whole page (a link, a reload, a submit without
JavaScript, a 400 with its errors), and its plan alone for htmx when the mode or step changes.
Requests are made through ledger.reexecution.services and planned by ledger.runtime.reexecute; the
divergence is computed by ledger.replay.divergence from the two logs, never stored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_http_methods, require_safe

from ledger import limits
from ledger.errors import LedgerError, NotFound, RunFinished
from ledger.evaluation import evaluations
from ledger.models import ReexecutionRequest, Run, Workspace
from ledger.reads import reexecutions, selectors
from ledger.reexecution import services
from ledger.reexecution.errors import Forbidden
from ledger.replay.divergence import divergence_report
from ledger.runtime.errors import UnknownWorkflow
from ledger.runtime.providers import known_providers
from ledger.runtime.reexecute import mode_plan
from ledger.runtime.registry import get_workflow

from ..format import duration, money
from .guard import has_role, switcher, workspace_or_404

Mode = ReexecutionRequest.Mode
Status = ReexecutionRequest.Status

MODE_HELP: dict[str, str] = {
    Mode.SIMULATE: "Every model and tool call is served from this run's record: no spend, no effects. "
    "Starts at once, no approval.",
    Mode.EVALUATE: "Model calls are live (with the model mapping below), every tool call is served from "
    "the record. Spends money: needs an approver.",
    Mode.RESUME: "This run continues where its log ends; completed steps are skipped. Needs an approver.",
    Mode.FORK: "A new run from the chosen step: steps before it are reused from the record, the step "
    "and everything after it run live, optionally with a changed input. Needs an approver.",
    Mode.RERUN: "A new run with the same input, everything live. Needs an approver.",
}
# Modes whose new run can be compared with the original (resume continues the original itself).
COMPARABLE = (Mode.SIMULATE, Mode.EVALUATE, Mode.FORK, Mode.RERUN)
MAX_INPUT = 1_000_000


# --- where a run came from, and what was made of it (the run page's header and evidence tab) ----


def divergence_url(request: ReexecutionRequest | dict[str, Any]) -> str | None:
    """The divergence page of a request whose new run exists to compare, else None."""
    if isinstance(request, dict):
        ws, public_id, mode, new_run = request["workspace"], request["id"], request["mode"], request["newRunId"]
        started = request["status"] in Status.started()
        tenant, _, workspace = ws.partition("/")
    else:
        public_id, mode, new_run = request.public_id, request.mode, request.new_run_id
        started = request.status in Status.started()
        tenant, workspace = request.workspace.tenant.slug, request.workspace.slug
    if mode not in COMPARABLE or not new_run or not started:
        return None
    return reverse("reexecution-divergence", args=[tenant, workspace, public_id])


def run_origin(run: Run, made: ReexecutionRequest | None) -> dict[str, Any] | None:
    """For the run page's header: the request that made this run (reexecutions.made_run, as the
    header read it), its original and approver."""
    if made is None:
        return None
    ws = run.workspace
    return {
        "request": made,
        "original_url": reverse("run", args=[ws.tenant.slug, ws.slug, made.original_run_id]),
        "divergence_url": divergence_url(made),
    }


def reexecution_rows(run: Run, approvals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The evidence bundle's approvals, as the evidence tab lists them: links to the new run and
    its divergence report (a request that made this run links its original instead)."""
    ws = run.workspace
    rows = []
    for entry in approvals:
        other = entry["runId"] if entry["relation"] == "made_this_run" else entry["newRunId"]
        rows.append(
            {
                **entry,
                "divergence_url": divergence_url(entry),
                "other_url": reverse("run", args=[ws.tenant.slug, ws.slug, other]) if other else None,
                "other": other,
            }
        )
    return rows


def _why_not(run: Run, mode: str) -> str:
    """Why the form offers `mode` greyed out for this run ("" when it can work): a finished run
    has nothing to resume (the request would be refused after the reason was typed)."""
    if mode == Mode.RESUME and run.finished:
        return f"This run has {run.status}: there is nothing to resume."
    return ""


def can_request(user: Any, workspace: Workspace) -> bool:
    return has_role(user, workspace, "operator")


# --- the request form --------------------------------------------------------------------------


@dataclass
class RequestForm:
    mode: str = Mode.SIMULATE
    from_step: str = ""
    input_text: str = ""
    reason: str = ""
    models: dict[str, str] = field(default_factory=dict)  # slot -> "provider/model" as typed
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, data: Any, slots: list[str]) -> RequestForm:
        return cls(
            mode=data.get("mode", Mode.SIMULATE).strip(),
            from_step=data.get("from_step", "").strip(),
            input_text=data.get("input", ""),
            reason=data.get("reason", ""),
            models={slot: data.get(f"model:{slot}", "").strip() for slot in slots},
        )

    def overrides(self) -> dict[str, dict[str, str]]:
        """The typed model mapping; an error per slot written other than provider/model."""
        out = {}
        for slot, typed in self.models.items():
            if not typed:
                continue
            provider, _, model = typed.partition("/")
            if not provider or not model:
                self.errors[f"model:{slot}"] = f"Write the model for slot {slot} as provider/model."
            else:
                out[slot] = {"provider": provider, "model": model}
        return out

    def parsed_input(self) -> Any:
        """The input override, or NOT_GIVEN when the box is empty."""
        if not self.input_text.strip():
            return services.NOT_GIVEN
        if len(self.input_text) > MAX_INPUT:
            self.errors["input"] = f"The input override is at most {MAX_INPUT:,} characters."
            return services.NOT_GIVEN
        try:
            value = limits.loads(self.input_text)  # depth-limited before parsing
        except ValueError as exc:
            self.errors["input"] = f"The input override must be JSON: {exc}"
            return services.NOT_GIVEN
        if limits.has_nul(value):
            self.errors["input"] = "The input override may not contain the NUL character (\\u0000)."
            return services.NOT_GIVEN
        return value


def _run_or_404(request: HttpRequest, tenant: str, workspace: str, run_id: str) -> Run:
    ws = workspace_or_404(request, tenant, workspace)
    try:
        run = selectors.get_run(ws, run_id)
    except NotFound:
        raise Http404("not found") from None
    run.workspace = ws
    return run


def _slots(run: Run) -> list[tuple[str, str]]:
    """(slot, what it uses now) for each model slot of the run's workflow, when registered here."""
    first = selectors.events(run, limit=1)
    name = first[0]["payload"].get("workflow") if first and isinstance(first[0]["payload"], dict) else None
    if not isinstance(name, str):
        return []
    try:
        workflow = get_workflow(name)
    except UnknownWorkflow:
        return []
    return [(slot, f"{p.name}/{p.model_id}") for slot, p in sorted(workflow.models.items())]


def _plan(run: Run, form: RequestForm, overrides: dict[str, dict[str, str]]) -> tuple[dict[str, Any] | None, str]:
    """The mode's plan, or why there is none for what the form says (shown in its place)."""
    if form.mode not in Mode.values:
        return None, "Choose a mode."
    if form.mode == Mode.FORK and not form.from_step:
        return None, "Choose the step the fork runs live from."
    try:
        plan = mode_plan(
            workspace=run.workspace,
            run_id=run.run_id,
            mode=form.mode,
            from_step=form.from_step if form.mode == Mode.FORK else None,
            model_overrides=overrides or None,
        )
    except NotFound:
        raise
    except LedgerError as exc:
        return None, exc.message
    return plan, ""


def _steps_of(run: Run) -> list[str]:
    plan = mode_plan(workspace=run.workspace, run_id=run.run_id, mode=Mode.SIMULATE)
    return [s["stepPath"] for s in plan["steps"]]


def _form_page(
    request: HttpRequest, run: Run, form: RequestForm, *, status: int = 200, message: str = ""
) -> HttpResponse:
    slots = _slots(run)
    overrides = form.overrides() if form.mode in services.OVERRIDABLE_MODELS else {}
    plan, plan_problem = _plan(run, form, overrides)
    ws = run.workspace
    context = {
        "run": run,
        "workspace": ws,
        "form": form,
        "plan": plan,
        "plan_problem": plan_problem,
        "modes": [(m, MODE_HELP[m], _why_not(run, m)) for m in Mode.values],
        "steps": _steps_of(run),
        "slots": [
            {
                "slot": slot,
                "current": current,
                "value": form.models.get(slot, ""),
                "error": form.errors.get(f"model:{slot}", ""),
            }
            for slot, current in slots
        ],
        "message": message,
        "overridable": services.OVERRIDABLE_MODELS,
        "providers": known_providers(),
        "form_url": reverse("run-reexecute", args=[ws.tenant.slug, ws.slug, run.run_id]),
        "plan_url": reverse("run-reexecute-plan", args=[ws.tenant.slug, ws.slug, run.run_id]),
        "run_url": reverse("run", args=[ws.tenant.slug, ws.slug, run.run_id]),
    }
    if getattr(request, "htmx", None) and request.method == "GET" and request.path == context["plan_url"]:
        return render(request, "console/reexecution/plan.html", {**context, "plan_said": True}, status=status)
    context["workspaces"] = switcher(request)
    return render(request, "console/reexecution/request.html", context, status=status)


def member(request: HttpRequest) -> User:
    """The signed-in member (every view here is behind login_required)."""
    assert isinstance(request.user, User)
    return request.user


def _require_operator(request: HttpRequest, run: Run) -> None:
    if not can_request(request.user, run.workspace):
        raise PermissionDenied("re-executing a run needs the operator role")


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def request_form(request: HttpRequest, tenant: str, workspace: str, run_id: str) -> HttpResponse:
    """GET: the form (with `?mode=&from_step=` it shows that plan, which is how it works without
    JavaScript); POST: ask for the re-execution through the request service."""
    run = _run_or_404(request, tenant, workspace, run_id)
    _require_operator(request, run)
    slots = [slot for slot, _ in _slots(run)]
    if request.method != "POST":
        return _form_page(request, run, RequestForm.read(request.GET, slots))
    form = RequestForm.read(request.POST, slots)
    if form.mode not in Mode.values:
        form.errors["mode"] = "Choose one of the five modes."
    try:
        limits.written(form.reason, field="reason", label="reason")
    except LedgerError as exc:
        form.errors["reason"] = exc.message
    if form.mode == Mode.FORK and not form.from_step:
        form.errors["from_step"] = "Choose the step the fork runs live from."
    run_input = form.parsed_input() if form.mode == Mode.FORK else services.NOT_GIVEN
    overrides = form.overrides() if form.mode in services.OVERRIDABLE_MODELS else {}
    if not form.errors:
        # The plan checks what the request service does not: that the model slots exist here.
        plan, problem = _plan(run, form, overrides)
        if plan is None:
            form.errors["plan"] = problem
    if form.errors:
        return _form_page(request, run, form, status=400)
    try:
        made = services.request_reexecution(
            workspace=run.workspace,
            run_id=run.run_id,
            mode=form.mode,
            reason=form.reason,
            by=member(request),
            from_step=form.from_step if form.mode == Mode.FORK else None,
            input=run_input,
            model_overrides=overrides or None,
        )
    except NotFound:
        raise Http404("not found") from None
    except Forbidden as exc:
        raise PermissionDenied(exc.message) from None
    except (RunFinished, LedgerError) as exc:
        if exc.status >= 500:
            raise
        return _form_page(request, run, form, status=exc.status, message=exc.message)
    ws = run.workspace
    return redirect(
        reverse("run-tab", args=[ws.tenant.slug, ws.slug, run.run_id, "evidence"])
        + f"?requested={made.public_id}#reexecutions"
    )


@login_required
@require_safe
def plan_fragment(request: HttpRequest, tenant: str, workspace: str, run_id: str) -> HttpResponse:
    """The plan for the mode (and step, and models) the form says now: htmx swaps it in."""
    run = _run_or_404(request, tenant, workspace, run_id)
    _require_operator(request, run)
    return _form_page(request, run, RequestForm.read(request.GET, [slot for slot, _ in _slots(run)]))


# --- the divergence report ---------------------------------------------------------------------


def request_or_404(
    request: HttpRequest,
    tenant: str,
    workspace: str,
    reexecution_id: str,
) -> ReexecutionRequest:
    ws = workspace_or_404(request, tenant, workspace)
    try:
        found = reexecutions.get([ws], reexecution_id)
    except NotFound:
        raise Http404("not found") from None
    found.workspace = ws
    return found


def report_for(found: ReexecutionRequest) -> dict[str, Any] | None:
    """The divergence of a request's new run from its original; None while there is no new run."""
    if found.mode not in COMPARABLE or not found.new_run_id:
        return None
    try:
        return divergence_report(
            workspace=found.workspace, original_run_id=found.original_run_id, new_run_id=found.new_run_id
        )
    except NotFound:
        return None


def _duration(ms: float | None) -> str:
    return "n/a" if ms is None else duration(ms / 1000)


def _side(side: dict[str, Any] | None) -> dict[str, Any] | None:
    if side is None:
        return None
    return {
        **side,
        "duration": _duration(side.get("durationMs")),
        "cost": money(side.get("costUsd")),
        "replayed_cost": money(side.get("replayedCostUsd")) if side.get("replayedCostUsd") else "",
        "output_json": json.dumps(side.get("output"), indent=2, ensure_ascii=False, default=str),
    }


def diff_lines(text: str | None) -> list[tuple[str, str]]:
    """A unified diff as (kind, line) for colouring: add, del, hunk or same."""
    if not text:
        return []
    kinds = []
    for line in text.splitlines():
        if line.startswith(("+++", "---")):
            kinds.append(("file", line))
        elif line.startswith("@@"):
            kinds.append(("hunk", line))
        elif line.startswith("+"):
            kinds.append(("add", line))
        elif line.startswith("-"):
            kinds.append(("del", line))
        else:
            kinds.append(("same", line))
    return kinds


def _calls(side: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    if side is None:
        return []
    return [{**c, "pretty": json.dumps(c, indent=2, ensure_ascii=False, default=str)} for c in side.get(key) or []]


def divergence_context(found: ReexecutionRequest, report: dict[str, Any]) -> dict[str, Any]:
    ws = found.workspace
    steps = []
    for step in report["steps"]:
        steps.append(
            {
                **step,
                "first": step["stepPath"] == report["firstDivergence"],
                "before": _side(step["original"]),
                "after": _side(step["new"]),
                "diffs": [(name, diff_lines(text)) for name, text in step["diff"].items() if text],
                "model_before": _calls(step["original"], "modelCalls"),
                "model_after": _calls(step["new"], "modelCalls"),
                "tools_before": _calls(step["original"], "toolCalls"),
                "tools_after": _calls(step["new"], "toolCalls"),
            }
        )
    return {
        "report": report,
        "steps": steps,
        "original": _side(report["original"]),
        "new": _side(report["new"]),
        "original_url": reverse("run", args=[ws.tenant.slug, ws.slug, found.original_run_id]),
        "new_url": reverse("run", args=[ws.tenant.slug, ws.slug, found.new_run_id]),
        "divergences": [
            {**d, "pretty": json.dumps(d, indent=2, ensure_ascii=False, default=str)} for d in report["divergences"]
        ],
    }


@login_required
@require_safe
def divergence(request: HttpRequest, tenant: str, workspace: str, reexecution_id: str) -> HttpResponse:
    found = request_or_404(request, tenant, workspace, reexecution_id)
    report = report_for(found)
    context: dict[str, Any] = {
        "workspace": found.workspace,
        "rx": found,
        "report": report,
        "run_url": reverse("run", args=[found.workspace.tenant.slug, found.workspace.slug, found.original_run_id]),
        "workspaces": switcher(request),
    }
    if report is not None:
        context.update(divergence_context(found, report))
    evaluation, scores = evaluations.scores_of_request(found.workspace, found)
    if evaluation is not None:
        ws = found.workspace
        context["evaluation_url"] = reverse("evaluation", args=[ws.tenant.slug, ws.slug, evaluation.public_id])
        context["evaluation_id"], context["scores"] = evaluation.public_id, scores
    return render(request, "console/reexecution/divergence.html", context)


RUN = "w/<slug:tenant>/<slug:workspace>/runs/<str:run_id>/"

urlpatterns = [
    path(RUN + "reexecute/", request_form, name="run-reexecute"),
    path(RUN + "reexecute/plan/", plan_fragment, name="run-reexecute-plan"),
    path(
        "w/<slug:tenant>/<slug:workspace>/reexecutions/<str:reexecution_id>/divergence/",
        divergence,
        name="reexecution-divergence",
    ),
]
