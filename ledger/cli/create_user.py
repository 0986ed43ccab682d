"""`ledger create-user NAME --tenant T --role ROLE [--password P]`: create or update a member.

The service is ledger/tenancy/services.py `create_user`, and stdout says what it did: a new user,
a new membership of an existing user, a role changed (audited `member.added`, `member.changed`),
nothing changed, the password set (an existing user's: audited `member.password_reset` in each of
their tenants, as `ledger reset-password`, their sessions ended). Refused with the reason on stderr and exit status 1, nothing
written: a tenant that does not exist, a name that is not a username, a new user without
`--password` (they could never sign in: `ledger add-member NAME --new` makes one with a one-time
password), a disabled account (409 `account_disabled`: `ledger enable-user NAME` first), a weak
password, the tenant's last admin given another role (409 `last_admin`). An existing user with no
password to sign in with is told so on stderr."""

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
    parser.add_argument("--password", help="required for a new user")


def handle(cmd: BaseCommand, *, name: str, tenant: str, role: str, password: str | None, **_: Any) -> None:
    done = tenancy.create_user(username=name, tenant=tenant, role=role, password=password)
    if done.new_user:
        said = f"{name} is a new user, {role} of {tenant}, with the password given"
    elif done.new_member:
        said = f"{name} is {role} of {tenant} (an existing user, now a member)"
    elif done.previous_role != role:
        said = f"{name} is {role} of {tenant} (was {done.previous_role})"
    else:
        said = f"{name} was {role} of {tenant} already"
    if done.password_set and not done.new_user:
        said += f"; their password is the one given ({done.sessions_ended} session(s) ended)"
    elif not done.new_user and not done.new_member and done.previous_role == role:
        said += ": nothing changed"
    cmd.stdout.write(said)
    if not done.has_password:
        cmd.stderr.write(f"{name} has no password to sign in with: ledger reset-password {name} gives them one")
