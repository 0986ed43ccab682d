"""Console benchmark: page server time against a bare query, and commit-to-browser latency of a
live event against a raw channel-layer fan-out.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/runledger_bench REDIS_URL=redis://127.0.0.1:6379/0 \
        .venv/bin/python bench/console.py [--repeats N] [--events N] [--subscribers 1,50] [--keep]

Pages (in this process, through Django's test client and the whole middleware stack): the run
page of a run with 100 and with 10,000 events, and the runs list of a workspace with 100 and with
10,000 runs, each against the bare SELECT of the rows that page shows (the newest page of events;
the first page of runs), timed in the same run on the same connection; and the run page's
evidence views (conversation, waterfall, the state at event N, a search) against the SELECT of the
events they read (the whole log, the prefix up to N, one page of matches). It also counts the page's
queries at both sizes.

Live (against Daphne on Redis, started here as a subprocess): 1 and 50 WebSocket subscribers
(autobahn clients in a subprocess of their own, signed in with a session cookie) on a run's
`/ws/runs/<runId>/`; events appended one at a time here; per delivery, the time from the append's
COMMIT returning to the subscriber having the message; against a `group_send` to a group of as many
channel-layer receivers, from the send to each receive. Both ends read CLOCK_MONOTONIC. The floor
beside it: the same subscribers on a second Daphne serving bench/barews.py, a bare Channels
consumer that forwards a group's messages, each frame (one of our rows) sent by `group_send`: what
Channels, Daphne, autobahn and Twisted take with no Runledger code. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: import the bench package from the repository root (bench/common.py)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    channel_layer,
    cleanup,
    close_layer,
    get_ok,
    median_seconds,
    percentile,
    record,
    require_services,
    setup_django,
    start_daphne,
    stop,
)
from bench.stream import append_one  # noqa: E402

SIZES = (100, 10_000)
VIEW_SIZES = (1_000, 100_000)  # issue 33: each run view at 100,000 events against its bare SELECT and its 1,000 figure
VIEW_TARGET = 3.0  # x the bare SELECT of the rows it shows, at 100,000 events
GROWTH_TARGET = 1.5  # x its own figure at 1,000 events
FLOOR_EVENTS = 2  # the floor under each view's figure: the same view of a run with nothing to show
WARMUP_EVENTS = 10
PAGE_WARMUP = 2  # untimed calls first: templates compiled, connection open, plans cached
COPY_BATCH = 100  # runs written through the log's append; the rest of a big workspace copies their rows


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/console.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=15, help="timed requests per page and size (default 15)")
    p.add_argument("--events", type=int, default=60, help="live events measured per subscriber count (default 60)")
    p.add_argument("--subscribers", default="1,50", help="WebSocket subscriber counts (default 1,50)")
    p.add_argument("--gap-ms", type=float, default=20.0, help="pause between live events (default 20)")
    p.add_argument("--live-only", action="store_true", help="skip the pages; measure live delivery only")
    p.add_argument("--keep", action="store_true", help="keep the bench data in the ledger tables")
    p.add_argument(
        "--views-only",
        action="store_true",
        help="only the run views at 1,000 and 100,000 events (fold snapshots, issue 33); no live part",
    )
    p.add_argument(
        "--skip-evidence",
        action="store_true",
        help="leave the evidence JSON out of the run views (its first request reads the whole log: a minute "
        "at 100,000 events)",
    )
    args = p.parse_args(argv)
    try:
        args.subscribers = [int(n) for n in args.subscribers.split(",")]
    except ValueError:
        p.error("--subscribers is a comma-separated list of numbers")
    if args.repeats < 1 or args.events < 1 or min(args.subscribers) < 1 or args.gap_ms < 0:
        p.error("need --repeats >= 1, --events >= 1, subscriber counts >= 1 and --gap-ms >= 0")
    return args


# --- data ---------------------------------------------------------------------------------------


def _step_events(n: int) -> list[dict[str, Any]]:
    """Five events per step, as a harness writes them: scheduled, attempt, model call and answer, done."""
    path = f"step{n}"
    return [
        {"type": "StepScheduled", "payload": {"stepPath": path}},
        {"type": "StepAttemptStarted", "payload": {"stepPath": path, "attempt": 1}},
        {
            "type": "harness.model.called",
            "payload": {
                "turn": 1,
                "promptHash": f"sha256:{n:064x}",
                "stepPath": path,
                "request": {"messages": [{"role": "user", "content": f"task {n}"}]},
            },
        },
        {
            "type": "harness.model.responded",
            "payload": {
                "turn": 1,
                "callId": f"mc_{n}",
                "stepPath": path,
                "model": {"provider": "openai", "modelId": "gpt-4o-mini"},
                "response": {"text": f"answer {n}", "usage": {"inputTokens": 800 + n % 50, "outputTokens": 120}},
            },
        },
        {"type": "StepCompleted", "payload": {"stepPath": path, "attempt": 1, "output": {"n": n}}},
    ]


def write_run(workspace: Any, run_id: str, events: int) -> None:
    from ledger.log import append

    body = [
        {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_bench_console", "label": f"{events} events"}}
    ]
    step = 0
    while len(body) < events - 1:
        body.extend(_step_events(step))
        step += 1
    body = body[: events - 1] + [{"type": "RunCompleted", "payload": {"output": {"steps": step}}}]
    for start in range(0, len(body), 500):
        append(workspace=workspace, run_id=run_id, events=body[start : start + 500])


def write_small_runs(workspace: Any, prefix: str, count: int) -> list[str]:
    """`count` short runs through the log's append (one transaction per 25, so commits do not dominate)."""
    from django.db import transaction

    from ledger.log import append

    ids = [f"{prefix}_{n}" for n in range(count)]
    for start in range(0, count, 25):
        with transaction.atomic():
            for n, run_id in enumerate(ids[start : start + 25], start):
                events = [
                    {
                        "type": "RunStarted",
                        "payload": {"workflowVersionId": f"wfver_bench_{n % 7}", "label": f"ticket {n}"},
                    },
                    *_step_events(n)[:4],
                ]
                if n % 5:
                    events.append(
                        {
                            "type": "RunCompleted" if n % 11 else "RunFailed",
                            "payload": {} if n % 11 else {"error": {"message": "boom"}},
                        }
                    )
                append(workspace=workspace, run_id=run_id, events=events)
    return ids


