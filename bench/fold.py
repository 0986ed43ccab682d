"""Fold benchmark: folding a 10,000-event run vs a bare ordered SELECT of the same rows.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/fold.py [--events N] [--repeat R]

Both are measured in the same run on the same PostgreSQL:

  bare SELECT      raw psycopg: SELECT the run's event rows ORDER BY sequence, fetchall
  fold             ledger.fold.fold over the run's envelopes (pure, in memory)
  read + fold      ledger.projection.log_of (the ORM read, JSON decoded) then fold: what
                   `ledger rebuild` and `ledger verify` pay per run

Each figure is the median of --repeat runs, printed with its ratio to the bare SELECT.
Target (issue 3): fold <= 2x the bare SELECT.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if not __package__:  # run as a script: import the bench package from the repository root (bench/common.py)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import cleanup, libpq_url, median_seconds, require_postgres, setup_django  # noqa: E402
from bench.ingest import Appender, make_events  # noqa: E402

TARGET_FOLD_VS_SELECT = 2.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/fold.py")
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    url = require_postgres("bench/fold.py")
    setup_django()

    import psycopg

    from ledger.fold import fold
    from ledger.models import Run
    from ledger.projection import log_of, prices_for
    from ledger.tenancy import bootstrap

    workspace = bootstrap(tenant="bench", workspace=f"fold-{time.strftime('%Y%m%d%H%M%S')}")
    appender = Appender(workspace, 500)
    try:
        appender.batched(make_events(args.events, "f"))()
        run = Run.objects.get(workspace=workspace, run_id=appender.run_ids[-1])
        prices = prices_for(workspace)
        log = log_of(run)
        assert len(log) == args.events

        with psycopg.connect(libpq_url(url)) as conn:
            def bare_select() -> None:
                with conn.cursor() as cur:
                    cur.execute(
                        "SELECT sequence, event_id, type, occurrence_id, recorded_at, payload "
                        "FROM ledger_event WHERE run_id = %s ORDER BY sequence", [run.pk])
                    rows = cur.fetchall()
                    assert len(rows) == args.events

            bare_select()  # warm: plan cache, pages in shared buffers
            select_s = median_seconds(bare_select, args.repeat)
        fold_s = median_seconds(lambda: fold(log, prices=prices), args.repeat)
        read_fold_s = median_seconds(lambda: fold(log_of(run), prices=prices), args.repeat)

        print(f"{args.events} events, median of {args.repeat}")
        print(f"{'what':<14} {'ms':>9} {'vs bare SELECT':>15}")
        for name, seconds in (("bare SELECT", select_s), ("fold", fold_s), ("read + fold", read_fold_s)):
            print(f"{name:<14} {seconds * 1000:9.1f} {seconds / select_s:14.2f}x")
        ratio = fold_s / select_s
        print(f"\nTarget: fold <= {TARGET_FOLD_VS_SELECT:.0f}x the bare SELECT: {ratio:.2f}x "
              f"{'MET' if ratio <= TARGET_FOLD_VS_SELECT else 'NOT MET'}")
    finally:
        cleanup(workspace, appender.run_ids)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
