"""Scale benchmark: the pages and appends at 10 million events against the same at 10,000.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/runledger_bench .venv/bin/python bench/scale.py
        [--runs 100000] [--repeat 7] [--reload] [--explain [FIGURE]]

Two datasets, each in its own database on the same server, made by the same generator: `big`,
--runs runs (about 100 events each: 10 million events for the default) over three workspaces in
`<db>_scale`, and `small`, 100 runs (about 10,000 events) in one workspace in `<db>_scale_10k`; each
also holds one run of 10,000 events (the probe of evidence and replay plan) in the first workspace.
Run start times spread over 400 days. A dataset is loaded once (COPY straight into the event and
projection tables, the projections from the fold of each run, then VACUUM ANALYZE) and reused on
later runs while its marker row in `bench_scale_dataset` names the loader's version; --reload loads
both again.

Then, in this process, each figure is measured on both databases, alternating, and printed as the
ratio big / small of the median times. Target (issue 12): every ratio <= 1.5x. See bench/README.md.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: import the bench package from the repository root (bench/common.py)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import get_ok, libpq_url, record, require_postgres, setup_django  # noqa: E402

# Bump when the generated data changes: a dataset with another version is loaded again.
LOADER_VERSION = 2
TENANT = "scale"
WORKSPACES = ("scale-a", "scale-b", "scale-c")
SPAN_DAYS = 400  # so that a 1-year usage window does not cover every row
SMALL_RUNS = 100
PROBE_RUN = "run_scale_probe"  # 10,000 events, in both datasets: evidence and replay plan
PROBE_STEPS = 769
PROBE_EVENTS = 2 + PROBE_STEPS * 13  # 9,999: 2 turns a step, RunStarted and RunCompleted
TARGET_RATIO = 1.5
# (provider, modelId); the last is in no price table, so some cost entries are unpriced.
MODELS = (
    ("openai", "gpt-4o-mini"),
    ("anthropic", "claude-sonnet-4-6"),
    ("google", "gemini-2.5-flash"),
    ("openai", "gpt-4o"),
    ("acme", "house-model-1"),
)
WORKFLOWS = 7
CHUNK_RUNS = 500  # runs generated and copied per transaction


# --- the generated runs -------------------------------------------------------------------------


def _step(run: int, s: int, turns: int) -> list[tuple[str, dict[str, Any]]]:
    """One step as a harness records it: scheduled, attempt, `turns` model calls that each ask for
    a tool call, the model's answer, completed: 4 * turns + 5 events."""
    path = f"step{s}"
    provider, model_id = MODELS[(run * 7 + s) % len(MODELS)]
    model = {"provider": provider, "modelId": model_id}
    out: list[tuple[str, dict[str, Any]]] = [
        ("StepScheduled", {"stepPath": path}),
        ("StepAttemptStarted", {"stepPath": path, "attempt": 1}),
    ]
    for t in range(turns + 1):
        prompt = f"{run}/{s}/{t}"
        out.append(
            (
                "harness.model.called",
                {
                    "turn": t,
                    "stepPath": path,
                    "promptHash": "sha256:" + hashlib.sha256(prompt.encode()).hexdigest(),
                    "request": {"messages": [{"role": "user", "content": f"ticket {run}: step {s}, turn {t}"}]},
                },
            )
        )
        usage = {
            "inputTokens": 600 + (run + 31 * s + 7 * t) % 1400,
            "outputTokens": 40 + (run + t) % 400,
            "cachedInputTokens": 200 * (t % 3),
        }
        call_id = f"tc_{s}_{t}"
        response: dict[str, Any] = {"usage": usage}
        if t < turns:
            response["toolCalls"] = [{"callId": call_id, "toolName": "lookup", "args": {"key": f"k{run % 997}"}}]
        else:
            response["text"] = f"answer for ticket {run}, step {s}"
        out.append(
            (
                "harness.model.responded",
                {"turn": t, "callId": f"mc_{s}_{t}", "stepPath": path, "model": model, "response": response},
            )
        )
        if t < turns:
            out.append(
                (
                    "harness.tool_call.started",
                    {
                        "callId": call_id,
                        "toolName": "lookup",
                        "turn": t,
                        "stepPath": path,
                        "caller": "model",
                        "args": {"key": f"k{run % 997}"},
                    },
                )
            )
            out.append(
                (
                    "harness.tool_call.succeeded",
                    {
                        "callId": call_id,
                        "stepPath": path,
                        "durationMs": 3 + (run + s) % 40,
                        "result": {"value": f"v{(run * s) % 1009}"},
                    },
                )
            )
    out.append(("StepCompleted", {"stepPath": path, "attempt": 1, "output": {"answer": f"a{run}.{s}"}}))
    return out


