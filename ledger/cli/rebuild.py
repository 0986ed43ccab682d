"""`ledger rebuild [RUN]`: rebuild projections from the log."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.log.projection import rebuild

from .common import add_run_arguments, runs_for

NAME = "rebuild"
HELP = "rebuild projections of one run or all from the log"


def add_arguments(parser: ArgumentParser) -> None:
    add_run_arguments(parser, optional=True)


def handle(cmd: BaseCommand, *, run: str | None, workspace: str | None, **_: Any) -> None:
    count = 0
    for target in runs_for(run, workspace):
        rebuild(target)
        count += 1
    cmd.stdout.write(f"rebuilt projections of {count} run(s)")
