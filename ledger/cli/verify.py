"""`ledger verify [RUN]`: dense sequences, event ids recomputed, artifact hashes, projections ==
fold; exit 1 on any failure."""

from __future__ import annotations

import sys
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

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
    cmd.stdout.write(f"verified {checked} run(s): {'ok' if not failures else f'{failures} failure(s)'}")
    if failures:
        sys.exit(1)