def run_events(run: int, steps: int, turns: int, *, failed: bool) -> list[tuple[str, dict[str, Any]]]:
    """A whole run: RunStarted, its steps, RunCompleted (or RunFailed)."""
    events = [
        (
            "RunStarted",
            {
                "workflowVersionId": f"wfver_scale_{run % WORKFLOWS}",
                "label": f"ticket {run}",
                "input": {"ticket": run, "priority": ("low", "normal", "high")[run % 3]},
            },
        )
    ]
    for s in range(steps):
        events += _step(run, s, turns)
    if failed:
        events.append(("RunFailed", {"error": {"message": f"ticket {run}: the tool gave up"}}))
    else:
        events.append(("RunCompleted", {"output": {"ticket": run, "resolved": True}}))
    return events


@dataclass(frozen=True)
class PlannedRun:
    index: int
    run_id: str
    workspace: int  # index into WORKSPACES
    started: datetime
    steps: int
    turns: int
    failed: bool


def planned_runs(count: int, end: datetime, workspaces: int) -> Iterator[PlannedRun]:
    """`count` runs oldest first, their starts spread evenly over SPAN_DAYS before `end`, taking turns
    over the first `workspaces` workspaces, then the probe: 3 + 0..9 steps of 1..3 tool-calling
    turns, about 100 events a run on average."""
    span = timedelta(days=SPAN_DAYS).total_seconds()
    for i in range(count):
        started = end - timedelta(seconds=span * (count - i) / count)
        yield PlannedRun(
            i, f"run_s{i:07d}", i % workspaces, started, 3 + i % 10, 1 + (i // 10) % 3, failed=i % 20 == 19
        )
    yield PlannedRun(count, PROBE_RUN, 0, end - timedelta(days=3), PROBE_STEPS, 2, failed=False)


# --- loading ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dataset:
    name: str
    url: str
    runs: int
    workspaces: int  # how many of WORKSPACES share the runs

    @property
    def database(self) -> str:
        return self.url.rpartition("/")[2]


@dataclass(frozen=True)
class Marker:
    version: int
    runs: int
    events: int
    end: datetime
    load_seconds: float


def ensure_database(dataset: Dataset) -> None:
    import psycopg

    base = libpq_url(dataset.url).rpartition("/")[0]
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [dataset.database]).fetchone():
            conn.execute(f'CREATE DATABASE "{dataset.database}"')


def use(dataset: Dataset) -> None:
    """Point Django's default connection (and so every product function) at `dataset`'s database.

    The process-local caches keyed by primary keys (folded states, content types) are emptied:
    the same key names another row in the other database.
    """
    from django.contrib.contenttypes.models import ContentType
    from django.db import connection

    from ledger.log.states import STATES

    if connection.settings_dict["NAME"] != dataset.database:
        connection.close()
        connection.settings_dict["NAME"] = dataset.database
    STATES.clear()
    ContentType.objects.clear_cache()


