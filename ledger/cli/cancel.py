"""`ledger cancel RUN --reason TEXT`: end a running run as `RunFailed {error: {name: "Cancelled",
message: reason}}` (ledger/replay/cancellation.py); an executor holding it stops at its next write."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.replay.cancellation import cancel_run

from .common import add_run_arguments, existing_run

NAME = "cancel"
HELP = "cancel a running run (audited); prints the outcome as JSON"


def add_arguments(parser: ArgumentParser) -> None:
    add_run_arguments(parser)
    parser.add_argument("--reason", required=True, help="why: the error's message and the audit entry's reason")


def handle(cmd: BaseCommand, *, run: str, workspace: str | None, reason: str, **_: Any) -> None:
    the_run = existing_run(cmd, run, workspace)
    done = cancel_run(workspace=the_run.workspace, run_id=the_run.run_id, reason=reason, by="system:cli")
    cmd.stdout.write(
        json.dumps(
            {
                "runId": done.run_id,
                "status": "failed",
                "executorHeld": done.held,
                "abandonedCalls": done.abandoned,
                "inDoubtCalls": done.in_doubt,
                "cancelledSubRuns": done.sub_runs,
            }
        )
    )
    cmd.stderr.write(f"run {done.run_id} cancelled" + (" (its executor stops at its next write)" if done.held else ""))
