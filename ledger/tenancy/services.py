"""Tenancy services: tenants, workspaces, members and API keys."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import import_module
from typing import Any

from axes.utils import reset as forget_failed_logins
from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user_model
from django.contrib.auth.models import AbstractBaseUser, User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from .. import audit, clock
from ..errors import Conflict, InvalidRequest, LedgerError, NotFound
from ..limits import plain_name, written
from ..log import statements
from ..log.bulk import column, table
from ..models import ApiKey, Membership, Role, Tenant, Workspace
from ..redaction import redact_text

KEY_PREFIX = "rl_"
# How fresh `ApiKey.last_used_at` is kept: one write per key per this, not one per request.
LAST_USED_RESOLUTION = timedelta(minutes=1)
# Tenancy changes made at the command line (`manage.py ledger create-user`, `create-key`, the demo).
CLI = audit.Actor(name="system:cli")
SLUG_MAX = 64  # the tenant's and the workspace's slug columns
_SLUG = re.compile(r"[-a-zA-Z0-9_]+")


@transaction.atomic
def bootstrap(*, tenant: str, workspace: str) -> Workspace:
    """Create the tenant and workspace if absent (idempotent)."""
    for field, slug in (("tenant", tenant), ("workspace", workspace)):
        # What the console's and the API's addresses take (`<slug:…>`, `tenant/workspace`).
        if not (_SLUG.fullmatch(slug) and len(slug) <= SLUG_MAX):
            raise InvalidRequest(
                f"the {field} must be 1 to {SLUG_MAX} letters, digits, '-' or '_' (it is part of "
                f"the workspace's addresses), got {slug[:80]!r}",
                field=field,
            )
    t, _ = Tenant.objects.get_or_create(slug=tenant, defaults={"name": tenant})
    ws, _ = Workspace.objects.get_or_create(tenant=t, slug=workspace, defaults={"name": workspace})
    return ws


class LastAdmin(Conflict):
    """Removing or demoting the tenant's last admin: nobody could manage its members, keys or
    settings any more (not even to undo it) but the command line's operator."""

    code = "last_admin"


@dataclass(frozen=True)
class UserSet:
    """What `create_user` did, for the command line to say exactly that."""

    membership: Membership
    new_user: bool
    # The role before: None when the membership is new (`new_member`), else the role it had (the
    # same as now when nothing changed).
    previous_role: str | None
    password_set: bool
    # False: the user has no password they could sign in with (none was ever set, or an unusable
    # one, as `createsuperuser --noinput` makes); `ledger reset-password` gives them one.
    has_password: bool
    # An existing user's password set: their sessions that were open and are now ended (deleted).
    sessions_ended: int = 0

    @property
    def new_member(self) -> bool:
        return self.previous_role is None


@transaction.atomic
def create_user(
    *,
    username: str,
    tenant: str,
    role: str,
    password: str | None,
    by: audit.Actor | AbstractBaseUser = CLI,
) -> UserSet:
    """Create or update a user and their membership (one role per tenant); audited as
    member.added or member.changed (a role change, as `change_role`; a password alone is not a
    membership change). Refused, nothing written: a role or username that is not one, a tenant
    that does not exist, a new user without a password (they could never sign in: `add_member`
    makes one with a one-time password), and a disabled account (AccountDisabled, as `add_member`
    refuses it: enabled first with `enable_user`). An existing user's password set is a reset by
    the operator, done and audited as `reset_password`'s (member.password_reset in each tenant
    they are a member of, without the password): their sessions end, their failed logins are
    forgotten."""
    _check_role(role)
    t = _existing_tenant(tenant)
    model = get_user_model()
    user = model.objects.filter(username=username).first()
    if user is None:
        _check_username(username)
        if not password:
            raise LedgerError(
                f"{username} is a new user and would have no password to sign in with: give one with "
                f"--password, or add them with ledger add-member {username} --tenant {tenant} --role {role} --new "
                "for a one-time password. Nothing was written",
                field="password",
            )
    elif not user.is_active:
        raise AccountDisabled(
            f"The account of {username} is disabled, so they cannot sign in: nothing changed. "
            f"Enable it first with ledger enable-user {username}",
            field="username",
        )
    if password:
        _check_password(password, username)
    new_user = user is None
    if user is None:
        user = model(username=username)
    if password:
        user.set_password(password)
    if new_user:
        try:
            # A tenant's admin may make the same name at the same moment (`add_member`): the
            # unique username decides.
            with transaction.atomic():
                user.save()
        except IntegrityError:
            raise UsernameTaken.of(username) from None
    elif password:
        user.save(update_fields=["password"])
    membership = Membership.objects.filter(user=user, tenant=t).first()
    previous = None if membership is None else str(membership.role)
    if membership is None:
        membership = _add_membership(t, user, role, by=by)
    else:
        _set_role(t, membership, role, by=by)
    ended = 0
    if password and not new_user:
        ended = _end_sessions(user)
        forget_failed_logins(username=username)
        _audit_account(
            _tenants_of(user),
            by,
            audit.Action.MEMBER_PASSWORD_RESET,
            username,
            {"sessionsEnded": ended, "oneTime": False},
        )
    return UserSet(membership, new_user, previous, bool(password), _has_password(user), ended)


