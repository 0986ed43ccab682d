"""Export benchmark: peak RSS of the server and of the command line while they export 10,000 and
then 1,000,000 events (issue 16: "Export of 1 million events streams in constant memory").

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/runledger_bench .venv/bin/python bench/export.py \
        [--events 1000000] [--per-run 10000] [--batch 500] [--keep | --reuse bench/export-…]

PostgreSQL only, DEBUG off. Writes `--events` events through `ledger.log.append` (the mix of
bench/ingest.py) into runs of `--per-run` events in a fresh workspace, then, for 10k events (one
run, `?runId=`) and for all of them (the workspace):

- **API**: a fresh Daphne serves `GET /api/v1/export/events` (JSONL) to an httpx client that reads
  the stream and counts the rows; then Daphne's peak RSS (VmHWM in /proc/<pid>/status).
- **CLI**: a fresh process runs `ledger export events … -o /dev/null`; then its peak RSS.

`--keep` leaves the workspace and its runs in place (the fill takes about 8 minutes a million
events on the loaded machine); `--reuse bench/SLUG` measures such a workspace again without filling
it (and keeps it). Each measurement is its own process, so a peak is the export's and not the fill's. The figures:
peak RSS at 1M / at 10k, for each; target: flat (<= 1.2x). Rows per second are printed alongside.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

if not __package__:  # run as a script: import the bench package from the repository root (bench/common.py)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO_ROOT, cleanup, record, require_postgres, setup_django, start_daphne, stop  # noqa: E402
from bench.ingest import make_events  # noqa: E402

TARGET_GROWTH = 1.2
LOG_DIR = REPO_ROOT / "var" / "bench"


def peak_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("/proc/<pid>/status has no VmHWM: this bench reads Linux's figures")


def fill(workspace: object, runs: int, per_run: int, batch: int) -> list[str]:
    from ledger.log import append

    run_ids = []
    started = time.perf_counter()
    for number in range(runs):
        run_id = f"run_export_{number}"
        run_ids.append(run_id)
        events = make_events(per_run, f"r{number}-")
        for start in range(0, per_run, batch):
            append(workspace=workspace, run_id=run_id, events=events[start : start + batch])  # type: ignore[arg-type]
        if (number + 1) % 10 == 0 or number + 1 == runs:
            done = (number + 1) * per_run
            print(f"  filled {done:,} events ({done / (time.perf_counter() - started):,.0f} ev/s)", flush=True)
    return run_ids


def rows_of(text_lines: int) -> int:
    return text_lines - 2  # the header and the end marker


def through_api(key: str, query: str) -> tuple[int, float, float]:
    """(rows, seconds, Daphne's peak RSS MB) of one export through a fresh Daphne."""
    import httpx

    LOG_DIR.mkdir(parents=True, exist_ok=True)
    process, base = start_daphne(LOG_DIR / "export-daphne.log")
    try:
        lines = 0
        started = time.perf_counter()
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=600) as client:
            with client.stream("GET", f"/api/v1/export/events{query}") as response:
                if response.status_code != 200:
                    raise SystemExit(f"export answered {response.status_code}: {response.read()[:500]!r}")
                for chunk in response.iter_bytes():
                    lines += chunk.count(b"\n")
        return rows_of(lines), time.perf_counter() - started, peak_mb(process.pid)
    finally:
        stop(process)


def through_cli(workspace: str, run_id: str | None) -> tuple[float, float]:
    """(seconds, peak RSS MB) of `ledger export events` in a fresh process."""
    args = [sys.executable, str(Path(__file__).resolve()), "--child", workspace] + ([run_id] if run_id else [])
    started = time.perf_counter()
    done = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"ledger export failed:\n{done.stdout}{done.stderr}")
    return time.perf_counter() - started, float(done.stdout.strip().splitlines()[-1])


def child(workspace: str, run_id: str | None) -> int:
    """The command line's export in this process (the parent reads its peak RSS from stdout)."""
    setup_django(production=True)
    from django.core.management import call_command

    call_command(
        "ledger",
        "export",
        "events",
        "--workspace",
        workspace,
        *(["--run", run_id] if run_id else []),
        "--output",
        os.devnull,
    )
    print(f"{peak_mb():.1f}")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        return child(argv[1], argv[2] if len(argv) > 2 else None)
    parser = argparse.ArgumentParser(prog="bench/export.py")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--per-run", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--keep", action="store_true", help="keep the runs (default: delete them)")
    parser.add_argument("--reuse", metavar="bench/SLUG", help="a kept workspace to measure again, unfilled")
    args = parser.parse_args(argv)
    require_postgres("bench/export.py")
    setup_django(production=True)

    from ledger.models import Run
    from ledger.tenancy.access import workspace_by_path
    from ledger.tenancy.services import bootstrap, create_key

    runs = max(1, args.events // args.per_run)
    if args.reuse:
        workspace = workspace_by_path(args.reuse)
        kept = list(Run.objects.filter(workspace=workspace).order_by("pk").values_list("run_id", "last_sequence"))
        runs, args.per_run = len(kept), kept[0][1]
        if any(last != args.per_run for _, last in kept):
            raise SystemExit(f"{args.reuse}: its runs are not all of {args.per_run} events")
    else:
        workspace = bootstrap(tenant="bench", workspace=f"export-{time.strftime('%Y%m%d%H%M%S')}-{os.getpid()}")
    path = f"bench/{workspace.slug}"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{runs * args.per_run:,} events in {runs} runs of {args.per_run:,} ({path}); load average {load}")
    run_ids: list[str] = []
    try:
        run_ids = [r for r, _ in kept] if args.reuse else fill(workspace, runs, args.per_run, args.batch)
        _, key = create_key(workspace=workspace, scopes=["read"], name="bench/export.py")
        total = runs * args.per_run
        print(f"\n{'export':<22} {'rows':>10} {'s':>7} {'rows/s':>9} {'peak RSS MB':>12}")
        figures: dict[str, dict[str, float]] = {"API": {}, "CLI": {}}
        for label, run_id, expected in (("10k", run_ids[0], args.per_run), ("all", None, total)):
            rows, seconds, peak = through_api(key, f"?runId={run_id}" if run_id else "")
            if rows != expected:
                raise SystemExit(f"the API export held {rows} rows, expected {expected}")
            figures["API"][label] = peak
            print(
                f"{'API (Daphne) ' + label:<22} {rows:>10,} {seconds:>7.1f} {rows / seconds:>9,.0f} {peak:>12.0f}",
                flush=True,
            )
            seconds, peak = through_cli(path, run_id)
            figures["CLI"][label] = peak
            print(
                f"{'ledger export ' + label:<22} {expected:>10,} {seconds:>7.1f} {expected / seconds:>9,.0f} "
                f"{peak:>12.0f}",
                flush=True,
            )
        print()
        for how, peaks in figures.items():
            ratio = peaks["all"] / peaks["10k"]
            met = ratio <= TARGET_GROWTH
            print(
                f"{how}: peak RSS exporting {total:,} events / exporting {args.per_run:,}: {ratio:.2f}x "
                f"(target: flat, <= {TARGET_GROWTH}x) {'MET' if met else 'NOT MET'}"
            )
            record(
                f"peak RSS, {how} export of {total} events / of {args.per_run}",
                value=peaks["all"],
                unit="MB",
                baseline=peaks["10k"],
                ratio=ratio,
                target=f"<= {TARGET_GROWTH}x (flat)",
                met=met,
            )
    finally:
        if not (args.keep or args.reuse):
            cleanup(workspace, run_ids)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
