"""Evaluations of a change against a dataset (docs/evaluations.md).

`start_evaluation` makes the `evaluate` batch of re-executions of the dataset version's runs
(ledger/reexecution/services.request_batch) with the change as its model mapping; inside a policy
(policies.covering) the batch is approved by the policy at once, otherwise it waits for an
approver like any batch. Each change of one of its requests reaches `on_request_change` (hooked
in apps.py); after the change commits, `advance` scores every request that finished (scores go on
the new run as a `custom.evaluation.scored` event, the one write path) and, once every request is
finished, denied or expired, writes the report and the verdict. `advance` is idempotent and
takes the evaluation's row lock, so calling it again (the CLI's --wait does) is harmless.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any
from xml.etree import ElementTree

from django.contrib.auth.models import User
from django.db import transaction

from .. import audit, clock
from ..canonical import NotCanonicalizable, canonical_bytes, digest
from ..errors import Fenced, LedgerError, NotFound
from ..limits import written
from ..log import append, rules
from ..models import Evaluation, Event, ReexecutionRequest, Run, Workspace
from ..reads import selectors
from ..reexecution import services as reexecution
from ..reexecution.errors import InvalidReexecution
from ..replay.divergence import divergence_report
from ..runtime.errors import InvalidReexecution as RuntimeInvalidReexecution
from ..runtime.errors import UnknownWorkflow
from ..runtime.record import inline_or_ref
from ..runtime.reexecute import DIVERGED
from . import budget, failif, policies
from .access import Principal, actor
from .datasets import get_dataset, get_version
from .errors import InvalidEvaluation
from .scorers import ScoreContext, Spending, check_specs, run_scorer

log = logging.getLogger(__name__)
Status = Evaluation.Status
Verdict = Evaluation.Verdict
RxStatus = ReexecutionRequest.Status
Action = audit.Action
SCORED = "custom.evaluation.scored"
SCORER_ACTOR = audit.Actor(name="system:evaluation")
FINAL = (RxStatus.SUCCEEDED, RxStatus.FAILED, RxStatus.DENIED, RxStatus.EXPIRED)


MAX_PROMPTS = 50
MAX_PROMPT_CHARS = 100_000
CHANGE_KEYS = {
    "model": {"modelOverrides"},
    "prompt": {"prompts"},
    "input": {"inputs", "mergePatch"},
    "workflow": {"workflow", "version"},
}


def check_change(value: Any, run_ids: Sequence[str] = ()) -> dict[str, Any]:
    """The kinds of change of docs/evaluations.md "Changes", checked for their shape:

    - `{kind: "model", modelOverrides: {slot: {provider, model}}}`;
    - `{kind: "prompt", prompts: {stepId: {system?, prompt?}}}` (the step ids are checked
      against each run's workflow when the batch is made);
    - `{kind: "input", inputs: {runId: input}}` or `{kind: "input", mergePatch: {...}}` (RFC 7396,
      applied to each run's own input);
    - `{kind: "workflow", workflow: NAME, version?: "wfver_…"}`.
    """
    if not isinstance(value, Mapping) or value.get("kind") not in policies.CHANGE_KINDS:
        raise InvalidEvaluation(
            f"change is {{kind, ...}} with kind one of {list(policies.CHANGE_KINDS)}", field="change"
        )
    kind = value["kind"]
    extra = sorted(set(value) - {"kind"} - CHANGE_KEYS[kind])
    if extra:
        raise InvalidEvaluation(
            f"a {kind} change takes {sorted(CHANGE_KEYS[kind])}, not {extra}", field="change", kind=kind
        )
    if kind == "model":
        overrides = value.get("modelOverrides")
        if not isinstance(overrides, Mapping) or not overrides:
            raise InvalidEvaluation("a model change names modelOverrides: slot -> {provider, model}", field="change")
        try:
            checked = reexecution.check_model_overrides(overrides)
        except LedgerError as exc:
            raise InvalidEvaluation(f"change: {exc.message}", field="change") from None
        return {"kind": "model", "modelOverrides": checked}
    if kind == "prompt":
        prompts = value.get("prompts")
        if (
            not isinstance(prompts, Mapping)
            or not prompts
            or not all(
                isinstance(step, str)
                and step
                and isinstance(o, Mapping)
                and o
                and set(o) <= {"system", "prompt"}
                and all(isinstance(t, str) for t in o.values())
                for step, o in prompts.items()
            )
        ):
            raise InvalidEvaluation(
                "a prompt change names prompts: step id -> {system?, prompt?} (strings)", field="change"
            )
        if len(prompts) > MAX_PROMPTS or any(len(t) > MAX_PROMPT_CHARS for o in prompts.values() for t in o.values()):
            raise InvalidEvaluation(
                f"a prompt change names at most {MAX_PROMPTS} steps, each text at most {MAX_PROMPT_CHARS} characters",
                field="change",
            )
        return {"kind": "prompt", "prompts": {step: dict(o) for step, o in prompts.items()}}
    if kind == "input":
        if ("inputs" in value) == ("mergePatch" in value):
            raise InvalidEvaluation(
                "an input change gives either inputs (run id -> input) or mergePatch (applied to every run's input)",
                field="change",
            )
        try:
            canonical_bytes(value.get("inputs", value.get("mergePatch")))
        except NotCanonicalizable as exc:
            raise InvalidEvaluation(f"change: the input has no canonical JSON form: {exc}", field="change") from None
        if "mergePatch" in value:
            if not isinstance(value["mergePatch"], Mapping):
                raise InvalidEvaluation("mergePatch is a JSON object (RFC 7396)", field="change")
            return {"kind": "input", "mergePatch": dict(value["mergePatch"])}
        inputs = value["inputs"]
        if not isinstance(inputs, Mapping) or not inputs:
            raise InvalidEvaluation("inputs is an object: run id -> the input it gets instead", field="change")
        strangers = sorted(set(inputs) - set(run_ids))
        if run_ids and strangers:
            raise InvalidEvaluation(
                f"inputs names run {strangers[0]}, which is not in the dataset version",
                field="change",
                runId=strangers[0],
            )
        return {"kind": "input", "inputs": dict(inputs)}
    name, version = value.get("workflow"), value.get("version")
    if not isinstance(name, str) or not name or (version is not None and (not isinstance(version, str) or not version)):
        raise InvalidEvaluation(
            "a workflow change names workflow (a registered workflow's name) and optionally its version id",
            field="change",
        )
    return {"kind": "workflow", "workflow": name, **({"version": version} if version else {})}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396 JSON merge patch: objects merge key by key, null removes a key, anything else
    replaces."""
    if not isinstance(patch, Mapping):
        return patch
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _original_input(workspace: Workspace, run_id: str) -> Any:
    run = Run.objects.filter(workspace=workspace, run_id=run_id).first()
    first = Event.objects.filter(run=run, sequence=1).values_list("type", "payload").first() if run else None
    if run is None or first is None or first[0] != "RunStarted":
        return None
    started = json.loads(first[1])
    return inline_or_ref(run, started.get("input"), started.get("inputRef"))


def _batch_change(workspace: Workspace, change: Mapping[str, Any], run_ids: Sequence[str]) -> dict[str, Any]:
    """The change as request_batch's arguments."""
    kind = change["kind"]
    if kind == "model":
        return {"model_overrides": change["modelOverrides"]}
    if kind == "prompt":
        return {"prompt_overrides": change["prompts"]}
    if kind == "workflow":
        return {"workflow": change["workflow"], "workflow_version": change.get("version", "")}
    if "inputs" in change:
        return {"inputs": change["inputs"]}
    return {"inputs": {r: merge_patch(_original_input(workspace, r), change["mergePatch"]) for r in run_ids}}


def describe_change(change: Mapping[str, Any]) -> str:
    """One line for the console: what the evaluation changes."""
    kind = change.get("kind")
    if kind == "model":
        return ", ".join(f"{slot}→{t['provider']}/{t['model']}" for slot, t in change.get("modelOverrides", {}).items())
    if kind == "prompt":
        return "; ".join(
            f"{step}: " + ", ".join(f"{part} “{text[:60]}{'…' if len(text) > 60 else ''}”" for part, text in o.items())
            for step, o in change.get("prompts", {}).items()
        )
    if kind == "input":
        if "mergePatch" in change:
            return f"every run's input merge-patched with {json.dumps(change['mergePatch'], ensure_ascii=False)[:120]}"
        return f"the input of {len(change.get('inputs', {}))} run(s) replaced"
    if kind == "workflow":
        return f"workflow {change.get('workflow')}" + (f" at {change['version']}" if change.get("version") else "")
    return str(kind)


@transaction.atomic
def start_evaluation(
    *,
    workspace: Workspace,
    dataset: str,
    change: Any,
    scorers: Any,
    fail_if: str,
    reason: str,
    by: Principal,
    version: int | None = None,
) -> Evaluation:
    who = actor(by, workspace)
    found = get_dataset(workspace, dataset)
    frozen = get_version(found, version)
    if not frozen.members:
        raise InvalidEvaluation(f"dataset {dataset} version {frozen.number} holds no runs", field="dataset")
    run_ids = [m["runId"] for m in frozen.members]
    checked_change = check_change(change, run_ids)
    specs = check_specs(scorers)
    condition = failif.check(fail_if) if fail_if else ""
    reason = written(reason, field="reason", label="reason", error=InvalidEvaluation)
    try:
        batch_id, requests = reexecution.request_batch(
            workspace=workspace,
            run_ids=run_ids,
            reason=reason,
            by=by,
            **_batch_change(workspace, checked_change, run_ids),
        )
    except (InvalidReexecution, RuntimeInvalidReexecution, UnknownWorkflow) as exc:
        details = {k: v for k, v in exc.details.items() if k != "field"}
        raise InvalidEvaluation(f"change: {exc.message}", field="change", **details) from None
    if checked_change["kind"] == "workflow":  # pinned to the version the batch was made for
        checked_change["version"] = requests[0].workflow_version
    policy = policies.covering(
        workspace,
        dataset_id=found.pk,
        change_kind=checked_change["kind"],
        scorer_names=[s["name"] for s in specs],
        requested_by=policies.requester_id(by),
    )
    if policy is not None and budget.day_spent(policy):
        policy = None  # today's budget is spent (or unknown): this one waits for a person like any other
    now = clock.now()
    evaluation = Evaluation.objects.create(
        public_id=f"ev_{secrets.token_hex(8)}",
        workspace=workspace,
        dataset_version=frozen,
        change=checked_change,
        scorers=specs,
        fail_if=condition,
        policy=policy,
        ceiling_usd=policy.ceiling_per_evaluation_usd if policy is not None else None,
        batch_id=batch_id,
        status=Status.RUNNING if policy is not None else Status.PENDING_APPROVAL,
        reason=reason.strip(),
        requested_by=who.name,
        requested_by_user=by if isinstance(by, User) else None,
        created_at=now,
    )
    audit.record(
        actor=who,
        tenant=workspace.tenant,
        workspace=workspace,
        action=Action.EVALUATION_STARTED,
        target=evaluation.public_id,
        reason=evaluation.reason,
        details={
            "dataset": found.name,
            "version": frozen.number,
            "datasetDigest": frozen.digest,
            "change": checked_change,
            "scorers": specs,
            "failIf": condition,
            "batchId": batch_id,
            "runs": len(requests),
            **(
                {"policyId": policy.public_id, "policyDigest": policy.digest}
                if policy is not None
                else {"waitsForApproval": True}
            ),
        },
    )
    if policy is not None:
        reexecution.approve_by_policy(
            workspace=workspace, batch_id=batch_id, policy_id=policy.public_id, policy_digest=policy.digest
        )
    return evaluation


# --- progress ---------------------------------------------------------------------------------


def _evaluation_pk(request: ReexecutionRequest) -> int | None:
    if not request.batch_id or request.mode != ReexecutionRequest.Mode.EVALUATE:
        return None
    return (
        Evaluation.objects.filter(workspace_id=request.workspace_id, batch_id=request.batch_id)
        .values_list("pk", flat=True)
        .first()
    )


def _advance_quietly(pk: int) -> None:
    try:
        advance(pk)
    except Exception:  # after a commit that must stand: the next change, --wait or the worker's sweep advances it
        log.warning("advancing evaluation %s failed", pk, exc_info=True)


def _to_advance() -> set[int]:
    """The evaluations whose requests changed in this thread's connection since its last advance.
    Per connection (so per thread and transaction), not per process: a set shared by the threads
    let one transaction skip an advance that another's, committing earlier, then made before the
    change was committed. A rolled-back transaction drops its callbacks but not what it put here:
    the next commit on the connection advances those too (advancing is idempotent)."""
    connection = transaction.get_connection()
    pending: set[int] | None = getattr(connection, "_evaluations_to_advance", None)
    if pending is None:
        pending = set()
        connection._evaluations_to_advance = pending
    return pending


def on_request_change(request: ReexecutionRequest) -> None:
    """execution.on_change: after a batch request's change commits, advance its evaluation. Not
    for a request the built-in executor just finished: its run is still leased to the executor
    (the scored event would be `fenced`); `after_request` does that one."""
    if request.executor == ReexecutionRequest.Executor.BUILTIN and request.status in (
        RxStatus.RUNNING,
        RxStatus.SUCCEEDED,
        RxStatus.FAILED,
    ):
        return
    if request.status == RxStatus.APPROVED and request.approver_name.startswith("policy:"):
        return  # approved with the evaluation's start, which is already running
    pk = _evaluation_pk(request)
    if pk is None:
        return
    pending = _to_advance()
    pending.add(pk)

    def run() -> None:
        # One advance per evaluation per commit, however many of its requests changed in it: the
        # first callback after the commit advances them all, the others find nothing left.
        while pending:
            _advance_quietly(pending.pop())

    transaction.on_commit(run)


def after_request(request_pk: int) -> None:
    """executor.after_request: the built-in executor is done with the request; score its run."""
    request = ReexecutionRequest.objects.filter(pk=request_pk).first()
    pk = _evaluation_pk(request) if request is not None else None
    if pk is not None:
        advance(pk)


def _context(
    evaluation: Evaluation, run_id: str, output: Any, member: Mapping[str, Any], original: Any, args: Any
) -> ScoreContext:
    return ScoreContext(
        workspace=evaluation.workspace,
        run_id=run_id,
        output=output,
        expected=member.get("expected"),
        original_output=original,
        args=args,
    )


def _spending(evaluation: Evaluation) -> Spending:
    """The evaluation's budget over its scorers' paid calls (scorers.py), kept on `evaluation` in
    memory (advance saves it): a scorer's call is paid like a run's, so past the ceiling, or once
    a call's cost is unknown, it is not made (the guard refuses the runs' next live call the same
    way)."""

    def refusal() -> str | None:
        stop = budget.exhausted(evaluation)
        if stop is None:
            return None
        evaluation.budget_exhausted = True
        if evaluation.budget_reason is None:
            evaluation.budget_reason = stop.as_json()
        return stop.message

    def spent(cost: Decimal | None) -> None:
        if cost is None:
            # Unknown (no price, no usage reported, or failed after the request left): not 0, so
            # the evaluation's ceilings cannot be kept from here on (budget.exhausted).
            evaluation.grader_unpriced_calls += 1
        else:
            evaluation.grader_cost_usd += cost

    return Spending(refusal=refusal, spent=spent)


def _score_all(evaluation: Evaluation, run_id: str, ctx_for: Any) -> dict[str, dict[str, Any]]:
    spending = _spending(evaluation)
    return {spec["name"]: run_scorer(spec, ctx_for(spec["args"]), spending).as_json() for spec in evaluation.scorers}


def _score(evaluation: Evaluation, request: ReexecutionRequest, member: Mapping[str, Any]) -> None:
    original = Run.objects.filter(workspace=evaluation.workspace, run_id=request.original_run_id).first()
    new = Run.objects.filter(workspace=evaluation.workspace, run_id=request.new_run_id).first()
    original_output = _output(original) if original is not None else None
    if new is None:
        evaluation.scores[request.new_run_id] = {"before": {}, "after": {}, "missing": True}
        return
    before = _score_all(
        evaluation,
        request.original_run_id,
        lambda args: _context(evaluation, request.original_run_id, original_output, member, original_output, args),
    )
    after = _score_all(
        evaluation,
        new.run_id,
        lambda args: _context(evaluation, new.run_id, _output(new), member, original_output, args),
    )
    try:
        with transaction.atomic():
            _append_scored(evaluation, request, new, before, after)
    except Fenced:
        # The run's lease changed hands between reading it and appending (a takeover at that very
        # moment): the evaluation is not finished while a run is unscored, and a later advance
        # (the next change, --wait or the worker's sweep) scores it; the grader's spend stays counted.
        log.info("run %s is still leased; its scores wait for the next advance", new.run_id)
        return
    evaluation.scores[new.run_id] = {"before": before, "after": after}


def _output(run: Run) -> Any:
    """A run's output as it was recorded: read back from its artifact when it was too large to keep
    inline (the row then holds only its ref), so a scorer never compares a long output as null."""
    return inline_or_ref(run, run.output, run.output_ref or None)


def _append_scored(
    evaluation: Evaluation, request: ReexecutionRequest, new: Run, before: dict[str, Any], after: dict[str, Any]
) -> None:
    # Written beside the executor that still holds the run's lease (an external one keeps it
    # until it runs out after its terminal append): with its token, which is not a takeover, so
    # the run is scored the moment its request finishes (docs/evaluations.md).
    append(
        workspace=evaluation.workspace,
        run_id=new.run_id,
        fencing_token=rules.holder_token(new, clock.now()),
        events=[
            {
                "type": SCORED,
                "payload": {
                    "evaluationId": evaluation.public_id,
                    "datasetDigest": evaluation.dataset_version.digest,
                    "originalRunId": request.original_run_id,
                    "scores": after,
                    "before": before,
                },
                "idempotencyKey": f"{evaluation.public_id}:{new.run_id}:scored",
            }
        ],
    )


def advance(evaluation_pk: int) -> Evaluation | None:
    """Score what finished; once every request is final, report and judge. Idempotent."""
    with transaction.atomic():
        evaluation = (
            Evaluation.objects.select_for_update(of=("self",))
            .select_related("workspace__tenant", "dataset_version__dataset", "policy")
            .filter(pk=evaluation_pk)
            .first()
        )
        if evaluation is None or evaluation.status in (Status.FINISHED, Status.DENIED, Evaluation.Status.EXPIRED):
            return evaluation
        requests = list(
            ReexecutionRequest.objects.filter(
                workspace_id=evaluation.workspace_id, batch_id=evaluation.batch_id
            ).order_by("original_run_id")
        )
        statuses = {r.status for r in requests}
        now = clock.now()
        if statuses <= {RxStatus.DENIED} or statuses <= {RxStatus.EXPIRED}:
            evaluation.status = Status.DENIED if RxStatus.DENIED in statuses else Status.EXPIRED
            evaluation.finished_at = now
            evaluation.save()
            _audit_finished(evaluation)
            return evaluation
        if evaluation.status == Status.PENDING_APPROVAL and statuses - {RxStatus.PENDING_APPROVAL}:
            evaluation.status = Status.RUNNING
        members = {m["runId"]: m for m in evaluation.dataset_version.members}
        for request in requests:
            if request.status in (RxStatus.SUCCEEDED, RxStatus.FAILED) and request.new_run_id not in evaluation.scores:
                _score(evaluation, request, members.get(request.original_run_id, {}))
        unscored = any(
            r.status in (RxStatus.SUCCEEDED, RxStatus.FAILED) and r.new_run_id not in evaluation.scores
            for r in requests
        )
        if all(r.status in FINAL for r in requests) and not unscored:
            evaluation.report = build_report(evaluation, requests)
            evaluation.verdict = judge(evaluation, evaluation.report)
            evaluation.status, evaluation.finished_at = Status.FINISHED, now
            evaluation.save()
            _audit_finished(evaluation)
        else:
            evaluation.save()
        return evaluation


def advance_finished_batches() -> list[str]:
    """The worker's sweep: advance every unfinished evaluation none of whose requests is still
    waiting or executing (its batch ended, but the hook that scores and judges it at the last
    request's end failed, e.g. a database restart). The ids of those it finished."""
    unfinished = Evaluation.objects.filter(status__in=(Status.PENDING_APPROVAL, Status.RUNNING))
    done = []
    for pk, public_id, workspace_id, batch_id in unfinished.values_list("pk", "public_id", "workspace_id", "batch_id"):
        busy = (
            ReexecutionRequest.objects.filter(workspace_id=workspace_id, batch_id=batch_id)
            .exclude(status__in=FINAL)
            .exists()
        )
        if not busy:
            advanced = advance(pk)
            if advanced is not None and advanced.status not in (Status.PENDING_APPROVAL, Status.RUNNING):
                done.append(public_id)
    return done


def _audit_finished(evaluation: Evaluation) -> None:
    aggregates = (evaluation.report or {}).get("aggregates", {})
    audit.record(
        actor=SCORER_ACTOR,
        tenant=evaluation.workspace.tenant,
        workspace=evaluation.workspace,
        action=Action.EVALUATION_FINISHED,
        target=evaluation.public_id,
        details={
            "status": evaluation.status,
            "verdict": evaluation.verdict,
            "batchId": evaluation.batch_id,
            **({"passRate": aggregates.get("passRate"), "spendUsd": aggregates.get("spendUsd")} if aggregates else {}),
        },
    )


# --- the report -------------------------------------------------------------------------------


def _tokens(usage: Any) -> int:
    if not isinstance(usage, Mapping):
        return 0
    return int(usage.get("inputTokens") or 0) + int(usage.get("outputTokens") or 0)


def _money(value: Any) -> Decimal | None:
    return None if value is None else Decimal(str(value))


def _relative(before: float | Decimal | None, after: float | Decimal | None) -> float | None:
    if before is None or after is None or not before:
        return None
    return round(float(after) / float(before) - 1, 6)


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 6) if values else None


def _ci95(deltas: Sequence[float]) -> list[float] | None:
    """The 95 % interval of the mean of paired differences (normal approximation, 1.96 s/sqrt n);
    None below two runs."""
    n = len(deltas)
    if n < 2:
        return None
    mean = sum(deltas) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in deltas) / (n - 1))
    half = 1.96 * sd / math.sqrt(n)
    return [round(mean - half, 6), round(mean + half, 6)]


