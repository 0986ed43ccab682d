"""`ledger remove-member NAME --tenant T`: end a member's membership of a tenant (the account stays).

The same service as the console's Members screen (ledger/tenancy/services.py `remove_member`),
audited alike as `member.removed`; the tenant's last admin stays (409 `last_admin`)."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.tenancy import services as tenancy

NAME = "remove-member"
HELP = "end a member's membership of a tenant (the user account stays)"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("name")
    parser.add_argument("--tenant", required=True)


def handle(cmd: BaseCommand, *, name: str, tenant: str, **_: Any) -> None:
    tenancy.remove_member(username=name, tenant=tenant)
    cmd.stdout.write(f"{name} is no longer a member of {tenant}")
