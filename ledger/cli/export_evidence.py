"""`ledger export-evidence RUN [--workspace T/W] [--output FILE]`: the run's deterministic evidence
zip (ledger/interop/bundle.py), to a file (default RUN.evidence.zip) or `-` for stdout; audited
(`evidence_bundle.downloaded`, actor `system:cli`). Prints the file's sha256 on stderr."""

from __future__ import annotations

import shutil
import sys
from argparse import ArgumentParser
from contextlib import nullcontext
from typing import Any

from django.core.management.base import BaseCommand

from ledger.interop import bundle

from .common import add_run_arguments, existing_run, failed_write, writable
from .export import CLI_ACTOR

NAME = "export-evidence"
HELP = "write a run's evidence bundle (deterministic zip, verifiable offline with verify --bundle)"


def add_arguments(parser: ArgumentParser) -> None:
    add_run_arguments(parser, workspace_help="TENANT/WORKSPACE (needed when the run id is ambiguous)")
    parser.add_argument("--output", "-o", help="the zip's path (default RUN.evidence.zip; - for stdout)")


def handle(cmd: BaseCommand, *, run: str, workspace: str | None, output: str | None, **_: Any) -> None:
    the_run = existing_run(cmd, run, workspace)
    target = output or bundle.bundle_name(the_run)
    with (
        failed_write("stdout" if target == "-" else target),
        nullcontext(sys.stdout.buffer) if target == "-" else writable(target) as out,
        bundle.bundle_file(the_run) as spooled,
    ):
        sha256 = bundle.file_sha256(spooled)
        bundle.record_bundle(run=the_run, by=CLI_ACTOR, sha256=sha256)
        shutil.copyfileobj(spooled, out)
        out.flush()
    if target != "-":
        cmd.stderr.write(f"wrote {target} sha256 {sha256}")
