"""`ledger state RUN [--workspace T/W] [--at N]`: the run's folded state (Little Workflow's
`run-state`), the JSON of `GET /api/v1/runs/{runId}/state` (ledger.replay.runlog.state_json)."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.canonical import ecma_dumps
from ledger.replay.runlog import state_json

from .common import add_run_arguments, existing_run

NAME = "state"
HELP = "the run's folded state (after event N with --at), as JSON"


def add_arguments(parser: ArgumentParser) -> None:
    add_run_arguments(parser)
    parser.add_argument("--at", type=int, default=None, help="fold events 1..N only (default: all)")


def handle(cmd: BaseCommand, *, run: str, workspace: str | None, at: int | None, **_: Any) -> None:
    the_run = existing_run(cmd, run, workspace)
    if at is not None and not 1 <= at <= the_run.last_sequence:
        cmd.stderr.write(f"--at must be from 1 to {the_run.last_sequence}")
        raise SystemExit(2)
    cmd.stdout.write(ecma_dumps(state_json(the_run, at=at), default=str).decode())
