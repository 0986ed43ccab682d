"""`ledger import-little DIR --workspace T/W`: a Little Workflow data directory into a workspace,
with the same event ids (ledger/interop/little_import.py), run by run: a run with a problem is
refused whole (named on stderr by file, run, sequence and reason) while the others come in; exit 1
when anything was refused, and a summary line either way."""

from __future__ import annotations

import sys
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand

from ledger.interop.little_import import ImportRefused, import_data_dir
from ledger.tenancy import access

NAME = "import-little"
HELP = "import a Little Workflow data directory (logs, artifacts, outer loops) with the same event ids"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("directory", help="the data directory (holds events/, artifacts/, outer-loops/)")
    parser.add_argument("--workspace", required=True, help="TENANT/WORKSPACE to import into")


def handle(cmd: BaseCommand, *, directory: str, workspace: str, **_: Any) -> None:
    space = access.workspace_by_path(workspace)
    try:
        summary = import_data_dir(Path(directory), space)
    except ImportRefused as exc:
        for problem in exc.problems:
            cmd.stderr.write(problem)
        cmd.stderr.write(exc.message)
        sys.exit(1)
    for line in summary.lines:
        cmd.stdout.write(line)
    for problem in summary.problems:
        cmd.stderr.write(problem)
    cmd.stdout.write(summary.line(workspace))
    if summary.refused:
        sys.exit(1)
