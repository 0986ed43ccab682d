"""The evidence bundle of a run (docs/design.md §5, first of the replay family): read-only, executes
nothing, costs nothing.

Everything comes from the projections and the log in a number of queries that does not grow with
the run: one per kind of row, plus the integrity checks of `ledger verify`, answered from the run's
log proof and the events after it (ledger/log/proofs.py) or, without a proof that fits, by reading
the log once (shared with the replay plan) and recording the proof.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from django.db import connections
from django.db.models import DateTimeField

from ..fold.pricing import prices_of
from ..log import artifacts as artifact_store
from ..log import proofs
from ..log.envelopes import formatted_in_sql
from ..models import CostEntry, Feedback, Run, Step, ToolCall
from ..reads import attention, reexecutions, selectors, serialize, subruns
from .plan import replay_plan
from .stored_plan import plan_of_checked


def _artifacts(run: Run, outcomes: dict[str, str]) -> list[dict[str, Any]]:
    """Every artifact the run's log references, ours or missing, with whether its bytes re-hash."""
    rows = artifact_store.resolve(run, sorted(outcomes))
    listed = []
    for ref in sorted(outcomes):
        row = rows.get(ref)
        if row is None:
            sha256 = artifact_store.parse_ref(ref)
            listed.append(
                {
                    "artifactId": ref[len(artifact_store.REF_PREFIX) :],
                    "sha256": sha256,
                    "size": None,
                    "contentType": None,
                    "ref": ref,
                    "verified": False,
                }
            )
        else:
            # An imported log's ref keeps its name; artifactId is ours, the one the API serves.
            entry = serialize.artifact(row)
            entry.pop("createdAt")
            listed.append({**entry, "ref": ref, "verified": outcomes[ref] == "ok"})
    return listed


def _integrity(verify_checks: list[dict[str, str]], plan_checks: list[dict[str, str]]) -> dict[str, Any]:
    """`ledger verify`'s checks, then the replay plan's that verify does not make (manifest drift);
    a check both make fails if either says so."""
    merged: dict[str, dict[str, str]] = {c["name"]: c for c in verify_checks}
    for check in plan_checks:
        mine = merged.get(check["name"])
        if mine is None or (mine["status"] == "pass" and check["status"] == "fail"):
            merged[check["name"]] = check
    checks = list(merged.values())
    return {"ok": all(c["status"] == "pass" for c in checks), "checks": checks}


def approvals(run: Run) -> list[dict[str, Any]]:
    """The run's re-execution requests (asked of it, or the one that made it), oldest first, each
    with its decision: who asked and why, who approved or denied with which note, the new run."""
    asked, made = reexecutions.all_around_run(run.workspace, run.run_id)
    if made is not None and all(r.pk != made.pk for r in asked):
        asked.insert(0, made)
    return [
        {
            **reexecutions.as_dict(r),
            "relation": "made_this_run"
            if r.new_run_id == run.run_id and r.original_run_id != run.run_id
            else "of_this_run",
        }
        for r in asked
    ]


def _rows(model: type[Step | ToolCall | CostEntry], run: Run, order: str) -> list[Any]:
    """The run's rows of a projection, in order, as plain objects with the model's attributes
    (what `serialize` reads): the bundle lists every row, and making 40,000 model instances took
    a third of a 100,000-event run's bundle (issue 33). The fields' own converters still apply."""
    rows = model.objects.filter(run=run).order_by(order)
    fields = [f.attname for f in model._meta.concrete_fields]
    if connections[rows.db].vendor != "postgresql":
        return [SimpleNamespace(**row) for row in rows.values(*fields)]
    # Timestamps as the API's text, formatted by PostgreSQL (serialize.when takes it as it is).
    moments = [f.attname for f in model._meta.concrete_fields if isinstance(f, DateTimeField)]
    texts = {f"{name}_text": formatted_in_sql(name) for name in moments}
    plain = [name for name in fields if name not in moments]
    listed = []
    for row in rows.values(*plain, **texts):
        for name in moments:
            row[name] = row.pop(f"{name}_text")
        listed.append(SimpleNamespace(**row))
    return listed


def verdicts(run: Run) -> dict[str, Any]:
    """The bundle's `artifacts`, `integrity` and `replayReady`: what the run's log proof (or one
    reading of the log, which records the proof) says of it, without listing its rows."""
    inspection = proofs.inspect(run)
    if inspection.state is not None:  # from the run's log proof: the plan of the fold of the whole log
        plan: dict[str, Any] | None = plan_of_checked(inspection.state, inspection.artifact_outcomes)
    elif inspection.log:
        plan = replay_plan(inspection.log, artifact_checks=inspection.artifact_outcomes, prices=prices_of(run))
    else:
        plan = None
    verify_checks = [{"name": c.name, "status": c.status, "detail": c.detail} for c in inspection.checks]
    return {
        "artifacts": _artifacts(run, inspection.artifact_outcomes),
        "integrity": _integrity(verify_checks, plan["integrity"]["checks"] if plan else []),
        "replayReady": plan["replayReady"] if plan else {"status": "fail", "missing": ["run:events"]},
    }


def feedback(run: Run) -> list[dict[str, Any]]:
    rows = Feedback.objects.filter(run=run).select_related("author", "api_key").order_by("created_at", "pk")
    return [serialize.feedback(f, run.run_id) for f in rows]


def evidence_bundle(run: Run) -> dict[str, Any]:
    """docs/api.md's evidence: `{run, steps, toolCalls, artifacts, costs, approvals, feedback, subRuns,
    usage, integrity, replayReady}`. `run` must come with `workspace__tenant` selected."""
    workspace = run.workspace
    checked = verdicts(run)
    sub_runs = list(selectors.filtered_runs(workspace, parent_run_id=run.run_id).order_by("created_at", "pk"))
    counts = selectors.children_counts(workspace, [run.run_id, *(r.run_id for r in sub_runs)])
    needs = attention.for_runs(workspace, [run, *sub_runs])
    trees = subruns.tree_usages(workspace, [run, *sub_runs], counts)
    return {
        "run": serialize.run(
            run, children=counts.get(run.run_id, 0), attention=needs.get(run.run_id), tree=trees[run.run_id]
        ),
        "steps": [serialize.step(s) for s in _rows(Step, run, "position")],
        "toolCalls": [serialize.tool_call(c) for c in _rows(ToolCall, run, "position")],
        "artifacts": checked["artifacts"],
        "costs": [serialize.cost(c) for c in _rows(CostEntry, run, "sequence")],
        "approvals": approvals(run),
        "feedback": feedback(run),
        "subRuns": serialize.runs(sub_runs, counts, needs, trees),
        "usage": serialize.usage(run),
        "integrity": checked["integrity"],
        "replayReady": checked["replayReady"],
    }
