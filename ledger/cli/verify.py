"""`ledger verify [RUN]`: dense sequences, event ids recomputed, artifact hashes, projections ==
fold, and (without RUN) the daily usage == the cost entries; exit 1 on any failure."""

from __future__ import annotations

import sys
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger import access, rollup, selectors
from ledger.verify import verify_run

from .common import add_run_arguments, runs_for

NAME = "verify"
HELP = "integrity of one run or all; exit 1 on any failure"


def add_arguments(parser: ArgumentParser) -> None:
    add_run_arguments(parser, optional=True)


def handle(cmd: BaseCommand, *, run: str | None, workspace: str | None, **_: Any) -> None:
    failures = 0
    checked = 0
    for target in runs_for(run, workspace):
        checked += 1
        for check in verify_run(target):
            if check.status == "fail":
                failures += 1
                cmd.stdout.write(f"FAIL {target.workspace}/{target.run_id} {check.name}: {check.detail}")
    # The daily usage sums the cost entries of a whole workspace, so it is checked with the
    # workspace, not with one of its runs: every day, counted again.
    spaces = [] if run else [access.workspace_by_path(workspace)] if workspace else selectors.all_workspaces()
    for space in spaces:
        for problem in rollup.differences(space.pk):
            failures += 1
            cmd.stdout.write(f"FAIL {space} usage_rollup: {problem}")
    if spaces:
        cmd.stdout.write(f"checked the daily usage of {len(spaces)} workspace(s)")
    cmd.stdout.write(f"verified {checked} run(s): {'ok' if not failures else f'{failures} failure(s)'}")
    if failures:
        sys.exit(1)
