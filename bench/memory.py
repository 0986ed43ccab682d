"""Memory benchmark: peak RSS while one run grows to 1,000,000 events through `ledger.log.append`.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/runledger_bench .venv/bin/python bench/memory.py \
        [--events 1000000] [--batch 500] [--keep]

PostgreSQL only, DEBUG off. Appends `--events` events to one fresh run in batches of `--batch`
(the mix of bench/ingest.py: model responses and tool calls, alternating), generating each batch
just before it is appended, so the bench itself holds one batch at a time. At 10k, 100k and 1M
events (and at the end) it prints the process's peak RSS (VmHWM) and current RSS (VmRSS) from
/proc/self/status, and what the run's folded state, which the append path keeps in the
process-local state cache (ledger.log.states.STATES) between batches, holds by then. The figure:
peak RSS at the last checkpoint / peak RSS at 10k events; target (issue 12): flat.
"""

from __future__ import annotations

import argparse
import gc
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: import the bench package from the repository root (bench/common.py)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import cleanup, record, require_postgres, setup_django  # noqa: E402
from bench.ingest import make_events  # noqa: E402

CHECKPOINTS = (10_000, 100_000, 1_000_000)
TARGET_GROWTH = 1.5  # "flat": what one run's 1M events may add to the process at 10k, at most


def status_mb(field: str) -> float:
    """A memory line of /proc/self/status (VmHWM: peak resident set, VmRSS: resident now), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"/proc/self/status has no {field}: this bench reads Linux's figures")


def batches(total: int, size: int) -> Any:
    """The run's events, one batch at a time, never all of them at once (the mix of make_events)."""
    yield make_events(min(size, total), "m0")
    for number, start in enumerate(range(size, total, size), 1):
        # make_events starts every list with RunStarted: drop it; the tag keeps call ids unique.
        yield make_events(min(size, total - start) + 1, f"m{number}-")[1:]


def held_by_the_state(workspace_pk: int, run_id: str) -> str:
    from ledger.log.states import STATES, AppendState

    entry = STATES._states.get((workspace_pk, run_id))
    if entry is None:
        return "not cached"
    state = entry.state
    kind = "compacted, " if isinstance(state, AppendState) else ""
    return (
        f"{kind}{len(state.model_calls)} model calls, {len(state.tool_calls)} tool calls, "
        f"{len(state.cost_entries)} cost entries, {len(state.steps)} steps; the cache {STATES.held:,} records"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/memory.py")
    parser.add_argument("--events", type=int, default=CHECKPOINTS[-1])
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--keep", action="store_true", help="keep the run (default: delete it)")
    args = parser.parse_args(argv)
    require_postgres("bench/memory.py")
    # The run grows past the default limit a run may hold (an operator's setting,
    # docs/operations.md), raised here so that the bench can write it.
    os.environ.setdefault("LEDGER_MAX_EVENTS_PER_RUN", str(max(args.events, 1) + 10))
    setup_django(production=True)

    from django.conf import settings

    from ledger.log import append
    from ledger.tenancy.services import bootstrap

    workspace = bootstrap(tenant="bench", workspace=f"memory-{time.strftime('%Y%m%d%H%M%S')}-{os.getpid()}")
    run_id = f"run_bench_{secrets.token_hex(8)}"
    checkpoints = sorted({c for c in CHECKPOINTS if c < args.events} | {args.events})
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"{args.events} events into one run in batches of {args.batch}; DEBUG={settings.DEBUG}; "
        f"load average {load}; before the first append: peak RSS {status_mb('VmHWM'):.0f} MB"
    )
    print(f"{'events':>9} {'peak RSS MB':>12} {'RSS MB':>8} {'ev/s':>7}  the run's cached state holds")
    peaks: dict[int, float] = {}
    try:
        appended, started = 0, time.perf_counter()
        for batch in batches(args.events, args.batch):
            append(workspace=workspace, run_id=run_id, events=batch)
            appended += len(batch)
            if appended in checkpoints:
                gc.collect()
                peaks[appended] = status_mb("VmHWM")
                rate = appended / (time.perf_counter() - started)
                print(
                    f"{appended:>9} {peaks[appended]:>12.0f} {status_mb('VmRSS'):>8.0f} {rate:>7.0f}  "
                    f"{held_by_the_state(workspace.pk, run_id)}",
                    flush=True,
                )
        first, last = peaks[checkpoints[0]], peaks[checkpoints[-1]]
        ratio = last / first
        met = ratio <= TARGET_GROWTH
        print(
            f"\npeak RSS at {checkpoints[-1]} events / at {checkpoints[0]}: {ratio:.2f}x "
            f"(target: flat, <= {TARGET_GROWTH}x) {'MET' if met else 'NOT MET'}"
        )
        record(
            f"peak RSS, one run of {checkpoints[-1]} events / at {checkpoints[0]}",
            value=last,
            unit="MB",
            baseline=first,
            ratio=ratio,
            target=f"<= {TARGET_GROWTH}x (flat)",
            met=met,
        )
    finally:
        if not args.keep:
            cleanup(workspace, [run_id])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
