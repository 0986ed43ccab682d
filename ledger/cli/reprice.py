"""`ledger reprice`: recompute cost entries from the recorded tokens after a price change."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.log.projection import reprice
from ledger.reads import selectors

NAME = "reprice"
HELP = "recompute cost entries from the recorded tokens after a price change"


def add_arguments(parser: ArgumentParser) -> None:
    """`ledger reprice` takes no arguments: it reprices every stored cost entry."""


def handle(cmd: BaseCommand, **_: Any) -> None:
    runs, changed = reprice(selectors.all_runs())
    cmd.stdout.write(f"repriced {runs} run(s): {changed} cost entr{'y' if changed == 1 else 'ies'} changed")
