"""Tenancy services: tenants, workspaces, members and API keys."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from .. import audit, clock
from ..errors import Conflict, LedgerError, NotFound
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


@transaction.atomic
def bootstrap(*, tenant: str, workspace: str) -> Workspace:
    """Create the tenant and workspace if absent (idempotent)."""
    t, _ = Tenant.objects.get_or_create(slug=tenant, defaults={"name": tenant})
    ws, _ = Workspace.objects.get_or_create(tenant=t, slug=workspace, defaults={"name": workspace})
    return ws


class LastAdmin(Conflict):
    """Removing or demoting the tenant's last admin: nobody could manage its members, keys or
    settings any more (not even to undo it) but the command line's operator."""

    code = "last_admin"


@transaction.atomic
def create_user(
    *,
    username: str,
    tenant: str,
    role: str,
    password: str | None,
    by: audit.Actor | AbstractBaseUser = CLI,
) -> Membership:
    """Create or update a user and their membership (one role per tenant); audited as
    member.added or member.changed (a role change, as `change_role`; a password alone is not a
    membership change)."""
    _check_role(role)
    t = _locked_tenant(slug=tenant)
    if t is None:
        raise NotFound(f"tenant {tenant} not found (create it with ledger bootstrap)")
    if password:
        _check_password(password, username)
    user, _ = get_user_model().objects.get_or_create(username=username)
    if password:
        user.set_password(password)
        user.save()
    membership = Membership.objects.filter(user=user, tenant=t).first()
    if membership is None:
        membership = _add_membership(t, user, role, by=by)
    else:
        _set_role(t, membership, role, by=by)
    return membership


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
    t = _locked_tenant(slug=tenant)
    if t is None:
        raise NotFound(f"tenant {tenant} not found (create it with ledger bootstrap)")
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
    return Added(_add_membership(t, user, role, by=by), password)


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
    t = _locked_tenant(slug=tenant)
    membership = Membership.objects.filter(user__username=username, tenant=t).first() if t else None
    if t is None or membership is None:
        raise NotFound(f"{username} is not a member of {tenant}")
    return _set_role(t, membership, role, by=by)


@transaction.atomic
def remove_member(*, username: str, tenant: str, by: audit.Actor | AbstractBaseUser = CLI) -> None:
    """End a user's membership of a tenant (the user account stays); audited as member.removed.
    LastAdmin for the tenant's last admin."""
    t = _locked_tenant(slug=tenant)
    membership = Membership.objects.filter(user__username=username, tenant=t).first() if t else None
    if t is None or membership is None:
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


def members(tenant: Tenant) -> list[Member]:
    """The tenant's members by name, each with their role and when they were last added (their
    `member.added` entry: memberships keep no date of their own; None when none was written)."""
    rows = list(Membership.objects.filter(tenant=tenant).select_related("user").order_by("user__username", "pk"))
    added = audit.members_added(tenant, [m.user.get_username() for m in rows])
    return [Member(m.user.get_username(), str(m.role), added.get(m.user.get_username())) for m in rows]


def _check_role(role: str) -> None:
    if role not in Role.values:
        raise LedgerError(f"role must be one of {', '.join(Role.values)}, got {role!r}", field="role")


def _locked_tenant(*, slug: str) -> Tenant | None:
    """The tenant, its row locked: membership changes of one tenant take turns, so two admins
    demoting each other at once cannot leave it without one."""
    return Tenant.objects.select_for_update().filter(slug=slug).first()


def _keep_an_admin(tenant: Tenant, membership: Membership, role: str | None) -> None:
    """LastAdmin when `membership` is the tenant's only admin and would stop being one (`role`
    below admin, or None: removed)."""
    if membership.role != Role.ADMIN or role == Role.ADMIN:
        return
    if not Membership.objects.filter(tenant=tenant, role=Role.ADMIN).exclude(pk=membership.pk).exists():
        what = "removed" if role is None else f"made {role}"
        raise LastAdmin(
            f"{membership.user.get_username()} is the last admin of {tenant.slug} and cannot be {what}: "
            "make another member admin first",
            field="role",
        )


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
