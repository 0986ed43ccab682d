"""`ledger enable-user NAME [--reason R]`: a disabled account, enabled again by the deployment's operator.

The service is ledger/tenancy/services.py `enable_user`: the user signs in again with the password
they had, a member of the tenants they were in with the roles they had; their failed logins are
forgotten. Audited `member.account_enabled` (actor `system:cli`, the reason) in each tenant they are
a member of. A name nobody has (404 `not_found`) is refused with exit status 1; an enabled account
changes nothing (exit 0, said on stdout). A user with no password to sign in with is told so on
stderr: `ledger reset-password NAME` gives them one."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.cli.common import audited_in
from ledger.tenancy import services as tenancy

NAME = "enable-user"
HELP = "enable a disabled user's account again"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("name")
    parser.add_argument("--reason", default="", help="recorded in the audit entries")


def handle(cmd: BaseCommand, *, name: str, reason: str = "", **_: Any) -> None:
    done = tenancy.enable_user(username=name, reason=reason)
    if done.changed:
        cmd.stdout.write(f"the account of {name} is enabled; {audited_in(done.tenants)}")
    else:
        cmd.stdout.write(f"the account of {name} is enabled already: nothing changed")
    if not done.has_password:
        cmd.stderr.write(f"{name} has no password to sign in with: ledger reset-password {name} gives them one")