def _same(a: Any, b: Any) -> bool:
    try:
        return digest(a) == digest(b)
    except Exception:  # noqa: BLE001
        return False


def _run_row(evaluation: Evaluation, request: ReexecutionRequest) -> dict[str, Any]:
    row: dict[str, Any] = {
        "runId": request.original_run_id,
        "newRunId": request.new_run_id or None,
        "requestId": request.public_id,
        "requestStatus": request.status,
    }
    if request.status not in (RxStatus.SUCCEEDED, RxStatus.FAILED) or not request.new_run_id:
        return {**row, "outcome": "not_run", "passed": False, "scores": {}}
    try:
        report = divergence_report(
            workspace=evaluation.workspace, original_run_id=request.original_run_id, new_run_id=request.new_run_id
        )
    except NotFound:
        return {**row, "outcome": "not_run", "passed": False, "scores": {}}
    before, after = report["original"], report["new"]
    scored = evaluation.scores.get(request.new_run_id, {})
    scores = {
        name: {"before": scored.get("before", {}).get(name), "after": value}
        for name, value in scored.get("after", {}).items()
    }
    kept = before["status"] == after["status"] and _same(before["output"], after["output"])
    unanswered = Event.objects.filter(
        run__workspace=evaluation.workspace, run__run_id=request.new_run_id, type=DIVERGED
    ).count()
    live_tools = sum(
        1
        for step in report["steps"]
        if step["new"] is not None
        for call in step["new"]["toolCalls"]
        if call.get("origin") in (None, "live")
    )
    cost_before, cost_after = _money(before["costUsd"]), _money(after["costUsd"])
    return {
        **row,
        "status": after["status"],
        "outcome": "kept" if kept else "changed",
        "firstDivergence": report["firstDivergence"],
        "divergences": len(report["divergences"]),
        "passed": bool(scores) and all(s["after"]["passed"] for s in scores.values()),
        "passedBefore": bool(scores) and all((s["before"] or {}).get("passed") for s in scores.values()),
        "scores": scores,
        "costUsd": {"before": before["costUsd"], "after": after["costUsd"]},
        "costDeltaUsd": str(cost_after - cost_before) if cost_before is not None and cost_after is not None else None,
        "tokens": {"before": _tokens(before["usage"]), "after": _tokens(after["usage"])},
        "durationMs": {"before": before["durationMs"], "after": after["durationMs"]},
        "liveToolCalls": live_tools,
        "unansweredCalls": unanswered,
    }


