"""`ledger report RUN [--table]`: usage and cost per step (JSON, or a table)."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.fold import fold
from ledger.fold.pricing import prices_of
from ledger.log.envelopes import log_of
from ledger.reads.report import render_report_table, usage_report

from .common import add_run_arguments, existing_run

NAME = "report"
HELP = "usage and cost per step"


def add_arguments(parser: ArgumentParser) -> None:
    add_run_arguments(parser)
    parser.add_argument("--table", action="store_true", help="a fixed-width table instead of JSON")


def handle(cmd: BaseCommand, *, run: str, workspace: str | None, table: bool, **_: Any) -> None:
    the_run = existing_run(cmd, run, workspace)
    report = usage_report(fold(log_of(the_run), prices=prices_of(the_run), run_id=the_run.run_id))
    if table:
        cmd.stdout.write(render_report_table(report), ending="")
    else:
        cmd.stdout.write(json.dumps(report, indent=2))
