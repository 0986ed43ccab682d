"""The demo's regression evaluations (part of `ledger demo`, docs/evaluations.md), on
`acme/support`:

- ten recorded `support.triage` runs (run_demo_eval_00 … _09) in the dataset `triage-golden`,
  added by carol;
- an evaluation policy bob approved for it (model changes; scorers exact, regex, model_graded);
- two evaluations carol started inside it, executed by the worker's own task body: a model swap
  (gpt-4o-mini -> o4-mini) that keeps every outcome (`passed`, at a higher cost), and a prompt
  change (the `draft` step's system message asks for one short sentence; the scripted model then
  fumbles the two lost-parcel tickets, ledger/demo/workflows.py TERSE) that regresses two of the
  ten runs (`failed`: pass rate 0.8).

Idempotent: each evaluation is recognised by its reason.
"""

from __future__ import annotations

from django.contrib.auth.models import User

from ..evaluation import datasets, evaluations, policies
from ..models import Dataset, Evaluation, EvaluationPolicy, Run, Workspace
from ..runtime.executor import start_run
from .workflows import TERSE

DATASET = "triage-golden"
TICKETS = [
    ("Where is my parcel?", "A-1"),
    ("My order is late.", "B-2"),
    ("Parcel lost, what now?", "C-3"),
    ("Delivered to the wrong door.", "D-4"),
    ("Tracking says shipped, nothing came.", "A-1"),
    ("Late again, second time this month.", "B-2"),
    ("The carrier says it is lost.", "C-3"),
    ("It arrived, thanks, but the box was open.", "D-4"),
    ("When will it ship?", "A-1"),
    ("Is it still delayed?", "B-2"),
]
KEPT = "Swap the triage model to o4-mini: every outcome must hold."
REGRESSED = "Ask the triage model for one short sentence per answer."
CHANGES = (
    (KEPT, {"kind": "model", "modelOverrides": {"default": {"provider": "scripted", "model": "o4-mini"}}}),
    (REGRESSED, {"kind": "prompt", "prompts": {"draft": {"system": f"You answer support tickets. {TERSE}"}}}),
)
SCORERS = ["exact", {"name": "regex", "args": {"pattern": "^Answer for", "field": "reply"}}]


def lay_out(workspace: Workspace) -> None:
    carol, bob = User.objects.get(username="carol"), User.objects.get(username="bob")
    run_ids = []
    for number, (ticket, order) in enumerate(TICKETS):
        run_id = f"run_demo_eval_{number:02d}"
        if not Run.objects.filter(workspace=workspace, run_id=run_id).exists():
            start_run(
                workspace=workspace,
                workflow="support.triage",
                run_id=run_id,
                input={"ticket": ticket, "orderId": order},
            )
        run_ids.append(run_id)
    if not Dataset.objects.filter(workspace=workspace, name=DATASET).exists():
        datasets.add_runs(workspace=workspace, name=DATASET, run_ids=run_ids, by=carol)
    if not EvaluationPolicy.objects.filter(workspace=workspace, dataset__name=DATASET).exists():
        policies.approve_policy(
            workspace=workspace,
            dataset=DATASET,
            change_kinds=["model", "prompt"],
            scorers=["exact", "regex", "model_graded"],
            ceiling_per_evaluation_usd="0.50",
            ceiling_per_day_usd="5",
            ttl_hours=24 * 90,
            note="CI may evaluate model swaps and prompt changes on the golden triage set.",
            by=bob,
        )
    for reason, change in CHANGES:
        if Evaluation.objects.filter(workspace=workspace, reason=reason).exists():
            continue
        made = evaluations.start_evaluation(
            workspace=workspace,
            dataset=DATASET,
            change=change,
            scorers=SCORERS,
            fail_if="pass_rate < 0.95",
            reason=reason,
            by=carol,
        )
        evaluations.execute_here(made)
