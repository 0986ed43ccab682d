"""`make bench`: every benchmark against PostgreSQL (and Redis), one table of their figures.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/runledger_bench REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/all.py [--only NAME,...] [--out bench/results.md]

Each bench runs as its own process with DEBUG off, in the order below, its output in
var/bench/<name>.log; each records its figures (bench.common.record) into one results file, and
this script writes them as one table, figure | value | baseline | ratio | target | met?, to stdout
and to bench/results.md, with the date, the commit and the machine's load average. Every ratio is
to a baseline measured in the same bench process. It never starts PostgreSQL or Redis: when either
is not configured or does not answer, it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: import the bench package from the repository root (bench/common.py)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import POSTGRES_SCHEMES, REPO_ROOT, libpq_url  # noqa: E402

LOG_DIR = REPO_ROOT / "var" / "bench"
BENCH_TIMEOUT_S = 20 * 60


@dataclass(frozen=True)
class Bench:
    name: str
    args: tuple[str, ...] = ()
    # Why the runner's arguments differ from the script's defaults (shown under the table).
    shortened: str = ""
    path: str = ""  # a script outside bench/

    @property
    def script(self) -> Path:
        return REPO_ROOT / (self.path or f"bench/{self.name}.py")


BENCHES = (
    Bench("ingest"),
    Bench("fold"),
    Bench("memory", ("--events", "200000"), "200,000 events instead of 1,000,000"),
    Bench("runtime", ("--calls", "200", "--repeat", "3")),
    Bench("parallel"),
    Bench("reexec", ("--repeat", "3"), "3 repeats instead of 5"),
    Bench("evaluation"),
    Bench("stream"),
    Bench("console", ("--repeats", "9"), "9 page repeats instead of 15"),
    Bench("fanout", ("--events", "40"), "40 events instead of 60"),
    Bench("soak"),
    Bench(
        "crash",
        ("--short",),
        "the short form: 12 Daphne kills, 3 PostgreSQL crashes (make crash: 100 and 10)",
        path="reliability/crash.py",
    ),
    Bench("scale"),
    Bench("export", ("--events", "200000"), "200,000 events instead of 1,000,000"),
)


@dataclass
class Outcome:
    bench: Bench
    status: str  # ok | failed (exit N) | timed out | not found
    seconds: float
    load: float  # 1-minute load average when it started
    figures: list[dict[str, Any]] = field(default_factory=list)


# --- the services -------------------------------------------------------------------------------


def require_reachable() -> tuple[str, str]:
    """DATABASE_URL and REDIS_URL, both configured and answering; otherwise say which and exit 2."""
    url, redis_url = os.environ.get("DATABASE_URL", ""), os.environ.get("REDIS_URL", "")
    example = (
        "  DATABASE_URL=postgres://postgres@127.0.0.1:5432/runledger_bench "
        "REDIS_URL=redis://127.0.0.1:6379/0 make bench\n"
        "(a scratch database: the benches migrate it and write into it; make bench never starts "
        "PostgreSQL or Redis itself)\n"
    )
    if not url.startswith(POSTGRES_SCHEMES) or not redis_url.startswith(("redis://", "rediss://")):
        sys.stderr.write("make bench measures PostgreSQL and Redis: set DATABASE_URL and REDIS_URL, e.g.\n" + example)
        raise SystemExit(2)
    problem = _postgres_problem(url) or _redis_problem(redis_url)
    if problem:
        sys.stderr.write(f"make bench: {problem}\n" + example)
        raise SystemExit(2)
    return url, redis_url


def _postgres_problem(url: str) -> str:
    import psycopg

    try:
        with psycopg.connect(libpq_url(url), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"PostgreSQL at DATABASE_URL does not answer: {str(exc).strip().splitlines()[0]}"
    return ""


def _redis_problem(url: str) -> str:
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3).ping()
    except redis.RedisError as exc:
        return f"Redis at REDIS_URL does not answer: {exc}"
    return ""


# --- running ------------------------------------------------------------------------------------


def run(bench: Bench, results: Path) -> Outcome:
    """One bench in its own process, its output in var/bench/<name>.log, its figures from `results`."""
    load = os.getloadavg()[0]
    if not bench.script.exists():
        return Outcome(bench, "not found", 0.0, load)
    env = {
        **os.environ,
        "DEBUG": "0",
        "SECRET_KEY": "bench-" + secrets.token_hex(16),
        "BENCH_RESULTS": str(results),
        "PYTHONUNBUFFERED": "1",
    }
    log = LOG_DIR / f"{bench.name}.log"
    began = time.monotonic()
    print(f"{bench.name:<8} ({' '.join(bench.args) or 'defaults'}) ...", end=" ", flush=True)
    with log.open("wb") as out:
        try:
            code = subprocess.run(
                [sys.executable, str(bench.script), *bench.args],
                cwd=REPO_ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=BENCH_TIMEOUT_S,
            ).returncode
            status = "ok" if code == 0 else f"failed (exit {code})"
        except subprocess.TimeoutExpired:
            status = f"timed out after {BENCH_TIMEOUT_S // 60} min"
    seconds = time.monotonic() - began
    print(f"{status}, {seconds:.0f} s (log: {log.relative_to(REPO_ROOT)})", flush=True)
    return Outcome(bench, status, seconds, load)


def collect(outcomes: list[Outcome], results: Path) -> None:
    lines = results.read_text(encoding="utf-8").splitlines() if results.exists() else []
    by_name = {o.bench.name: o for o in outcomes}
    for line in lines:
        figure = json.loads(line)
        if figure["bench"] in by_name:
            by_name[figure["bench"]].figures.append(figure)


# --- the table ----------------------------------------------------------------------------------


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return ""
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}" if abs(value) >= 1 else f"{value:.3f}"
    return f"{text} {unit}".rstrip()


def _met(met: bool | None) -> str:
    return "" if met is None else "yes" if met else "**no**"


def render(
    outcomes: list[Outcome], *, started: datetime, loads: tuple[float, float], server: str, commit: str, total_s: float
) -> str:
    met = [f["met"] for o in outcomes for f in o.figures if f["met"] is not None]
    lines = [
        "# Benchmark results (`make bench`)",
        "",
        f"{started:%Y-%m-%d %H:%M} UTC, commit {commit}, {server}, {os.cpu_count()} cores; "
        f"load average {loads[0]:.2f} at the start, {loads[1]:.2f} at the end; DEBUG off; "
        f"{total_s / 60:.1f} min in all. {sum(met)} of {len(met)} targets met.",
        "",
        "Each ratio is to a baseline measured in the same bench process, seconds apart (see bench/README.md "
        "for what each bench does); absolute values move with the machine's load, the ratios much less.",
        "",
        "| bench | figure | value | baseline | ratio | target | met? |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for o in outcomes:
        for f in o.figures:
            lines.append(
                f"| {o.bench.name} | {f['figure']} | {_number(f['value'], f['unit'])} | "
                f"{_number(f['baseline'], f['unit'])} | {f['ratio_text']} | {f['target']} | {_met(f['met'])} |"
            )
        if not o.figures:
            lines.append(f"| {o.bench.name} | (no figure recorded: {o.status}) | | | | | |")
    lines += ["", "| bench | arguments | status | took | load at its start |", "|---|---|---|---:|---:|"]
    for o in outcomes:
        args = " ".join(o.bench.args) or "defaults"
        if o.bench.shortened:
            args += f" ({o.bench.shortened})"
        lines.append(f"| {o.bench.name} | {args} | {o.status} | {o.seconds:.0f} s | {o.load:.2f} |")
    notes = [f"- {o.bench.name}: {f['figure']}: {f['note']}" for o in outcomes for f in o.figures if f.get("note")]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines) + "\n"


def _server(url: str) -> str:
    import psycopg

    with psycopg.connect(libpq_url(url)) as conn:
        version = conn.execute("SHOW server_version").fetchone()
    return f"PostgreSQL {version[0].split()[0] if version else '?'}"


def _commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    return head.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/all.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only", help="comma-separated bench names (default: all of " + ", ".join(b.name for b in BENCHES) + ")"
    )
    parser.add_argument("--out", default=str(REPO_ROOT / "bench" / "results.md"), help="where the table goes")
    args = parser.parse_args(argv)
    wanted = set(args.only.split(",")) if args.only else {b.name for b in BENCHES}
    unknown = wanted - {b.name for b in BENCHES}
    if unknown:
        parser.error(f"unknown bench(es): {', '.join(sorted(unknown))}")
    url, _ = require_reachable()

    LOG_DIR.mkdir(parents=True, exist_ok=True)
    results = LOG_DIR / f"results-{os.getpid()}.jsonl"
    results.unlink(missing_ok=True)
    started, began, load_before = datetime.now(UTC), time.monotonic(), os.getloadavg()[0]
    outcomes = [run(bench, results) for bench in BENCHES if bench.name in wanted]
    collect(outcomes, results)
    results.unlink(missing_ok=True)
    table = render(
        outcomes,
        started=started,
        loads=(load_before, os.getloadavg()[0]),
        server=_server(url),
        commit=_commit(),
        total_s=time.monotonic() - began,
    )
    print("\n" + table, end="")
    Path(args.out).write_text(table, encoding="utf-8")
    print(f"\nwritten to {args.out}")
    return 0 if all(o.status == "ok" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
