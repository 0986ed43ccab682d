"""`ledger export runs|events|costs|audit [--format jsonl|csv] [--workspace T/W | --tenant T]
[--from …] [--to …] [--run RUN] [--output FILE]`: the data exports of ledger/interop/exports.py, streamed
to stdout or a file, audited (`export.downloaded`, actor `system:cli`)."""

from __future__ import annotations

import sys
from argparse import ArgumentParser
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger import audit
from ledger.errors import NotFound
from ledger.interop import exports
from ledger.log.prepare import validate_run_id
from ledger.models import Tenant
from ledger.tenancy import access

from .common import failed_write, find_run, writable

NAME = "export"
HELP = "stream runs, events, cost entries or the audit log as JSONL or CSV (audited)"
CLI_ACTOR = audit.Actor(name="system:cli")


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("kind", choices=exports.KINDS)
    parser.add_argument("--format", dest="fmt", choices=exports.FORMATS, default="jsonl")
    parser.add_argument(
        "--workspace", help="TENANT/WORKSPACE (default: every workspace; the audit log needs this or --tenant)"
    )
    parser.add_argument("--tenant", help="audit only: one tenant's log")
    parser.add_argument("--from", dest="start", help="YYYY-MM-DD or ISO 8601, inclusive")
    parser.add_argument("--to", dest="end", help="YYYY-MM-DD (that whole day) or ISO 8601, exclusive")
    parser.add_argument("--run", dest="run_id", help="one run (runs, events, costs)")
    parser.add_argument("--output", "-o", help="write to this file instead of stdout")


def handle(
    cmd: BaseCommand,
    *,
    kind: str,
    fmt: str,
    workspace: str | None,
    tenant: str | None,
    start: str | None,
    end: str | None,
    run_id: str | None,
    output: str | None,
    **_: Any,
) -> None:
    try:
        bounds = exports.parse_bound(start, "--from", end=False), exports.parse_bound(end, "--to", end=True)
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    if bounds[0] is not None and bounds[1] is not None and bounds[0] >= bounds[1]:
        raise CommandError("--from must be before --to")  # as the API's 400: an empty export is no answer
    if run_id and kind != "audit":
        find_run(validate_run_id(run_id), workspace)  # a run that is not there is said, not exported empty
    filters = {
        k: v
        for k, v in {"workspace": workspace, "tenant": tenant, "from": start, "to": end, "runId": run_id}.items()
        if v
    }
    spaces = [access.workspace_by_path(workspace)] if workspace else None
    selection = exports.Selection(
        kind=kind, workspaces=spaces, start=bounds[0], end=bounds[1], run_id=run_id, filters=filters
    )
    if kind == "audit":
        if run_id:
            raise CommandError("--run does not apply to the audit log")
        if not (tenant or spaces):
            raise CommandError("the audit log is one tenant's: give --tenant T (or --workspace T/W)")
        the_tenant = spaces[0].tenant if spaces else Tenant.objects.filter(slug=tenant).first()
        if the_tenant is None:
            raise NotFound(f"tenant {tenant} not found")
        selection = replace(selection, tenant=the_tenant)
    elif tenant:
        raise CommandError("--tenant applies to the audit log only; use --workspace T/W")
    with failed_write(output or "stdout"), writable(output) if output else nullcontext(sys.stdout.buffer) as out:
        exports.record_export(selection=selection, fmt=fmt, by=CLI_ACTOR)
        for piece in exports.render(selection, fmt):
            out.write(piece)
        out.flush()
