"""`ledger keys list [--workspace T/W] [--all]` and `ledger keys revoke PREFIX`: the API keys,
by prefix (never their secrets), and revoking one (audited `api_key.revoked`, actor system:cli).
`ledger create-key` makes them."""

from __future__ import annotations

from argparse import ArgumentParser
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger import audit
from ledger.tenancy import access
from ledger.tenancy import services as tenancy

NAME = "keys"
HELP = "list API keys by prefix, or revoke one"


def add_arguments(parser: ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="keys_action", required=True, metavar="list|revoke")
    listing = sub.add_parser(
        "list",
        help="one key per line: prefix, workspace, name, scopes, owner ((unowned) if none), created, last used, revoked",
    )
    listing.add_argument("--workspace", help="TENANT/WORKSPACE (default: every workspace)")
    listing.add_argument("--all", action="store_true", dest="include_revoked", help="include revoked keys")
    revoking = sub.add_parser("revoke", help="revoke the key with this prefix (idempotent)")
    revoking.add_argument("prefix")
    revoking.add_argument("--reason", default="", help="recorded in the audit entry")


def _when(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds").replace("+00:00", "Z") if value else "-"


def handle(cmd: BaseCommand, *, keys_action: str, **options: Any) -> None:
    if keys_action == "list":
        ws = access.workspace_by_path(options["workspace"]) if options.get("workspace") else None
        cmd.stdout.write("PREFIX\tWORKSPACE\tNAME\tSCOPES\tOWNER\tCREATED\tLAST_USED\tREVOKED")
        listed = list(tenancy.keys(workspace=ws, include_revoked=options["include_revoked"]))
        owners = audit.key_owner_names(listed)
        for key in listed:
            cmd.stdout.write(
                "\t".join(
                    [
                        key.prefix,
                        str(key.workspace),
                        key.name or "-",
                        ",".join(key.scopes),
                        owners.get(key.pk, "(unowned)"),
                        _when(key.created_at),
                        _when(key.last_used_at),
                        _when(key.revoked_at),
                    ]
                )
            )
        return
    found = tenancy.key_by_prefix(options["prefix"])
    if found is None:
        raise CommandError(f"no API key with prefix {options['prefix']!r}")
    if tenancy.revoke_key(found, reason=options["reason"]):
        cmd.stdout.write(f"revoked {found.prefix} ({found.workspace})")
    else:
        cmd.stdout.write(f"{found.prefix} was already revoked")