def _has_password(user: AbstractBaseUser) -> bool:
    # Django counts an empty hash as usable, yet no password matches it: what a user made without
    # one (`User.objects.create(username=…)`, this command before it required one) holds.
    return bool(user.password) and user.has_usable_password()


class AlreadyMember(Conflict):
    """Adding a user who is a member of the tenant already: a member has one role, changed with
    `change_role`, never a second membership."""

    code = "already_member"


class UsernameTaken(Conflict):
    """A new user by a name a user of the deployment already has (usernames are the deployment's,
    not a tenant's): adding them is adding an existing user, a choice the admin makes knowingly."""

    code = "username_taken"

    @classmethod
    def of(cls, username: str) -> UsernameTaken:
        return cls(
            f"A user called {username} exists already: add them as an existing user, or choose another name",
            field="username",
        )


class UnknownUser(NotFound):
    """An existing user to add, by a name no user has."""


class AccountDisabled(Conflict):
    """A user whose account is disabled (`is_active` off: Django refuses their sign-in): neither
    added as a member (they could not use it, and would be one without anyone noticing the day the
    account is enabled again) nor given a new password (it would not let them in). The deployment's
    operator enables the account first."""

    code = "account_disabled"

    @classmethod
    def of(cls, username: str, *, what: str) -> AccountDisabled:
        return cls(
            f"The account of {username} is disabled, so they cannot sign in: {what}. "
            f"The deployment's operator can enable it again (manage.py ledger enable-user {username})",
            field="username",
        )


@dataclass(frozen=True)
class Added:
    membership: Membership
    # A new user's one-time password: returned once, stored only as Django's hash. None: an
    # existing user, who keeps their own.
    password: str | None


# The one-time password's alphabet: lower-case letters and digits without the ones a person
# misreads when handing it over (0/o, 1/l/i): 25 characters of 31, ~124 bits.
_PASSWORD_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"
_PASSWORD_GROUPS, _PASSWORD_GROUP = 5, 5


def one_time_password(username: str) -> str:
    """A strong random password, five dashed groups of five (`k7fq2-…`), that passes
    AUTH_PASSWORD_VALIDATORS for `username` (drawn again in the unlikely case it does not)."""
    while True:
        password = "-".join(
            "".join(secrets.choice(_PASSWORD_ALPHABET) for _ in range(_PASSWORD_GROUP)) for _ in range(_PASSWORD_GROUPS)
        )
        try:
            validate_password(password, user=get_user_model()(username=username))
        except ValidationError:
            continue
        return password


