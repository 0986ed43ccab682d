"""`manage.py ledger …`: the operations of docs/api.md, one subcommand each, each in its own module
of ledger/cli (this command only dispatches)."""

from __future__ import annotations

import os
import sys
from argparse import ArgumentParser
from importlib import import_module
from types import ModuleType
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger.cli import MODULES
from ledger.errors import LedgerError


def _subcommands() -> dict[str, ModuleType]:
    modules = [import_module(f"ledger.cli.{name}") for name in MODULES]
    return {module.NAME: module for module in modules}


class Command(BaseCommand):
    help = "Runledger operations (see docs/api.md, Operations)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        for name, module in _subcommands().items():
            module.add_arguments(sub.add_parser(name, help=module.HELP))

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        try:
            _subcommands()[action].handle(self, **options)
        except LedgerError as exc:
            raise CommandError(exc.message) from exc
        except BrokenPipeError:
            # Whoever read stdout stopped (`ledger events RUN | head`): stop as a Unix tool does, with
            # no traceback, and nothing more written to the closed pipe at exit (Python's own advice).
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