def read_marker() -> Marker | None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass('bench_scale_dataset') IS NOT NULL")
        if not cur.fetchone()[0]:
            return None
        cur.execute("SELECT version, runs, events, end_at, load_seconds FROM bench_scale_dataset")
        row = cur.fetchone()
    return Marker(*row) if row else None


def load(dataset: Dataset, *, reload: bool) -> Marker:
    """The dataset's marker, after loading it unless it is already there at this loader's version."""
    from django.core.management import call_command

    ensure_database(dataset)
    use(dataset)
    call_command("migrate", verbosity=0, interactive=False)
    marker = read_marker()
    if marker and marker.version == LOADER_VERSION and marker.runs == dataset.runs and not reload:
        return marker
    _empty(dataset)  # whatever is there (an older version, a load cut short) goes
    began = time.monotonic()
    end = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    print(f"loading {dataset.name}: {dataset.runs:,} runs + the probe into {dataset.database} ...", flush=True)
    events = _copy_runs(dataset, end)
    _analyze(dataset)  # before the rollup's count, whose plan needs the tables' statistics
    _count_daily_usage(end)
    _analyze(dataset)
    marker = Marker(LOADER_VERSION, dataset.runs, events, end, time.monotonic() - began)
    _write_marker(dataset, marker)
    print(f"  {dataset.name}: {events:,} events loaded in {marker.load_seconds:.0f} s", flush=True)
    return marker


def _empty(dataset: Dataset) -> None:
    """Drop the dataset's database and create it again, migrated: the loader writes into empty tables."""
    import psycopg
    from django.core.management import call_command
    from django.db import connection

    connection.close()
    base = libpq_url(dataset.url).rpartition("/")[0]
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dataset.database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{dataset.database}"')
    call_command("migrate", verbosity=0, interactive=False)


def _count_daily_usage(end: datetime) -> None:
    """The daily usage rollup of the copied cost entries (an append keeps it; COPY does not)."""
    from ledger.log import rollup
    from ledger.models import Workspace

    days = {end.date() - timedelta(days=d) for d in range(SPAN_DAYS + 2)}
    for workspace in Workspace.objects.filter(tenant__slug=TENANT):
        rollup.recount(workspace.pk, days)


