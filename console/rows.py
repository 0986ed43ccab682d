"""The rows the console renders in two places: a page and its live push (the WebSocket consumers).

One renderer per row serves the page, its htmx fragment and the push, so a pushed row is the row
a reload shows (`render_event_row` below, templates/console/runs/run_row.html).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

from ledger.canonical import ecma_dumps
from ledger.log.verify import artifact_refs
from ledger.log.vocabulary import MODEL_AND_TOOL_PREFIXES, ORIGINS
from ledger.models import Run, Workspace
from ledger.reads import attention, failure, runlist, selectors
from ledger.reads.attention import Attention
from ledger.reads.failure import Failure

from .format import elapsed, priced, span
from .templatetags.console_format import (
    call_cost,
    count,
    escaped,
    kept_value,
    long_text,
    money,
    shown_data,
    shown_name,
    shown_text,
    timestamp,
)

RUN_ROW_TEMPLATE = "console/runs/run_row.html"


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
        # The stored payload is canonical JSON; decoding kept its key order, so this is it, indented,
        # its numbers written as stored (ECMAScript form: 5e-7, 100000000000000000000), as every
        # read of the log writes them (docs/api.md § Runs and events).
        "pretty": ecma_dumps(payload, option=orjson.OPT_INDENT_2).decode(),
        "artifacts": [
            {"id": ref.removeprefix("artifact://"), "url": artifact_url(workspace, ref.removeprefix("artifact://"))}
            for ref in refs
        ],
    }


def render_event_row(row: dict[str, Any], *, shared: bool = False) -> SafeString:
    """One timeline row as HTML, for the page's rows (`{% event_rows %}`), the rows fragment and
    the WebSocket push. Written out here rather than by a template: a page draws 200 of them, and
    Django's engine took ~0.3 ms a row (a lookup and a filter per value), more than all of the
    page's queries. Every value is escaped as the engine escapes it, and the names and texts go
    through the filters the template used (`shown_name`, `shown_text`, `shown_data`, `timestamp`).
    `shared`: a share link's page, which offers no Copy button."""
    sequence = str(row["sequence"])
    out = []
    if row.get("gap"):
        out.append(
            f'<tr class="gap" data-before="{sequence}"><td colspan="6"><span class="gap-mark" aria-hidden="true">'
            f"⋯</span> {escaped(row['gap'])}</td></tr>\n"
        )
    marks = ""
    if row.get("call"):
        marks = f' data-call="{escaped(kept_value(row["call"]))}"' + (' data-pair="end"' if row.get("pair_end") else "")
    out.append(f'<tr class="event" id="event-{sequence}" data-sequence="{sequence}"{marks}>\n')
    out.append(
        f'  <td class="num"><a href="#event-{sequence}" title="{escaped(row["event_id"])}">{sequence}</a></td>\n'
    )
    out.append(f'  <td class="mono ev-type">{escaped(shown_name(row["type"]))}</td>\n')
    out.append(f'  <td class="mono ev-step">{escaped(shown_name(row["step_path"]))}</td>\n')
    if row.get("offset"):
        at = row["occurred_at"].isoformat()
        moment = (
            f'<time datetime="{escaped(at)}" title="{escaped(row.get("absolute", ""))}">{escaped(row["offset"])}</time>'
        )
    else:
        moment = escaped(timestamp(row["recorded_at"], "ms"))
    out.append(f'  <td class="mono ev-time">{moment}</td>\n')
    origin = row.get("origin")
    badge = f'<span class="origin origin-{escaped(origin)}">{escaped(origin)}</span>' if origin else ""
    out.append(f"  <td>{badge}</td>\n")
    out.append('  <td class="ev-payload">\n')
    summary = f'<span class="ev-summary">{escaped(shown_text(row["summary"]))}</span>' if row.get("summary") else ""
    out.append(f"    {summary}\n    <details><summary>payload</summary>\n")
    copy = (
        ""
        if shared
        else f'<button type="button" class="copy" aria-label="Copy the payload of event {sequence}">Copy</button>'
    )
    out.append(f"      {copy}\n")
    out.append(f'      <pre class="mono json">{escaped(shown_data(row["pretty"]))}</pre>\n    </details>\n    ')
    for a in row.get("artifacts", ()):
        short = escaped(Truncator(a["id"]).chars(20))  # `{{ a.id|truncatechars:20 }}`
        if a.get("url"):
            out.append(f'<a class="artifact mono" href="{escaped(a["url"])}" title="verified download">{short}</a> ')
        else:
            out.append(f'<span class="artifact mono" title="{escaped(a["id"])}">{short}</span> ')
    out.append("\n  </td>\n</tr>\n")
    return mark_safe("".join(out))  # every value in it is escaped above


