"""Parallel groups: a group of 8 branches whose tools each sleep 200 ms, run by our runtime with
its branches concurrent (max_concurrency=8) and one after another (max_concurrency=1).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/runledger_bench .venv/bin/python bench/parallel.py \\
        [--branches 8] [--sleep-ms 200] [--repeat 3] [--keep]

Without DATABASE_URL it runs on the embedded SQLite default (var/runledger.sqlite3), which the
concurrent branches must keep working on too. Each configuration runs once unmeasured, then
--repeat times, interleaved; the figure is the median wall time of a whole run (RunStarted to
RunCompleted: the group, plus a code step after it), and the floor is branches x sleep. Issue 15
asks for "well under 8 x 200 ms"; tests/test_runtime_parallel.py asserts the concurrency itself
(a barrier all eight tools must reach together), this script only measures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: import the bench package from the repository root (bench/common.py)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import cleanup, record, setup_django  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/parallel.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--branches", type=int, default=8, help="branches of the group (default 8)")
    p.add_argument("--sleep-ms", type=int, default=200, help="how long each branch's tool sleeps (default 200)")
    p.add_argument("--repeat", type=int, default=3, help="measured runs per configuration (default 3)")
    p.add_argument("--keep", action="store_true", help="keep the bench runs (default: delete them)")
    args = p.parse_args(argv)
    if args.branches < 1 or args.sleep_ms < 0 or args.repeat < 1:
        p.error("need --branches >= 1, --sleep-ms >= 0 and --repeat >= 1")
    return args


def workflow(branches: int, sleep_s: float, concurrency: int) -> Any:
    from ledger.runtime.registry import CodeRun, Parallel, Tool, ToolCall, Workflow

    def slow(args: Any) -> dict[str, Any]:
        time.sleep(sleep_s)
        return {"item": args["item"]}

    return Workflow(
        name=f"bench_parallel_{branches}_{concurrency}",
        steps=(
            Parallel(
                "fan",
                lambda i, o: [{"item": n} for n in range(branches)],
                ToolCall("slow", "slow", lambda item, o: item),
                max_branches=max(16, branches),
                max_concurrency=concurrency,
            ),
            CodeRun("count", lambda i, o: len(o["fan"])),
        ),
        tools={"slow": Tool("slow", slow, effect="read", timeout_s=60)},
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    setup_django(production=True)
    from django.conf import settings
    from django.db import connection

    from ledger.runtime.executor import new_run_id, start_run
    from ledger.tenancy.services import bootstrap

    workspace = bootstrap(tenant="bench", workspace=f"parallel-{datetime.now(UTC):%Y%m%d%H%M%S}-{os.getpid()}")
    sleep_s = args.sleep_ms / 1000
    configs = {"concurrent": min(args.branches, settings.RUNLEDGER_PARALLEL_THREADS), "one by one": 1}
    flows = {label: workflow(args.branches, sleep_s, n) for label, n in configs.items()}
    run_ids: list[str] = []
    seconds: dict[str, list[float]] = {label: [] for label in configs}

    def run(label: str) -> float:
        run_id = new_run_id()
        run_ids.append(run_id)
        began = time.perf_counter()
        outcome = start_run(workspace=workspace, workflow=flows[label], input={}, run_id=run_id)
        took = time.perf_counter() - began
        assert outcome.status == "completed" and outcome.output == args.branches, outcome
        return took

    print(
        f"{connection.vendor}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; "
        f"RUNLEDGER_PARALLEL_THREADS={settings.RUNLEDGER_PARALLEL_THREADS}; "
        "load average %.2f %.2f %.2f" % os.getloadavg()
    )
    try:
        for label in configs:
            run(label)  # warm-up
        for _ in range(args.repeat):
            for label in configs:
                seconds[label].append(run(label))
    finally:
        if not args.keep and connection.vendor == "postgresql":  # cleanup() speaks PostgreSQL
            cleanup(workspace, run_ids)
    floor = args.branches * sleep_s
    print(
        f"\n{args.branches} branches, each tool sleeping {args.sleep_ms} ms (one after another: {floor * 1000:.0f} ms)"
    )
    print(f"{'configuration':<16}{'threads':>8}{'median ms':>12}{'of the serial floor':>22}")
    for label, n in configs.items():
        median = statistics.median(seconds[label])
        print(f"{label:<16}{n:>8}{median * 1000:>12.0f}{median / floor if floor else 0:>21.2f}x")
    concurrent, serial = (statistics.median(seconds[label]) * 1000 for label in configs)
    record(
        f"parallel group, {args.branches} branches x {args.sleep_ms} ms tool: run wall time",
        value=concurrent,
        unit="ms",
        baseline=serial,
        ratio=concurrent / serial,
        target="<= 0.5x one branch at a time",
        met=concurrent / serial <= 0.5,
        note=f"{configs['concurrent']} threads; the serial floor is {floor * 1000:.0f} ms",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
