"""`ledger create-user NAME --tenant T --role ROLE --password P`: create or update a member."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.models import Role
from ledger.tenancy import services as tenancy

NAME = "create-user"
HELP = "create or update a member"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("name")
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--role", required=True, choices=list(Role.values))
    parser.add_argument("--password")


def handle(cmd: BaseCommand, *, name: str, tenant: str, role: str, password: str | None, **_: Any) -> None:
    m = tenancy.create_user(username=name, tenant=tenant, role=role, password=password)
    cmd.stdout.write(f"{m.user.username} is {m.role} of {tenant}")