def render_cost_rows(costs: list[dict[str, Any]]) -> SafeString:
    """The evidence tab's cost entries (serialize.cost's shape), a row each, as its template
    wrote them (200 a page; ~0.4 ms a row in Django's engine)."""
    out = []
    for c in costs:
        model = f"{escaped(shown_name(c['provider']))}/{escaped(shown_name(c['modelId']))}"
        tokens = "".join(
            f'<td class="num">{escaped(count(c[name]))}</td>'
            for name in ("inputTokens", "outputTokens", "cachedInputTokens", "reasoningTokens")
        )
        out.append(
            f'\n      <tr><td class="num">{escaped(c["sequence"])}</td><td class="mono">{model}</td>'
            f'<td class="mono">{escaped(shown_name(c["stepPath"] or ""))}</td>\n        '
            f"{tokens}\n        "
            f"<td>{escaped(call_cost(c['costUsd'], c['unpricedReason']))}</td>"
            f'<td class="mono muted">{escaped(c["priceTableVersion"])}</td></tr>\n    '
        )
    return mark_safe("".join(out))  # every value in it is escaped above


def render_step_rows(steps: list[dict[str, Any]]) -> SafeString:
    """The steps tab's (and a share link's) steps, a row each, as templates/console/run/steps.html
    wrote them (200 a page; ~0.4 ms a row in Django's engine). `steps`: the views' row dicts."""
    out = []
    for s in steps:
        step, shown = s["step"], s["tokens"]
        path, status = escaped(kept_value(s["path"])), escaped(s["status"])
        visit = "" if s["visit"] is None else escaped(s["visit"])
        line = s.get("output_line")
        if line:
            if line == s.get("output_text"):
                output = f'<span class="mono">{escaped(shown_text(line))}</span>'
            else:
                text = long_text(s["output_text"])
                output = f'<details><summary class="mono">{escaped(shown_text(line))}</summary>{text}</details>'
        elif step.output_ref:
            output = f'<span class="mono muted">{escaped(shown_name(step.output_ref))}</span>'
        else:
            output = '<span class="muted">—</span>'
        error = f'<span class="failure">{escaped(shown_text(s["error_line"]))}</span>' if s.get("error_line") else ""
        should = "<strong>yes</strong> (would run)" if s["should_run"] else "no (reused)"
        out.append(
            f'\n      <tr class="step" data-step="{path}">\n'
            f'        <td class="mono">{escaped(shown_name(s["path"]))}</td>\n'
            f'        <td><span class="status status-{status}">{status}</span></td>\n'
            f'        <td class="num">{escaped(count(s["attempts"]))}</td>\n'
            f'        <td class="num">{visit}</td>\n'
            f"        <td>{escaped(span(step))}</td>\n"
            f'        <td class="num">{escaped(count(shown["input"]))}</td>'
            f'<td class="num">{escaped(count(shown["output"]))}</td>\n'
            f'        <td class="num">{escaped(count(shown["cached"]))}</td>'
            f'<td class="num">{escaped(count(shown["reasoning"]))}</td>\n'
            f'        <td>{escaped(money(step.cost_usd))} <span class="muted">{escaped(priced(step))}</span></td>\n'
            f'        <td class="step-output">{output}</td>\n'
            f'        <td class="step-error">{error}</td>\n'
            f'        <td class="should-run">{should}</td>\n'
            "      </tr>\n    "
        )
    return mark_safe("".join(out))  # every value in it is escaped above


def render_step_cost_rows(steps: list[dict[str, Any]]) -> SafeString:
    """The costs tab's (and a share link's) per-step rows, as templates/console/run/costs.html
    wrote them."""
    out = []
    for s in steps:
        shown, step = s["tokens"], s["step"]
        out.append(
            f'\n      <tr><td class="mono">{escaped(shown_name(s["path"]))}</td>'
            f'<td class="num">{escaped(count(shown["input"]))}</td><td class="num">{escaped(count(shown["output"]))}</td>\n'
            f'        <td class="num">{escaped(count(shown["cached"]))}</td>'
            f'<td class="num">{escaped(count(shown["reasoning"]))}</td><td>{escaped(money(step.cost_usd))}</td>'
            f"<td>{escaped(priced(step))}</td></tr>\n    "
        )
    return mark_safe("".join(out))  # every value in it is escaped above


# --- the runs list: one row per run -----------------------------------------------------------


