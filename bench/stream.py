"""Live-stream latency: commit to SSE receipt, against a raw channel-layer round trip.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \
        .venv/bin/python bench/stream.py [--events N] [--gap-ms MS] [--keep]

Starts Daphne (console.asgi:application) on 127.0.0.1 on a free port as a subprocess, opens one
SSE subscriber (httpx, a thread of this process) on a fresh run, then appends N events one by one
through `append_events` here and measures, per event, the time from its commit returning to the
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
import socket
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
WARMUP = 20


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/stream.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=500, help="measured events (default 500)")
    p.add_argument("--gap-ms", type=float, default=10.0,
                   help="pause between appends, so that each event is measured on its own (default 10)")
    p.add_argument("--keep", action="store_true", help="keep the bench run in the ledger tables")
    args = p.parse_args(argv)
    if args.events < 1 or args.gap_ms < 0:
        p.error("need --events >= 1 and --gap-ms >= 0")
    return args


def require_services() -> str:
    url, redis_url = os.environ.get("DATABASE_URL", ""), os.environ.get("REDIS_URL", "")
    if not url.startswith(("postgres://", "postgresql://")) or not redis_url.startswith(("redis://", "rediss://")):
        sys.stderr.write(
            "bench/stream.py measures PostgreSQL + Redis: set both, e.g.\n"
            "  DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 "
            ".venv/bin/python bench/stream.py\n"
        )
        raise SystemExit(2)
    return redis_url


def setup_django() -> None:
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


# --- Daphne -------------------------------------------------------------------------------------


def start_daphne(log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    for _ in range(3):  # the free port may be taken between probing and binding it
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [str(Path(sys.executable).parent / "daphne"), "-b", "127.0.0.1", "-p", str(port),
                 "console.asgi:application"],
                cwd=REPO_ROOT, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT,
            )
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(f"{base}/api/v1/runs/run_probe/stream", timeout=1).status_code == 401:
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
            with httpx.Client(timeout=httpx.Timeout(30.0)) as client, client.stream(
                "GET", self.url, headers={"Authorization": f"Bearer {self.key}"}
            ) as response:
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
    append_events registers its announcement, so it runs right after COMMIT and before the
    announcement is sent (append_events' own atomic block becomes a savepoint in this one)."""
    from django.db import transaction

    from ledger.append import append_events

    committed: list[float] = []
    with transaction.atomic():
        transaction.on_commit(lambda: committed.append(time.perf_counter()))
        result = append_events(workspace=workspace, run_id=run_id, events=[event])
    return result.last_sequence, committed[0]


def measure_stream(workspace: Any, run_id: str, base: str, key: str, events: int, gap: float) -> list[float]:
    append_one(workspace, run_id, {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_bench"}})
    subscriber = Subscriber(f"{base}/api/v1/runs/{run_id}/stream", key)
    subscriber.start()
    subscriber.wait_for(1)
    commits: dict[int, float] = {}
    for n in range(WARMUP + events):
        sequence, committed = append_one(
            workspace, run_id, {"type": "StepScheduled", "payload": {"stepPath": f"step{n}"}})
        if n >= WARMUP:
            commits[sequence] = committed
        subscriber.wait_for(sequence)
        time.sleep(gap)
    append_one(workspace, run_id, {"type": "RunCompleted", "payload": {}})
    if not subscriber.ended.wait(30) or subscriber.error is not None:
        raise SystemExit(f"the stream did not end: {subscriber.error!r}")
    return [subscriber.received[seq] - committed for seq, committed in commits.items()]


async def measure_layer_round_trip(redis_url: str, events: int, gap: float) -> list[float]:
    from channels_redis.core import RedisChannelLayer

    layer = RedisChannelLayer(hosts=[redis_url])
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
        await layer.close_pools()
    return timings


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    redis_url = require_services()
    setup_django()

    from django.db import connection

    from bench.ingest import cleanup
    from ledger.tenancy import bootstrap, create_key

    ws_slug = f"stream-{datetime.now(timezone.utc):%Y%m%d%H%M%S}-{os.getpid()}-{secrets.token_hex(3)}"
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
        floor = asyncio.run(measure_layer_round_trip(redis_url, args.events, gap))
        latencies = measure_stream(workspace, run_id, base, key, args.events, gap)
    finally:
        stop(process)
        if not args.keep:
            cleanup(workspace, [run_id])
    log_path.unlink(missing_ok=True)

    def row(name: str, values: list[float]) -> str:
        ms = [v * 1000 for v in values]
        return (f"{name:<44} {percentile(ms, 50):>8.2f} {percentile(ms, 99):>8.2f} "
                f"{statistics.fmean(ms):>8.2f} {max(ms):>8.2f}")

    print(f"\n{'ms':<44} {'p50':>8} {'p99':>8} {'mean':>8} {'max':>8}")
    print(row("commit -> SSE receipt (append_events, Daphne)", latencies))
    print(row("baseline: group_send -> receive (raw Redis)", floor))
    print(f"\nSSE p50 is {percentile(latencies, 50) / percentile(floor, 50):.1f}x the layer round trip; "
          f"p99 {percentile(latencies, 99) / percentile(floor, 99):.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
