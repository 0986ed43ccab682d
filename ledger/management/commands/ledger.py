"""`manage.py ledger …`: the operations of docs/api.md, one subcommand each, each in its own module
of ledger/cli (this command only dispatches)."""

from __future__ import annotations

import os
import sys
from argparse import ArgumentParser, _SubParsersAction
from collections.abc import Iterator
from importlib import import_module
from types import ModuleType
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger.cli import MODULES
from ledger.errors import LedgerError

# Options that name files: a path on Linux may be any bytes (Python hands the ones that are not
# UTF-8 over as lone surrogates), and the file system takes them back as they came.
PATHS = frozenset({"directory", "export_file", "bundle_file", "output", "junit", "json_out"})


def _labels(parser: ArgumentParser) -> Iterator[tuple[str, str]]:
    """(dest, how the operator typed it) for each argument of `parser` and of its sub-parsers."""
    for action in parser._actions:
        if isinstance(action, _SubParsersAction):
            for sub in action.choices.values():
                yield from _labels(sub)
        elif action.option_strings:
            yield action.dest, action.option_strings[-1]
        else:  # a positional argument, as the usage line names it
            yield action.dest, str(action.metavar or action.dest).upper()


def _not_utf8(value: Any) -> bool:
    values = value if isinstance(value, list) else [value]
    return any(isinstance(v, str) and not v.isascii() and _has_surrogate(v) for v in values)


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _subcommands() -> dict[str, ModuleType]:
    modules = [import_module(f"ledger.cli.{name}") for name in MODULES]
    return {module.NAME: module for module in modules}


class Command(BaseCommand):
    help = "Runledger operations (see docs/api.md, Operations)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        self.labels: dict[str, dict[str, str]] = {}
        for name, module in _subcommands().items():
            module.add_arguments(action := sub.add_parser(name, help=module.HELP))
            self.labels[name] = dict(_labels(action))

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        # Text that is not UTF-8 (invalid bytes on the command line) can be neither stored nor
        # looked up: refused by the argument's name before anything reads or writes.
        labels = getattr(self, "labels", {}).get(action, {})
        for dest, value in options.items():
            if dest in labels and dest not in PATHS and _not_utf8(value):
                raise CommandError(f"{labels[dest]} is not valid UTF-8 text")
        try:
            _subcommands()[action].handle(self, **options)
        except LedgerError as exc:
            raise CommandError(exc.message) from exc
        except BrokenPipeError:
            # Whoever read stdout stopped (`ledger events RUN | head`): stop as a Unix tool does, with
            # no traceback, and nothing more written to the closed pipe at exit (Python's own advice).
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except OSError as exc:
            # What the answer is written to failed (`> file` on a full disk, a quota, an I/O error),
            # or a file the command reads did: one line, no traceback. What is left in stdout's
            # buffer cannot be written either, so it goes nowhere rather than failing again at exit.
            if getattr(self.stdout, "_out", None) is sys.stdout:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise CommandError(f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror or str(exc)) from exc
