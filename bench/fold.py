"""Fold benchmark: reading and folding a 10,000-event run against a bare ordered SELECT of its rows.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/runledger_bench .venv/bin/python bench/fold.py \
        [--events N] [--repeat R] [--profile]

Measured in one process against one PostgreSQL, DEBUG off, each the median of --repeat:

  bare SELECT      raw psycopg on its own connection: the run's event rows ORDER BY sequence, fetchall
  read             ledger.log.envelopes.read_envelopes (what log_of returns): plain cursor, orjson
  read, ORM        for comparison: the ORM's Event rows turned into envelopes one by one
  fold             ledger.fold.fold over the run's envelopes (pure, in memory)
  read + fold      log_of then fold: what `ledger rebuild` and `ledger verify` pay per run

Every figure is printed as a ratio to the bare SELECT of the same run. Target (issue 12): fold
<= 2x the bare SELECT. `--profile` adds a cProfile of the fold and of the read.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if not __package__:  # run as a script: import the bench package from the repository root (bench/common.py)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    cleanup,
    libpq_url,
    median_seconds,
    profile,
    record,
    require_postgres,
    setup_django,
)
from bench.ingest import Appender, make_events  # noqa: E402

TARGET_FOLD_VS_SELECT = 2.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/fold.py")
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="then profile one fold and one read")
    args = parser.parse_args(argv)
    url = require_postgres("bench/fold.py")
    setup_django(production=True)

    import psycopg
    from django.conf import settings

    from ledger.fold import fold
    from ledger.fold.pricing import prices_for
    from ledger.log.envelopes import event_envelope, log_of
    from ledger.models import Event, Run
    from ledger.tenancy.services import bootstrap

    workspace = bootstrap(tenant="bench", workspace=f"fold-{time.strftime('%Y%m%d%H%M%S')}-{os.getpid()}")
    appender = Appender(workspace, 500)
    try:
        for append in appender.batched(make_events(args.events, "f")):  # Steps: one call per batch
            append()
        run = Run.objects.get(workspace=workspace, run_id=appender.run_ids[-1])
        prices = prices_for(workspace)
        log = log_of(run)
        assert len(log) == args.events

        def orm_read() -> list[dict[str, object]]:
            return [event_envelope(e, run.run_id) for e in Event.objects.filter(run=run).order_by("sequence")]

        assert orm_read() == log, "the plain-cursor reader and the ORM disagree"

        with psycopg.connect(libpq_url(url)) as conn:

            def bare_select() -> None:
                with conn.cursor() as cur:
                    cur.execute(
                        "SELECT sequence, event_id, type, occurrence_id, recorded_at, payload "
                        "FROM ledger_event WHERE run_id = %s ORDER BY sequence",
                        [run.pk],
                    )
                    assert len(cur.fetchall()) == args.events

            bare_select()  # warm: plan cache, pages in shared buffers
            figures = {"bare SELECT": median_seconds(bare_select, args.repeat)}
            figures["read"] = median_seconds(lambda: log_of(run), args.repeat, warmup=1)
            figures["read, ORM"] = median_seconds(orm_read, args.repeat, warmup=1)
            figures["fold"] = median_seconds(lambda: fold(log, prices=prices), args.repeat, warmup=1)
            figures["read + fold"] = median_seconds(lambda: fold(log_of(run), prices=prices), args.repeat)
            # The baseline once more at the end: the machine's load moves while the others run.
            figures["bare SELECT"] = min(figures["bare SELECT"], median_seconds(bare_select, args.repeat))

        select_s = figures["bare SELECT"]
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(
            f"{args.events} events (model responses and tool calls, alternating), median of {args.repeat}; "
            f"DEBUG={settings.DEBUG}; load average {load}"
        )
        print(f"{'what':<14} {'ms':>9} {'vs bare SELECT':>15}")
        for name, seconds in figures.items():
            print(f"{name:<14} {seconds * 1000:9.1f} {seconds / select_s:14.2f}x")
        ratio = figures["fold"] / select_s
        met = ratio <= TARGET_FOLD_VS_SELECT
        print(
            f"\nTarget: fold <= {TARGET_FOLD_VS_SELECT:.0f}x the bare SELECT: {ratio:.2f}x {'MET' if met else 'NOT MET'}"
        )
        record(
            f"fold of a {args.events}-event run / bare ordered SELECT",
            value=figures["fold"] * 1000,
            unit="ms",
            baseline=select_s * 1000,
            ratio=ratio,
            target=f"<= {TARGET_FOLD_VS_SELECT:.0f}x",
            met=met,
            note=f"read + fold {figures['read + fold'] / select_s:.2f}x; read {figures['read'] / select_s:.2f}x "
            f"(ORM read {figures['read, ORM'] / select_s:.2f}x)",
        )
        if args.profile:
            profile(f"fold of {args.events} events", lambda: fold(log, prices=prices))
            profile(f"read of {args.events} events", lambda: log_of(run))
    finally:
        cleanup(workspace, appender.run_ids)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
