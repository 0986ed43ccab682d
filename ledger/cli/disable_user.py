"""`ledger disable-user NAME [--reason R]`: a user's account, disabled by the deployment's operator.

The service is ledger/tenancy/services.py `disable_user`: every sign-in of theirs is refused (any
password), every session they have open ends, and nobody can make them a member or give them a
new password (409 `account_disabled`) until `ledger enable-user NAME`. Their memberships, roles and
password stay. Audited `member.account_disabled` (actor `system:cli`, the reason) in each tenant
they are a member of. A name nobody has (404 `not_found`) is refused with exit status 1; an account
disabled already changes nothing (exit 0, said on stdout). The last admin with an enabled account of
a tenant is refused too (409 `last_admin`, exit 1, nothing changed): with `--force` the account is
disabled and each tenant left without one is named on stderr."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.cli.common import audited_in
from ledger.tenancy import services as tenancy

NAME = "disable-user"
HELP = "disable a user's account (sign-in refused, sessions ended); ledger enable-user undoes it"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("name")
    parser.add_argument("--reason", default="", help="recorded in the audit entries")
    parser.add_argument(
        "--force", action="store_true", help="disable even the last admin with an enabled account of a tenant"
    )


def handle(cmd: BaseCommand, *, name: str, reason: str = "", force: bool = False, **_: Any) -> None:
    done = tenancy.disable_user(username=name, reason=reason, force=force)
    if not done.changed:
        cmd.stdout.write(f"the account of {name} is disabled already: nothing changed")
        return
    cmd.stdout.write(
        f"the account of {name} is disabled: {done.sessions_ended} session(s) ended; {audited_in(done.tenants)}"
    )
    for slug in done.without_admin:
        cmd.stderr.write(
            f"{slug} has no admin with an enabled account now: nobody but you can manage its members, keys or "
            f"settings until one is (ledger enable-user {name}, or ledger create-user NAME --tenant {slug} --role admin)"
        )
