"""`ledger run WORKFLOW --input JSON --workspace T/W`: run a registered workflow; its run id is
printed alone on its line before it starts (so the caller knows it even if the executor dies)."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger.log.prepare import validate_run_id
from ledger.reads import selectors
from ledger.runtime import progress
from ledger.runtime.executor import RunOutcome, new_run_id, start_run
from ledger.runtime.registry import get_workflow
from ledger.tenancy import access

from .common import exit_unless_completed, json_arg, load_workflow_modules, report_outcome

NAME = "run"
HELP = "run a registered workflow; prints the run id alone on its line"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("workflow")
    parser.add_argument("--input", required=True, help="the run input, JSON")
    parser.add_argument("--workspace", required=True, help="TENANT/WORKSPACE")
    parser.add_argument("--run-id", help="the id to start (or resume) under; a new one by default")
    parser.add_argument("--module", action="append", default=[], help="import this module to register workflows")
    parser.add_argument("--requested-by", help="the member asking for the run: they may not approve its tool calls")


def handle(
    cmd: BaseCommand,
    *,
    workflow: str,
    input: str,
    workspace: str,
    run_id: str | None,
    module: list[str],
    requested_by: str | None = None,
    **_: Any,
) -> None:
    run_input = json_arg(input)  # before anything is printed or created
    if requested_by is not None and selectors.user_named(requested_by) is None:
        # The requester may not approve the run's tool calls: a name nobody has would let the
        # person who asked approve their own call.
        raise CommandError(f"--requested-by: no user {requested_by}")
    load_workflow_modules(module)
    get_workflow(workflow)  # an unknown name is refused before a run id is handed out
    ws = access.workspace_by_path(workspace)
    run_id = validate_run_id(run_id) if run_id is not None else new_run_id()
    cmd.stdout.write(run_id)
    cmd.stdout.flush()  # the id is known to the caller even if the executor dies
    reporter = progress.reporter_for(cmd.stderr, workspace=ws, run_id=run_id, workflow=get_workflow(workflow))

    def execute() -> RunOutcome:
        with progress.reporting(reporter):
            return start_run(workspace=ws, workflow=workflow, input=run_input, run_id=run_id, requested_by=requested_by)

    outcome = report_outcome(cmd, execute)
    exit_unless_completed(outcome)
