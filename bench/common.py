"""What every benchmark needs: the services it measures, Django set up on them, timing and
percentile helpers, the recording of its figures for `make bench`, a live Daphne, a cProfile report
and the clean-up of its runs.

A benchmark is run as a script (`.venv/bin/python bench/fold.py`), so Python puts `bench/` first
on the path; each script swaps it for the repository root before importing `bench.common`:
`bench/console.py` is named like the `console` package that holds the settings, and one module
object per helper needs one way of importing it.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import secrets
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
POSTGRES_SCHEMES = ("postgres://", "postgresql://", "pgsql://")


# --- services -----------------------------------------------------------------------------------


def require_postgres(script: str) -> str:
    """DATABASE_URL if it names PostgreSQL; otherwise say how to run `script` and exit 2."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(POSTGRES_SCHEMES):
        sys.stderr.write(
            f"{script} measures PostgreSQL only: set DATABASE_URL to a PostgreSQL database, e.g.\n"
            f"  DATABASE_URL=postgres://postgres@127.0.0.1:5432/runledger_bench .venv/bin/python {script}\n"
            f"(DATABASE_URL is {'unset' if not url else repr(url.split('://', 1)[0] + '://...')})\n"
        )
        raise SystemExit(2)
    return url


def require_services(script: str) -> str:
    """REDIS_URL, if DATABASE_URL names PostgreSQL and REDIS_URL names Redis; otherwise exit 2."""
    url, redis_url = os.environ.get("DATABASE_URL", ""), os.environ.get("REDIS_URL", "")
    if not url.startswith(POSTGRES_SCHEMES) or not redis_url.startswith(("redis://", "rediss://")):
        sys.stderr.write(
            f"{script} measures PostgreSQL + Redis: set both, e.g.\n"
            "  DATABASE_URL=postgres://postgres@127.0.0.1:5432/runledger_bench "
            f"REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/python {script}\n"
        )
        raise SystemExit(2)
    return redis_url


def libpq_url(url: str) -> str:
    # libpq knows postgres:// and postgresql://; dj-database-url also accepts pgsql://.
    return "postgresql://" + url.split("://", 1)[1]


def setup_django(*, production: bool = False) -> None:
    """Django on the configured database, migrated. `production`: DEBUG off (and a throwaway
    SECRET_KEY), for a benchmark whose figure would count DEBUG's keeping of every query."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    # In-process appends go through the API's per-key limit too (see start_daphne).
    os.environ.setdefault("LEDGER_MAX_EVENTS_PER_MINUTE_PER_KEY", "10000000")
    if production:
        os.environ.setdefault("DEBUG", "0")
        os.environ.setdefault("SECRET_KEY", "bench-" + secrets.token_hex(16))
    else:
        os.environ.setdefault("DEBUG", "1")  # DEBUG is off unless turned on; these benches ran with it on
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def head_only_changes(workspace_id: int, state: Any, *args: Any, **kwargs: Any) -> Any:
    """A stand-in for ledger.log.strategies.batch_changes that writes no projection row: only the head's
    sequence and status, the log's own bookkeeping. For the benches' "projection writes off"
    variants (ingest's upkeep figure, runtime's "ours, no projections"); never the product's."""
    from ledger.log.projection import Changes

    return Changes(run={"last_sequence": state.last_sequence, "status": state.status})


def head_only_totals(workspace_id: int, state: Any, *args: Any, **kwargs: Any) -> Any:
    """The same stand-in for ledger.log.strategies.batch_totals (what a long batch's last part
    writes once for the whole batch): the head's sequence and status, no projection row."""
    return head_only_changes(workspace_id, state)


# --- measuring ----------------------------------------------------------------------------------


def median_seconds(fn: Callable[[], Any], repeat: int, *, warmup: int = 0) -> float:
    """The median wall time of `repeat` calls of `fn`, after `warmup` calls that are not counted."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def get_ok(client: Any, url: str) -> Callable[[], Any]:
    """A timed call that GETs `url` with a Django test client and stops the bench on anything but 200."""

    def go() -> Any:
        response = client.get(url)
        if response.status_code != 200:
            raise SystemExit(f"GET {url} answered {response.status_code}")
        return response

    return go


def channel_layer() -> Any:
    """A new instance of the channel layer the settings configure (Daphne's, with `REDIS_URL`:
    ledger.log.announce.RedisPubSubLayer), for a baseline `group_send` round trip on it."""
    from django.conf import settings
    from django.utils.module_loading import import_string

    config = settings.CHANNEL_LAYERS["default"]
    return import_string(config["BACKEND"])(**config.get("CONFIG", {}))


async def close_layer(layer: Any) -> None:
    """Close what `channel_layer()` opened on this event loop (the core channels_redis layer's
    `flush` would delete every channel's messages in Redis, so that one closes its pools)."""
    close_pools = getattr(layer, "close_pools", None)
    await (close_pools() if close_pools is not None else layer.flush())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def profile(name: str, fn: Callable[[], Any], *, top: int = 25, top_tottime: int = 15) -> None:
    """Run `fn` once under cProfile and print where the time went, by cumulative and own time."""
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.runcall(fn)
    elapsed = time.perf_counter() - start
    for sort, limit in (("cumulative", top), ("tottime", top_tottime)):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).strip_dirs().sort_stats(sort).print_stats(limit)
        text = out.getvalue()
        # Drop pstats' preamble up to the column header.
        text = text[text.find("   ncalls") :] if "   ncalls" in text else text
        print(f"\n=== cProfile: {name} ({elapsed:.2f}s under the profiler), top {limit} by {sort} ===")
        print(text.rstrip())


