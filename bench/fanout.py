"""Several Daphne processes on one Redis: WebSocket subscribers of one run served by one process
against the same subscribers split over several.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/runledger_bench REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/fanout.py [--subscribers 50] [--daphnes 2] [--events 60] [--gap-ms 20] [--keep]

It starts --daphnes Daphne processes on the same Redis (as a deployment behind a load balancer
would run them) and measures, for --subscribers WebSocket clients of one run, the time from an
append's COMMIT to each client having the event (bench/console.py's clients and clock): first with
every client on the first Daphne, then with the clients spread evenly over all of them. Each Daphne
gets the announcement through the Redis group of the run and reads the new rows once for its own
subscribers (console/live/run.py's RunFeed), so the second figure shows what a process added to
the pool costs and buys. The baseline, measured in the same run: `group_send` to as many
channel-layer receivers (bench/console.py). See docs/scaling.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: import the bench package from the repository root (bench/common.py)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    cleanup,
    percentile,
    record,
    require_services,
    setup_django,
    start_daphne,
    stop,
)
from bench.console import WARMUP_EVENTS, Board, Subscribers, measure_fanout  # noqa: E402
from bench.stream import append_one  # noqa: E402


def measure(
    workspace: Any, run_id: str, bases: list[str], session: str, subscribers: int, events: int, gap: float
) -> list[float]:
    """Commit-to-message latencies of `subscribers` clients spread evenly over the Daphnes at `bases`."""
    started, _ = append_one(workspace, run_id, {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_bench"}})
    path = f"/ws/runs/{run_id}/?after={started}&workspace={workspace.tenant.slug}/{workspace.slug}"
    shares = [subscribers // len(bases) + (i < subscribers % len(bases)) for i in range(len(bases))]
    boards = [Board() for _ in bases]
    clients = [Subscribers(base, path, session, share, board) for base, share, board in zip(bases, shares, boards)]
    latencies: list[float] = []
    try:
        for n in range(WARMUP_EVENTS + events):
            sequence, committed = append_one(
                workspace, run_id, {"type": "StepScheduled", "payload": {"stepPath": f"s{n}"}}
            )
            arrived = [board.wait_for(sequence, share) for board, share in zip(boards, shares)]
            if n >= WARMUP_EVENTS:
                latencies += [moment - committed for moments in arrived for moment in moments.values()]
            time.sleep(gap)
        append_one(workspace, run_id, {"type": "RunCompleted", "payload": {}})
    finally:
        for c in clients:
            c.close()
    return latencies


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/fanout.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=50, help="WebSocket clients of the run (default 50)")
    parser.add_argument("--daphnes", type=int, default=2, help="Daphne processes for the spread figure (default 2)")
    parser.add_argument("--events", type=int, default=60, help="events measured per configuration (default 60)")
    parser.add_argument("--gap-ms", type=float, default=20.0, help="pause between events (default 20)")
    parser.add_argument("--keep", action="store_true", help="keep the bench data in the ledger tables")
    args = parser.parse_args(argv)
    if args.subscribers < args.daphnes or args.daphnes < 2 or args.events < 1:
        parser.error("need --daphnes >= 2, at least one subscriber per Daphne and --events >= 1")
    redis_url = require_services("bench/fanout.py")
    setup_django(production=True)

    from django.contrib.auth.models import User
    from django.test import Client

    from ledger.tenancy.services import bootstrap, create_user

    stamp = f"{datetime.now(UTC):%Y%m%d%H%M%S}-{os.getpid()}-{secrets.token_hex(3)}"
    workspace = bootstrap(tenant="bench", workspace=f"fanout-{stamp}")
    username = f"bench-fanout-{stamp}"
    create_user(username=username, tenant="bench", role="viewer", password=secrets.token_urlsafe(12))
    client = Client()
    client.force_login(User.objects.get(username=username))
    session = client.cookies["sessionid"].value
    print(
        f"Redis {redis_url}; {args.subscribers} subscribers, {args.events} events {args.gap_ms:g} ms apart; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )

    logs = [
        Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-fanout-daphne-{os.getpid()}-{i}.log"
        for i in range(args.daphnes)
    ]
    daphnes: list[Any] = []
    run_ids: list[str] = []
    try:
        for log in logs:
            daphnes.append(start_daphne(log))
        bases = [base for _, base in daphnes]
        gap = args.gap_ms / 1000
        results = {}
        for label, used in (("1 Daphne", bases[:1]), (f"{args.daphnes} Daphnes", bases)):
            run_ids.append(f"run_bench_fanout_{len(run_ids)}")
            results[label] = measure(workspace, run_ids[-1], used, session, args.subscribers, args.events, gap)
        baseline = asyncio.run(measure_fanout(args.subscribers, args.events, gap))
    finally:
        for process, _ in daphnes:
            stop(process)
        if not args.keep:
            cleanup(workspace, run_ids)
            User.objects.filter(username=username).delete()
    for log in logs:
        log.unlink(missing_ok=True)

    print(f"\n{'commit -> WebSocket message, ms':<44} {'p50':>8} {'p99':>8}")
    base50, base99 = percentile(baseline, 50), percentile(baseline, 99)
    rows = [(f"{args.subscribers} subscribers on {label}", values) for label, values in results.items()]
    for label, values in (*rows, (f"baseline: group_send -> {args.subscribers} receives", baseline)):
        print(f"{label:<44} {percentile(values, 50) * 1000:>8.2f} {percentile(values, 99) * 1000:>8.2f}")
    for label, values in results.items():
        for q, base in ((50, base50), (99, base99)):
            value = percentile(values, q)
            record(
                f"{args.subscribers} WebSocket subscribers on {label}, p{q}",
                value=value * 1000,
                unit="ms",
                baseline=base * 1000,
                ratio=value / base,
                target="(for docs/scaling.md)",
                met=None,
                ratio_format="{:.1f}×",
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
