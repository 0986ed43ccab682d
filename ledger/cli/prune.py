"""`ledger prune [--workspace T/W] [--older-than DAYS] [--dry-run] [--batch-size N]`: retention.

Deletes whole runs (with their sub-run trees) whose last activity is past their workspace's
retention (ledger/tenancy/retention.py says exactly when a run may go); `--older-than DAYS` applies that
many days to every workspace selected instead of their settings. One tree per transaction, each
audited (`run.pruned`). `--dry-run` lists what would go and changes nothing. On a terminal a
progress bar goes to stderr; otherwise one plain line per tree on stdout, and a total.
"""

from __future__ import annotations

import functools
import sys
from argparse import ArgumentParser
from typing import Any, TextIO

from django.core.management.base import BaseCommand

from ledger import clock
from ledger.reads import selectors
from ledger.tenancy import access, retention

NAME = "prune"
HELP = "retention: delete whole runs past their workspace's retention, audited"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--workspace", help="TENANT/WORKSPACE (default: every workspace)")
    parser.add_argument(
        "--older-than",
        type=int,
        dest="older_than",
        metavar="DAYS",
        help="use this retention for every workspace selected, instead of their settings",
    )
    parser.add_argument("--dry-run", action="store_true", dest="dry_run", help="list what would go; change nothing")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=100,
        dest="batch_size",
        metavar="N",
        help="candidate runs read per query (default 100); each tree is its own transaction",
    )


def _bar(stream: TextIO, progress: retention.Progress, *, label: str) -> None:
    width = 30
    done = min(progress.examined, progress.total)
    filled = width * done // progress.total if progress.total else width
    stream.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{progress.total} runs examined")
    stream.flush()


def _describe(tree: retention.TreeOutcome) -> str:
    counts = ", ".join(f"{k}={v}" for k, v in tree.counts.items())
    below = f" (+{len(tree.run_ids) - 1} sub-run(s))" if len(tree.run_ids) > 1 else ""
    return (
        f"{tree.workspace} {tree.root_run_id}{below} last activity "
        f"{tree.last_activity.isoformat().replace('+00:00', 'Z')}: {counts}"
    )


def handle(
    cmd: BaseCommand, *, workspace: str | None, older_than: int | None, dry_run: bool, batch_size: int, **_: Any
) -> None:
    retention.validate_days(older_than)
    spaces = [access.workspace_by_path(workspace)] if workspace else list(selectors.all_workspaces())
    tty = sys.stderr.isatty()
    now = clock.now()
    verb = "would prune" if dry_run else "pruned"
    totals: dict[str, int] = {}
    for space in spaces:
        days = older_than if older_than is not None else space.retention_days
        if days is None:
            if workspace:
                cmd.stdout.write(f"{space}: no retention set (runs are kept forever); nothing to prune")
            continue
        progress = retention.Progress(total=retention.candidates(space, retention.cutoff(days, now), now).count())
        if tty:
            progress.listener = functools.partial(_bar, sys.stderr, label=str(space))
        for tree in retention.prune_workspace(
            space, days=days, now=now, dry_run=dry_run, batch_size=batch_size, progress=progress
        ):
            for k, v in tree.counts.items():
                totals[k] = totals.get(k, 0) + v
            if dry_run or not tty:
                cmd.stdout.write(f"{verb} {_describe(tree)}")
        if tty:
            _bar(sys.stderr, retention.Progress(examined=progress.total, total=progress.total), label=str(space))
            sys.stderr.write("\n")
    summary = ", ".join(f"{k}={v}" for k, v in totals.items()) or "runs=0"
    cmd.stdout.write(f"{verb} in all: {summary}{' (dry run: nothing changed)' if dry_run else ''}")
