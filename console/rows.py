"""The rows the console renders in two places: a page and its live push (the WebSocket consumers).

One template per row serves the page, its htmx fragment and the push, so a pushed row is the row
a reload shows (templates/console/run/event_row.html, templates/console/runs/run_row.html).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from ledger.log.verify import artifact_refs
from ledger.log.vocabulary import MODEL_AND_TOOL_PREFIXES, ORIGINS
from ledger.models import Run, Workspace
from ledger.reads import attention, failure, selectors
from ledger.reads.attention import Attention
from ledger.reads.failure import Failure

from .format import elapsed

RUN_ROW_TEMPLATE = "console/runs/run_row.html"
EVENT_ROW_TEMPLATE = "console/run/event_row.html"


# --- a run's timeline: one row per event ------------------------------------------------------


def artifact_url(workspace: Workspace, artifact_id: str) -> str:
    """The verified download: the API re-hashes the bytes before serving them."""
    url = reverse("api-artifact-content", args=[artifact_id])
    return f"{url}?workspace={workspace.tenant.slug}/{workspace.slug}"


def event_origin(event_type: str, payload: Any) -> str | None:
    """The origin badge of a model or tool event (docs/design.md §3): what a re-execution wrote
    (recorded | simulated | live), else "live" (an original run's calls happened live). Other
    events have no origin: None."""
    if not event_type.startswith(MODEL_AND_TOOL_PREFIXES):
        return None
    origin = payload.get("origin") if isinstance(payload, dict) else None
    return origin if origin in ORIGINS else "live"


def event_row(envelope: dict[str, Any], workspace: Workspace) -> dict[str, Any]:
    """What the row template shows of one envelope."""
    payload = envelope["payload"]
    step_path = payload.get("stepPath") if isinstance(payload, dict) else None
    refs = sorted(set(artifact_refs(payload)))
    return {
        "sequence": envelope["sequence"],
        "event_id": envelope["eventId"],
        "type": envelope["type"],
        "step_path": step_path if isinstance(step_path, str) else "",
        "recorded_at": envelope["recordedAt"],
        "origin": event_origin(envelope["type"], payload),
        # The stored payload is canonical JSON; json.loads kept its key order, so this is it, indented.
        "pretty": json.dumps(payload, indent=2, ensure_ascii=False),
        "artifacts": [
            {"id": ref.removeprefix("artifact://"), "url": artifact_url(workspace, ref.removeprefix("artifact://"))}
            for ref in refs
        ],
    }


def render_event_row(row: dict[str, Any]) -> str:
    return render_to_string(EVENT_ROW_TEMPLATE, {"row": row})


# --- the runs list: one row per run -----------------------------------------------------------


@dataclass(frozen=True)
class RunRow:
    """What one row of the runs list shows, besides the run's own columns."""

    run: Run
    children: int
    rating: tuple[float, int] | None
    now: datetime
    attention: Attention | None = None
    failure: Failure | None = None

    @property
    def started(self) -> datetime:
        return self.run.started_at or self.run.created_at

    @property
    def duration(self) -> str:
        """As of the page's one moment, so every row of a page is measured alike."""
        return elapsed(self.run.started_at, self.run.finished_at, now=self.now)

    @property
    def partly_priced(self) -> bool:
        return bool(self.run.unpriced_calls and self.run.priced_calls)

    @property
    def calls(self) -> int:
        return self.run.priced_calls + self.run.unpriced_calls


def run_rows(workspace: Workspace, runs: list[Run]) -> list[RunRow]:
    """Rows for a page of runs: six queries however long the page is."""
    counts = selectors.children_counts(workspace, [r.run_id for r in runs])
    ratings = selectors.ratings_for(r.pk for r in runs)
    needs = attention.for_runs(workspace, runs)
    failures = failure.for_runs(runs)
    now = timezone.now()
    for run in runs:
        run.workspace = workspace  # already loaded with its tenant: the row's link needs both
    return [
        RunRow(
            run, counts.get(run.run_id, 0), ratings.get(run.pk), now, needs.get(run.run_id), failures.get(run.run_id)
        )
        for run in runs
    ]


def render_run_row(workspace: Workspace, run: Run) -> str:
    return render_to_string(RUN_ROW_TEMPLATE, {"row": run_rows(workspace, [run])[0], "workspace": workspace})
