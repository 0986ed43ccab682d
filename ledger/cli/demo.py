"""`ledger demo`: bootstrap the demo tenants, users and runs (idempotent)."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger.demo import DEMO_PASSWORD, HISTORY_RUNS, load_demo

NAME = "demo"
MAX_HISTORY_RUNS = 10_000  # a mistyped count would fill the database with made-up runs
HELP = "bootstrap the demo tenants, users and runs (idempotent)"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--history-runs",
        type=int,
        default=None,
        help=f"how many runs to lay out over the last 30 days (default 300, at most {MAX_HISTORY_RUNS:,})",
    )


def handle(cmd: BaseCommand, *, history_runs: int | None = None, **_: Any) -> None:
    if history_runs is not None and not 0 <= history_runs <= MAX_HISTORY_RUNS:
        raise CommandError(f"--history-runs must be from 0 to {MAX_HISTORY_RUNS:,}, got {history_runs}")
    summary = load_demo(history_runs=HISTORY_RUNS if history_runs is None else history_runs)
    cmd.stdout.write(f"demo ready: {summary}")
    cmd.stdout.write(
        f"log in as alice (admin), bob (approver), carol (operator) or dave (viewer), password {DEMO_PASSWORD}"
    )
