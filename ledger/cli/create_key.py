"""`ledger create-key --workspace T/W --scopes ingest,read[,execute] [--name N] [--owner USERNAME]`:
a new API key on stdout, alone on its line (the secret is shown once). `--owner` names the member
the key acts for: what it requests counts as theirs for every "not your own" rule."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger import audit
from ledger.errors import NotFound
from ledger.models import Membership
from ledger.tenancy import access
from ledger.tenancy import services as tenancy

NAME = "create-key"
HELP = "print a new API key, alone on its line"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--workspace", required=True, help="TENANT/WORKSPACE")
    parser.add_argument("--scopes", required=True, help="comma-separated: ingest,read,execute")
    parser.add_argument("--name", default="")
    parser.add_argument("--owner", default="", help="USERNAME of the member of the tenant the key belongs to")


def handle(cmd: BaseCommand, *, workspace: str, scopes: str, name: str, owner: str = "", **_: Any) -> None:
    ws = access.workspace_by_path(workspace)
    by = tenancy.CLI
    if owner:
        member = Membership.objects.select_related("user").filter(user__username=owner, tenant=ws.tenant).first()
        if member is None:
            raise NotFound(f"{owner} is not a member of tenant {ws.tenant.slug}")
        by = audit.Actor.of(member.user)
    key = tenancy.create_key(workspace=ws, scopes=scopes.split(","), name=name, by=by)[1]
    cmd.stdout.write(key)