@dataclass(frozen=True)
class RunRow:
    """What one row of the runs list shows, besides the run's own columns.

    `tree`: the row of a run without a parent on the nested list, whose cost and tokens are its
    whole tree's (ledger/reads/runlist.py annotated them); `depth`: how far below such a row a
    nested sub-run is; `hidden_below`: runs of the tree not shown under it (its page lists them)."""

    run: Run
    children: int
    rating: tuple[float, int] | None
    now: datetime
    attention: Attention | None = None
    failure: Failure | None = None
    depth: int = 0
    tree: bool = False
    hidden_below: int = 0

    @property
    def parent(self) -> str:
        return self.run.parent_run_id

    @property
    def cost(self) -> Any:
        return self.run.tree_cost if self.tree else self.run.cost_usd  # type: ignore[attr-defined]

    @property
    def input_tokens(self) -> int:
        return int(self.run.tree_input_tokens if self.tree else self.run.input_tokens)  # type: ignore[attr-defined]

    @property
    def output_tokens(self) -> int:
        return int(self.run.tree_output_tokens if self.tree else self.run.output_tokens)  # type: ignore[attr-defined]

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def below(self) -> int:
        return int(self.run.below) if self.tree else 0  # type: ignore[attr-defined]

    @property
    def priced_calls(self) -> int:
        return int(self.run.tree_priced_calls if self.tree else self.run.priced_calls)  # type: ignore[attr-defined]

    @property
    def unpriced_calls(self) -> int:
        return int(self.run.tree_unpriced_calls if self.tree else self.run.unpriced_calls)  # type: ignore[attr-defined]

    @property
    def error(self) -> str:
        """The failure in a line: the error's name and message (a string error as it is)."""
        error = self.run.error
        if not error:
            return ""
        if isinstance(error, dict):
            name = error.get("name") or error.get("code") or ""
            message = error.get("message") or ""
            return f"{name}: {message}" if name and message else str(name or message or "failed")
        return str(error)

    @property
    def started(self) -> datetime:
        return self.run.started_at or self.run.created_at

    @property
    def duration(self) -> str:
        """As of the page's one moment, so every row of a page is measured alike."""
        return elapsed(self.run.started_at, self.run.finished_at, now=self.now)

    @property
    def partly_priced(self) -> bool:
        return bool(self.unpriced_calls and self.priced_calls)

    @property
    def calls(self) -> int:
        return self.priced_calls + self.unpriced_calls


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


def nested_rows(workspace: Workspace, roots: list[Run], *, limit: int, per_run: int) -> list[RunRow]:
    """Rows for a page of tree roots (annotated with their tree's totals), each followed by up to
    `per_run` runs below it, depth first, oldest first; `limit` sub-runs on the page in all.
    Four queries however long the page is."""
    below = runlist.family_below(roots, limit=limit)
    children: dict[str, list[Run]] = {}
    for r in below:
        children.setdefault(r.parent_run_id, []).append(r)
    shown = [r.run_id for r in roots] + [r.run_id for r in below]
    counts = selectors.children_counts(workspace, shown)
    ratings = selectors.ratings_for([r.pk for r in roots] + [r.pk for r in below])
    needs = attention.for_runs(workspace, [*roots, *below])
    failures = failure.for_runs([*roots, *below])
    now = timezone.now()
    rows: list[RunRow] = []
    for root in roots:
        root.workspace = workspace
        nested: list[RunRow] = []
        seen = {root.pk}
        stack = [(child, 1) for child in reversed(children.get(root.run_id, []))]
        while stack and len(nested) < per_run:
            run, depth = stack.pop()
            if run.pk in seen:
                continue
            seen.add(run.pk)
            run.workspace = workspace
            nested.append(
                RunRow(
                    run,
                    counts.get(run.run_id, 0),
                    ratings.get(run.pk),
                    now,
                    needs.get(run.run_id),
                    failures.get(run.run_id),
                    depth=depth,
                )
            )
            stack.extend((child, depth + 1) for child in reversed(children.get(run.run_id, [])))
        hidden = max(int(root.below) - len(nested), 0)  # type: ignore[attr-defined]
        rows.append(
            RunRow(
                root,
                counts.get(root.run_id, 0),
                ratings.get(root.pk),
                now,
                needs.get(root.run_id),
                failures.get(root.run_id),
                tree=True,
                hidden_below=hidden,
            )
        )
        rows.extend(nested)
    return rows


def render_run_row(workspace: Workspace, run: Run) -> str:
    """One row as the list shows it now: a run without a parent with its tree's totals."""
    if not run.parent_run_id:
        annotated = runlist.with_tree_totals(selectors.runs(workspace).filter(pk=run.pk)).first()
        if annotated is not None:
            row = nested_rows(workspace, [annotated], limit=0, per_run=0)[0]
            return render_to_string(RUN_ROW_TEMPLATE, {"row": row, "workspace": workspace})
    row = run_rows(workspace, [run])[0]
    if run.parent_run_id:
        row = RunRow(row.run, row.children, row.rating, row.now, row.attention, row.failure, depth=1)
    return render_to_string(RUN_ROW_TEMPLATE, {"row": row, "workspace": workspace})
