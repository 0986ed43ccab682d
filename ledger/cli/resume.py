"""`ledger resume RUN`: continue a crashed run of a registered workflow from where its log ends."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.reads import selectors
from ledger.runtime import progress
from ledger.runtime.errors import UnknownWorkflow
from ledger.runtime.executor import RunOutcome, resume_run
from ledger.runtime.registry import get_workflow

from .common import (
    add_run_arguments,
    existing_run,
    exit_unless_completed,
    json_arg,
    load_workflow_modules,
    report_outcome,
)

NAME = "resume"
HELP = "continue a run from where its log ends"


def add_arguments(parser: ArgumentParser) -> None:
    add_run_arguments(parser)
    parser.add_argument("--input", help="the run input, JSON; must equal the original when given")
    parser.add_argument("--take-over", action="store_true", help="take the run lease from a live executor")
    parser.add_argument("--module", action="append", default=[], help="import this module to register workflows")


def handle(
    cmd: BaseCommand,
    *,
    run: str,
    workspace: str | None,
    input: str | None,
    take_over: bool,
    module: list[str],
    **_: Any,
) -> None:
    load_workflow_modules(module)
    the_run = existing_run(cmd, run, workspace)
    kwargs: dict[str, Any] = {"input": json_arg(input)} if input is not None else {}
    reporter = None
    first = selectors.events(the_run, limit=1)
    name = first[0]["payload"].get("workflow") if first else None
    try:
        if isinstance(name, str):
            reporter = progress.reporter_for(
                cmd.stderr, workspace=the_run.workspace, run_id=the_run.run_id, workflow=get_workflow(name)
            )
    except UnknownWorkflow:
        pass  # resume_run refuses it, saying so

    def execute() -> RunOutcome:
        if reporter is None:  # not a registered workflow: resume_run says why
            return resume_run(workspace=the_run.workspace, run_id=the_run.run_id, take_over=take_over, **kwargs)
        with progress.reporting(reporter):
            return resume_run(workspace=the_run.workspace, run_id=the_run.run_id, take_over=take_over, **kwargs)

    outcome = report_outcome(cmd, execute)
    cmd.stdout.write(
        json.dumps(
            {"runId": outcome.run_id, "status": outcome.status, "output": outcome.output, "error": outcome.error}
        )
    )
    exit_unless_completed(outcome)
