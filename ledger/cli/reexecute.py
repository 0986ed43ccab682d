"""`ledger reexecute RUN --mode M --reason R --as USER`: a member asks for a re-execution from the
terminal (simulate starts at once; other modes wait for an approver); prints the request id and
its status."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger.models import ReexecutionRequest
from ledger.reads import selectors
from ledger.reexecution import services

from .common import find_run, json_arg

NAME = "reexecute"
HELP = (
    "request a re-execution as a member (simulate starts at once; other modes wait for an approver); "
    "prints the request id"
)


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("run")
    parser.add_argument("--mode", required=True, choices=list(ReexecutionRequest.Mode.values))
    parser.add_argument("--reason", required=True)
    parser.add_argument("--as", dest="as_user", required=True, help="the requesting member's username (operator+)")
    parser.add_argument("--workspace", help="TENANT/WORKSPACE (needed when the run id is ambiguous)")
    parser.add_argument("--from-step", help="fork: the first step that runs live")
    parser.add_argument("--input", help="fork: the new run's input, JSON")


def handle(
    cmd: BaseCommand,
    *,
    run: str,
    mode: str,
    reason: str,
    as_user: str,
    workspace: str | None,
    from_step: str | None,
    input: str | None,
    **_: Any,
) -> None:
    the_run = find_run(run, workspace)
    user = selectors.user_named(as_user)
    if user is None:
        raise CommandError(f"no user {as_user}")
    made = services.request_reexecution(
        workspace=the_run.workspace,
        run_id=the_run.run_id,
        mode=mode,
        reason=reason,
        by=user,
        from_step=from_step,
        input=json_arg(input) if input is not None else services.NOT_GIVEN,
    )
    cmd.stdout.write(f"{made.public_id} {made.status}")
