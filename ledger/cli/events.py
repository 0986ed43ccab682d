"""`ledger events RUN [--workspace T/W] [--type PREFIX*]`: one JSON envelope per line, in sequence
order."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.canonical import ecma_dumps
from ledger.reads import selectors

from .common import add_run_arguments, existing_run

NAME = "events"
HELP = "one JSON envelope per line, in sequence order"


def add_arguments(parser: ArgumentParser) -> None:
    add_run_arguments(parser, workspace_help="TENANT/WORKSPACE (needed when the run id is ambiguous)")
    parser.add_argument("--type", dest="type_filter", help="exact type, or PREFIX* for a prefix")


def handle(cmd: BaseCommand, *, run: str, workspace: str | None, type_filter: str | None, **_: Any) -> None:
    the_run = existing_run(cmd, run, workspace)
    prefix, exact = None, None
    if type_filter:
        prefix, exact = (type_filter[:-1], None) if type_filter.endswith("*") else (None, type_filter)
    for env in selectors.events(the_run, type_prefix=prefix):
        if exact is None or env["type"] == exact:
            cmd.stdout.write(ecma_dumps(env).decode())
