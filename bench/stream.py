"""Live-stream latency: commit to SSE receipt, against a raw channel-layer round trip.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \
        .venv/bin/python bench/stream.py [--events N] [--gap-ms MS] [--keep]

Starts Daphne (console.asgi:application) on 127.0.0.1 on a free port as a subprocess, opens one
SSE subscriber (httpx, a thread of this process) on a fresh run, then appends N events one by one
through `ledger.log.append` here and measures, per event, the time from its commit returning to the
subscriber having received the whole frame. Both ends read this process's perf_counter.

Baseline, measured in the same run through the same Redis: a `group_send` to a group of one
channel and the `receive` on that channel, back to back in one event loop: the floor for any
announcement, before a reader has read the database or written a byte of HTTP.
See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import threading
import time
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
    percentile,
    record,
    require_services,
    setup_django,
    start_daphne,
    stop,
)

WARMUP = 20


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/stream.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=500, help="measured events (default 500)")
    p.add_argument(
        "--gap-ms",
        type=float,
        default=10.0,
        help="pause between appends, so that each event is measured on its own (default 10)",
    )
    p.add_argument("--keep", action="store_true", help="keep the bench run in the ledger tables")
    args = p.parse_args(argv)
    if args.events < 1 or args.gap_ms < 0:
        p.error("need --events >= 1 and --gap-ms >= 0")
    return args


# --- Daphne -------------------------------------------------------------------------------------


# --- the subscriber -----------------------------------------------------------------------------


class Subscriber(threading.Thread):
    """Reads the stream to its end, noting when each event's frame was complete."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(daemon=True)
        self.url, self.key = url, key
        self.received: dict[int, float] = {}
        self.arrived = threading.Condition()
        self.ended = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        import httpx

        try:
            with (
                httpx.Client(timeout=httpx.Timeout(30.0)) as client,
                client.stream("GET", self.url, headers={"Authorization": f"Bearer {self.key}"}) as response,
            ):
                response.raise_for_status()
                sequence: int | None = None
                event = ""
                for line in response.iter_lines():
                    if line.startswith("id: "):
                        sequence = int(line[4:])
                    elif line.startswith("event: "):
                        event = line[7:]
                    elif line == "":
                        if sequence is not None:
                            moment = time.perf_counter()
                            with self.arrived:
                                self.received[sequence] = moment
                                self.arrived.notify_all()
                        if event == "end":
                            break
                        sequence, event = None, ""
        except BaseException as exc:  # reported by the main thread
            self.error = exc
        finally:
            self.ended.set()
            with self.arrived:
                self.arrived.notify_all()

    def wait_for(self, sequence: int, timeout: float = 30.0) -> None:
        with self.arrived:
            if not self.arrived.wait_for(lambda: sequence in self.received or self.ended.is_set(), timeout):
                raise SystemExit(f"the subscriber did not receive sequence {sequence} within {timeout:g} s")
        if sequence not in self.received:
            raise SystemExit(f"the stream closed before sequence {sequence}: {self.error!r}")


# --- measurements -------------------------------------------------------------------------------


def append_one(workspace: Any, run_id: str, event: dict[str, Any]) -> tuple[int, float]:
    """Append one event; return its sequence and the moment its COMMIT returned.

    on_commit callbacks run in the order they were registered: this one is registered before
    the log's append registers its announcement, so it runs right after COMMIT and before the
    announcement is sent (the log's append' own atomic block becomes a savepoint in this one)."""
    from django.db import transaction

    from ledger.log import append

    committed: list[float] = []
    with transaction.atomic():
        transaction.on_commit(lambda: committed.append(time.perf_counter()))
        result = append(workspace=workspace, run_id=run_id, events=[event])
    return result.last_sequence, committed[0]


