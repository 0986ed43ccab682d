"""`ledger replay-plan RUN`: what a resume would do, without doing it."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.replay.stored_plan import replay_plan_for

from .common import add_run_arguments, existing_run

NAME = "replay-plan"
HELP = "what a resume would do, without doing it"


def add_arguments(parser: ArgumentParser) -> None:
    add_run_arguments(parser)


def handle(cmd: BaseCommand, *, run: str, workspace: str | None, **_: Any) -> None:
    cmd.stdout.write(json.dumps(replay_plan_for(existing_run(cmd, run, workspace)), indent=2))