def build_report(evaluation: Evaluation, requests: Sequence[ReexecutionRequest]) -> dict[str, Any]:
    runs = [_run_row(evaluation, r) for r in requests]
    ran = [r for r in runs if r["outcome"] != "not_run"]
    n = len(runs)
    after_scores = [s["after"]["value"] for r in ran for s in r["scores"].values()]
    before_scores = [s["before"]["value"] for r in ran for s in r["scores"].values() if s["before"]]
    deltas = [
        s["after"]["value"] - s["before"]["value"] for r in ran for s in r["scores"].values() if s["before"] is not None
    ]

    def total(key: str, side: str) -> float | None:
        values = [r[key][side] for r in ran]
        if not values or any(v is None for v in values):
            return None
        return float(sum(Decimal(str(v)) for v in values))

    cost_before, cost_after = total("costUsd", "before"), total("costUsd", "after")
    pass_rate = round(sum(1 for r in runs if r["passed"]) / n, 6) if n else None
    # The originals of the runs that did not run were never scored: they are not counted as failing
    # before (an incomplete evaluation of passing originals read "before 0 %").
    pass_before = round(sum(1 for r in ran if r.get("passedBefore")) / len(ran), 6) if ran else None
    mean_after, mean_before = _mean(after_scores), _mean(before_scores)
    aggregates = {
        "runs": n,
        "ran": len(ran),
        "passed": sum(1 for r in runs if r["passed"]),
        "passRate": pass_rate,
        "passRateBefore": pass_before,
        "passRateDelta": round(pass_rate - pass_before, 6)
        if pass_rate is not None and pass_before is not None
        else None,
        "meanScore": mean_after,
        "meanScoreBefore": mean_before,
        "meanScoreDelta": _mean(deltas),
        "meanScoreDeltaCi95": _ci95(deltas),
        "changed": sum(1 for r in ran if r["outcome"] == "changed"),
        "changedRate": round(sum(1 for r in ran if r["outcome"] == "changed") / n, 6) if n else None,
        "failed": sum(1 for r in runs if r.get("status") != "completed"),
        "costUsdBefore": cost_before,
        "costUsdAfter": cost_after,
        "costDelta": _relative(cost_before, cost_after),
        "latencyDelta": _relative(total("durationMs", "before"), total("durationMs", "after")),
        "tokensDelta": _relative(total("tokens", "before"), total("tokens", "after")),
        "liveToolCalls": sum(r.get("liveToolCalls", 0) for r in ran),
        "unansweredCalls": sum(r.get("unansweredCalls", 0) for r in ran),
        "graderCostUsd": budget.usd_text(evaluation.grader_cost_usd),
        "spendUsd": budget.usd_text(budget.spend(evaluation)),
        "unpricedCalls": budget.unpriced_calls(evaluation),
        "budgetExhausted": evaluation.budget_exhausted,
    }
    return {"runs": runs, "aggregates": aggregates}