@transaction.atomic
def add_member(
    *, username: str, tenant: str, role: str, new_user: bool, by: audit.Actor | AbstractBaseUser = CLI
) -> Added:
    """Make a user a member of the tenant with a role; audited as member.added (as `create_user`
    adds one). `new_user`: make the user, with a one-time password (`one_time_password`) returned
    in `Added` and nowhere else; otherwise an existing user, whose password is not touched. Refused
    (nothing written): a role or username that is not one (`details.field`), AlreadyMember, a new
    user by a taken name (UsernameTaken), an existing one by a name nobody has (UnknownUser)."""
    _check_role(role)
    model = get_user_model()
    username = model.normalize_username(username.strip())
    if not username:
        raise LedgerError("Name the user to add", field="username")
    t = _existing_tenant(tenant)
    password = None
    if new_user:
        _check_username(username)
        if model.objects.filter(username=username).exists():
            raise UsernameTaken.of(username)
        password = one_time_password(username)
        user = model(username=username)
        user.set_password(password)
        try:
            # Another tenant's admin may make the same name at the same moment: the unique
            # username decides, and the loser is told the name is taken rather than failing.
            with transaction.atomic():
                user.save()
        except IntegrityError:
            raise UsernameTaken.of(username) from None
    else:
        found = model.objects.filter(username=username).first()
        if found is None:
            raise UnknownUser(
                f"No user is called {username}: check the name, or add them as a new user", field="username"
            )
        user = found
        existing = Membership.objects.filter(user=user, tenant=t).first()
        if existing is not None:
            raise AlreadyMember(
                f"{username} is a member of {t.slug} already ({existing.role}): change their role instead",
                field="username",
            )
        if not user.is_active:
            raise AccountDisabled.of(username, what="they are not added")
    return Added(_add_membership(t, user, role, by=by), password)


class ResetNotAllowed(LedgerError):
    """A tenant admin may not set this account's password: their own (they change it themselves,
    knowing the current one), a deployment operator's (Django staff or superuser), or one that is
    also a member of a tenant they do not administer (a new password would hand them the account
    there too: docs/security.md § Roles)."""

    code = "reset_not_allowed"
    status = 403


@dataclass(frozen=True)
class PasswordReset:
    username: str
    # The new one-time password: returned once, stored only as Django's hash.
    password: str
    # The user's sessions that were open and are now ended (deleted).
    sessions_ended: int


@transaction.atomic
def reset_password(
    *, username: str, tenant: str | None = None, by: audit.Actor | AbstractBaseUser = CLI
) -> PasswordReset:
    """Give a user a new one-time password (`one_time_password`, returned in `PasswordReset` and
    nowhere else), end every session they have open, and forget their failed logins (a lockout
    would keep the new password out); audited as member.password_reset in each tenant they are a
    member of.

    By a tenant admin (`by` a user, `tenant` theirs): the user must be a member of `tenant`
    (else NotFound, as another tenant's member is), and `_may_reset` decides. By the command line:
    any user of the deployment (`tenant` None), as `manage.py changepassword` can. AccountDisabled
    for a disabled account either way."""
    model = get_user_model()
    t = None
    if tenant is not None:
        t = _locked_tenant(slug=tenant)
        membership = (
            Membership.objects.select_related("user").filter(user__username=username, tenant=t).first() if t else None
        )
        if t is None or membership is None:
            raise NotFound(f"{username} is not a member of {tenant}")
        user = membership.user
    else:
        found = model.objects.filter(username=username).first()
        if found is None:
            raise NotFound(f"No user is called {username}")
        user = found
    if not isinstance(by, audit.Actor):
        if t is None:
            raise ResetNotAllowed("A member resets a password within a tenant they administer")
        _may_reset(user, by, t)
    if not user.is_active:
        raise AccountDisabled.of(username, what="a new password would not let them in")
    password = one_time_password(username)
    user.set_password(password)
    user.save(update_fields=["password"])
    ended = _end_sessions(user)
    forget_failed_logins(username=username)
    tenants = Tenant.objects.filter(pk__in=Membership.objects.filter(user=user).values("tenant")).order_by("slug")
    _audit_account(tenants, by, audit.Action.MEMBER_PASSWORD_RESET, username, {"sessionsEnded": ended})
    return PasswordReset(username, password, ended)


