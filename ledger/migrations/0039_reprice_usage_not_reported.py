"""The cost entries of calls whose recorded usage gave no token count (`{}`: an OpenAI stream without
`include_usage`, traced to the OTLP endpoint), written as priced $0 before such a call became
unpriced: each gets `usage_reported = False`, a NULL cost and no `priced_as`, and what they feed
follows, so that `ledger verify` finds the projections equal to the fold:

- their runs' and steps' priced and unpriced calls (one call moves from one to the other; the
  dollars are unchanged, a $0 less, or NULL when no priced call is left);
- the daily usage cells of their days, counted again from the cost entries (the monthly cells
  follow through their triggers, migration 0018);
- their runs' fold snapshots, which hold the old costs (reads store them again).

Runs imported from Little Workflow keep its rule (a usage object is a count) and are not read.
Only entries with no input and no output tokens can be such calls: the rest are not read either.
"""

import json
from datetime import UTC, datetime, time, timedelta

from django.db import migrations
from django.db.models import Count, F, OuterRef, Q, Subquery, Sum
from django.db.models.functions import TruncDate

from ledger.fold.pricing import LITTLE_WORKFLOW, reports_tokens

TOKENS = ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens")


def _usage(event_type, payload_text):
    """The usage object the fold read for the cost entry of this event (ledger/fold/handlers.py)."""
    payload = json.loads(payload_text) if payload_text else None
    if not isinstance(payload, dict):
        return None
    if event_type == "ModelCallCompleted":  # Little Workflow's legacy model event: usage at the top
        return payload.get("usage")
    response = payload.get("response")
    return response.get("usage") if isinstance(response, dict) else None


def reprice_usage_not_reported(apps, schema_editor):
    CostEntry = apps.get_model("ledger", "CostEntry")
    DailyUsage = apps.get_model("ledger", "DailyUsage")
    Event = apps.get_model("ledger", "Event")
    FoldSnapshot = apps.get_model("ledger", "FoldSnapshot")
    Run = apps.get_model("ledger", "Run")
    Step = apps.get_model("ledger", "Step")

    event = Event.objects.filter(run_id=OuterRef("run_id"), sequence=OuterRef("sequence"))
    candidates = (
        CostEntry.objects.filter(input_tokens=0, output_tokens=0, usage_reported=True)
        .exclude(run__imported_from=LITTLE_WORKFLOW)
        .annotate(
            event_type=Subquery(event.values("type")[:1]),
            payload=Subquery(event.values("payload")[:1]),
            run_workspace=F("run__workspace_id"),
        )
        .values_list("pk", "run_id", "step_path", "cost_usd", "run_workspace", "recorded_at", "event_type", "payload")
        .order_by("pk")
    )
    found, runs = [], set()
    moved_runs, moved_steps, days = {}, {}, {}  # priced calls that become unpriced; days to count again
    for pk, run_id, step_path, cost, workspace_id, recorded_at, event_type, payload in candidates.iterator(2000):
        usage = _usage(event_type, payload)
        if not isinstance(usage, dict) or reports_tokens(usage):
            continue
        found.append(pk)
        runs.add(run_id)
        if cost is not None:
            moved_runs[run_id] = moved_runs.get(run_id, 0) + 1
            if step_path:
                moved_steps[run_id, step_path] = moved_steps.get((run_id, step_path), 0) + 1
            days.setdefault(workspace_id, set()).add(recorded_at.astimezone(UTC).date())
    for start in range(0, len(found), 2000):
        CostEntry.objects.filter(pk__in=found[start : start + 2000]).update(
            usage_reported=False, cost_usd=None, priced_as=""
        )
    # The dollars of such a call were $0 (no tokens): the sums stand, the calls change sides.
    for run_id, moved in moved_runs.items():
        Run.objects.filter(pk=run_id).update(
            priced_calls=F("priced_calls") - moved, unpriced_calls=F("unpriced_calls") + moved
        )
        Run.objects.filter(pk=run_id, priced_calls=0).update(cost_usd=None)
    for (run_id, step_path), moved in moved_steps.items():
        steps = Step.objects.filter(run_id=run_id, step_path=step_path)
        steps.update(priced_calls=F("priced_calls") - moved, unpriced_calls=F("unpriced_calls") + moved)
        steps.filter(priced_calls=0).update(cost_usd=None)
    for workspace_id, wanted in days.items():
        _recount_days(CostEntry, DailyUsage, workspace_id, wanted)
    FoldSnapshot.objects.filter(run_id__in=runs).delete()


def _recount_days(CostEntry, DailyUsage, workspace_id, days):
    """The daily cells of `days` counted again from the cost entries (ledger/log/rollup.py `recount`)."""
    entries = CostEntry.objects.filter(
        run__workspace_id=workspace_id,
        recorded_at__gte=datetime.combine(min(days), time.min, tzinfo=UTC),
        recorded_at__lt=datetime.combine(max(days) + timedelta(days=1), time.min, tzinfo=UTC),
    )
    rows = (
        entries.annotate(day=TruncDate("recorded_at", tzinfo=UTC))
        .values("day", "provider", "model_id", workflow=F("run__workflow_version_id"))
        .annotate(
            **{name: Sum(name) for name in TOKENS},
            cost=Sum("cost_usd"),
            calls=Count("pk"),
            priced=Count("pk", filter=Q(cost_usd__isnull=False)),
        )
        .order_by()
    )
    cells = [
        DailyUsage(
            workspace_id=workspace_id,
            day=r["day"],
            provider=r["provider"],
            model_id=r["model_id"],
            workflow_version_id=r["workflow"],
            **{name: r[name] for name in TOKENS},
            cost_usd=r["cost"] or 0,
            calls=r["calls"],
            priced_calls=r["priced"],
        )
        for r in rows
        if r["day"] in days
    ]
    DailyUsage.objects.filter(workspace_id=workspace_id, day__in=days).delete()
    DailyUsage.objects.bulk_create(sorted(cells, key=lambda c: (c.day, c.provider, c.model_id, c.workflow_version_id)))


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0038_cost_entry_usage_reported"),
    ]

    operations = [
        migrations.RunPython(reprice_usage_not_reported, migrations.RunPython.noop),
    ]
