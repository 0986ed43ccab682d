"""`ledger add-member NAME --tenant T --role ROLE [--new]`: make a user a member of a tenant.

The same service as the console's Members screen (ledger/tenancy/services.py `add_member`),
audited alike as `member.added`. An existing user keeps their password; with `--new` the user is
made with a one-time password, printed on stdout alone on its line (shown once: only its hash is
stored). A member already (409 `already_member`), a new user by a taken name (409
`username_taken`) or an existing one by a name nobody has (404 `not_found`) change nothing."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.models import Role
from ledger.tenancy import services as tenancy

NAME = "add-member"
HELP = "make a user a member of a tenant (--new: a new user, with a one-time password)"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("name")
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--role", required=True, choices=list(Role.values))
    parser.add_argument("--new", action="store_true", help="make a new user; print their one-time password")


def handle(cmd: BaseCommand, *, name: str, tenant: str, role: str, new: bool, **_: Any) -> None:
    added = tenancy.add_member(username=name, tenant=tenant, role=role, new_user=new)
    username = added.membership.user.get_username()
    if added.password is None:
        cmd.stdout.write(f"{username} is {role} of {tenant}")
        return
    cmd.stderr.write(f"{username} is a new user, {role} of {tenant}; their one-time password, shown once:")
    cmd.stdout.write(added.password)