@dataclass(frozen=True)
class AccountChange:
    """What `disable_user` or `enable_user` did."""

    username: str
    # False: the account was so already; nothing was written.
    changed: bool
    # The tenants the user is a member of, by slug: the change is audited in each.
    tenants: tuple[str, ...]
    # Disabling: the user's sessions that were open and are now ended (deleted).
    sessions_ended: int = 0
    # Disabling: the tenants of which no admin with an enabled account is left, so nobody but the
    # operator can manage their members, keys or settings until one is.
    without_admin: tuple[str, ...] = ()
    # Enabling: False when the user has no password to sign in with (`ledger reset-password`).
    has_password: bool = True


@transaction.atomic
def disable_user(
    *, username: str, reason: str = "", force: bool = False, by: audit.Actor | AbstractBaseUser = CLI
) -> AccountChange:
    """Disable a user's account (Django's `is_active` off: every sign-in refused, with any
    password) and end every session they have open; audited as member.account_disabled, with the
    reason, in each tenant they are a member of. The deployment's operator's alone (the command
    line): an account belongs to the deployment, not to a tenant. Their memberships, roles and
    password stay, so `enable_user` gives the account back as it was. NotFound for a name nobody
    has; an account disabled already changes nothing (`changed` False). LastAdmin, with nothing
    changed, when they are the last admin with an enabled account of a tenant, unless `force`
    (the tenants then left so are `without_admin`)."""
    user = _user_for_update(username)
    reason = written(reason, field="reason", label="reason", required=False)
    tenants = _tenants_of(user)
    if not user.is_active:
        return AccountChange(username, False, tuple(t.slug for t in tenants))
    administered = Membership.objects.filter(user=user, role=Role.ADMIN).values("tenant_id")
    still_run = Membership.objects.filter(role=Role.ADMIN, user__is_active=True).exclude(user=user)
    without = list(
        Tenant.objects.filter(pk__in=administered)
        .exclude(pk__in=still_run.values("tenant_id"))
        .order_by("slug")
        .values_list("slug", flat=True)
    )
    if without and not force:
        raise LastAdmin(
            f"{username} is the last admin with an enabled account of {', '.join(without)}: disabled, nobody "
            "but the deployment's operator could manage its members, keys or settings; make another member "
            f"admin first, or disable it anyway: ledger disable-user {username} --force",
            field="username",
        )
    user.is_active = False
    user.save(update_fields=["is_active"])
    ended = _end_sessions(user)
    _audit_account(tenants, by, audit.Action.MEMBER_ACCOUNT_DISABLED, username, {"sessionsEnded": ended}, reason)
    return AccountChange(username, True, tuple(t.slug for t in tenants), ended, tuple(without))


@transaction.atomic
def enable_user(*, username: str, reason: str = "", by: audit.Actor | AbstractBaseUser = CLI) -> AccountChange:
    """Enable a disabled account again: the user signs in with the password they had, as the
    member of the tenants they were in, with the roles they had; audited as
    member.account_enabled, with the reason, in each of those tenants. Their failed logins are
    forgotten (a lockout from before would keep them out). NotFound for a name nobody has; an
    enabled account changes nothing (`changed` False)."""
    user = _user_for_update(username)
    reason = written(reason, field="reason", label="reason", required=False)
    tenants = _tenants_of(user)
    has_password = _has_password(user)
    if user.is_active:
        return AccountChange(username, False, tuple(t.slug for t in tenants), has_password=has_password)
    user.is_active = True
    user.save(update_fields=["is_active"])
    forget_failed_logins(username=username)
    _audit_account(tenants, by, audit.Action.MEMBER_ACCOUNT_ENABLED, username, None, reason)
    return AccountChange(username, True, tuple(t.slug for t in tenants), has_password=has_password)


def _audit_account(
    tenants: Iterable[Tenant],
    by: audit.Actor | AbstractBaseUser,
    action: str,
    username: str,
    details: dict[str, Any] | None,
    reason: str = "",
) -> None:
    """A change to a user's account (password, enabled), audited in each tenant they are in."""
    for each in tenants:
        audit.record(actor=by, tenant=each, action=action, target=f"user:{username}", reason=reason, details=details)


