"""`ledger limits TENANT/WORKSPACE [--events-per-run N|default] [--bytes-per-run N|default]
[--events-per-minute-per-key N|default] [--reason TEXT]`: the size limits in force in a workspace,
and the operator's overrides of them.

Without a flag it prints each limit (value, the deployment's default, whether overridden); with
flags it sets those overrides first (`default` puts one back to the setting), audited
`limits.changed` with actor system:cli (ledger/tenancy/limits_settings.py). Only the operator
changes them: the console shows them to the workspace's admins, read-only (docs/security.md).
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger import limits
from ledger.tenancy import access, limits_settings
from ledger.tenancy import services as tenancy

NAME = "limits"
HELP = "show or override a workspace's size limits (events and bytes per run, events per minute per key)"

FLAGS = {
    "max_events_per_run": "--events-per-run",
    "max_bytes_per_run": "--bytes-per-run",
    "max_events_per_minute_per_key": "--events-per-minute-per-key",
}


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("workspace", metavar="TENANT/WORKSPACE")
    for limit in limits.SIZE_LIMITS:
        parser.add_argument(
            FLAGS[limit.name],
            dest=limit.name,
            metavar="N|default",
            help=f"{limit.label.lower()} ({limit.low} to {limit.high}; default: {limit.setting})",
        )
    parser.add_argument("--reason", default="", help="recorded in the audit entry")


def handle(cmd: BaseCommand, *, workspace: str, reason: str = "", **options: Any) -> None:
    ws = access.workspace_by_path(workspace)
    wanted = {
        limit.name: limits_settings.parse(limit.name, options[limit.name])
        for limit in limits.SIZE_LIMITS
        if options.get(limit.name) is not None
    }
    if wanted:
        changed = limits_settings.set_limits(workspace=ws, overrides=wanted, by=tenancy.CLI, reason=reason)
        cmd.stderr.write(f"{len(changed)} limit(s) changed" if changed else "nothing changed")
    cmd.stdout.write("LIMIT\tVALUE\tDEFAULT\tSOURCE")
    for row in limits.effective(ws):
        source = "override" if row["overridden"] else "default"
        cmd.stdout.write(f"{FLAGS[row['name']].removeprefix('--')}\t{row['value']}\t{row['default']}\t{source}")
