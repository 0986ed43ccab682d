"""Ingest benchmark: `ledger.log.append` against raw psycopg 3 baselines on the same PostgreSQL.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/ingest.py \
        [--events N] [--single N] [--profile [batched|single|both]] [--keep]

Measures, in one process against one database:

  append, batched      the log's append in batches of --batch (500) events, one fresh run
  append, single       the log's append with one event per call, one fresh run
  raw COPY             COPY ... FROM STDIN (write_row), one transaction per batch
  raw executemany      executemany of INSERTs, one transaction per batch
  raw single INSERT    one INSERT per statement, autocommit
  OTLP spans           --events/2 GenAI spans POSTed as OTLP protobuf to Daphne, against the events
                       they become POSTed to the append endpoint (bench/otlp.py)
  a long run           one event per call (a new step each) to a run of 20,000 steps, against the
                       same to a run of 10 steps: flat (<= 1.5x)

and, through a Daphne serving this checkout, the batched events POSTed pre-encoded by httpx and
written by runledger.client (client/) as a harness would, each as a share of raw COPY.

The raw baselines write into a scratch copy of ledger_event (CREATE TABLE ... (LIKE ledger_event
INCLUDING ...), in a schema of its own, dropped at the end) through a plain psycopg.connect()
connection, with the same precomputed canonical payload text, event ids, sequences and
timestamps, so that only the write path differs. See bench/README.md for what the ratios mean.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: import the bench package from the repository root (bench/common.py)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    cleanup,
    head_only_changes,
    head_only_totals,
    libpq_url,
    profile,
    record,
    require_postgres,
    setup_django,
    start_daphne,
    stop,
)

# Targets from the issue: append throughput as a fraction of the raw baseline.
TARGET_BATCHED_VS_COPY = 0.25
TARGET_SINGLE_VS_INSERT = 0.40

EVENT_COLUMNS = (
    "run_id",
    "sequence",
    "event_id",
    "type",
    "occurrence_id",
    "recorded_at",
    "payload",
    "idempotency_key",
    "request_digest",
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/ingest.py",
        description="Benchmark ledger.log.append against raw psycopg 3 on PostgreSQL.",
    )
    p.add_argument("--events", type=int, default=20_000, help="events for the batched measurements (default 20000)")
    p.add_argument(
        "--single", type=int, default=2_000, help="events for the one-event-per-call measurements (default 2000)"
    )
    p.add_argument("--batch", type=int, default=500, help="batch size (default 500)")
    p.add_argument(
        "--rounds",
        type=int,
        default=10,
        help="the five methods take turns in this many slices of their work (default 10)",
    )
    p.add_argument(
        "--profile",
        nargs="?",
        const="batched",
        choices=("batched", "single", "both"),
        help="after the timed runs, run cProfile around an extra (untimed) batched and/or "
        "single append measurement and print the top 25 functions by cumulative time",
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the bench runs and events in the ledger tables (default: delete them)"
    )
    args = p.parse_args(argv)
    if args.events < args.batch or args.batch < 1 or args.single < 1 or args.rounds < 1:
        p.error("need --batch >= 1, --events >= --batch, --single >= 1 and --rounds >= 1")
    return args


# --- the events ---------------------------------------------------------------------------------

_TEXT = (
    "The invoice total matches the purchase order after applying the 4% early-payment discount; "
    "I will now fetch the vendor record to confirm the remittance address before drafting the reply "
    "{n}."
)


def make_events(n: int, tag: str) -> list[dict[str, Any]]:
    """A run's worth of request items: RunStarted, then model responses and tool calls, alternating."""
    events: list[dict[str, Any]] = [{"type": "RunStarted", "payload": {"workflowVersionId": "wfver_bench"}}]
    for i in range(1, n):
        turn = (i + 1) // 2
        if i % 2:
            events.append(
                {
                    "type": "harness.model.responded",
                    "payload": {
                        "turn": turn,
                        "callId": f"c{tag}{i}",
                        "stepPath": "s",
                        "model": {"provider": "openai", "modelId": "gpt-4o-mini"},
                        "response": {
                            "text": _TEXT.format(n=i),
                            "usage": {"inputTokens": 1200, "outputTokens": 150},
                        },
                    },
                }
            )
        else:
            events.append(
                {
                    "type": "harness.tool_call.started",
                    "payload": {
                        "callId": f"t{tag}{i}",
                        "caller": "agent",
                        "toolName": "vendors.lookup",
                        "turn": turn,
                        "args": {"vendorId": f"v_{i % 97}", "fields": ["name", "remitTo"], "limit": 1},
                    },
                }
            )
    return events


