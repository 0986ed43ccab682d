"""`ledger create-key --workspace T/W --scopes ingest,read[,execute] [--name N]`: a new API key on
stdout, alone on its line (the secret is shown once)."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.tenancy import access
from ledger.tenancy import services as tenancy

NAME = "create-key"
HELP = "print a new API key, alone on its line"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--workspace", required=True, help="TENANT/WORKSPACE")
    parser.add_argument("--scopes", required=True, help="comma-separated: ingest,read,execute")
    parser.add_argument("--name", default="")


def handle(cmd: BaseCommand, *, workspace: str, scopes: str, name: str, **_: Any) -> None:
    ws = access.workspace_by_path(workspace)
    key = tenancy.create_key(workspace=ws, scopes=scopes.split(","), name=name)[1]
    cmd.stdout.write(key)