def _user_for_update(username: str) -> User:
    """The user by name, their row locked (two operators' changes take turns); NotFound."""
    if not username.strip():
        raise LedgerError("Name the user", field="username")
    found = get_user_model().objects.select_for_update().filter(username=username).first()
    if found is None:
        raise NotFound(f"No user is called {username}", field="username")
    return found


def _tenants_of(user: AbstractBaseUser) -> list[Tenant]:
    return list(
        Tenant.objects.filter(pk__in=Membership.objects.filter(user_id=user.pk).values("tenant")).order_by("slug")
    )


def _may_reset(user: AbstractBaseUser, admin: AbstractBaseUser, tenant: Tenant) -> None:
    """ResetNotAllowed unless `admin`, an admin of `tenant`, may set `user`'s password: not their
    own, not a deployment operator's, and only if every tenant `user` belongs to is one `admin`
    administers. The refusal names no other tenant: that would tell this tenant's admin of it."""
    name = user.get_username()
    administered = set(Membership.objects.filter(user_id=admin.pk, role=Role.ADMIN).values_list("tenant_id", flat=True))
    if tenant.pk not in administered:
        raise ResetNotAllowed(f"Only an admin of {tenant.slug} resets its members' passwords")
    if user.pk == admin.pk:
        raise ResetNotAllowed(
            "This is your own account: change your password under your name at the top right "
            "(Change your password), with your current one",
            field="username",
        )
    if getattr(user, "is_staff", False) or getattr(user, "is_superuser", False):
        raise ResetNotAllowed(
            f"{name} is an account of the deployment's operators: only they set its password",
            field="username",
        )
    elsewhere = Membership.objects.filter(user_id=user.pk).exclude(tenant_id__in=administered)
    if elsewhere.exists():
        raise ResetNotAllowed(
            f"{name} is also a member of another tenant, one you do not administer: a new password "
            f"would give you their account there too. The deployment's operator can reset it "
            f"(manage.py ledger reset-password {name})",
            field="username",
        )


def _end_sessions(user: AbstractBaseUser) -> int:
    """Delete the user's open sessions, returning how many. The new password ends them already
    (Django refuses a session whose hash of the password is not the current one, and so do the
    streams' re-checks: console/streams.py); deleting them makes it so at once and everywhere.
    Sessions are found by decoding each unexpired one: the session table has no user column."""
    store = import_module(settings.SESSION_ENGINE).SessionStore
    if not hasattr(store, "get_model_class"):
        return 0  # cache or cookie sessions: the password's hash alone ends them
    model = store.get_model_class()
    live = model.objects.filter(expire_date__gt=timezone.now()).values_list("session_key", "session_data")
    owner = str(user.pk)
    keys = [key for key, data in live.iterator() if str(store().decode(data).get(SESSION_KEY)) == owner]
    model.objects.filter(session_key__in=keys).delete()
    return len(keys)


def _check_username(username: str) -> None:
    """The user model's own rules for a username (Django's: at most 150 characters of letters,
    digits and @ . + - _), as LedgerError by the field."""
    field = get_user_model()._meta.get_field("username")
    try:
        field.clean(username, None)
    except ValidationError as exc:
        raise LedgerError("Username refused: " + " ".join(exc.messages), field="username") from None


def _check_password(password: str, username: str) -> None:
    # AUTH_PASSWORD_VALIDATORS, before anything is written: a refused password changes nothing.
    try:
        validate_password(password, user=get_user_model()(username=username))
    except ValidationError as exc:
        raise LedgerError("password refused: " + " ".join(exc.messages)) from None


def _add_membership(tenant: Tenant, user: User, role: str, *, by: audit.Actor | AbstractBaseUser) -> Membership:
    membership = Membership.objects.create(user=user, tenant=tenant, role=role)
    audit.record(
        actor=by,
        tenant=tenant,
        action=audit.Action.MEMBER_ADDED,
        target=f"user:{user.get_username()}",
        details={"role": role},
    )
    return membership