def raw_rows(events: list[dict[str, Any]], run_pk: int, batch: int) -> list[tuple[Any, ...]]:
    """The rows the log's append would write for `events`, precomputed for the raw baselines."""
    from ledger.canonical import canonical_bytes, event_id

    base = datetime.now(UTC).replace(microsecond=0)
    rows = []
    for index, item in enumerate(events):
        sequence = index + 1
        recorded_at = base + timedelta(milliseconds=index // batch)  # one timestamp per batch
        rows.append(
            (
                run_pk,
                sequence,
                event_id(run_id=f"run_raw_{run_pk}", sequence=sequence, type=item["type"], payload=item["payload"]),
                item["type"],
                None,
                recorded_at,
                canonical_bytes(item["payload"]).decode(),
                None,
                None,
            )
        )
    return rows


def chunks(seq: list[Any], size: int) -> list[list[Any]]:
    return [seq[i : i + size] for i in range(0, len(seq), size)]


# --- measurements -------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    events: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else float("inf")


Steps = list[Callable[[], None]]  # one write each: a batch, or a single event


def timed(name: str, events: int, steps: Steps) -> Result:
    start = time.perf_counter()
    for step in steps:
        step()
    return Result(name, events, time.perf_counter() - start)


def interleaved(methods: dict[str, tuple[int, Steps]], rounds: int) -> dict[str, Result]:
    """Each method's steps in `rounds` slices, the methods taking turns slice by slice: a change
    in the machine's load (other processes on a shared machine) then hits every method alike,
    and the ratios hold up even when the absolute rates do not."""
    seconds = dict.fromkeys(methods, 0.0)
    for r in range(rounds):
        for name, (_, steps) in methods.items():
            part = steps[r * len(steps) // rounds : (r + 1) * len(steps) // rounds]
            seconds[name] += timed(name, 0, part).seconds
    return {name: Result(name, n, seconds[name]) for name, (n, _) in methods.items()}


class Appender:
    def __init__(self, workspace: Any, batch: int) -> None:
        self.workspace = workspace
        self.batch = batch
        self.run_ids: list[str] = []

    def new_run_id(self) -> str:
        run_id = f"run_bench_{secrets.token_hex(8)}"
        self.run_ids.append(run_id)
        return run_id

    def batched(self, events: list[dict[str, Any]]) -> Steps:
        return self._appends(chunks(events, self.batch))

    def single(self, events: list[dict[str, Any]]) -> Steps:
        return self._appends([[e] for e in events])

    def _appends(self, batches: list[list[dict[str, Any]]]) -> Steps:
        from ledger.log import append

        run_id, ws = self.new_run_id(), self.workspace
        return [functools.partial(append, workspace=ws, run_id=run_id, events=b) for b in batches]


class Raw:
    """Baselines through a plain psycopg 3 connection into a scratch copy of ledger_event."""

    def __init__(self, url: str, batch: int) -> None:
        import psycopg

        self.conn = psycopg.connect(libpq_url(url), autocommit=True)
        self.batch = batch
        self.schema = f"bench_{os.getpid()}_{secrets.token_hex(4)}"
        self.table = f"{self.schema}.raw_event"
        cols = ", ".join(EVENT_COLUMNS)
        self.insert_sql = f"INSERT INTO {self.table} ({cols}) VALUES ({', '.join(['%s'] * len(EVENT_COLUMNS))})"
        self.copy_sql = f"COPY {self.table} ({cols}) FROM STDIN"
        self.conn.execute(f"CREATE SCHEMA {self.schema}")
        # INCLUDING IDENTITY as well: ledger_event.id is an identity column that both write paths
        # leave to the database. LIKE does not copy foreign keys (nor triggers).
        self.conn.execute(
            f"CREATE TABLE {self.table} (LIKE public.ledger_event INCLUDING DEFAULTS INCLUDING IDENTITY "
            "INCLUDING CONSTRAINTS INCLUDING INDEXES)"
        )

    def drop(self) -> None:
        self.conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        self.conn.close()

    def copy(self, rows: list[tuple[Any, ...]]) -> Steps:
        return [functools.partial(self._copy, b) for b in chunks(rows, self.batch)]

    def executemany(self, rows: list[tuple[Any, ...]]) -> Steps:
        return [functools.partial(self._executemany, b) for b in chunks(rows, self.batch)]

    def single(self, rows: list[tuple[Any, ...]]) -> Steps:
        # autocommit: each INSERT is its own transaction
        return [functools.partial(self.conn.execute, self.insert_sql, row) for row in rows]

    def _copy(self, batch: list[tuple[Any, ...]]) -> None:
        with self.conn.transaction(), self.conn.cursor() as cur, cur.copy(self.copy_sql) as cp:
            for row in batch:
                cp.write_row(row)

    def _executemany(self, batch: list[tuple[Any, ...]]) -> None:
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.executemany(self.insert_sql, batch)


# --- report -------------------------------------------------------------------------------------


def print_table(results: dict[str, Result]) -> None:
    ratios = {
        "append, batched": ("raw COPY", "raw executemany"),
        "append, single": ("raw single INSERT",),
    }
    print(f"\n{'method':<22} {'events':>8} {'seconds':>9} {'events/s':>10}   ratio vs baseline")
    print("-" * 86)
    for key in ("append, batched", "raw COPY", "raw executemany", "append, single", "raw single INSERT"):
        r = results[key]
        vs = "  ".join(f"{r.rate / results[b].rate:6.1%} of {b.removeprefix('raw ')}" for b in ratios.get(key, ()))
        print(f"{r.name:<22} {r.events:>8} {r.seconds:>9.3f} {r.rate:>10,.0f}   {vs}")

    batched_copy = results["append, batched"].rate / results["raw COPY"].rate
    single_insert = results["append, single"].rate / results["raw single INSERT"].rate
    print("\nTargets (from the issue):")
    for label, value, target in (
        ("batched append >= 25% of COPY", batched_copy, TARGET_BATCHED_VS_COPY),
        ("single append >= 40% of single autocommit INSERT", single_insert, TARGET_SINGLE_VS_INSERT),
    ):
        print(f"  {label:<50} {value:6.1%}  {'MET' if value >= target else 'NOT MET'}")
        ours, raw = (
            ("append, batched", "raw COPY")
            if target == TARGET_BATCHED_VS_COPY
            else ("append, single", "raw single INSERT")
        )
        record(
            f"{ours} / {raw}",
            value=results[ours].rate,
            unit="ev/s",
            baseline=results[raw].rate,
            ratio=value,
            target=f">= {target:.0%}",
            met=value >= target,
            ratio_format="{:.1%}",
        )


TARGET_PROJECTION_OVERHEAD = 0.30
TARGET_HTTP_VS_COPY = 0.15


def print_http(
    workspace: Any, appender: Appender, args: argparse.Namespace, events: list[dict[str, Any]], copy: Result
) -> None:
    """The same batched events POSTed to Daphne by one HTTP client, and the same requests handed to
    Django in this process (its test client: no server, no socket), against the same PostgreSQL.

    The request bodies are encoded once beforehand, so neither side pays for the client's JSON. The
    difference between the two per request is what serving it costs: Daphne's HTTP parsing and
    writing, Django's ASGI handler with its thread hop to the sync view, the loopback and httpx.
    """
    import httpx
    import orjson
    from django.test import Client

    from ledger.tenancy.services import create_key

    _, key = create_key(workspace=workspace, scopes=["ingest"])
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    in_process = Client(HTTP_AUTHORIZATION=headers["Authorization"])

    def post_all(send: Callable[[str, bytes], tuple[int, str]], items: list[dict[str, Any]]) -> Callable[[], None]:
        run_id = appender.new_run_id()
        bodies = [orjson.dumps({"events": batch}) for batch in chunks(items, args.batch)]

        def go() -> None:
            for body in bodies:
                status, text = send(f"/api/v1/runs/{run_id}/events", body)
                if status != 200:
                    raise SystemExit(f"HTTP append failed: {status} {text[:300]}")

        return go

    def through_test_client(url: str, body: bytes) -> tuple[int, str]:
        response = in_process.post(url, data=body, content_type="application/json")
        return response.status_code, response.content.decode()

    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-ingest-daphne-{os.getpid()}.log"
    process, base = start_daphne(log_path)
    sizes: list[int] = []
    try:
        with httpx.Client(base_url=base, timeout=120, headers=headers) as client:

            def through_daphne(url: str, body: bytes) -> tuple[int, str]:
                response = client.post(url, content=body)
                sizes.append(len(response.content))
                return response.status_code, response.text

            for send in (through_daphne, through_test_client):  # warm up
                post_all(send, make_events(2 * args.batch, "hw"))()
            through_client(base, key, appender, make_events(2 * args.batch, "cw"), args.batch)()  # warm up
            http = timed("HTTP append, batched", args.events, [post_all(through_daphne, events)])
            direct = timed("same, Django in-process", args.events, [post_all(through_test_client, events)])
            via_client = timed(
                "runledger.client, batched", args.events, [through_client(base, key, appender, events, args.batch)]
            )
    finally:
        stop(process)
    bare = time_bare_daphne(events, args.batch, max(sizes))
    ratio = http.rate / copy.rate
    requests = len(chunks(events, args.batch))
    per_request, per_direct = http.seconds / requests * 1000, direct.seconds / requests * 1000
    print(
        f"\nHTTP: {args.events} events POSTed in batches of {args.batch} ({requests} requests, bodies encoded beforehand)"
    )
    for r, ms in ((http, per_request), (direct, per_direct)):
        print(
            f"  {r.name:<24} {r.events:>8} {r.seconds:>9.3f} {r.rate:>10,.0f}   {r.rate / copy.rate:6.1%} of COPY"
            f"   {ms:7.1f} ms/request"
        )
    print(
        f"  serving a request (Daphne, ASGI, loopback, httpx): {per_request - per_direct:.1f} ms of {per_request:.1f} "
        f"({(per_request - per_direct) / per_request:.0%})"
    )
    print(
        f"  Daphne alone (a bare ASGI app answering {max(sizes):,} bytes, bench/bareasgi.py): {bare:.1f} ms/request; "
        f"Django's ASGI handler, its thread hop and the rest: {per_request - per_direct - bare:.1f} ms"
    )
    print(f"  target >= 15% of COPY: {'MET' if ratio >= TARGET_HTTP_VS_COPY else 'NOT MET'}")
    client_ratio = via_client.rate / copy.rate
    print(
        f"  {via_client.name:<24} {via_client.events:>8} {via_client.seconds:>9.3f} {via_client.rate:>10,.0f}   "
        f"{client_ratio:6.1%} of COPY   {via_client.rate / http.rate:6.1%} of the pre-encoded POSTs"
    )
    record(
        "client (runledger.client, batched, through HTTP) / raw COPY",
        value=via_client.rate,
        unit="ev/s",
        baseline=copy.rate,
        ratio=client_ratio,
        target="none (issue 16 asks for the figure)",
        met=None,
        ratio_format="{:.1%}",
        note=f"{via_client.rate / http.rate:.0%} of the same batches POSTed pre-encoded",
    )
    record(
        "HTTP batch of 500 through Daphne / raw COPY",
        value=http.rate,
        unit="ev/s",
        baseline=copy.rate,
        ratio=ratio,
        target=">= 15%",
        met=ratio >= TARGET_HTTP_VS_COPY,
        ratio_format="{:.1%}",
        note=f"Daphne's share of a request: {(per_request - per_direct) / per_request:.0%} "
        f"({per_request - per_direct:.1f} of {per_request:.1f} ms)",
    )


def time_bare_daphne(events: list[dict[str, Any]], batch: int, response_bytes: int) -> float:
    """ms per request of the same bodies POSTed to a Daphne serving bench/bareasgi.py, which
    reads each body and answers `response_bytes` bytes: what Daphne costs with no application."""
    import httpx
    import orjson

    bodies = [orjson.dumps({"events": b}) for b in chunks(events, batch)]
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-ingest-bare-{os.getpid()}.log"
    process, base = start_daphne(
        log_path,
        "bench.bareasgi:application",
        probe="/",
        probe_status=200,
        env={"BENCH_BARE_RESPONSE_BYTES": str(response_bytes)},
    )
    try:
        with httpx.Client(base_url=base, timeout=120) as client:
            for body in bodies[:2]:  # warm up
                client.post("/", content=body)
            start = time.perf_counter()
            for body in bodies:
                if client.post("/", content=body).status_code != 200:
                    raise SystemExit("the bare ASGI app did not answer 200")
            return (time.perf_counter() - start) / len(bodies) * 1000
    finally:
        stop(process)


def through_client(
    base: str, key: str, appender: Appender, events: list[dict[str, Any]], batch: int
) -> Callable[[], None]:
    """`events` written by runledger.client as a harness would: a run started, the rest emitted
    into batches of `batch` (no time flush), flushed at the end. Unlike the pre-encoded POSTs the
    client pays for what a harness pays for: its JSON, its idempotency keys, its retry loop."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))
    from runledger.client import Client

    run_id = appender.new_run_id()

    def go() -> None:
        with Client(base, key, timeout=120) as client:
            run = client.start_run(
                events[0]["payload"]["workflowVersionId"], run_id=run_id, batch_size=batch, flush_interval=0
            )
            for item in events[1:]:
                run.emit(item["type"], item["payload"])
            run.flush()
            if run.last_sequence != len(events):
                raise SystemExit(f"client append ended at {run.last_sequence}, not {len(events)}")

    return go


def print_projection_overhead(appender: Appender, args: argparse.Namespace) -> None:
    """What keeping the projections current adds to a batched append.

    Measured in the same run, interleaved batch by batch: the batched append as shipped, with the
    fold's `advance` timed inside it, and on another run with the projection writes switched off.
    The append without any projection work is the second figure less the fold time (the fold
    still runs there, since the lifecycle checks read its state).
    """
    import ledger.log.strategies as append_module

    real_advance, real_changes, real_totals = (
        append_module.advance,
        append_module.batch_changes,
        append_module.batch_totals,
    )
    fold_seconds = 0.0

    def timed_advance(*a: Any, **kw: Any) -> None:
        nonlocal fold_seconds
        start = time.perf_counter()
        real_advance(*a, **kw)
        fold_seconds += time.perf_counter() - start

    n = min(args.events, 10_000)
    variants = {
        "with projections": ((real_changes, real_totals), appender.batched(make_events(n, "pf"))),
        "no projection writes": ((head_only_changes, head_only_totals), appender.batched(make_events(n, "pn"))),
    }
    seconds, folds = dict.fromkeys(variants, 0.0), dict.fromkeys(variants, 0.0)
    # Where each variant's time is spent: this thread's CPU and the PostgreSQL backend's (Linux's
    # /proc/<pid>/stat), for the floor analysis (bench/README.md § Floors).
    client, server = dict.fromkeys(variants, 0.0), dict.fromkeys(variants, 0.0)
    backend = backend_pid()
    try:
        append_module.advance = timed_advance
        for batches in zip(*(steps for _, steps in variants.values())):
            for (name, (changes, _)), batch in zip(variants.items(), batches):
                append_module.batch_changes, append_module.batch_totals = changes
                fold_seconds = 0.0
                gc.collect()  # neither variant pays for the other's garbage (the fold pauses the collector)
                thread_before, backend_before = time.thread_time(), process_cpu(backend)
                seconds[name] += timed(name, 0, [batch]).seconds
                client[name] += time.thread_time() - thread_before
                server[name] += process_cpu(backend) - backend_before
                folds[name] += fold_seconds
    finally:
        append_module.advance, append_module.batch_changes = real_advance, real_changes
        append_module.batch_totals = real_totals
    full, no_writes = seconds["with projections"], seconds["no projection writes"]
    base = no_writes - folds["no projection writes"]
    overhead = (full - base) / base
    print(f"\nProjection upkeep in a batched append ({n} events, batches of {args.batch}, interleaved):")
    print(f"  append with projections        {full:8.3f}s  (fold {folds['with projections']:.3f}s of it)")
    print(f"  append, projection writes off  {no_writes:8.3f}s  (fold {folds['no projection writes']:.3f}s of it)")
    print(f"  append without projection work {base:8.3f}s  (the line above less its fold)")
    print(
        f"  projection upkeep adds {overhead:6.1%}   target <= 30%  "
        f"{'MET' if overhead <= TARGET_PROJECTION_OVERHEAD else 'NOT MET'}"
    )
    per_event = {name: (seconds[name] / n * 1e6, client[name] / n * 1e6, server[name] / n * 1e6) for name in variants}
    for name, (wall, ours, pg) in per_event.items():
        print(
            f"  {name:<30} per event: wall {wall:5.1f} us, this process's CPU {ours:5.1f} us, "
            f"the backend's {pg:5.1f} us"
        )
    fold_us = folds["with projections"] / n * 1e6
    client_rows_us = per_event["with projections"][1] - per_event["no projection writes"][1]
    floor = (fold_us + client_rows_us) / (base / n * 1e6)
    print(
        f"  before the server writes a projection row: the fold {fold_us:.1f} us and this process's projection "
        f"rows {client_rows_us:.1f} us an event, {floor:+.0%} of the append without projection work"
    )
    record(
        "projection upkeep in a batched append",
        value=full,
        unit="s",
        baseline=base,
        ratio=overhead,
        target="<= +30%",
        met=overhead <= TARGET_PROJECTION_OVERHEAD,
        ratio_format="{:+.0%}",
        note=f"the fold and this process's projection rows alone: {floor:+.0%} (backend CPU "
        f"{per_event['no projection writes'][2]:.1f} -> {per_event['with projections'][2]:.1f} us an event)",
    )


LONG_RUN_STEPS = 20_000  # steps already in the long run before its single appends are timed
SHORT_RUN_STEPS = 10
TARGET_LONG_RUN = 1.5  # flat: what a run's length may add to an append, at most


def print_long_run(appender: Appender, args: argparse.Namespace) -> None:
    """One event per call (a new step each, as a harness schedules them) to a run that already
    holds LONG_RUN_STEPS steps against the same to a run of SHORT_RUN_STEPS, interleaved: what
    an append costs on a long run (ledger/log/projection.py `touched_steps` reads only the steps
    a batch names)."""
    from ledger.log import append

    runs = {}
    for name, steps in (("long", LONG_RUN_STEPS), ("short", SHORT_RUN_STEPS)):
        run_id = appender.new_run_id()
        body = [{"type": "RunStarted", "payload": {"workflowVersionId": "wfver_bench_ingest"}}]
        body += [{"type": "StepScheduled", "payload": {"stepPath": f"early{i}"}} for i in range(steps)]
        for part in chunks(body, 500):
            append(workspace=appender.workspace, run_id=run_id, events=part)
        runs[name] = run_id

    def singles(name: str, tag: str, count: int) -> Steps:
        ws, run_id = appender.workspace, runs[name]
        return [
            functools.partial(
                append,
                workspace=ws,
                run_id=run_id,
                events=[{"type": "StepScheduled", "payload": {"stepPath": f"{tag}{i}"}}],
            )
            for i in range(count)
        ]

    for name in runs:
        timed("warm-up", 0, singles(name, "warm", 20))
    count = max(args.rounds, args.single // 4)
    results = interleaved(
        {name: (count, singles(name, "late", count)) for name in runs},
        rounds=args.rounds,
    )
    long_us, short_us = (results[n].seconds / count * 1e6 for n in ("long", "short"))
    ratio = long_us / short_us
    print(f"One event per call to a run of {LONG_RUN_STEPS:,} steps and to one of {SHORT_RUN_STEPS} ({count} each):")
    print(f"  {LONG_RUN_STEPS:,} steps  {long_us:8.0f} us an append")
    print(f"  {SHORT_RUN_STEPS} steps {short_us:12.0f} us an append")
    flat = "MET" if ratio <= TARGET_LONG_RUN else "NOT MET"
    print(
        f"  a run of {LONG_RUN_STEPS:,} steps / of {SHORT_RUN_STEPS}: {ratio:.2f}x  target <= {TARGET_LONG_RUN}x  {flat}"
    )
    record(
        f"append, single, to a run of {LONG_RUN_STEPS:,} steps / to a run of {SHORT_RUN_STEPS}",
        value=long_us,
        unit="us",
        baseline=short_us,
        ratio=ratio,
        target=f"<= {TARGET_LONG_RUN:g}x (flat)",
        met=ratio <= TARGET_LONG_RUN,
    )


def backend_pid() -> int:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        return int(cur.fetchone()[0])


def process_cpu(pid: int) -> float:
    """Seconds of CPU (user + system) the process `pid` has used (Linux's /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    url = require_postgres("bench/ingest.py")
    setup_django(production=True)

    from django.conf import settings
    from django.db import connection

    from ledger.tenancy.services import bootstrap

    ws_slug = f"bench-{datetime.now(UTC):%Y%m%d%H%M%S}-{os.getpid()}-{secrets.token_hex(3)}"
    workspace = bootstrap(tenant="bench", workspace=ws_slug)
    with connection.cursor() as cur:
        cur.execute("SELECT version(), current_setting('synchronous_commit')")
        version, sync_commit = cur.fetchone()
    print(
        f"PostgreSQL: {version.split(' on ')[0]} (synchronous_commit={sync_commit}); "
        f"Python {sys.version.split()[0]}; DEBUG={settings.DEBUG}; workspace bench/{ws_slug}"
    )
    print(f"batched: {args.events} events in batches of {args.batch}; single: {args.single} events, one per call")

    appender = Appender(workspace, args.batch)
    raw = Raw(url, args.batch)
    try:
        # Precompute everything outside the timed regions.
        batched_events = make_events(args.events, "b")
        single_events = make_events(args.single, "s")
        warm_batched = make_events(2 * args.batch, "wb")
        warm_single = make_events(50, "ws")
        run_pk = iter(range(1_000_000_001, 1_000_001_000))  # distinct fake run ids in the scratch table
        rows = {name: raw_rows(batched_events, next(run_pk), args.batch) for name in ("copy", "many")}
        rows["single"] = raw_rows(single_events, next(run_pk), args.batch)
        warm_rows = {name: raw_rows(warm_batched, next(run_pk), args.batch) for name in ("copy", "many")}
        warm_rows["single"] = raw_rows(warm_single, next(run_pk), args.batch)

        # Warm up each method briefly (imports, connection, plan caches, pages in shared buffers).
        for steps in (
            appender.batched(warm_batched),
            appender.single(warm_single),
            raw.copy(warm_rows["copy"]),
            raw.executemany(warm_rows["many"]),
            raw.single(warm_rows["single"]),
        ):
            timed("warm-up", 0, steps)

        results = interleaved(
            {
                "append, batched": (args.events, appender.batched(batched_events)),
                "raw COPY": (args.events, raw.copy(rows["copy"])),
                "raw executemany": (args.events, raw.executemany(rows["many"])),
                "append, single": (args.single, appender.single(single_events)),
                "raw single INSERT": (args.single, raw.single(rows["single"])),
            },
            rounds=args.rounds,
        )
        for name, result in results.items():
            print(f"  {name:<20} {result.seconds:8.3f}s", flush=True)
        print_table(results)
        print_http(workspace, appender, args, batched_events, results["raw COPY"])
        from bench.otlp import print_otlp

        print_otlp(workspace, appender, spans=args.events // 2, copy_rate=results["raw COPY"].rate)
        print_projection_overhead(appender, args)
        print_long_run(appender, args)

        if args.profile in ("batched", "both"):
            profile(
                f"the log's append, {args.events} events in batches of {args.batch}",
                functools.partial(timed, "profiled", args.events, appender.batched(make_events(args.events, "pb"))),
            )
        if args.profile in ("single", "both"):
            profile(
                f"the log's append, {args.single} events one per call",
                functools.partial(timed, "profiled", args.single, appender.single(make_events(args.single, "ps"))),
            )
    finally:
        raw.drop()
        if not args.keep:
            cleanup(workspace, appender.run_ids)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