def record(
    figure: str,
    *,
    value: float,
    unit: str,
    baseline: float | None,
    ratio: float | None,
    target: str,
    met: bool | None,
    ratio_format: str = "{:.2f}×",
    note: str = "",
) -> None:
    """Add one figure to the results file `make bench` collects (env BENCH_RESULTS); no-op without it.

    A benchmark still prints its own table; this is the line `bench/all.py` turns into a row of
    `bench/results.md`. `value` and `baseline` are in `unit` (the baseline measured in the same run),
    `ratio` the figure the target is about, shown with `ratio_format` ("{:.1%}" for a share of the
    baseline, "{:+.0%}" for an overhead); `met` is None where the figure has no target.
    """
    path = os.environ.get("BENCH_RESULTS")
    if not path:
        return
    line = {
        "bench": Path(sys.argv[0]).stem,
        "figure": figure,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "ratio": ratio,
        "ratio_text": "" if ratio is None else ratio_format.format(ratio),
        "target": target,
        "met": met,
        "note": note,
    }
    # One write of one line in append mode: figures of concurrent benches never interleave.
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(line, ensure_ascii=False) + "\n")


# --- Daphne -------------------------------------------------------------------------------------


def _free_port() -> int:
    """A free port: any (the kernel's pick), or one in BENCH_PORTS=LOW-HIGH when that is set (a
    shared machine where each session has a range of its own)."""
    low, _, high = os.environ.get("BENCH_PORTS", "").partition("-")
    candidates = range(int(low), int(high) + 1) if low and high else [0]
    for candidate in candidates:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise SystemExit(f"no free port in BENCH_PORTS={os.environ['BENCH_PORTS']}")


def start_daphne(
    log_path: Path,
    app: str = "console.asgi:application",
    *,
    probe: str = "/api/v1/runs/run_probe/stream",
    probe_status: int = 401,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """A Daphne serving `app` (this checkout's by default) on a free port, and its base URL, once
    `probe` answers with `probe_status`."""
    import httpx

    # The benches play many browsers of one member (50 subscribers of a run) and one key appending
    # far past a tenant's fair share: lift the per-caller cap on open streams
    # (LEDGER_STREAM_MAX_PER_CALLER, console/streams.py) and the events a key may append a minute
    # (LEDGER_MAX_EVENTS_PER_MINUTE_PER_KEY, console/api/ratelimit.py), which would refuse them.
    env = {
        **os.environ,
        "LEDGER_STREAM_MAX_PER_CALLER": "10000",
        "LEDGER_MAX_EVENTS_PER_MINUTE_PER_KEY": "10000000",
        **(env or {}),
    }
    for _ in range(3):  # the free port may be taken between probing and binding it
        port = _free_port()
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [str(Path(sys.executable).parent / "daphne"), "-b", "127.0.0.1", "-p", str(port), app],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(f"{base}{probe}", timeout=1).status_code == probe_status:
                    return process, base
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        stop(process)
    raise SystemExit(f"Daphne did not start; see {log_path}")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


# --- clean-up -----------------------------------------------------------------------------------


def cleanup(workspace: Any, run_ids: list[str], *, keep_workspace: bool = False) -> None:
    """Delete the bench runs the way retention does (mark them pruning, delete what hangs off them),
    then what else the workspace holds (keys, artifacts, re-execution requests), then the workspace.

    The audit log is insert-only and outlives what it names (ledger/audit.py), and retention in the
    product deletes runs, never a workspace. So a bench workspace that an audit entry names (an API
    key was created in it) is emptied but kept, with its entries, and the bench says so; one that no
    entry names is deleted. `keep_workspace`: only the runs go (a bench that
    wrote into a workspace it did not make). Best effort: a table added later that the deletes below do not cover
    leaves the bench rows in place, with a warning, rather than failing the benchmark.
    """
    from django.db import connection, transaction

    from ledger.log import rollup
    from ledger.models import AuditEntry, Run

    try:
        with transaction.atomic():
            pks = list(Run.objects.filter(workspace=workspace, run_id__in=run_ids).values_list("pk", flat=True))
            with connection.cursor() as cur:
                if pks:
                    days = rollup.days_of(pks)
                    Run.objects.filter(pk__in=pks).update(pruning=True)
                    for table, column in _referencing(Run):  # ledger_event among them
                        cur.execute(f'DELETE FROM {table} WHERE "{column}" = ANY(%s)', [pks])
                    cur.execute("DELETE FROM ledger_run WHERE id = ANY(%s)", [pks])
                    for workspace_id, spent in days.items():  # the daily usage without their cost entries
                        rollup.recount(workspace_id, spent)
                if keep_workspace:
                    return
                # Re-execution requests name the API key that asked, so they go before the keys.
                for table in ("ledger_reexecutionrequest", "ledger_artifact", "ledger_apikey"):
                    cur.execute(f"DELETE FROM {table} WHERE workspace_id = %s", [workspace.pk])
            audited = AuditEntry.objects.filter(workspace=workspace).count()
            if not audited:
                workspace.delete()
    except Exception as exc:  # noqa: BLE001 - cleanup must not hide the results
        sys.stderr.write(f"warning: could not delete the bench data of workspace bench/{workspace.slug}: {exc}\n")
        return
    if audited:
        print(
            f"(workspace bench/{workspace.slug} emptied and kept: {audited} audit entries name it, "
            "and the audit log is insert-only)"
        )


def _referencing(model: Any) -> list[tuple[str, str]]:
    """(table, column) of every foreign key to `model`, as the models declare them: some have no
    constraint in the database (ledger/models.py, Event.run), so the catalog would miss them."""
    return [
        (rel.related_model._meta.db_table, rel.field.column)
        for rel in model._meta.related_objects
        if rel.one_to_many or rel.one_to_one
    ]