def metrics(aggregates: Mapping[str, Any]) -> dict[str, float | None]:
    """The names `--fail-if` reads (failif.METRICS) from a report's aggregates."""
    return {
        "pass_rate": aggregates.get("passRate"),
        "pass_rate_before": aggregates.get("passRateBefore"),
        "pass_rate_delta": aggregates.get("passRateDelta"),
        "mean_score": aggregates.get("meanScore"),
        "mean_score_delta": aggregates.get("meanScoreDelta"),
        "changed_rate": aggregates.get("changedRate"),
        "changed": aggregates.get("changed"),
        "failed": aggregates.get("failed"),
        "cost_delta": aggregates.get("costDelta"),
        "latency_delta": aggregates.get("latencyDelta"),
        "tokens_delta": aggregates.get("tokensDelta"),
    }


def judge(evaluation: Evaluation, report: Mapping[str, Any]) -> str:
    if evaluation.budget_exhausted or report["aggregates"]["budgetExhausted"]:
        return Verdict.BUDGET_EXHAUSTED
    if any(r["outcome"] == "not_run" for r in report["runs"]):
        return Verdict.INCOMPLETE
    if evaluation.fail_if and failif.evaluate(failif.parse(evaluation.fail_if), metrics(report["aggregates"])):
        return Verdict.FAILED
    return Verdict.PASSED


