"""Data exports (docs/api.md "Export and interop"): runs, events, cost entries and the audit log as
JSONL or CSV, streamed from keyset-ordered chunks so that memory stays flat however many rows.

A file is a header naming the schema, the rows, and an end marker counting them:

- JSONL: first line `{"schemaVersion": 1, "export": KIND, "format": "jsonl", "exportedAt", "filters"}`,
  one JSON object per row, last line `{"end": {"rows": N}}`.
- CSV: first line `# ` + that header's JSON, then the column names, the rows, and last
  `# {"end": {"rows": N}}`. No data row begins with `#` (the first column is a workspace path
  or an audit id), so a reader skips lines that do. Text cells are written with
  `ledger.interop.csvcells.reversible_cell` (a formula-like cell gets a leading `'`, which `read_cell`
  removes), JSON values as their JSON text, an absent value as an empty cell.

A file without its end marker was cut short. Events are exported whole runs at a time, each run up
to the last sequence it had when the export reached it, with their ids and sequences and the
payload as stored (RFC 8785 text), so `ledger verify --export FILE` recomputes every id and checks
each run's sequences are 1..N from the file alone (ledger/interop/offline.py). `from`/`to` choose runs (and
so events) by the run's creation time, cost entries by when they were recorded, audit entries by
their time.

Each chunk is a fresh keyset query (`pk > last`, or a run's `sequence > last`), never an OFFSET and
never a cursor held open between chunks: a stream served over ASGI resumes in whichever thread is
free, and a reader that stalls holds no transaction open.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import orjson
from django.db import transaction

from .. import audit, clock
from ..audit import Actor
from ..canonical import canonical_json, ecma_dumps
from ..limits import day_in_range
from ..log.envelopes import format_recorded_at
from ..models import ApiKey, AuditEntry, CostEntry, Event, Run, Tenant, Workspace
from ..reads import serialize
from .csvcells import reversible_cell

SCHEMA_VERSION = 1
KINDS = ("runs", "events", "costs", "audit")
FORMATS = ("jsonl", "csv")
# Rows per query. Small enough that a chunk of the largest rows (events of up to 256 kB inline
# payload) stays a few hundred MB at worst; tests shrink it to cross chunk boundaries.
CHUNK_ROWS = 1000
RUN_CHUNK = 200  # runs whose events one query reads

USAGE_COLUMNS = [
    "inputTokens",
    "outputTokens",
    "cachedInputTokens",
    "reasoningTokens",
    "costUsd",
    "pricedCalls",
    "unpricedCalls",
]
COLUMNS: dict[str, list[str]] = {
    "runs": [
        "workspace",
        "runId",
        "workflowVersionId",
        "status",
        "parentRunId",
        "rootRunId",
        "replayOf",
        "createdAt",
        "startedAt",
        "finishedAt",
        "lastSequence",
        "eventCount",
        *USAGE_COLUMNS,
        "input",
        "output",
        "error",
    ],
    "events": ["workspace", "runId", "sequence", "eventId", "type", "occurrenceId", "recordedAt", "payload"],
    "costs": [
        "workspace",
        "runId",
        "sequence",
        "callId",
        "stepPath",
        "provider",
        "modelId",
        "pricedAs",
        "inputTokens",
        "outputTokens",
        "cachedInputTokens",
        "reasoningTokens",
        "costUsd",
        "priceTableVersion",
        "recordedAt",
        "unpricedReason",
    ],
    "audit": ["id", "at", "actor", "action", "tenant", "workspace", "target", "reason", "details"],
}
# Cells holding JSON values (objects, or null) rather than text.
JSON_COLUMNS = {"input", "output", "error", "payload", "details"}


@dataclass(frozen=True)
class Selection:
    """What to export: `workspaces` (None: every workspace, the command line only), or the audit
    log of `tenant` (optionally one of its workspaces); times are [start, end)."""

    kind: str
    workspaces: Sequence[Workspace] | None = None
    tenant: Tenant | None = None
    start: datetime | None = None
    end: datetime | None = None
    run_id: str | None = None
    filters: dict[str, Any] = field(default_factory=dict)  # as asked, for the header and the audit entry


def _path(workspace: Workspace) -> str:
    return f"{workspace.tenant.slug}/{workspace.slug}"


def _when_filter(qs: Any, column: str, selection: Selection) -> Any:
    if selection.start is not None:
        qs = qs.filter(**{f"{column}__gte": selection.start})
    if selection.end is not None:
        qs = qs.filter(**{f"{column}__lt": selection.end})
    return qs


def _runs(selection: Selection) -> Any:
    qs = Run.objects.select_related("workspace__tenant")
    if selection.workspaces is not None:
        qs = qs.filter(workspace__in=list(selection.workspaces))
    if selection.run_id:
        qs = qs.filter(run_id=selection.run_id)
    return _when_filter(qs, "created_at", selection).order_by("pk")


def _chunks_by_pk(qs: Any, size: int) -> Iterator[list[Any]]:
    last = 0
    while True:
        chunk = list(qs.filter(pk__gt=last)[:size])
        if not chunk:
            return
        yield chunk
        last = chunk[-1].pk


def parse_bound(raw: str | None, name: str, *, end: bool) -> datetime | None:
    """A date (whole days, `to` inclusive) or an ISO 8601 instant (UTC unless it says otherwise);
    ValueError naming `name` otherwise."""
    if not raw:
        return None
    try:
        if len(raw) == 10:
            moment = datetime.combine(date.fromisoformat(raw) + timedelta(days=1 if end else 0), time.min, tzinfo=UTC)
        else:
            moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        if not day_in_range(moment.date()):
            raise ValueError
    except (ValueError, OverflowError):
        raise ValueError(f"{name} must be a date YYYY-MM-DD or an ISO 8601 time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


# --- rows ------------------------------------------------------------------------------------


def run_rows(selection: Selection) -> Iterator[dict[str, Any]]:
    for chunk in _chunks_by_pk(_runs(selection), CHUNK_ROWS):
        for run in chunk:
            yield {
                "workspace": _path(run.workspace),
                "runId": run.run_id,
                "workflowVersionId": run.workflow_version_id or None,
                "status": run.status,
                "parentRunId": run.parent_run_id or None,
                "rootRunId": run.root_run_id or None,
                "replayOf": run.replay_of or None,
                "createdAt": serialize.when(run.created_at),
                "startedAt": serialize.when(run.started_at),
                "finishedAt": serialize.when(run.finished_at),
                "lastSequence": run.last_sequence,
                "eventCount": run.event_count,
                **serialize.usage(run),
                "input": run.input,
                "output": run.output,
                "error": run.error,
            }


@dataclass(frozen=True)
class EventRow:
    """An event as exported: its payload kept as the stored canonical text (never re-encoded)."""

    workspace: str
    run_id: str
    sequence: int
    event_id: str
    type: str
    occurrence_id: str | None
    recorded_at: str
    payload_text: str


def _event_query(**where: Any) -> Any:
    return Event.objects.filter(**where).values_list(
        "run_id", "sequence", "event_id", "type", "occurrence_id", "recorded_at", "payload"
    )


def _event_batches(runs: list[Run]) -> Iterator[list[tuple[Any, ...]]]:
    """The events of `runs` (in pk order), a list of at most about CHUNK_ROWS rows at a time, each
    query an index range scan of (run, sequence): runs small enough are read together with
    `run IN (…)`; a larger run alone, by `sequence > last` — never `(run, sequence) > (a, b)`
    spelled as an OR, which PostgreSQL answers by filtering the index from the start each time."""
    small: list[Run] = []
    held = 0
    for run in [*runs, None]:
        if run is None or (small and held + run.last_sequence > CHUNK_ROWS):
            if small:
                yield list(_event_query(run_id__in=[r.pk for r in small]).order_by("run_id", "sequence"))
            small, held = [], 0
        if run is None:
            break
        if run.last_sequence <= CHUNK_ROWS:
            small.append(run)
            held += run.last_sequence
            continue
        after = 0
        while after < run.last_sequence:
            rows = list(
                _event_query(run_id=run.pk, sequence__gt=after, sequence__lte=run.last_sequence).order_by("sequence")[
                    :CHUNK_ROWS
                ]
            )
            if not rows:
                break
            yield rows
            after = rows[-1][1]


def event_rows(selection: Selection) -> Iterator[EventRow]:
    """Whole runs in creation order, each in sequence order up to its last sequence as read when
    its chunk of runs was (events appended meanwhile are left for the next export)."""
    for runs in _chunks_by_pk(_runs(selection), RUN_CHUNK):
        heads = {run.pk: (run.last_sequence, run.run_id, _path(run.workspace)) for run in runs}
        for rows in _event_batches(runs):
            for run_pk, sequence, event_id, type_, occurrence_id, recorded_at, payload in rows:
                last, run_id, workspace = heads[run_pk]
                if sequence <= last:
                    yield EventRow(
                        workspace,
                        run_id,
                        sequence,
                        event_id,
                        type_,
                        occurrence_id,
                        format_recorded_at(recorded_at),
                        payload,
                    )


def cost_rows(selection: Selection) -> Iterator[dict[str, Any]]:
    qs = CostEntry.objects.all()
    if selection.workspaces is not None:
        qs = qs.filter(run__workspace__in=list(selection.workspaces))
    if selection.run_id:
        qs = qs.filter(run__run_id=selection.run_id)
    qs = _when_filter(qs, "recorded_at", selection).select_related("run__workspace__tenant").order_by("pk")
    for chunk in _chunks_by_pk(qs, CHUNK_ROWS):
        for entry in chunk:
            yield {"workspace": _path(entry.run.workspace), "runId": entry.run.run_id, **serialize.cost(entry)}


def audit_rows(selection: Selection) -> Iterator[dict[str, Any]]:
    assert selection.tenant is not None
    after: tuple[datetime, int] | None = None
    while True:
        qs = audit.entries(tenant=selection.tenant, start=selection.start, end=selection.end, after=after)
        if selection.workspaces is not None:
            qs = qs.filter(workspace__in=list(selection.workspaces))
        chunk: list[AuditEntry] = list(qs[:CHUNK_ROWS])
        if not chunk:
            return
        for entry in chunk:
            yield audit.as_dict(entry)
        after = (chunk[-1].at, chunk[-1].pk)


# --- files -----------------------------------------------------------------------------------


def header(selection: Selection, fmt: str) -> dict[str, Any]:
    return {
        "schemaVersion": SCHEMA_VERSION,
        "export": selection.kind,
        "format": fmt,
        "exportedAt": format_recorded_at(clock.now()),
        "filters": selection.filters,
    }


def _json(value: Any) -> bytes:
    return ecma_dumps(value, option=orjson.OPT_NON_STR_KEYS)


def _event_line(row: EventRow) -> bytes:
    # Built around the stored payload text: it is what the id was computed over, byte for byte.
    head = {
        "workspace": row.workspace,
        "eventId": row.event_id,
        "runId": row.run_id,
        "sequence": row.sequence,
        "type": row.type,
    }
    if row.occurrence_id is not None:
        head["occurrenceId"] = row.occurrence_id
    head["recordedAt"] = row.recorded_at
    return _json(head)[:-1] + b',"payload":' + row.payload_text.encode() + b"}\n"


def _event_dict(row: EventRow) -> dict[str, Any]:
    return {
        "workspace": row.workspace,
        "runId": row.run_id,
        "sequence": row.sequence,
        "eventId": row.event_id,
        "type": row.type,
        "occurrenceId": row.occurrence_id,
        "recordedAt": row.recorded_at,
        "payload": row.payload_text,
    }


def _csv_cell(column: str, value: Any) -> str:
    if value is None:
        return ""
    if column == "payload":
        return reversible_cell(value)  # already JSON text
    if column in JSON_COLUMNS:
        return reversible_cell(canonical_json(value))
    if isinstance(value, str):
        return reversible_cell(value)
    if isinstance(value, float):
        return f"{value:.12f}".rstrip("0").rstrip(".") or "0"
    return str(value)


def _rows(selection: Selection) -> Iterator[Any]:
    if selection.kind == "runs":
        return run_rows(selection)
    if selection.kind == "events":
        return event_rows(selection)
    if selection.kind == "costs":
        return cost_rows(selection)
    return audit_rows(selection)


def render(selection: Selection, fmt: str, *, batch_bytes: int = 1 << 16) -> Iterator[bytes]:
    """The export file in pieces of about `batch_bytes`, read chunk by chunk as they are asked for."""
    buffer: list[bytes] = []
    size = 0
    count = 0
    if fmt == "jsonl":
        buffer.append(_json(header(selection, fmt)) + b"\n")
        for row in _rows(selection):
            line = _event_line(row) if isinstance(row, EventRow) else _json(row) + b"\n"
            buffer.append(line)
            size += len(line)
            count += 1
            if size >= batch_bytes:
                yield b"".join(buffer)
                buffer, size = [], 0
        buffer.append(_json({"end": {"rows": count}}) + b"\n")
        yield b"".join(buffer)
        return
    columns = COLUMNS[selection.kind]
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\r\n")
    text.write("# " + json.dumps(header(selection, fmt), ensure_ascii=False, separators=(",", ":")) + "\r\n")
    writer.writerow(columns)
    for row in _rows(selection):
        values = _event_dict(row) if isinstance(row, EventRow) else row
        writer.writerow([_csv_cell(c, values[c]) for c in columns])
        count += 1
        if text.tell() >= batch_bytes:
            yield text.getvalue().encode()
            text.seek(0)
            text.truncate()
    # No comma in the end marker: a CSV reader takes it for a one-cell row (ledger/interop/offline.py).
    text.write("# " + json.dumps({"end": {"rows": count}}, separators=(",", ":")) + "\r\n")
    yield text.getvalue().encode()


def filename(selection: Selection, fmt: str) -> str:
    return f"runledger-{selection.kind}-{clock.now().strftime('%Y%m%dT%H%M%SZ')}.{fmt}"


# --- audit -----------------------------------------------------------------------------------


@transaction.atomic
def record_export(*, selection: Selection, fmt: str, by: Actor | Any | ApiKey) -> None:
    """One `export.downloaded` entry per tenant the export reads, written before the first byte:
    an export that is cut short was still asked for."""
    if selection.tenant is not None:
        tenants = {selection.tenant.pk: (selection.tenant, selection.workspaces)}
    elif selection.workspaces is not None:
        tenants = {}
        for ws in selection.workspaces:
            tenants.setdefault(ws.tenant_id, (ws.tenant, []))[1].append(ws)  # type: ignore[union-attr]
    else:
        tenants = {t.pk: (t, None) for t in Tenant.objects.order_by("pk")}
    for tenant, spaces in tenants.values():
        only = spaces[0] if spaces is not None and len(spaces) == 1 else None
        audit.record(
            actor=by,
            tenant=tenant,
            workspace=only,
            action=audit.Action.EXPORT_DOWNLOADED,
            target=f"export:{selection.kind}",
            details={
                "export": selection.kind,
                "format": fmt,
                "filters": selection.filters,
                "workspaces": None if spaces is None else [_path(w) for w in spaces],
            },
        )
