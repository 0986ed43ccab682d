"""`ledger reset-password NAME`: a lost password, set again by the deployment's operator.

The same service as the console's Settings → Members *Reset password* (ledger/tenancy/services.py
`reset_password`): a new one-time password, printed on stdout alone on its line (shown once: only
its hash is stored), every session of the user ended, their failed logins forgotten; audited
`member.password_reset` (actor `system:cli`) in each tenant they are a member of. The operator may
reset any user of the deployment, a member of several tenants too (a tenant's admin may not:
docs/security.md § Roles). A name nobody has (404 `not_found`) or a disabled account (409
`account_disabled`) changes nothing."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.tenancy import services as tenancy

NAME = "reset-password"
HELP = "give a user a new one-time password and end their sessions"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("name")


def handle(cmd: BaseCommand, *, name: str, **_: Any) -> None:
    reset = tenancy.reset_password(username=name)
    cmd.stderr.write(
        f"{reset.username} has a new one-time password, shown once ({reset.sessions_ended} session(s) ended):"
    )
    cmd.stdout.write(reset.password)