# --- reads ------------------------------------------------------------------------------------


def get_evaluation(workspace: Workspace, public_id: str) -> Evaluation:
    evaluation = (
        Evaluation.objects.filter(workspace=workspace, public_id=public_id)
        .select_related("dataset_version__dataset", "policy")
        .first()
    )
    if evaluation is None:
        raise NotFound(f"evaluation {public_id} not found", evaluationId=public_id)
    evaluation.workspace = workspace
    return evaluation


def evaluations(
    workspace: Workspace, *, limit: int = 50, after: tuple[datetime, int] | None = None
) -> list[Evaluation]:
    """The newest `limit`, from just after `after` (a page's last row: created_at, pk)."""
    qs = (
        Evaluation.objects.filter(workspace=workspace)
        .select_related("dataset_version__dataset", "policy")
        .order_by("-created_at", "-pk")
    )
    return list(selectors.older_than(qs, after)[:limit])


def evaluation_json(
    evaluation: Evaluation, *, report: bool = True, unpriced_calls: int | None = None
) -> dict[str, Any]:
    """The API's evaluation; `unpriced_calls` when the caller counted them already
    (budget.unpriced_calls_of, for a page of them)."""
    version = evaluation.dataset_version
    out = {
        "id": evaluation.public_id,
        "dataset": version.dataset.name,
        "datasetVersion": version.number,
        "datasetDigest": version.digest,
        "change": evaluation.change,
        "scorers": evaluation.scorers,
        "failIf": evaluation.fail_if or None,
        "policyId": evaluation.policy.public_id if evaluation.policy is not None else None,
        "ceilingUsd": budget.usd_text(evaluation.ceiling_usd) if evaluation.ceiling_usd is not None else None,
        "batchId": evaluation.batch_id,
        "status": evaluation.status,
        "verdict": evaluation.verdict or None,
        "budgetExhausted": evaluation.budget_exhausted,
        "budgetReason": evaluation.budget_reason,
        # Calls of unknown cost so far: while above 0 the spend (the report's spendUsd) is a lower bound.
        "unpricedCalls": budget.unpriced_calls(evaluation) if unpriced_calls is None else unpriced_calls,
        "reason": evaluation.reason,
        "requestedBy": evaluation.requested_by,
        "createdAt": clock.iso(evaluation.created_at),
        "finishedAt": clock.iso(evaluation.finished_at),
    }
    if report:
        out["report"] = evaluation.report
    return out