@transaction.atomic
def change_role(*, username: str, tenant: str, role: str, by: audit.Actor | AbstractBaseUser = CLI) -> bool:
    """Give a member another role; audited as member.changed. False when it is their role
    already (nothing written). LastAdmin when it would leave the tenant without an admin."""
    _check_role(role)
    t = _existing_tenant(tenant)
    membership = Membership.objects.filter(user__username=username, tenant=t).first()
    if membership is None:
        raise NotFound(f"{username} is not a member of {tenant}")
    return _set_role(t, membership, role, by=by)


@transaction.atomic
def remove_member(*, username: str, tenant: str, by: audit.Actor | AbstractBaseUser = CLI) -> None:
    """End a user's membership of a tenant (the user account stays); audited as member.removed.
    LastAdmin for the tenant's last admin."""
    t = _existing_tenant(tenant)
    membership = Membership.objects.filter(user__username=username, tenant=t).first()
    if membership is None:
        raise NotFound(f"{username} is not a member of {tenant}")
    _keep_an_admin(t, membership, None)
    role = membership.role
    membership.delete()
    audit.record(
        actor=by,
        tenant=t,
        action=audit.Action.MEMBER_REMOVED,
        target=f"user:{username}",
        details={"role": role},
    )


@dataclass(frozen=True)
class Member:
    username: str
    role: str
    added_at: datetime | None
    # False: the account is disabled (Django refuses its sign-in).
    active: bool = True


def members(tenant: Tenant) -> list[Member]:
    """The tenant's members by name, each with their role and when they were last added (their
    `member.added` entry: memberships keep no date of their own; None when none was written)."""
    rows = list(Membership.objects.filter(tenant=tenant).select_related("user").order_by("user__username", "pk"))
    added = audit.members_added(tenant, [m.user.get_username() for m in rows])
    return [
        Member(m.user.get_username(), str(m.role), added.get(m.user.get_username()), m.user.is_active) for m in rows
    ]


def beyond_reset(tenant: Tenant, admin: AbstractBaseUser) -> set[str]:
    """The usernames of the tenant's members whose password `admin` may not reset (`_may_reset`:
    a deployment operator's account, or a member of a tenant `admin` does not administer), for the
    Members list to offer the reset only where it works (one query)."""
    administered = Membership.objects.filter(user_id=admin.pk, role=Role.ADMIN).values("tenant_id")
    elsewhere = Membership.objects.filter(user_id=OuterRef("user_id")).exclude(tenant_id__in=administered)
    rows = Membership.objects.filter(tenant=tenant).filter(
        Q(Exists(elsewhere)) | Q(user__is_staff=True) | Q(user__is_superuser=True)
    )
    return set(rows.values_list("user__username", flat=True))


def _check_role(role: str) -> None:
    if role not in Role.values:
        raise LedgerError(f"role must be one of {', '.join(Role.values)}, got {role!r}", field="role")


def _locked_tenant(*, slug: str) -> Tenant | None:
    """The tenant, its row locked: membership changes of one tenant take turns, so two admins
    demoting each other at once cannot leave it without one."""
    return Tenant.objects.select_for_update().filter(slug=slug).first()


def _existing_tenant(slug: str) -> Tenant:
    """`_locked_tenant`, or NotFound naming the tenant (the command line's operator may mistype
    it; a console's admin names only their own)."""
    t = _locked_tenant(slug=slug)
    if t is None:
        raise NotFound(f"tenant {slug} not found (create it with ledger bootstrap)")
    return t


def _keep_an_admin(tenant: Tenant, membership: Membership, role: str | None) -> None:
    """LastAdmin when `membership` is an admin and would stop being one (`role` below admin, or
    None: removed) while no other admin of the tenant has an enabled account: an admin whose
    account is disabled cannot sign in, so does not count (`ledger disable-user`)."""
    if membership.role != Role.ADMIN or role == Role.ADMIN:
        return
    others = Membership.objects.filter(tenant=tenant, role=Role.ADMIN, user__is_active=True)
    if not others.exclude(pk=membership.pk).exists():
        name, what = membership.user.get_username(), "removed" if role is None else f"made {role}"
        if not membership.user.is_active:
            why = f"{name}'s account is disabled and {tenant.slug} has no admin with an enabled account"
        elif Membership.objects.filter(tenant=tenant, role=Role.ADMIN).exclude(pk=membership.pk).exists():
            why = f"{name} is the last admin of {tenant.slug} with an enabled account"
        else:
            why = f"{name} is the last admin of {tenant.slug}"
        raise LastAdmin(f"{why} and cannot be {what}: make another member admin first", field="role")