def _write_marker(dataset: Dataset, marker: Marker) -> None:
    import psycopg

    with psycopg.connect(libpq_url(dataset.url), autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_scale_dataset (version int, runs int, events bigint, "
            "end_at timestamptz, load_seconds float8)"
        )
        conn.execute("DELETE FROM bench_scale_dataset")
        conn.execute(
            "INSERT INTO bench_scale_dataset VALUES (%s, %s, %s, %s, %s)",
            [marker.version, marker.runs, marker.events, marker.end, marker.load_seconds],
        )


def _analyze(dataset: Dataset) -> None:
    import psycopg

    with psycopg.connect(libpq_url(dataset.url), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def _copy_runs(dataset: Dataset, end: datetime) -> int:
    """COPY every planned run's events and projection rows, CHUNK_RUNS runs per transaction."""
    import psycopg

    from ledger.tenancy.services import bootstrap

    workspaces = [bootstrap(tenant=TENANT, workspace=slug) for slug in WORKSPACES]
    total = 0
    began = time.monotonic()
    with psycopg.connect(libpq_url(dataset.url)) as conn:
        # Trusted rows of our own making: no per-row foreign-key trigger (the loader writes the
        # runs before their events); the insert-only guards only watch UPDATE and DELETE anyway.
        conn.execute("SET session_replication_role = replica")
        first_pk = _reserve_run_ids(conn, dataset.runs + 1)
        chunk: list[PlannedRun] = []
        for planned in planned_runs(dataset.runs, end, dataset.workspaces):
            chunk.append(planned)
            if len(chunk) == CHUNK_RUNS or planned.run_id == PROBE_RUN:
                total += _copy_chunk(conn, chunk, first_pk, workspaces)
                conn.commit()
                chunk = []
                done = planned.index + 1
                if done % 10_000 < CHUNK_RUNS:
                    rate = total / (time.monotonic() - began)
                    print(f"  {done:,} runs, {total:,} events ({rate:,.0f} events/s)", flush=True)
    return total


def _reserve_run_ids(conn: Any, count: int) -> int:
    """The first of `count` ledger_run ids taken from its sequence for the loader's explicit ids."""
    seq = conn.execute("SELECT pg_get_serial_sequence('ledger_run', 'id')").fetchone()[0]
    first = conn.execute("SELECT nextval(%s)", [seq]).fetchone()[0]
    conn.execute("SELECT setval(%s, %s)", [seq, first + count])
    return int(first)


def _copy_chunk(conn: Any, chunk: list[PlannedRun], first_pk: int, workspaces: list[Any]) -> int:
    from ledger.canonical import canonical_bytes, event_id_for_canonical
    from ledger.fold import fold
    from ledger.fold.pricing import prices_for
    from ledger.log.envelopes import format_recorded_at
    from ledger.log.projection import cost_fields, payload_bytes_of, run_fields, step_fields, tool_fields
    from ledger.models import CostEntry, Event, Run, Step, ToolCall

    prices = prices_for(workspaces[0])
    rows: dict[type, list[dict[str, Any]]] = {Run: [], Event: [], Step: [], ToolCall: [], CostEntry: []}
    for planned in chunk:
        pk = first_pk + planned.index
        log = []
        for sequence, (type_, payload) in enumerate(
            run_events(planned.index, planned.steps, planned.turns, failed=planned.failed), 1
        ):
            # About 1.5 s between events; milliseconds, as the append path stores them.
            at = planned.started + timedelta(milliseconds=1500 * sequence)
            text = canonical_bytes(payload)
            eid = event_id_for_canonical(run_id=planned.run_id, sequence=sequence, type=type_, payload_canonical=text)
            rows[Event].append(
                {
                    "run_id": pk,
                    "sequence": sequence,
                    "event_id": eid,
                    "type": type_,
                    "recorded_at": at,
                    "payload": text.decode(),
                }
            )
            log.append(
                {
                    "eventId": eid,
                    "runId": planned.run_id,
                    "sequence": sequence,
                    "type": type_,
                    "recordedAt": format_recorded_at(at),
                    "payload": payload,
                }
            )
        state = fold(log, prices=prices, run_id=planned.run_id)
        rows[Run].append(
            {
                "id": pk,
                "workspace_id": workspaces[planned.workspace].pk,
                "run_id": planned.run_id,
                "created_at": planned.started,
                "root_run_id": "",
                "lease_owner": "",
                "lease_expires_at": None,
                "fencing_token": 0,
                "pruning": False,
                "imported_from": "",
                "started_by": "",
                **run_fields(state),
                # Kept on the head by the write path, not by the fold (LEDGER_MAX_BYTES_PER_RUN).
                "payload_bytes": payload_bytes_of(log),
            }
        )
        rows[Step] += [{"run_id": pk, **step_fields(state, path, i)} for i, path in enumerate(state.steps)]
        rows[ToolCall] += [{"run_id": pk, **tool_fields(state, c, i)} for i, c in enumerate(state.tool_calls)]
        recorded_at = {e["sequence"]: e["recordedAt"] for e in log}
        rows[CostEntry] += [
            {"run_id": pk, **cost_fields(state, i, recorded_at)} for i in range(len(state.cost_entries))
        ]
    with conn.cursor() as cur:
        for model, dicts in rows.items():
            _copy(cur, model, dicts)
    return len(rows[Event])


def _copy(cur: Any, model: Any, dicts: list[dict[str, Any]]) -> None:
    from django.db import models
    from psycopg.types.json import Jsonb

    if not dicts:
        return
    names = list(dicts[0])
    fields = [model._meta.get_field(name) for name in names]
    json_at = [i for i, f in enumerate(fields) if isinstance(f, models.JSONField)]
    columns = ", ".join(f'"{f.column}"' for f in fields)
    with cur.copy(f"COPY {model._meta.db_table} ({columns}) FROM STDIN") as copy:
        for d in dicts:
            row = [d[name] for name in names]
            for i in json_at:
                if row[i] is not None:
                    row[i] = Jsonb(row[i])
            copy.write_row(row)


# --- measuring ----------------------------------------------------------------------------------


@dataclass
class Figure:
    name: str
    base: str  # the dataset the ratio is to
    other: str
    samples: dict[str, list[float]]  # dataset name -> seconds
    queries: dict[str, int]

    def median(self, dataset: str) -> float:
        return statistics.median(self.samples[dataset])

    @property
    def ratio(self) -> float:
        return self.median(self.other) / self.median(self.base)


@dataclass
class Probes:
    """What one dataset's figures are measured on, found once per dataset."""

    workspace: Any
    client: Any
    typical: Any  # a run of 172 events (10 steps of 3 tool-calling turns), the newest such in scale-a
    probe: Any  # the 10,000-event run
    deep_cursor: str  # the runs list's cursor of the last full page of scale-a
    end: date  # the last day of the dataset
    appended: list[str]  # runs the append figures wrote, deleted at the end


def probes_for(dataset: Dataset, marker: Marker) -> Probes:
    from django.contrib.auth.models import User
    from django.test import Client

    from console.pages import runs as runs_page
    from console.pages.filters import page_cursor
    from ledger.models import Membership, Run, Workspace
    from ledger.tenancy.services import create_user

    workspace = Workspace.objects.select_related("tenant").get(tenant__slug=TENANT, slug=WORKSPACES[0])
    username = "scale-viewer"
    if not Membership.objects.filter(user__username=username, tenant=workspace.tenant).exists():
        create_user(username=username, tenant=TENANT, role="viewer", password=secrets.token_urlsafe(12))
    client = Client()
    client.force_login(User.objects.get(username=username))
    typical = max(
        r.index
        for r in planned_runs(dataset.runs, marker.end, dataset.workspaces)
        if r.workspace == 0 and (r.steps, r.turns) == (10, 3)
    )
    # The cursor of the last full page: 99.8% of the way down the big workspace's runs, half way
    # down the small one's, and 50 rows shown from both.
    runs = Run.objects.filter(workspace=workspace).order_by("-created_at", "-pk")
    deep = runs[runs.count() - runs_page.PAGE_SIZE - 1]
    return Probes(
        workspace=workspace,
        client=client,
        typical=Run.objects.select_related("workspace__tenant").get(workspace=workspace, run_id=f"run_s{typical:07d}"),
        probe=Run.objects.select_related("workspace__tenant").get(workspace=workspace, run_id=PROBE_RUN),
        deep_cursor=page_cursor(deep.created_at, deep.pk, kind=runs_page.CURSOR_KIND, scope=workspace),
        end=marker.end.date() - timedelta(days=1),
        appended=[],
    )


def _append(p: Probes, *, per_call: int, events: int) -> Callable[[], Any]:
    """A new run in scale-a: `events` events of a generated run, `per_call` per the log's append call."""
    from ledger.log import append

    body = [
        {"type": t, "payload": payload}
        for t, payload in run_events(10**6, steps=events // 13 + 1, turns=2, failed=False)
    ][:events]

    def go() -> None:
        run_id = f"run_scale_append_{len(p.appended)}_{os.getpid()}_{time.monotonic_ns()}"
        p.appended.append(run_id)
        for start in range(0, len(body), per_call):
            append(workspace=p.workspace, run_id=run_id, events=body[start : start + per_call])

    return go


PAGES: dict[str, Callable[[Probes], Callable[[], Any]]] = {
    "append, single (50 events, 1 per call)": lambda p: _append(p, per_call=1, events=50),
    "append, batched (5,000 events, 500 per call)": lambda p: _append(p, per_call=500, events=5000),
    "run page (172-event run)": lambda p: get_ok(p.client, _run_url(p, p.typical)),
    "run page (10,000-event run)": lambda p: get_ok(p.client, _run_url(p, p.probe)),
    "runs list, first page": lambda p: get_ok(p.client, _ws_url(p)),
    "runs list, last full page (cursor)": lambda p: get_ok(p.client, _ws_url(p) + f"?cursor={p.deep_cursor}"),
    "usage report, 30 days": lambda p: get_ok(p.client, _usage_url(p, 30)),
    "usage report, 1 year": lambda p: get_ok(p.client, _usage_url(p, 365)),
    "usage report data, 1 year (ledger.reads.usage.report)": lambda p: _usage_data(p, 365),
    "evidence bundle (10,000-event run)": lambda p: _evidence(p.probe),
    "replay plan (10,000-event run)": lambda p: _replay_plan(p.probe),
    "ledger verify (172-event run)": lambda p: _verify(p.typical),
}


def _ws_url(p: Probes) -> str:
    return f"/w/{p.workspace.tenant.slug}/{p.workspace.slug}/"


def _run_url(p: Probes, run: Any) -> str:
    return f"{_ws_url(p)}runs/{run.run_id}/"


def _usage_url(p: Probes, days: int) -> str:
    return f"{_ws_url(p)}usage/?from={p.end - timedelta(days=days - 1)}&to={p.end}"


def _usage_data(p: Probes, days: int) -> Callable[[], Any]:
    from ledger.reads.usage import report

    return lambda: report(start=p.end - timedelta(days=days - 1), end=p.end, workspace=p.workspace)


def _usage_from_cost_entries(p: Probes, days: int) -> Callable[[], Any]:
    """What the report read before the daily rollup: the cost entries, grouped by day and model."""
    from django.db.models import Count, Q, Sum
    from django.db.models.functions import TruncDate

    from ledger.models import CostEntry

    since = datetime.combine(p.end - timedelta(days=days - 1), datetime.min.time(), tzinfo=UTC)
    until = datetime.combine(p.end + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
    entries = CostEntry.objects.filter(run__workspace=p.workspace, recorded_at__gte=since, recorded_at__lt=until)
    sums = {name: Sum(name) for name in ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens")}
    return lambda: list(
        entries.annotate(day=TruncDate("recorded_at", tzinfo=UTC))
        .values("day", "provider", "model_id")
        .annotate(**sums, cost=Sum("cost_usd"), calls=Count("pk"), priced=Count("pk", filter=Q(cost_usd__isnull=False)))
    )


def _usage_by_day(p: Probes, days: int) -> Callable[[], Any]:
    """A year's report data by day: what the report read before its periods (the daily rollup)."""
    from ledger.reads.usage import report

    return lambda: report(start=p.end - timedelta(days=days - 1), end=p.end, granularity="day", workspace=p.workspace)


def _usage_mid_month(p: Probes) -> Callable[[], Any]:
    """A year's report data ending on the 15th: its first and last months only partly in the range,
    read from the daily rollup beside the whole months (the figures' window is whole months when the
    dataset ends on a month's last day)."""
    from ledger.reads.usage import report

    end = p.end.replace(day=15)
    return lambda: report(start=end - timedelta(days=364), end=end, workspace=p.workspace)


def rollup_gain(p: Probes, repeat: int) -> dict[str, float]:
    """Median seconds of a year's report data: by month from the rollups (what the page reads), the
    same ending mid-month, by day from the daily rollup, and by day from the cost entries."""
    from bench.common import median_seconds

    reads = {
        "months": _usage_data(p, 365),
        "mid-month": _usage_mid_month(p),
        "days": _usage_by_day(p, 365),
        "cost entries": _usage_from_cost_entries(p, 365),
    }
    return {name: median_seconds(fn, repeat, warmup=1) for name, fn in reads.items()}


def _evidence(run: Any) -> Callable[[], Any]:
    from ledger.replay.evidence import evidence_bundle

    return lambda: evidence_bundle(run)


def _replay_plan(run: Any) -> Callable[[], Any]:
    from ledger.replay.stored_plan import replay_plan_for

    return lambda: replay_plan_for(run)


def _verify(run: Any) -> Callable[[], Any]:
    from ledger.log.verify import verify_run

    def go() -> None:
        failed = [c for c in verify_run(run) if c.status != "pass"]
        if failed:
            raise SystemExit(f"ledger verify {run.run_id}: {failed}")

    return go


def measure(base: Dataset, other: Dataset, probes: dict[str, Probes], repeat: int, names: list[str]) -> list[Figure]:
    """Each figure on both datasets in two alternating rounds (base, other, base, other), each round
    a warm-up call and then half the samples: a change in the machine's load hits both alike."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    figures = []
    for name in names:
        figure = Figure(name, base.name, other.name, {base.name: [], other.name: []}, {})
        for _ in range(2):
            for dataset in (base, other):
                use(dataset)
                fn = PAGES[name](probes[dataset.name])
                with CaptureQueriesContext(connection) as captured:
                    fn()
                figure.queries[dataset.name] = len(captured)
                for _ in range((repeat + 1) // 2):
                    start = time.perf_counter()
                    fn()
                    figure.samples[dataset.name].append(time.perf_counter() - start)
        figures.append(figure)
        print(
            f"  {name:<50} {figure.median(base.name) * 1000:9.2f} {figure.median(other.name) * 1000:9.2f} ms "
            f"{figure.ratio:6.2f}x",
            flush=True,
        )
    return figures


def explain(name: str, p: Probes) -> None:
    """EXPLAIN ANALYZE of every SELECT the figure's call runs, on the current dataset."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    fn = PAGES[name](p)
    fn()
    with CaptureQueriesContext(connection) as captured:
        fn()
    print(f"\n=== EXPLAIN ANALYZE: {name} ({len(captured)} queries) ===")
    with connection.cursor() as cur:
        for query in captured.captured_queries:
            sql = query["sql"]
            if not sql.lstrip().upper().startswith("SELECT"):
                continue
            cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
            plan = [row[0] for row in cur.fetchall()]
            total = next((line for line in plan if line.startswith("Execution Time")), "")
            print(f"-- {total}: {sql[:160]}")
            if float(total.split()[2]) >= 1.0:
                print("\n".join("   " + line for line in plan))


def cleanup_appended(datasets: list[Dataset], probes: dict[str, Probes]) -> None:
    """Delete the runs the append figures wrote, so that each dataset stays as loaded."""
    from bench.common import cleanup

    for dataset in datasets:
        if dataset.name in probes:
            use(dataset)
            cleanup(probes[dataset.name].workspace, probes[dataset.name].appended, keep_workspace=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/scale.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000, help="runs of the big dataset (default 100000)")
    parser.add_argument("--repeat", type=int, default=7, help="timed calls per figure and dataset (default 7)")
    parser.add_argument("--reload", action="store_true", help="load both datasets again")
    parser.add_argument(
        "--explain",
        nargs="?",
        const="*",
        metavar="FIGURE",
        help="EXPLAIN ANALYZE the queries of every figure (or those whose name contains FIGURE) on the big dataset",
    )
    args = parser.parse_args(argv)
    url = require_postgres("bench/scale.py")
    began = time.monotonic()
    setup_django(production=True)

    small = Dataset("small", f"{url}_scale_10k", SMALL_RUNS, workspaces=1)
    mid = Dataset("mid", f"{url}_scale_1m", args.runs // 10, workspaces=len(WORKSPACES))
    big = Dataset("big", f"{url}_scale", args.runs, workspaces=len(WORKSPACES))
    markers = {d.name: load(d, reload=args.reload) for d in (small, mid, big)}
    probes = {}
    for dataset in (small, mid, big):
        use(dataset)
        probes[dataset.name] = probes_for(dataset, markers[dataset.name])
    print(f"\nload average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; median of {args.repeat}")
    for d in (small, mid, big):
        m = markers[d.name]
        print(
            f"{d.name:>5}: {m.runs:,} runs + the probe in {d.workspaces} workspace(s), {m.events:,} events, in "
            f"{d.database} (loaded in {m.load_seconds:.0f} s, ending {m.end.date()})"
        )
    print(f"\n  {'figure':<50} {'small':>9} {'big':>9}    ratio")
    usage_pages = [name for name in PAGES if name.startswith("usage")]
    try:
        figures = measure(small, big, probes, args.repeat, list(PAGES))
        print(f"\n  {'usage: every day of the window has calls in both':<50} {'mid':>9} {'big':>9}    ratio")
        saturated = measure(mid, big, probes, args.repeat, usage_pages)
        if args.explain:
            use(big)
            for name in PAGES:
                if args.explain == "*" or args.explain in name:
                    explain(name, probes["big"])
        use(big)
        gain = rollup_gain(probes["big"], args.repeat)
    finally:
        cleanup_appended([small, mid, big], probes)
    print_table(figures, markers)
    print_table(saturated, markers)
    ms = {name: seconds * 1000 for name, seconds in gain.items()}
    print(
        f"\nA year's usage report data at {markers['big'].events:,} events: {ms['months']:.1f} ms by month from "
        f"the rollups (the page's read), {ms['mid-month']:.1f} ms for a year ending on the 15th (its partial months "
        f"from the daily rollup), {ms['days']:.1f} ms by day from the daily rollup, {ms['cost entries']:.1f} ms by "
        f"day from the cost entries (before the rollups)"
    )
    record(
        "usage report data, 1 year, 10M events: daily rollup / cost entries",
        value=ms["days"],
        unit="ms",
        baseline=ms["cost entries"],
        ratio=ms["days"] / ms["cost entries"],
        target="(what the rollup saves)",
        met=None,
    )
    record(
        "usage report data, 1 year, 10M events: by month (monthly rollup) / by day (daily rollup)",
        value=ms["months"],
        unit="ms",
        baseline=ms["days"],
        ratio=ms["months"] / ms["days"],
        target="(what the periods save)",
        met=None,
    )
    print(f"\ntotal {time.monotonic() - began:.0f} s")
    return 0


def print_table(figures: list[Figure], markers: dict[str, Marker]) -> None:
    def size(dataset: str) -> str:  # without the probe's events: the 10k, 1M and 10M of the names
        events = markers[dataset].events - PROBE_EVENTS
        return f"{events / 1e6:.0f}M" if events >= 950_000 else f"{events / 1e3:.0f}k"

    base, other = size(figures[0].base), size(figures[0].other)
    print(f"\n| figure | {base} events, ms | {other} events, ms | ratio | queries | target <= {TARGET_RATIO}x |")
    print("|---|---:|---:|---:|---:|---|")
    for f in figures:
        met = f.ratio <= TARGET_RATIO
        queries = f"{f.queries[f.base]}" + (
            "" if f.queries[f.base] == f.queries[f.other] else f" / {f.queries[f.other]}"
        )
        print(
            f"| {f.name} | {f.median(f.base) * 1000:.2f} | {f.median(f.other) * 1000:.2f} | {f.ratio:.2f}x | "
            f"{queries} | {'met' if met else 'NOT MET'} |"
        )
        record(
            f"{f.name} ({other} vs {base} events)",
            value=f.median(f.other) * 1000,
            unit="ms",
            baseline=f.median(f.base) * 1000,
            ratio=f.ratio,
            target=f"≤ {TARGET_RATIO}×",
            met=met,
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