def junit_xml(evaluation: Evaluation) -> str:
    """The report as JUnit XML for CI: one test case per run (failed when a score failed or the
    run did not run) and one for the gate (failed unless the verdict is `passed`)."""
    report = evaluation.report or {"runs": [], "aggregates": {}}
    runs = report["runs"]
    suite = ElementTree.Element(
        "testsuite",
        name=f"evaluation {evaluation.public_id} of {evaluation.dataset_version.dataset.name}",
        tests=str(len(runs) + 1),
        failures=str(sum(1 for r in runs if not r["passed"]) + (evaluation.verdict != Verdict.PASSED)),
        errors="0",
    )
    classname = f"runledger.{evaluation.dataset_version.dataset.name}"
    for row in runs:
        case = ElementTree.SubElement(suite, "testcase", classname=classname, name=row["runId"])
        if not row["passed"]:
            failing = [
                f"{name}: {s['after']['reason']}" for name, s in row["scores"].items() if not s["after"]["passed"]
            ]
            message = "; ".join(failing) or f"the run did not run ({row['requestStatus']})"
            failure = ElementTree.SubElement(case, "failure", message=message[:1000])
            failure.text = message
    gate = ElementTree.SubElement(suite, "testcase", classname=classname, name="gate")
    if evaluation.verdict != Verdict.PASSED:
        message = f"verdict {evaluation.verdict or evaluation.status}" + (
            f": fail-if {evaluation.fail_if}" if evaluation.verdict == Verdict.FAILED else ""
        )
        ElementTree.SubElement(gate, "failure", message=message).text = message
    return ElementTree.tostring(suite, encoding="unicode", xml_declaration=True)