def _set_role(tenant: Tenant, membership: Membership, role: str, *, by: audit.Actor | AbstractBaseUser) -> bool:
    before = str(membership.role)
    if before == role:
        return False
    _keep_an_admin(tenant, membership, role)
    membership.role = role
    membership.save(update_fields=["role"])
    audit.record(
        actor=by,
        tenant=tenant,
        action=audit.Action.MEMBER_CHANGED,
        target=f"user:{membership.user.get_username()}",
        details={"role": role, "previousRole": before},
    )
    return True


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@transaction.atomic
def create_key(
    *, workspace: Workspace, scopes: Iterable[str], name: str = "", by: audit.Actor | AbstractBaseUser = CLI
) -> tuple[ApiKey, str]:
    """Create an API key; the secret is returned once and only its hash is stored. Audited."""
    scopes = sorted(set(scopes))
    unknown = set(scopes) - set(ApiKey.SCOPES)
    if not scopes or unknown:
        raise LedgerError(f"scopes must be a non-empty subset of {', '.join(ApiKey.SCOPES)}")
    most = ApiKey._meta.get_field("name").max_length or 200
    if len(name) > most:  # PostgreSQL's column refuses it (a traceback), SQLite's would keep it all
        raise InvalidRequest(f"a key name has at most {most} characters", field="name", limit=most)
    name = redact_text(plain_name(name, field="name", label="key name"), workspace)
    prefix = secrets.token_hex(6)
    key = f"{KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    api_key = ApiKey.objects.create(
        workspace=workspace, name=name, prefix=prefix, secret_hash=_hash(key), scopes=scopes
    )
    audit.record(
        actor=by,
        tenant=workspace.tenant,
        workspace=workspace,
        action=audit.Action.API_KEY_CREATED,
        target=audit.key_actor(api_key),
        details={"name": name, "scopes": scopes},
    )
    return api_key, key


def authenticate_key(key: str) -> ApiKey | None:
    """The live ApiKey for a presented secret, or None; notes its use (`_note_use`)."""
    if not key.startswith(KEY_PREFIX):
        return None
    prefix, _, _ = key[len(KEY_PREFIX) :].partition("_")
    api_key = _key_with_workspace(prefix)
    if api_key is None or api_key.revoked_at is not None:
        return None
    if not hmac.compare_digest(api_key.secret_hash, _hash(key)):
        return None
    _note_use(api_key)
    return api_key


