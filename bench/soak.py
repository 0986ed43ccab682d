"""Concurrency soak through `bin/serve` (the multi-process server `make serve` runs): 16 writers on
one run against 16 writers on 16 runs, on one Daphne process and on N; 16 writers batching through
runledger.client; then 16 claimers racing for every tool call of the gateway.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/runledger_bench REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/soak.py [--writers 16] [--seconds 20] [--races 40] [--processes auto] [--keep]

- Writers: each a thread with its own HTTP connection appending one event per request, as a
  harness that sends every fact when it happens. Throughput (events/s) and per-request latency
  p50/p99; afterwards every run is checked dense 1..N with N = what was acknowledged. Measured on
  `bin/serve --processes 1` (the hot run, and the distinct runs) and on `--processes N` (N = cores
  by default: the distinct runs): the N-process figure as a ratio of the one-process one (target
  >= 1.6x on a 2-core machine). The hot run's throughput is reported as a ratio of the distinct
  runs' (one run serializes its appends on its head row: that is the price of a dense sequence).
- Batched writers: each thread a `runledger.client.Client` writing its run with `Run.emit` (the
  outbox sends a batch of `batch_size` events, one POST), flushing every batch, on the N processes.
- The baseline of the distinct-run and batched figures, measured in the same run: the same number
  of threads' raw autocommit single-row INSERTs into a scratch table (target for the batched
  writers: >= 25% of it).
- Gateway (on the N processes): for each of --races tool calls, 16 threads claim the same call
  with the same idempotency key at once; exactly one may get 201 `claimed` and execute (the others
  409 `tool_call_in_progress`), it completes, and then 16 more claims all get the recorded result
  (`idempotentReplay`). Executions per call must be exactly 1.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: import the bench package from the repository root (bench/common.py)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))  # runledger.client

from bench.common import (  # noqa: E402
    REPO_ROOT,
    cleanup,
    libpq_url,
    percentile,
    record,
    require_services,
    setup_django,
)


def start_serve(log_path: Path, processes: int) -> tuple[subprocess.Popen[bytes], str]:
    """`bin/serve --processes N --workers 0` (production settings, as the bench's Django) on a free
    port, and its base URL once every one of its Daphne processes answers."""
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Sixteen writers on one key: the per-key rate limit (console/api/ratelimit.py) lifted.
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "LEDGER_MAX_EVENTS_PER_MINUTE_PER_KEY": "10000000"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "bin/serve", "--processes", str(processes), "--workers", "0", "127.0.0.1", str(port)],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        # Fresh connections, as many at once as there are processes, until all answer together:
        # every process has imported the application, not only the first to accept.
        answers: list[int] = []

        def probe() -> None:
            try:
                answers.append(httpx.get(f"{base}/api/v1/runs/run_probe/stream", timeout=5).status_code)
            except httpx.TransportError:
                pass

        probes = [threading.Thread(target=probe) for _ in range(4 * processes)]
        for t in probes:
            t.start()
        for t in probes:
            t.join()
        if answers.count(401) == len(probes):
            return process, base
        time.sleep(0.5)
    stop(process)
    raise SystemExit(f"bin/serve did not start; see {log_path}")


def server_cpu(process: subprocess.Popen[bytes]) -> float:
    """CPU seconds (user + system) the Daphne processes of a `bin/serve` have used so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for task in Path(f"/proc/{process.pid}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def writers(base: str, key: str, run_ids: list[str], seconds: float) -> tuple[list[int], list[float], int]:
    """Every thread appends one event per request to its run until time is up: acknowledged events
    per thread, latencies (s) and refusals."""
    import httpx

    latencies: list[list[float]] = [[] for _ in run_ids]
    refused = [0] * len(run_ids)
    barrier = threading.Barrier(len(run_ids))

    def work(n: int) -> None:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
            barrier.wait()
            end = time.monotonic() + seconds
            i = 0
            while time.monotonic() < end:
                body = {"events": [{"type": "StepScheduled", "payload": {"stepPath": f"w{n}.{i}"}}]}
                began = time.perf_counter()
                response = http.post(f"/api/v1/runs/{run_ids[n]}/events", json=body)
                if response.status_code == 200:
                    latencies[n].append(time.perf_counter() - began)
                else:
                    refused[n] += 1
                i += 1

    threads = [threading.Thread(target=work, args=(n,)) for n in range(len(run_ids))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [len(per) for per in latencies], [x for per in latencies for x in per], sum(refused)


def batched_writers(base: str, key: str, run_ids: list[str], seconds: float, batch: int) -> tuple[list[int], float]:
    """Every thread a runledger.client Client emitting events to its run, flushing every `batch`
    (one POST of `batch` events): events acknowledged per thread, and the seconds it took from the
    barrier to the last flush."""
    from runledger.client import Client

    counts = [0] * len(run_ids)
    barrier = threading.Barrier(len(run_ids) + 1)
    failures: list[BaseException] = []

    def work(n: int) -> None:
        try:
            with Client(base, key) as client:
                run = client.run(run_ids[n], batch_size=batch, flush_interval=0)
                barrier.wait()
                end = time.monotonic() + seconds
                i = 0
                while time.monotonic() < end:
                    for _ in range(batch):
                        run.emit("StepScheduled", {"stepPath": f"b{n}.{i}"})
                        i += 1
                    counts[n] += len(run.flush())
        except BaseException as exc:  # noqa: BLE001 - reported after the join
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(len(run_ids))]
    for t in threads:
        t.start()
    barrier.wait()
    began = time.monotonic()
    for t in threads:
        t.join()
    if failures:
        raise SystemExit(f"soak: a batched writer failed: {failures[0]!r}")
    return counts, time.monotonic() - began


def raw_inserts(url: str, count: int, seconds: float) -> int:
    """The baseline: `count` threads, each its own autocommit connection, one-row INSERTs for `seconds`."""
    import psycopg

    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_soak_raw")
        conn.execute(
            "CREATE TABLE bench_soak_raw (id bigserial PRIMARY KEY, run text NOT NULL, seq int NOT NULL, "
            "payload text NOT NULL)"
        )
    done = [0] * count
    barrier = threading.Barrier(count)

    def work(n: int) -> None:
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            barrier.wait()
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                conn.execute(
                    "INSERT INTO bench_soak_raw (run, seq, payload) VALUES (%s, %s, %s)",
                    (f"r{n}", done[n], '{"stepPath":"s"}'),
                )
                done[n] += 1

    threads = [threading.Thread(target=work, args=(n,)) for n in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("DROP TABLE bench_soak_raw")
    return sum(done)


def dense(workspace: Any, run_id: str, acknowledged: int) -> bool:
    from django.db.models import Count, Max

    from ledger.models import Event, Run

    run = Run.objects.get(workspace=workspace, run_id=run_id)
    facts = Event.objects.filter(run=run).aggregate(n=Count("id"), top=Max("sequence"))
    return facts["n"] == facts["top"] == run.last_sequence == acknowledged


def gateway_races(base: str, key: str, run_id: str, claimers: int, races: int) -> tuple[Counter[int], list[float], int]:
    """Per call, `claimers` threads claim at once; the one that gets 201 completes it; then every
    claimer claims again and must get the recorded result. Returns the claim answers' codes, claim
    latencies and how many calls did not execute exactly once (or did not replay for everyone)."""
    import httpx

    codes: Counter[int] = Counter()
    latencies: list[float] = []
    wrong = 0
    lock = threading.Lock()
    clients = [
        httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60) for _ in range(claimers)
    ]
    try:
        for race in range(races):
            claim = {
                "callId": f"race-{race}",
                "toolName": "charge_card",
                "args": {"amount": race},
                "idempotencyKey": f"key-{race}",
                "effect": "write",
                "owner": "",
            }
            barrier = threading.Barrier(claimers)
            answers: list[Any] = [None] * claimers

            def contend(n: int, again: bool = False) -> None:
                barrier.wait()
                began = time.perf_counter()
                response = clients[n].post(f"/api/v1/runs/{run_id}/tool-calls", json={**claim, "owner": f"claimer-{n}"})
                took = time.perf_counter() - began
                with lock:
                    codes[response.status_code] += 1
                    latencies.append(took)
                answers[n] = (response.status_code, response.json())

            threads = [threading.Thread(target=contend, args=(n,)) for n in range(claimers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            winners = [
                n for n, (status, body) in enumerate(answers) if status == 201 and body.get("status") == "claimed"
            ]
            if len(winners) != 1:
                wrong += 1
                continue
            winner, token = winners[0], answers[winners[0]][1]["leaseToken"]
            call = f"/api/v1/runs/{run_id}/tool-calls/{claim['callId']}"
            clients[winner].post(f"{call}/outbound", json={"leaseToken": token}).raise_for_status()
            clients[winner].post(
                f"{call}/complete", json={"leaseToken": token, "result": {"charged": race}}
            ).raise_for_status()
            barrier = threading.Barrier(claimers)
            threads = [threading.Thread(target=contend, args=(n, True)) for n in range(claimers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if not all(
                status == 200 and body.get("idempotentReplay") and body.get("result") == {"charged": race}
                for status, body in answers
            ):
                wrong += 1
    finally:
        for c in clients:
            c.close()
    return codes, latencies, wrong


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--races", type=int, default=40)
    parser.add_argument("--processes", default="auto", help="Daphne processes of the N-process phases (auto: cores)")
    parser.add_argument("--batch", type=int, default=100, help="events per POST of the batched writers")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    processes = _cores() if args.processes == "auto" else int(args.processes)
    require_services("bench/soak.py")
    setup_django(production=True)

    from ledger.log import append
    from ledger.tenancy.services import bootstrap, create_key

    url = os.environ["DATABASE_URL"]
    workspace = bootstrap(tenant="bench-soak", workspace=secrets.token_hex(4))
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    w = args.writers
    hot = "run_soak_hot"
    one = [f"run_soak_1p_{n}" for n in range(w)]
    many = [f"run_soak_np_{n}" for n in range(w)]
    batched = [f"run_soak_batch_{n}" for n in range(w)]
    race_run = "run_soak_gateway"
    every = [hot, *one, *many, *batched, race_run, "run_soak_warm"]
    for run_id in every:
        append(
            workspace=workspace,
            run_id=run_id,
            events=[{"type": "RunStarted", "payload": {"workflowVersionId": "wfver_soak"}}],
        )
    log_dir = REPO_ROOT / "var" / "bench"
    log_dir.mkdir(parents=True, exist_ok=True)
    load = [os.getloadavg()[0]]
    server, base = start_serve(log_dir / "soak-serve-1.log", 1)
    try:
        writers(base, key, ["run_soak_warm"] * 2, 1.0)  # the server's first requests are not measured
        hot_counts, hot_lat, hot_refused = writers(base, key, [hot] * w, args.seconds)
        cpu = server_cpu(server)
        one_counts, one_lat, one_refused = writers(base, key, one, args.seconds)
        one_cpu = server_cpu(server) - cpu
    finally:
        stop(server)
    load.append(os.getloadavg()[0])
    server, base_n = start_serve(log_dir / "soak-serve-n.log", processes)
    try:
        writers(base_n, key, ["run_soak_warm"] * (2 * processes), 1.0)
        cpu = server_cpu(server)
        many_counts, many_lat, many_refused = writers(base_n, key, many, args.seconds)
        many_cpu = server_cpu(server) - cpu
        batch_counts, batch_seconds = batched_writers(base_n, key, batched, args.seconds, args.batch)
        load.append(os.getloadavg()[0])
        codes, claim_lat, wrong = gateway_races(base_n, key, race_run, w, args.races)
    finally:
        stop(server)
    raw_n = raw_inserts(url, w, args.seconds)
    load.append(os.getloadavg()[0])
    hot_n, one_n, many_n, batch_n = sum(hot_counts), sum(one_counts), sum(many_counts), sum(batch_counts)
    hot_dense = dense(workspace, hot, 1 + hot_n)
    one_dense = all(dense(workspace, run_id, 1 + n) for run_id, n in zip(one, one_counts))
    many_dense = all(dense(workspace, run_id, 1 + n) for run_id, n in zip(many, many_counts))
    batch_dense = all(dense(workspace, run_id, 1 + n) for run_id, n in zip(batched, batch_counts))
    hot_rate, one_rate, many_rate = hot_n / args.seconds, one_n / args.seconds, many_n / args.seconds
    batch_rate, raw_rate = batch_n / batch_seconds, raw_n / args.seconds
    ms = 1000.0
    loads = " ".join(f"{x:.1f}" for x in load)

    def line(label: str, rate: float, lat: list[float], refused: int, is_dense: bool) -> str:
        return (
            f"  {label:<28} {rate:8.0f} ev/s  p50 {percentile(lat, 50) * ms:6.1f} ms  "
            f"p99 {percentile(lat, 99) * ms:6.1f} ms  refused {refused}  dense {is_dense}"
        )

    print(f"soak: {w} writers, {args.seconds:g} s each phase, bin/serve with 1 and {processes} processes")
    print(line("one run, 1 process:", hot_rate, hot_lat, hot_refused, hot_dense))
    print(line(f"{w} runs, 1 process:", one_rate, one_lat, one_refused, one_dense))
    print(line(f"{w} runs, {processes} processes:", many_rate, many_lat, many_refused, many_dense))
    print(
        f"  {f'{w} runs, client batches of {args.batch}:':<28} {batch_rate:8.0f} ev/s  "
        f"({batch_n} events in {batch_seconds:.1f} s)  dense {batch_dense}"
    )
    print(f"  {'raw INSERTs:':<28} {raw_rate:8.0f} rows/s ({w} autocommit connections)")
    print(
        f"  gateway: {args.races} calls x {w} claimers: answers {dict(codes)}, "
        f"claim p50 {percentile(claim_lat, 50) * ms:.1f} ms p99 {percentile(claim_lat, 99) * ms:.1f} ms, "
        f"calls not executed exactly once: {wrong}"
    )
    print(f"  load average (1 min) at each phase's end: {loads}")
    # The in-run floor of the N-process figure: events/s = cores the servers got / CPU an event.
    cores_one, cores_many = one_cpu / args.seconds, many_cpu / args.seconds
    per_one = one_cpu / one_n * ms if one_n else 0.0
    per_many = many_cpu / many_n * ms if many_n else 0.0
    print(
        f"  Daphne CPU, {w} runs: 1 process {cores_one:.2f} cores, {per_one:.2f} ms an event; "
        f"{processes} processes {cores_many:.2f} cores, {per_many:.2f} ms an event"
    )
    scaling = many_rate / one_rate if one_rate else None
    record(
        f"soak: {w} writers on one run / on {w} runs (API, 1 event/request, 1 process)",
        value=hot_rate,
        unit="ev/s",
        baseline=one_rate,
        ratio=hot_rate / one_rate if one_rate else None,
        target="reported",
        met=None,
        note=f"dense: {hot_dense}; p50 {percentile(hot_lat, 50) * ms:.1f} ms, p99 {percentile(hot_lat, 99) * ms:.1f} ms",
    )
    record(
        f"soak: {w} writers on {w} runs (API, 1 event/request), 1 process / raw autocommit INSERT, {w} connections",
        value=one_rate,
        unit="ev/s",
        baseline=raw_rate,
        ratio=one_rate / raw_rate if raw_rate else None,
        target="reported",
        met=None,
        ratio_format="{:.1%}",
        note=f"dense: {one_dense}; p50 {percentile(one_lat, 50) * ms:.1f} ms, p99 {percentile(one_lat, 99) * ms:.1f} ms",
    )
    record(
        f"soak: {w} writers on {w} runs (API, 1 event/request), {processes} processes / 1 process",
        value=many_rate,
        unit="ev/s",
        baseline=one_rate,
        ratio=scaling,
        target=">= 1.6×",
        met=scaling is not None and scaling >= 1.6,
        note=f"dense: {many_dense}; {many_rate / raw_rate:.1%} of raw; p50 {percentile(many_lat, 50) * ms:.1f} ms, "
        f"p99 {percentile(many_lat, 99) * ms:.1f} ms; Daphne CPU: 1 process {cores_one:.2f} cores "
        f"({per_one:.2f} ms/event), {processes} processes {cores_many:.2f} cores ({per_many:.2f} ms/event); "
        f"load average {loads}",
    )
    record(
        f"soak: {w} writers on {w} runs, runledger.client batches of {args.batch}, {processes} processes / raw INSERT",
        value=batch_rate,
        unit="ev/s",
        baseline=raw_rate,
        ratio=batch_rate / raw_rate if raw_rate else None,
        target=">= 25%",
        met=bool(raw_rate) and batch_rate / raw_rate >= 0.25,
        ratio_format="{:.1%}",
        note=f"dense: {batch_dense}",
    )
    record(
        f"soak: gateway, {w} claimers racing per call ({args.races} calls, {processes} processes): executed exactly once",
        value=args.races - wrong,
        unit="calls",
        baseline=args.races,
        ratio=(args.races - wrong) / args.races,
        target="100%",
        met=wrong == 0,
        ratio_format="{:.0%}",
        note=f"claim p50 {percentile(claim_lat, 50) * ms:.1f} ms, p99 {percentile(claim_lat, 99) * ms:.1f} ms",
    )
    if not args.keep:
        cleanup(workspace, every)
    if not (hot_dense and one_dense and many_dense and batch_dense and wrong == 0):
        raise SystemExit("soak: a run is not dense or a call did not execute exactly once")


if __name__ == "__main__":
    main()
