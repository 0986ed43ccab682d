"""`ledger verify [RUN]`: dense sequences, event ids recomputed, artifact hashes, projections ==
fold, (without RUN) the daily usage == the cost entries and the workspace's price overrides
all taken by the price table, and (without RUN or --workspace) that
every row of the log and its projections names a run that exists; exit 1 on any failure.

`ledger verify --export FILE` and `--bundle FILE` check a file that left the ledger, from the file
alone (ledger/interop/offline.py): no database is read."""

from __future__ import annotations

import sys
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger.fold.pricing import refused_overrides
from ledger.interop import offline
from ledger.log import rollup
from ledger.log.verify import Check, run_references, verify_run
from ledger.reads import selectors
from ledger.tenancy import access

from .common import add_run_arguments, runs_for

NAME = "verify"
HELP = "integrity of one run or all; exit 1 on any failure"


def add_arguments(parser: ArgumentParser) -> None:
    add_run_arguments(parser, optional=True)
    files = parser.add_mutually_exclusive_group()
    files.add_argument("--export", dest="export_file", metavar="FILE", help="an export file (JSONL or CSV)")
    files.add_argument("--bundle", dest="bundle_file", metavar="FILE", help="an evidence bundle (zip)")


def handle(
    cmd: BaseCommand,
    *,
    run: str | None,
    workspace: str | None,
    export_file: str | None = None,
    bundle_file: str | None = None,
    **_: Any,
) -> None:
    if export_file or bundle_file:
        _verify_file(cmd, export_file, bundle_file)
        return
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
        # An override stored that the price table refuses is left out of its runs' prices
        # (pricing.prices_for): the admin meant something else, so it is a failure to fix.
        for key, why in refused_overrides(space).items():
            failures += 1
            cmd.stdout.write(f"FAIL {space} price_overrides: {key!r} is left out of the prices: {why}")
    if spaces:
        cmd.stdout.write(f"checked the daily and monthly usage of {len(spaces)} workspace(s)")
    if not run and not workspace:  # a row whose run is gone belongs to no workspace: only the whole database finds it
        for check in run_references():
            if check.status == "fail":
                failures += 1
                cmd.stdout.write(f"FAIL {check.name}: {check.detail}")
        cmd.stdout.write("checked that every event, step, tool call and cost entry names a run that exists")
    cmd.stdout.write(f"verified {checked} run(s): {'ok' if not failures else f'{failures} failure(s)'}")
    if failures:
        sys.exit(1)


def _verify_file(cmd: BaseCommand, export_file: str | None, bundle_file: str | None) -> None:
    name = export_file or bundle_file or ""
    path = Path(name)
    if path.is_dir():
        raise CommandError(f"{name}: a directory, not a file")
    if not path.is_file():
        raise CommandError(f"{name}: no such file")
    checks: list[Check] = offline.verify_export(path) if export_file else offline.verify_bundle(path)
    failures = [c for c in checks if c.status == "fail"]
    for check in checks:
        cmd.stdout.write(f"{'FAIL' if check.status == 'fail' else 'ok  '} {name} {check.name}: {check.detail}")
    cmd.stdout.write(f"verified {name}: {'ok' if not failures else f'{len(failures)} failure(s)'}")
    if failures:
        sys.exit(1)