def measure_stream(workspace: Any, run_id: str, base: str, key: str, events: int, gap: float) -> list[float]:
    append_one(workspace, run_id, {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_bench"}})
    subscriber = Subscriber(f"{base}/api/v1/runs/{run_id}/stream", key)
    subscriber.start()
    subscriber.wait_for(1)
    commits: dict[int, float] = {}
    for n in range(WARMUP + events):
        sequence, committed = append_one(
            workspace, run_id, {"type": "StepScheduled", "payload": {"stepPath": f"step{n}"}}
        )
        if n >= WARMUP:
            commits[sequence] = committed
        subscriber.wait_for(sequence)
        time.sleep(gap)
    append_one(workspace, run_id, {"type": "RunCompleted", "payload": {}})
    if not subscriber.ended.wait(30) or subscriber.error is not None:
        raise SystemExit(f"the stream did not end: {subscriber.error!r}")
    return [subscriber.received[seq] - committed for seq, committed in commits.items()]


async def measure_layer_round_trip(events: int, gap: float) -> list[float]:
    layer = channel_layer()  # as Daphne's is
    group = f"bench.stream.{secrets.token_hex(4)}"
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    timings: list[float] = []
    try:
        for n in range(WARMUP + events):
            began = time.perf_counter()
            await layer.group_send(group, {"type": "ledger.appended", "runId": "run_x", "sequence": n})
            await layer.receive(channel)
            if n >= WARMUP:
                timings.append(time.perf_counter() - began)
            await asyncio.sleep(gap)
    finally:
        await layer.group_discard(group, channel)
        await close_layer(layer)
    return timings


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    redis_url = require_services("bench/stream.py")
    setup_django(production=True)  # Daphne inherits DEBUG=0 and the SECRET_KEY through the environment

    from django.db import connection

    from ledger.tenancy.services import bootstrap, create_key

    ws_slug = f"stream-{datetime.now(UTC):%Y%m%d%H%M%S}-{os.getpid()}-{secrets.token_hex(3)}"
    workspace = bootstrap(tenant="bench", workspace=ws_slug)
    _, key = create_key(workspace=workspace, scopes=["read"], name="bench/stream.py")
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('server_version'), current_setting('synchronous_commit')")
        version, sync_commit = cur.fetchone()
    gap = args.gap_ms / 1000
    print(f"PostgreSQL {version} (synchronous_commit={sync_commit}), Redis {redis_url}; workspace bench/{ws_slug}")
    print(f"{args.events} events, one per append, {args.gap_ms:g} ms apart, after {WARMUP} warm-up events")

    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-stream-daphne-{os.getpid()}.log"
    process, base = start_daphne(log_path)
    run_id = f"run_bench_stream_{secrets.token_hex(4)}"
    try:
        floor = asyncio.run(measure_layer_round_trip(args.events, gap))
        latencies = measure_stream(workspace, run_id, base, key, args.events, gap)
    finally:
        stop(process)
        if not args.keep:
            cleanup(workspace, [run_id])
    log_path.unlink(missing_ok=True)

    def row(name: str, values: list[float]) -> str:
        ms = [v * 1000 for v in values]
        return (
            f"{name:<44} {percentile(ms, 50):>8.2f} {percentile(ms, 99):>8.2f} "
            f"{statistics.fmean(ms):>8.2f} {max(ms):>8.2f}"
        )

    print(f"\n{'ms':<44} {'p50':>8} {'p99':>8} {'mean':>8} {'max':>8}")
    print(row("commit -> SSE receipt (the log's append, Daphne)", latencies))
    print(row("baseline: group_send -> receive (raw Redis)", floor))
    print(
        f"\nSSE p50 is {percentile(latencies, 50) / percentile(floor, 50):.1f}x the layer round trip; "
        f"p99 {percentile(latencies, 99) / percentile(floor, 99):.1f}x "
        f"(load average {' '.join(f'{v:.2f}' for v in os.getloadavg())})"
    )
    for q in (50, 99):
        value, baseline = percentile(latencies, q) * 1000, percentile(floor, q) * 1000
        record(
            f"commit -> SSE receipt p{q} / group_send -> receive",
            value=value,
            unit="ms",
            baseline=baseline,
            ratio=value / baseline,
            target="",
            met=None,
            ratio_format="{:.1f}x",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
