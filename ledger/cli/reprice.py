"""`ledger reprice [RUN] [--workspace TENANT/WORKSPACE]`: recompute cost entries from the
recorded tokens after a price change: one run, one workspace's runs, or (without either) every
run of every workspace."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.log.projection import reprice

from .common import add_run_arguments, runs_for

NAME = "reprice"
HELP = "recompute cost entries from the recorded tokens after a price change (one run, a workspace's runs, or all)"


def add_arguments(parser: ArgumentParser) -> None:
    add_run_arguments(parser, optional=True, workspace_help="TENANT/WORKSPACE: only its runs (or RUN's workspace)")


def handle(cmd: BaseCommand, *, run: str | None, workspace: str | None, **_: Any) -> None:
    runs, changed = reprice(runs_for(run, workspace))
    cmd.stdout.write(f"repriced {runs} run(s): {changed} cost entr{'y' if changed == 1 else 'ies'} changed")
