"""Concurrency soak: 16 writers on one run against 16 writers on 16 runs, through the API of a live
Daphne, for a fixed time each; then 16 claimers racing for every tool call of the gateway.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/runledger_bench REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/soak.py [--writers 16] [--seconds 20] [--races 40] [--keep]

- Writers: each a thread with its own HTTP connection appending one event per request, as a
  harness that sends every fact when it happens. Throughput (events/s) and per-request latency
  p50/p99; afterwards every run is checked dense 1..N with N = what was acknowledged. The hot run's
  throughput is reported as a ratio of the distinct runs' (one run serializes its appends on its
  head row: that is the price of a dense sequence). The distinct runs' baseline, measured in the
  same run: the same writers' raw autocommit single-row INSERTs into a scratch table.
- Gateway: for each of --races tool calls, 16 threads claim the same call with the same
  idempotency key at once; exactly one may get 201 `claimed` and execute (the others 409
  `tool_call_in_progress`), it completes, and then 16 more claims all get the recorded result
  (`idempotentReplay`). Executions per call must be exactly 1.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: import the bench package from the repository root (bench/common.py)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    REPO_ROOT,
    cleanup,
    libpq_url,
    percentile,
    record,
    require_services,
    setup_django,
    start_daphne,
    stop,
)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--races", type=int, default=40)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    require_services("bench/soak.py")
    setup_django(production=True)
    import os

    from ledger.log import append
    from ledger.tenancy.services import bootstrap, create_key

    url = os.environ["DATABASE_URL"]
    workspace = bootstrap(tenant="bench-soak", workspace=secrets.token_hex(4))
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    hot = "run_soak_hot"
    distinct = [f"run_soak_{n}" for n in range(args.writers)]
    race_run = "run_soak_gateway"
    for run_id in [hot, *distinct, race_run, "run_soak_warm"]:
        append(
            workspace=workspace,
            run_id=run_id,
            events=[{"type": "RunStarted", "payload": {"workflowVersionId": "wfver_soak"}}],
        )
    log_dir = REPO_ROOT / "var" / "bench"
    log_dir.mkdir(parents=True, exist_ok=True)
    daphne, base = start_daphne(log_dir / "soak-daphne.log")
    try:
        writers(base, key, ["run_soak_warm"] * 2, 1.0)  # the server's first requests are not measured
        hot_counts, hot_lat, hot_refused = writers(base, key, [hot] * args.writers, args.seconds)
        spread_counts, spread_lat, spread_refused = writers(base, key, distinct, args.seconds)
        hot_n, spread_n = sum(hot_counts), sum(spread_counts)
        raw_n = raw_inserts(url, args.writers, args.seconds)
        hot_dense = dense(workspace, hot, 1 + hot_n)
        spread_dense = all(dense(workspace, run_id, 1 + n) for run_id, n in zip(distinct, spread_counts))
        codes, claim_lat, wrong = gateway_races(base, key, race_run, args.writers, args.races)
    finally:
        stop(daphne)
    hot_rate, spread_rate, raw_rate = hot_n / args.seconds, spread_n / args.seconds, raw_n / args.seconds
    ms = 1000.0
    print(f"soak: {args.writers} writers, {args.seconds:g} s each phase, Daphne at {base}")
    print(
        f"  one run:       {hot_rate:8.0f} ev/s  p50 {percentile(hot_lat, 50) * ms:6.1f} ms  "
        f"p99 {percentile(hot_lat, 99) * ms:6.1f} ms  refused {hot_refused}  dense {hot_dense}"
    )
    print(
        f"  distinct runs: {spread_rate:8.0f} ev/s  p50 {percentile(spread_lat, 50) * ms:6.1f} ms  "
        f"p99 {percentile(spread_lat, 99) * ms:6.1f} ms  refused {spread_refused}  dense {spread_dense}"
    )
    print(f"  raw INSERTs:   {raw_rate:8.0f} rows/s ({args.writers} autocommit connections)")
    print(
        f"  gateway: {args.races} calls x {args.writers} claimers: answers {dict(codes)}, "
        f"claim p50 {percentile(claim_lat, 50) * ms:.1f} ms p99 {percentile(claim_lat, 99) * ms:.1f} ms, "
        f"calls not executed exactly once: {wrong}"
    )
    w = args.writers
    record(
        f"soak: {w} writers on one run / on {w} runs (API, 1 event/request)",
        value=hot_rate,
        unit="ev/s",
        baseline=spread_rate,
        ratio=hot_rate / spread_rate if spread_rate else None,
        target="reported",
        met=None,
        note=f"dense: {hot_dense}; p50 {percentile(hot_lat, 50) * ms:.1f} ms, p99 {percentile(hot_lat, 99) * ms:.1f} ms",
    )
    record(
        f"soak: {w} writers on {w} runs (API) / raw autocommit INSERT, {w} connections",
        value=spread_rate,
        unit="ev/s",
        baseline=raw_rate,
        ratio=spread_rate / raw_rate if raw_rate else None,
        target="reported",
        met=None,
        ratio_format="{:.1%}",
        note=f"dense: {spread_dense}; p50 {percentile(spread_lat, 50) * ms:.1f} ms, p99 {percentile(spread_lat, 99) * ms:.1f} ms",
    )
    record(
        f"soak: gateway, {w} claimers racing per call ({args.races} calls): executed exactly once",
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
        cleanup(workspace, [hot, *distinct, race_run, "run_soak_warm"])
    if not (hot_dense and spread_dense and wrong == 0):
        raise SystemExit("soak: a run is not dense or a call did not execute exactly once")


if __name__ == "__main__":
    main()