def execute_here(evaluation: Evaluation) -> Evaluation:
    """Execute the evaluation's approved requests in this process, one after the other, and
    advance it after each (`ledger evaluate --here`, tests, the bench): what the worker does
    from its queue, without one. A request a worker holds already is skipped by its lease."""
    from ..reexecution.executor import run_request

    pks = ReexecutionRequest.objects.filter(
        workspace_id=evaluation.workspace_id, batch_id=evaluation.batch_id, status=RxStatus.APPROVED
    ).values_list("pk", flat=True)
    for pk in sorted(pks):
        run_request(request_pk=pk)  # its after_request hook scores the new run
    return advance(evaluation.pk) or evaluation


def scores_of_request(workspace: Workspace, request: ReexecutionRequest) -> tuple[Evaluation | None, dict[str, Any]]:
    """The evaluation a request belongs to (None outside one) and its new run's scores
    `{name: {before, after}}` once scored: what the divergence and batch pages show."""
    if not request.batch_id:
        return None, {}
    found = (
        Evaluation.objects.filter(workspace=workspace, batch_id=request.batch_id)
        .only("public_id", "scores", "batch_id", "workspace_id")
        .first()
    )
    if found is None:
        return None, {}
    scored = found.scores.get(request.new_run_id) or {}
    return found, {
        name: {"before": scored.get("before", {}).get(name), "after": value}
        for name, value in scored.get("after", {}).items()
    }
