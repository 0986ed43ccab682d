"""`ledger loop start|resume|show`: outer loops (ledger/runtime/outer_loop.py).

- `ledger loop start WORKFLOW --input JSON --workspace T/W --max-cycles N [--goal TEXT]
  [--supervise NAME] [--loop-id ol_…]`: prints the loop id alone on its first line (so the caller
  knows it even if the driver dies), drives the loop to its end, then prints its state as JSON.
- `ledger loop resume OL [--workspace T/W] [--take-over]`: continues a loop from its record.
- `ledger loop show OL [--workspace T/W]`: the loop's state (goal, cycles with run id, status,
  output, verdict and usage, the pending cycle's run id, usage summed), JSON.

Exit 1 when the loop did not end done (exhausted, or refused: the error's code and text on stderr).
"""

from __future__ import annotations

import json
import sys
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.errors import NotFound
from ledger.models import Run, RunStatus
from ledger.runtime.outer_loop import (
    LoopState,
    check_outer_loop_id,
    checked_start,
    new_outer_loop_id,
    read_loop,
    record_run_id,
    resume_outer_loop,
    start_outer_loop,
)
from ledger.runtime.registry import get_workflow
from ledger.tenancy import access

from .common import find_run, json_arg, load_workflow_modules

NAME = "loop"
HELP = "outer loops: start, resume or show a goal-driven loop of runs"


def add_arguments(parser: ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="loop_action", required=True, metavar="start|resume|show")
    start = sub.add_parser("start", help="start a loop running WORKFLOW as cycles; prints the loop id first")
    start.add_argument("workflow")
    start.add_argument("--input", required=True, help="the loop's input, JSON (each cycle gets it with the goal)")
    start.add_argument("--workspace", required=True, help="TENANT/WORKSPACE")
    start.add_argument("--max-cycles", type=int, required=True, help="cycles at most (1-100)")
    start.add_argument("--goal", default="", help="what the loop is for, as the cycles and the supervisor see it")
    start.add_argument("--supervise", help="a registered supervise adapter (needed when --max-cycles > 1)")
    start.add_argument("--loop-id", help="the outer loop id (ol_…) to start, or resume; a new one by default")
    start.add_argument("--take-over", action="store_true", help="take the loop's lease from a live driver")
    start.add_argument("--module", action="append", default=[], help="import this module to register workflows")
    resume = sub.add_parser("resume", help="continue a loop from where its record ends")
    resume.add_argument("loop")
    resume.add_argument("--workspace")
    resume.add_argument("--supervise", help="a registered supervise adapter instead of the recorded one")
    resume.add_argument("--take-over", action="store_true", help="take the loop's lease from a live driver")
    resume.add_argument("--module", action="append", default=[], help="import this module to register workflows")
    show = sub.add_parser("show", help="the loop's state, JSON")
    show.add_argument("loop")
    show.add_argument("--workspace")


def handle(cmd: BaseCommand, *, loop_action: str, **options: Any) -> None:
    if loop_action == "start":
        _start(cmd, **options)
    elif loop_action == "resume":
        _resume(cmd, **options)
    else:
        _show(cmd, **options)


def _start(
    cmd: BaseCommand,
    *,
    workflow: str,
    input: str,
    workspace: str,
    max_cycles: int,
    goal: str,
    supervise: str | None,
    loop_id: str | None,
    take_over: bool,
    module: list[str],
    **_: Any,
) -> None:
    loop_input = json_arg(input)
    load_workflow_modules(module)
    get_workflow(workflow)  # an unknown name is refused before a loop id is handed out
    ws = access.workspace_by_path(workspace)
    checked_start(max_cycles, supervise)  # and what start_outer_loop would refuse
    loop_id = check_outer_loop_id(loop_id or new_outer_loop_id())
    cmd.stdout.write(loop_id)
    cmd.stdout.flush()
    _report(
        cmd,
        start_outer_loop(
            workspace=ws,
            workflow=workflow,
            input=loop_input,
            max_cycles=max_cycles,
            goal=goal,
            supervise=supervise,
            outer_loop_id=loop_id,
            take_over=take_over,
        ),
    )


def _resume(
    cmd: BaseCommand,
    *,
    loop: str,
    workspace: str | None,
    supervise: str | None,
    take_over: bool,
    module: list[str],
    **_: Any,
) -> None:
    load_workflow_modules(module)
    record = _record(cmd, loop, workspace)
    _report(
        cmd, resume_outer_loop(workspace=record.workspace, outer_loop_id=loop, supervise=supervise, take_over=take_over)
    )


def _show(cmd: BaseCommand, *, loop: str, workspace: str | None, **_: Any) -> None:
    record = _record(cmd, loop, workspace)
    cmd.stdout.write(json.dumps(read_loop(record.workspace, loop, record).to_json(), indent=2))


def _record(cmd: BaseCommand, loop: str, workspace: str | None) -> Run:
    """The loop's record run, or "outer loop … not found" on stderr and exit 1 (the record's own
    run id is the loop's business, not the caller's)."""
    if workspace:
        access.workspace_by_path(workspace)  # an unknown workspace is said as such
    try:
        return find_run(record_run_id(check_outer_loop_id(loop)), workspace)
    except NotFound:
        cmd.stderr.write(f"outer loop {loop} not found" + (f" in {workspace}" if workspace else ""))
        sys.exit(1)


def _report(cmd: BaseCommand, state: LoopState) -> None:
    cycles = len(state.completed_cycles)
    if state.status == RunStatus.COMPLETED:
        cmd.stderr.write(f"outer loop {state.outer_loop_id} done after {cycles} cycle{'s' if cycles != 1 else ''}")
    else:
        error = state.error if isinstance(state.error, dict) else {}
        cmd.stderr.write(f"{error.get('causeCode', 'outer_loop_failed')}: {error.get('message', state.error)}")
    cmd.stdout.write(json.dumps(state.to_json()))
    if state.status != RunStatus.COMPLETED:
        sys.exit(1)