class _KeyQuery:
    """`ApiKey.objects.select_related("workspace__tenant").filter(prefix=…).first()`, its SQL
    written once. Every request with an API key makes this read, and through the ORM it cost ~1 ms
    (PostgreSQL, quiet machine): ~0.24 ms compiling the three models' 24 columns into SQL and
    ~0.24 ms for PostgreSQL to plan the join again, for a 0.02 ms execution. Here the statement is
    built once, prepared on PostgreSQL (planned once per connection), and the rows become the same
    instances the ORM makes (`from_db`, each field's converters, the related objects cached as
    `select_related` caches them); tests/test_tenancy.py holds it to the ORM's answer."""

    def __init__(self, vendor: str) -> None:
        self.models = (ApiKey, Workspace, Tenant)
        tables = ("k", "w", "t")
        self.fields = [list(m._meta.concrete_fields) for m in self.models]
        self.attnames = [[f.attname for f in fields] for fields in self.fields]
        columns = ", ".join(
            f"{alias}.{column(model, f.name)}"
            for alias, model, fields in zip(tables, self.models, self.fields)
            for f in fields
        )
        placeholder = "$1" if vendor == "postgresql" else "%s"
        self.sql = (
            f"SELECT {columns} FROM {table(ApiKey)} k"
            f" JOIN {table(Workspace)} w ON w.{column(Workspace, 'id')} = k.{column(ApiKey, 'workspace')}"
            f" JOIN {table(Tenant)} t ON t.{column(Tenant, 'id')} = w.{column(Workspace, 'tenant')}"
            f" WHERE k.{column(ApiKey, 'prefix')} = {placeholder}"
        )
        self.prepared = self.sql.encode() if vendor == "postgresql" else None
        # What the ORM runs on a column's value, for the columns that have any: the backend's
        # converters, then the field's.
        self.converters = []
        position = 0
        for alias, fields in zip(tables, self.fields):
            for f in fields:
                col = f.get_col(alias)
                converters = connection.ops.get_db_converters(col) + f.get_db_converters(connection)  # type: ignore[attr-defined]  # not in django-stubs
                if converters:
                    self.converters.append((position, col, converters))
                position += 1

    def fetch(self, prefix: str) -> ApiKey | None:
        if self.prepared is not None:
            row = statements.fetch_one(self.prepared, (prefix,))
        else:
            with connection.cursor() as cursor:
                cursor.execute(self.sql, [prefix])
                row = cursor.fetchone()
        if row is None:
            return None
        values = list(row)
        for i, col, converters in self.converters:
            for convert in converters:
                values[i] = convert(values[i], col, connection)
        objects, start = [], 0
        for model, attnames in zip(self.models, self.attnames):
            objects.append(model.from_db(connection.alias, attnames, values[start : start + len(attnames)]))
            start += len(attnames)
        api_key, workspace, tenant = objects
        assert isinstance(api_key, ApiKey)
        ApiKey._meta.get_field("workspace").set_cached_value(api_key, workspace)
        Workspace._meta.get_field("tenant").set_cached_value(workspace, tenant)
        return api_key


_key_queries: dict[str, _KeyQuery] = {}


def _key_with_workspace(prefix: str) -> ApiKey | None:
    query = _key_queries.get(connection.vendor)
    if query is None:
        query = _key_queries[connection.vendor] = _KeyQuery(connection.vendor)
    return query.fetch(prefix)


def _note_use(api_key: ApiKey) -> None:
    """Stamp `last_used_at`, at most once a minute per key: the row just read says whether the
    stamp is stale, so a busy key costs no write on most requests. The conditional UPDATE makes
    concurrent requests at the turn of the minute write once between them."""
    now = clock.now()
    stale = now - LAST_USED_RESOLUTION
    if api_key.last_used_at is not None and api_key.last_used_at > stale:
        return
    ApiKey.objects.filter(Q(last_used_at__isnull=True) | Q(last_used_at__lte=stale), pk=api_key.pk).update(
        last_used_at=now
    )
    api_key.last_used_at = now


def keys(*, workspace: Workspace | None = None, include_revoked: bool = True) -> QuerySet[ApiKey]:
    """API keys (of one workspace, or all: the command line's view), newest first."""
    qs = ApiKey.objects.select_related("workspace__tenant").order_by("-created_at", "-pk")
    if workspace is not None:
        qs = qs.filter(workspace=workspace)
    return qs if include_revoked else qs.filter(revoked_at__isnull=True)


def key_by_prefix(prefix: str, *, workspace: Workspace | None = None) -> ApiKey | None:
    """The key with this prefix (in `workspace` when given: a member sees only their own)."""
    return keys(workspace=workspace).filter(prefix=prefix).first()


@transaction.atomic
def revoke_key(api_key: ApiKey, *, by: audit.Actor | AbstractBaseUser = CLI, reason: str = "") -> bool:
    """Revoke a key (idempotent: only the first revocation is audited, and returns True)."""
    reason = written(reason, field="reason", label="reason", required=False, workspace=api_key.workspace)
    revoked = ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    if revoked:
        workspace = Workspace.objects.select_related("tenant").get(pk=api_key.workspace_id)
        audit.record(
            actor=by,
            tenant=workspace.tenant,
            workspace=workspace,
            action=audit.Action.API_KEY_REVOKED,
            target=audit.key_actor(api_key),
            reason=reason,
            details={"name": api_key.name},
        )
    api_key.refresh_from_db(fields=["revoked_at"])
    return bool(revoked)