def copy_runs(workspace: Any, source_ids: list[str], copies: int) -> list[str]:
    """`copies` older copies of each source run's row in ledger_run, with new run ids.

    The runs list reads the run rows (plus children counts and ratings for the page shown), so
    copies of the rows are what it would see of runs written one by one; writing 10,000 runs
    through the log's append takes minutes on a loaded machine. The copies have no events: the bench
    deletes them at the end, as retention would."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'ledger_run' "
            "AND table_schema = current_schema() ORDER BY ordinal_position"
        )
        columns = [name for (name,) in cur.fetchall() if name != "id"]
        new_id = "r.run_id || '_c' || g"
        shifted = "r.{0} - g * interval '1 hour'"
        override = {
            "run_id": new_id,
            "root_run_id": f"CASE WHEN r.root_run_id = r.run_id THEN {new_id} ELSE r.root_run_id END",
            "created_at": shifted.format("created_at"),
            "started_at": shifted.format("started_at"),
            "finished_at": shifted.format("finished_at"),
        }
        select = ", ".join(override.get(c, f"r.{c}") for c in columns)
        cur.execute(
            f"INSERT INTO ledger_run ({', '.join(columns)}) SELECT {select} "
            "FROM ledger_run r CROSS JOIN generate_series(1, %s) g "
            "WHERE r.workspace_id = %s AND r.run_id = ANY(%s)",
            [copies, workspace.pk, source_ids],
        )
    return [f"{run_id}_c{g}" for run_id in source_ids for g in range(1, copies + 1)]


# --- pages --------------------------------------------------------------------------------------


def _bare(sql: str, params: list[Any]) -> Callable[[], Any]:
    from django.db import connection

    def go() -> Any:
        with connection.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall()

    return go


def _queries(fn: Callable[[], Any]) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        fn()
    return len(captured)


def measure_views(client: Any, url: str, run: Any, repeats: int) -> list[tuple[str, float, float, int]]:
    """The run page's evidence views (issue 13). The conversation and waterfall fold the whole
    log and the state tab the prefix up to event N, so their bare query reads those rows; a
    search reads one page of the events that match."""
    from console.pages import run as run_page

    log = "SELECT * FROM ledger_event WHERE run_id = %s ORDER BY sequence"
    half = max(1, run.last_sequence // 2)
    views = [
        ("conversation", "conversation/", log, [run.pk]),
        ("waterfall", "waterfall/", log, [run.pk]),
        (
            f"state at event {half:,}",
            f"state/?at={half}",
            "SELECT * FROM ledger_event WHERE run_id = %s AND sequence <= %s ORDER BY sequence",
            [run.pk, half],
        ),
        (
            "search by type",
            "?type=harness.model.",
            "SELECT * FROM ledger_event WHERE run_id = %s AND sequence > 0 AND type LIKE %s ORDER BY sequence LIMIT %s",
            [run.pk, "harness.model.%", run_page.PAGE_SIZE + 1],
        ),
    ]
    results = []
    for name, suffix, sql, params in views:
        page = get_ok(client, url + suffix)
        results.append(
            (
                f"  {name}",
                median_seconds(page, repeats, warmup=PAGE_WARMUP),
                median_seconds(_bare(sql, params), repeats, warmup=PAGE_WARMUP),
                _queries(page),
            )
        )
    return results


def measure_pages(
    client: Any, workspaces: dict[str, Any], runs: dict[int, tuple[Any, str]], repeats: int
) -> list[tuple[str, float, float, int]]:
    from console.pages import run as run_page
    from console.pages import runs as runs_page
    from ledger.models import Run

    results = []
    for size, (ws, run_id) in runs.items():
        run = Run.objects.get(workspace=ws, run_id=run_id)
        url = f"/w/{ws.tenant.slug}/{ws.slug}/runs/{run_id}/"
        page = get_ok(client, url)
        shown = run_page.PAGE_SIZE
        bare = _bare(
            "SELECT * FROM ledger_event WHERE run_id = %s AND sequence > %s ORDER BY sequence LIMIT %s",
            [run.pk, max(0, run.last_sequence - shown), shown],
        )
        results.append(
            (
                f"run page, {size:,} events",
                median_seconds(page, repeats, warmup=PAGE_WARMUP),
                median_seconds(bare, repeats, warmup=PAGE_WARMUP),
                _queries(page),
            )
        )
        results += measure_views(client, url, run, repeats)
    for size in SIZES:
        ws = workspaces[f"runs{size}"]
        page = get_ok(client, f"/w/{ws.tenant.slug}/{ws.slug}/")
        bare = _bare(
            "SELECT * FROM ledger_run WHERE workspace_id = %s ORDER BY created_at DESC, id DESC LIMIT %s",
            [ws.pk, runs_page.PAGE_SIZE + 1],
        )
        results.append(
            (
                f"runs list, {size:,} runs",
                median_seconds(page, repeats, warmup=PAGE_WARMUP),
                median_seconds(bare, repeats, warmup=PAGE_WARMUP),
                _queries(page),
            )
        )
    return results


def bench_pages(
    client: Any, workspaces: dict[str, Any], written: dict[str, list[str]], repeats: int
) -> list[tuple[str, float, float, int]]:
    """Write the page runs and workspaces (noting them in `written` for the clean-up), then time the pages."""
    from django.db import connection

    runs: dict[int, tuple[Any, str]] = {}
    for size in SIZES:
        run_id = f"run_bench_page_{size}"
        write_run(workspaces["pages"], run_id, size)
        written["pages"].append(run_id)
        runs[size] = (workspaces["pages"], run_id)
    for size in SIZES:
        ws = workspaces[f"runs{size}"]
        real = write_small_runs(ws, "run_bench_list", min(size, COPY_BATCH))
        written[f"runs{size}"] += real
        if size > COPY_BATCH:
            written[f"runs{size}"] += copy_runs(ws, real, size // COPY_BATCH - 1)
    with connection.cursor() as cur:  # fresh statistics, as autovacuum would gather after such a load
        cur.execute("ANALYZE ledger_run, ledger_event")
    return measure_pages(client, workspaces, runs, repeats)


# --- run views at 1,000 and 100,000 events (fold snapshots) ------------------------------------


def _in(table: str, column: str, run_pk: int, values: list[Any]) -> Callable[[], Any]:
    marks = ", ".join(["%s"] * len(values)) or "NULL"
    return _bare(f"SELECT * FROM {table} WHERE run_id = %s AND {column} IN ({marks})", [run_pk, *values])


def _both(*selects: Callable[[], Any]) -> Callable[[], Any]:
    def go() -> Any:
        return [select() for select in selects]

    return go


def _shown_events(run: Any, view: Callable[[Any], Any], upto: int | None = None) -> list[int]:
    """The sequences of the events a view reads besides its state (what SnapshotRun.prefetch read)."""
    from ledger.replay.runlog import snapshot

    folded = snapshot(run, upto=upto)
    view(folded)
    return sorted(folded.events)


def view_baselines(run: Any) -> dict[str, Callable[[], Any]]:
    """Per view, the bare SELECT of the rows it shows (see bench/README.md)."""
    from console.pages import at, conversation, share, waterfall
    from console.pages import run as run_page
    from ledger.replay.runlog import children_of

    half = max(1, run.last_sequence // 2)
    talk = _shown_events(run, lambda f: conversation.conversation_page(run.workspace, f))
    bars = _shown_events(run, lambda f: waterfall.waterfall(run, f, children_of(run)))
    state = at.state_after(run, half)
    listed = [s.step_path for s in state["steps"]]
    step_page = f"SELECT * FROM ledger_step WHERE run_id = %s AND position >= 0 AND position < {share.STEPS_SHOWN}"
    return {
        "timeline (the run page)": _bare(
            "SELECT * FROM ledger_event WHERE run_id = %s ORDER BY sequence DESC LIMIT %s", [run.pk, run_page.PAGE_SIZE]
        ),
        "evidence tab": _both(
            _bare(
                "SELECT * FROM ledger_toolcall WHERE run_id = %s AND position >= 0 AND position < %s",
                [run.pk, run_page.EVIDENCE_PAGE_SIZE],
            ),
            _bare(
                "SELECT * FROM ledger_costentry WHERE run_id = %s ORDER BY sequence LIMIT %s",
                [run.pk, run_page.EVIDENCE_PAGE_SIZE],
            ),
        ),
        "conversation": _in("ledger_event", "sequence", run.pk, talk),
        "waterfall": _in("ledger_event", "sequence", run.pk, bars),
        "state at event N/2": _both(
            _in("ledger_event", "sequence", run.pk, [half]), _in("ledger_step", "step_path", run.pk, listed)
        ),
        "evidence JSON": _both(
            *(
                _bare(f"SELECT * FROM {table} WHERE run_id = %s ORDER BY {order}", [run.pk])
                for table, order in (
                    ("ledger_step", "position"),
                    ("ledger_toolcall", "position"),
                    ("ledger_costentry", "sequence"),
                )
            )
        ),
        "shared page": _both(
            _bare(
                "SELECT * FROM ledger_event WHERE run_id = %s AND sequence > 0 ORDER BY sequence LIMIT %s",
                [run.pk, share.TIMELINE_PAGE],
            ),
            _bare(step_page, [run.pk]),
            _in("ledger_event", "sequence", run.pk, talk),
        ),
    }


def _calls(fn: Callable[[], Any]) -> int:
    """Python function calls of one call of `fn` (cProfile's count): the view's work in this
    process, which the machine's load does not move as it moves the wall time."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(fn)
    return int(pstats.Stats(profiler).total_calls)  # type: ignore[attr-defined]


def _interleaved(fns: list[Callable[[], Any]], repeats: int, *, warmup: int = 0) -> list[float]:
    """The median wall time of each of `fns`, called in turn (one of each per round), so that the
    machine's load, which moves by the minute, weighs on each alike."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, taken in zip(fns, samples, strict=True):
            start = time.perf_counter()
            fn()
            taken.append(time.perf_counter() - start)
    return [statistics.median(taken) for taken in samples]


def bench_views(
    client: Any, workspace: Any, user: Any, written: list[str], repeats: int, *, skip: bool = False
) -> list[tuple[int, str, float, float, float, int, int]]:
    """Each run view of a run of 1,000 and of 100,000 events, and of a run of two (started,
    completed: the floor, what the view costs with nothing to show): (size, view, first request,
    median of the later ones, bare SELECT of what it shows, queries, Python calls). A run long enough for
    the worker to prove when it ends (ledger/log/proofs.py) is proved first, as the worker would;
    the first request of a run then reads its stored snapshots and proof in a process that has
    never read it; the later ones read the cached fold, as a server does after its first. The
    later requests of the three runs, and their bare SELECTs, alternate."""
    from django.db import connection

    from ledger.log.proofs import PROVE_FROM, prove_run
    from ledger.log.snapshots import HEADS, READS
    from ledger.models import Run
    from ledger.tenancy.sharing import create_link, share_path

    urls: dict[int, dict[str, str]] = {}
    firsts: dict[int, dict[str, float]] = {}
    baselines: dict[int, dict[str, Callable[[], Any]]] = {}
    for size in (FLOOR_EVENTS, *VIEW_SIZES):
        run_id = f"run_bench_views_{size}"
        began = time.perf_counter()
        write_run(workspace, run_id, size)
        written.append(run_id)
        print(f"  wrote {size:,} events in {time.perf_counter() - began:.1f} s", flush=True)
        with connection.cursor() as cur:  # fresh statistics, as autovacuum would gather after such a load
            cur.execute("ANALYZE ledger_run, ledger_event, ledger_step, ledger_toolcall, ledger_costentry")
        run = Run.objects.select_related("workspace__tenant").get(workspace=workspace, run_id=run_id)
        _, token = create_link(workspace=workspace, run=run, by=user, expires_in_hours=24)
        base = f"/w/{workspace.tenant.slug}/{workspace.slug}/runs/{run_id}/"
        urls[size] = {
            "timeline (the run page)": base,
            "evidence tab": base + "evidence/",
            "conversation": base + "conversation/",
            "waterfall": base + "waterfall/",
            "state at event N/2": base + f"state/?at={max(1, size // 2)}",
            "evidence JSON": share_path(token) + "evidence.json",
            "shared page": share_path(token),
        }
        if skip:
            del urls[size]["evidence JSON"]
        if size >= PROVE_FROM:  # what `ledger worker` does when such a run ends (the append queued it)
            began = time.perf_counter()
            prove_run.call(run.pk)
            print(f"  the worker proved it and stored its snapshots in {time.perf_counter() - began:.1f} s", flush=True)
        READS.clear()  # as a server that has never read the run
        HEADS.clear()
        firsts[size] = {}
        for name, url in urls[size].items():
            first = get_ok(client, url)
            began = time.perf_counter()
            first()
            firsts[size][name] = time.perf_counter() - began
        baselines[size] = view_baselines(run)
    sizes = list(urls)
    results = []
    for name in urls[VIEW_SIZES[0]]:
        pages = [get_ok(client, urls[size][name]) for size in sizes]
        views = _interleaved(pages, repeats, warmup=PAGE_WARMUP)
        bares = _interleaved([baselines[size][name] for size in sizes], repeats, warmup=PAGE_WARMUP)
        for size, page, view, bare in zip(sizes, pages, views, bares, strict=True):
            results.append((size, name, firsts[size][name], view, bare, _queries(page), _calls(page)))
    results.sort(key=lambda r: sizes.index(r[0]))  # by size, then the views in their order
    return results


def report_views(results: list[tuple[int, str, float, float, float, int, int]], repeats: int) -> None:
    small = {name: page for size, name, _, page, *_ in results if size == VIEW_SIZES[0]}
    floor = {name: page for size, name, _, page, *_ in results if size == FLOOR_EVENTS}
    print(
        f"\n{'run views, ms (median of ' + str(repeats) + ')':<32} {'events':>8} {'first':>9} {'view':>8} "
        f"{'bare':>8} {'ratio':>7} {'/ 1k':>6} {'queries':>8} {'calls':>9}"
    )
    for size, name, first, page, bare, queries, calls in results:
        growth = page / small[name]
        print(
            f"{name:<32} {size:>8,} {first * 1000:>9.1f} {page * 1000:>8.2f} {bare * 1000:>8.3f} "
            f"{page / bare:>6.1f}x {growth:>5.2f}x {queries:>8} {calls:>9,}"
        )
        if size != VIEW_SIZES[-1]:
            continue
        record(
            f"{name} at {size:,} events / the bare SELECT of the rows it shows",
            value=page * 1000,
            unit="ms",
            baseline=bare * 1000,
            ratio=page / bare,
            target=f"<= {VIEW_TARGET:g}x",
            met=page / bare <= VIEW_TARGET,
            ratio_format="{:.1f}x",
            note=f"first request (folds, stores snapshots) {first * 1000:.0f} ms",
        )
        record(
            f"{name} at {size:,} events / its own figure at {VIEW_SIZES[0]:,}",
            value=page * 1000,
            unit="ms",
            baseline=small[name] * 1000,
            ratio=growth,
            target=f"<= {GROWTH_TARGET:g}x",
            met=growth <= GROWTH_TARGET,
            ratio_format="{:.2f}x",
        )
        record(
            f"{name}: the same view of a {FLOOR_EVENTS}-event run / the bare SELECT at {size:,} events",
            value=floor[name] * 1000,
            unit="ms",
            baseline=bare * 1000,
            ratio=floor[name] / bare,
            target="(the floor under the figure above)",
            met=None,
            ratio_format="{:.1f}x",
            note=f"the view at {size:,} events is {page / floor[name]:.2f}x its floor",
        )
    print(f"  {FLOOR_EVENTS} events: the floor, the same view of a run with nothing to show (the session, the")
    print("  access checks, the header, the navigation and the template around an empty view)")
    print("  first: the first request of the run in this process (it folds the log, or folds forward from a")
    print("  stored snapshot, and stores the snapshots it passes); view: the median of later requests;")
    print("  queries and calls (Python function calls, cProfile's count) of one later request: the view's")
    print("  work, which the machine's load does not move")


# --- live: WebSocket subscribers ----------------------------------------------------------------


class Board:
    """Arrival moments per (subscriber, sequence), filled by the client thread."""

    def __init__(self) -> None:
        self.arrived: dict[int, dict[int, float]] = defaultdict(dict)
        self.changed = threading.Condition()

    def record(self, subscriber: int, sequence: int, moment: float) -> None:
        with self.changed:
            self.arrived[sequence].setdefault(subscriber, moment)
            self.changed.notify_all()

    def wait_for(self, sequence: int, subscribers: int, timeout: float = 30.0) -> dict[int, float]:
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.arrived[sequence]) >= subscribers, timeout):
                got = len(self.arrived[sequence])
                raise SystemExit(f"sequence {sequence} reached {got} of {subscribers} subscribers within {timeout:g} s")
            return dict(self.arrived[sequence])


class Subscribers:
    """N autobahn WebSocket clients in a process of their own (as browsers would be): it reports
    `subscriber sequence moment` lines, the moment read from CLOCK_MONOTONIC when the message was
    in, which on Linux is the same clock as this process's perf_counter."""

    def __init__(self, base: str, path: str, session: str, count: int, board: Board) -> None:
        import subprocess

        self.process = subprocess.Popen(
            [sys.executable, __file__, "--subscribe", base, path, session, str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        ready = self.process.stdout.readline().strip()
        if ready != "ready":
            self.close()
            raise SystemExit(f"the WebSocket subscribers did not connect: {ready or 'no answer'}")
        self.reader = threading.Thread(target=self._read, args=(board,), daemon=True)
        self.reader.start()

    def _read(self, board: Board) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            subscriber, sequence, moment = line.split()
            board.record(int(subscriber), int(sequence), float(moment))

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=15)
        except Exception:
            self.process.kill()
            self.process.wait(timeout=10)


def subscribe(base: str, path: str, session: str, count: int) -> int:
    """The subscriber process: connect `count` clients, say ready, report every event message
    until stdin closes."""
    from autobahn.asyncio.websocket import WebSocketClientFactory, WebSocketClientProtocol

    host, port = base.removeprefix("http://").split(":")
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    done = loop.create_future()

    class Client(WebSocketClientProtocol):  # type: ignore[misc]
        def onOpen(self) -> None:
            self.factory.opened.set_result(None)

        def onMessage(self, payload: bytes, is_binary: bool) -> None:
            moment = time.perf_counter()
            message = json.loads(payload)
            if message.get("type") == "event":
                sys.stdout.write(f"{self.factory.index} {message['sequence']} {moment!r}\n")
                sys.stdout.flush()

        def onClose(self, was_clean: bool, code: int | None, reason: str | None) -> None:
            if not self.factory.opened.done():
                self.factory.opened.set_exception(RuntimeError(f"refused: {code} {reason}"))

    async def connect(index: int) -> Any:
        factory = WebSocketClientFactory(
            f"ws://{host}:{port}{path}", origin=base, headers={"Cookie": f"sessionid={session}"}
        )
        factory.protocol = Client
        factory.index, factory.opened = index, loop.create_future()
        transport, _ = await loop.create_connection(factory, host, int(port))
        await asyncio.wait_for(factory.opened, 30)
        return transport

    async def run() -> None:
        transports = []
        try:
            for start in range(0, count, 10):  # a few handshakes at a time, not a thundering herd
                transports += await asyncio.gather(*(connect(i) for i in range(start, min(count, start + 10))))
        except Exception as exc:  # reported to the parent instead of "ready"
            print(f"error {exc!r}", flush=True)
            return
        print("ready", flush=True)
        loop.add_reader(sys.stdin.fileno(), lambda: done.done() or sys.stdin.read(1) or done.set_result(None))
        await done
        loop.remove_reader(sys.stdin.fileno())
        for transport in transports:
            transport.close()
        await asyncio.sleep(0.1)

    loop.run_until_complete(run())
    return 0


def measure_live(
    workspace: Any, run_id: str, base: str, session: str, subscribers: int, events: int, gap: float
) -> list[float]:
    from ledger.models import Run

    append_one(workspace, run_id, {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_bench_console"}})
    last = Run.objects.get(workspace=workspace, run_id=run_id).last_sequence
    board = Board()
    path = f"/ws/runs/{run_id}/?after={last}&workspace={workspace.tenant.slug}/{workspace.slug}"
    clients = Subscribers(base, path, session, subscribers, board)
    latencies: list[float] = []
    try:
        for n in range(WARMUP_EVENTS + events):
            sequence, committed = append_one(
                workspace, run_id, {"type": "StepScheduled", "payload": {"stepPath": f"s{n}"}}
            )
            arrived = board.wait_for(sequence, subscribers)
            if n >= WARMUP_EVENTS:
                latencies.extend(moment - committed for moment in arrived.values())
            time.sleep(gap)
        append_one(workspace, run_id, {"type": "RunCompleted", "payload": {}})
    finally:
        clients.close()
    return latencies


def row_html(workspace: Any, run_id: str) -> str:
    """The html of the run's last StepScheduled row as the console's live socket sends it (the
    bare fan-out below sends frames of the same size)."""
    from console.live.run import _row
    from ledger.log.envelopes import log_of
    from ledger.models import Run

    run = Run.objects.get(workspace=workspace, run_id=run_id)
    last = next(e for e in reversed(log_of(run)) if e["type"] == "StepScheduled")
    return json.loads(_row(last, run))["html"]


def measure_bare(base: str, subscribers: int, events: int, gap: float, html: str, *, shared: bool) -> list[float]:
    """The same subscriber process on a Daphne serving bench/barews.py (Channels consumers that
    only forward a group's messages: a group member per socket, or with `shared` one for the
    process, as ours has): per delivery, the time from the `group_send` of a frame like ours
    (`html`) to the subscriber having it. What Channels, Daphne, autobahn and Twisted take alone;
    no Runledger code runs between the send and the socket."""
    from bench.barews import GROUP, SHARED_GROUP

    group = SHARED_GROUP if shared else GROUP
    board = Board()
    clients = Subscribers(base, "/shared" if shared else "/", "-", subscribers, board)
    loop = asyncio.new_event_loop()
    layer = channel_layer()
    latencies: list[float] = []
    try:
        for n in range(1, WARMUP_EVENTS + events + 1):
            text = json.dumps({"type": "event", "sequence": n, "html": html})
            began = time.perf_counter()
            loop.run_until_complete(layer.group_send(group, {"type": "bench.frame", "text": text}))
            arrived = board.wait_for(n, subscribers)
            if n > WARMUP_EVENTS:
                latencies.extend(moment - began for moment in arrived.values())
            time.sleep(gap)
    finally:
        clients.close()
        loop.run_until_complete(close_layer(layer))
        loop.close()
    return latencies


async def measure_fanout(receivers: int, events: int, gap: float, *, sorted_set: bool = False) -> list[float]:
    """group_send to a group of `receivers` channels of one layer (as a Daphne process holds its
    consumers), then every receive: per receiver, the time from the send to its message. On the
    layer the settings configure (Daphne's); with `sorted_set`, on channels_redis's default layer
    at the same Redis, the baseline of the rounds before the pub/sub layer (printed, not recorded)."""
    if sorted_set:
        from channels_redis.core import RedisChannelLayer
        from django.conf import settings

        layer = RedisChannelLayer(hosts=settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"])
    else:
        layer = channel_layer()  # as Daphne's is
    group = f"bench.console.{secrets.token_hex(4)}"
    channels = [await layer.new_channel() for _ in range(receivers)]
    for channel in channels:
        await layer.group_add(group, channel)

    async def receive(channel: str) -> float:
        await layer.receive(channel)
        return time.perf_counter()

    timings: list[float] = []
    try:
        for n in range(WARMUP_EVENTS + events):
            began = time.perf_counter()
            await layer.group_send(group, {"type": "ledger.appended", "runId": "run_x", "sequence": n})
            arrived = await asyncio.wait_for(asyncio.gather(*(receive(c) for c in channels)), 30)
            if n >= WARMUP_EVENTS:
                timings.extend(moment - began for moment in arrived)
            await asyncio.sleep(gap)
    finally:
        for channel in channels:
            await layer.group_discard(group, channel)
        await close_layer(layer)
    return timings


# --- main ---------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    if argv[:1] == ["--subscribe"]:
        base, path, session, count = argv[1:]
        return subscribe(base, path, session, int(count))
    args = parse_args(argv)
    redis_url = require_services("bench/console.py")
    began = time.monotonic()
    # The views' run holds 100,000 events: twice the default limit a run may hold (an operator's
    # setting, docs/operations.md), raised here so that the bench can write it.
    os.environ.setdefault("LEDGER_MAX_EVENTS_PER_RUN", str(2 * VIEW_SIZES[-1]))
    setup_django(production=True)  # Daphne inherits DEBUG=0 and the SECRET_KEY through the environment

    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client

    from ledger.tenancy.services import bootstrap, create_user

    stamp = f"{datetime.now(UTC):%Y%m%d%H%M%S}-{os.getpid()}-{secrets.token_hex(3)}"
    workspaces = {
        name: bootstrap(tenant="bench", workspace=f"console-{name}-{stamp}")
        for name in ("pages", "runs100", "runs10000", "live", "views")
    }
    username = f"bench-console-{stamp}"
    create_user(username=username, tenant="bench", role="viewer", password=secrets.token_urlsafe(12))
    user = User.objects.get(username=username)
    client = Client()
    client.force_login(user)
    session = client.cookies["sessionid"].value

    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('server_version')")
        (version,) = cur.fetchone()
    print(f"PostgreSQL {version}, Redis {redis_url}; workspaces bench/console-*-{stamp}")

    written: dict[str, list[str]] = defaultdict(list)
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-console-daphne-{os.getpid()}.log"
    bare_log_path = log_path.with_name(f"bench-console-bare-daphne-{os.getpid()}.log")
    process = bare_process = None
    pages: list[tuple[str, float, float, int]] = []
    views: list[tuple[int, str, float, float, float, int, int]] = []
    live: dict[int, tuple[list[float], list[float], list[float], list[float], list[float]]] = {}
    try:
        if not args.live_only:
            print("writing the view runs ...", flush=True)
            views = bench_views(
                client, workspaces["views"], user, written["views"], args.repeats, skip=args.skip_evidence
            )
        if not args.live_only and not args.views_only:
            print("writing runs ...", flush=True)
            pages = bench_pages(client, workspaces, written, args.repeats)
            print(f"  done at {time.monotonic() - began:.0f} s", flush=True)
        counts = [] if args.views_only else args.subscribers
        if counts:
            print(
                f"timing live delivery (load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}) ...", flush=True
            )
            process, base = start_daphne(log_path)
            bare_process, bare_base = start_daphne(
                bare_log_path, "bench.barews:application", probe="/", probe_status=200
            )
            gap = args.gap_ms / 1000
            for count in counts:
                fanout = asyncio.run(measure_fanout(count, args.events, gap))
                sorted_set = asyncio.run(measure_fanout(count, args.events, gap, sorted_set=True))
                run_id = f"run_bench_live_{count}"
                written["live"].append(run_id)
                delivered = measure_live(workspaces["live"], run_id, base, session, count, args.events, gap)
                html = row_html(workspaces["live"], run_id)
                per_socket = measure_bare(bare_base, count, args.events, gap, html, shared=False)
                bare = measure_bare(bare_base, count, args.events, gap, html, shared=True)
                live[count] = (delivered, fanout, sorted_set, bare, per_socket)
    finally:
        for running in (process, bare_process):
            if running is not None:
                stop(running)
        if not args.keep:
            for name, ws in workspaces.items():
                cleanup(ws, written[name])
            User.objects.filter(username=username).delete()
    log_path.unlink(missing_ok=True)
    bare_log_path.unlink(missing_ok=True)

    if views:
        report_views(views, args.repeats)
    if pages:
        print(
            f"\n{'server time, ms (median of ' + str(args.repeats) + ')':<34} {'page':>8} {'bare query':>11} "
            f"{'ratio':>7} {'queries':>8}"
        )
        for name, page_s, bare_s, queries in pages:
            print(f"{name:<34} {page_s * 1000:>8.2f} {bare_s * 1000:>11.3f} {page_s / bare_s:>6.0f}x {queries:>8}")
        print("  bare query: the SELECT of the rows the page shows (newest page of events; first page of runs;")
        print("  the whole log for the conversation and waterfall, events 1..N for the state, a page of matches)")

    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    if live:
        print(f"\n{'live delivery, ms (load average ' + load + ')':<44} {'p50':>8} {'p99':>8} {'mean':>8} {'max':>8}")
    for count, (delivered, fanout, sorted_set, bare, per_socket) in live.items():
        for name, values in (
            (f"commit -> WebSocket message, {count} subscriber(s)", delivered),
            (f"  baseline: group_send -> {count} receive(s)", fanout),
            ("  (sorted-set layer's, not the figure's)", sorted_set),
            ("  floor: bare Channels fan-out on Daphne", bare),
            ("  (bare, a group member per socket)", per_socket),
        ):
            ms = [v * 1000 for v in values]
            print(
                f"{name:<44} {percentile(ms, 50):>8.2f} {percentile(ms, 99):>8.2f} "
                f"{statistics.fmean(ms):>8.2f} {max(ms):>8.2f}"
            )
        print(
            f"  ratio: p50 {percentile(delivered, 50) / percentile(fanout, 50):.1f}x, "
            f"p99 {percentile(delivered, 99) / percentile(fanout, 99):.1f}x "
            f"({len(delivered)} deliveries of {args.events} events); against the sorted-set layer's: "
            f"p50 {percentile(delivered, 50) / percentile(sorted_set, 50):.1f}x, "
            f"p99 {percentile(delivered, 99) / percentile(sorted_set, 99):.1f}x"
        )
        print(
            f"  floor: the bare fan-out is p50 {percentile(bare, 50) / percentile(fanout, 50):.1f}x, "
            f"p99 {percentile(bare, 99) / percentile(fanout, 99):.1f}x the group_send; ours is "
            f"p50 {percentile(delivered, 50) / percentile(bare, 50):.2f}x, "
            f"p99 {percentile(delivered, 99) / percentile(bare, 99):.2f}x the bare fan-out"
        )
        for q, target in ((50, 3.0), (99, 5.0)):
            value, baseline = percentile(delivered, q) * 1000, percentile(fanout, q) * 1000
            floor = percentile(bare, q) * 1000
            record(
                f"commit -> WebSocket message p{q}, {count} subscriber(s) / group_send",
                value=value,
                unit="ms",
                baseline=baseline,
                ratio=value / baseline,
                target=f"<= {target:g}x",
                met=value / baseline <= target,
                ratio_format="{:.1f}x",
                note=f"load average {load}; the bare Channels fan-out on Daphne "
                f"delivers the same frame at {floor / baseline:.1f}x",
            )
            record(
                f"WebSocket p{q}, {count} subscriber(s): ours / the bare Channels fan-out on Daphne (group_send -> "
                "frame, no Runledger code)",
                value=value,
                unit="ms",
                baseline=floor,
                ratio=value / floor,
                target="(the floor under the figure above)",
                met=None,
                ratio_format="{:.2f}x",
            )
    print(f"\ntotal {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
