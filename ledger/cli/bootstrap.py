"""`ledger bootstrap --tenant T --workspace W`: create tenant and workspace if absent (idempotent)."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.tenancy import services as tenancy

NAME = "bootstrap"
HELP = "create tenant and workspace if absent"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--workspace", required=True)


def handle(cmd: BaseCommand, *, tenant: str, workspace: str, **_: Any) -> None:
    ws = tenancy.bootstrap(tenant=tenant, workspace=workspace)
    cmd.stdout.write(f"workspace {ws.tenant.slug}/{ws.slug} ready")
