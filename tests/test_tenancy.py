"""Tenants, members and API keys, through the management commands of docs/api.md."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from ledger.models import ApiKey, Membership, Tenant, Workspace
from ledger.tenancy.services import authenticate_key, revoke_key

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("ledger", *args, stdout=out)
    return out.getvalue()


def test_bootstrap_is_idempotent() -> None:
    run("bootstrap", "--tenant", "acme", "--workspace", "support")
    run("bootstrap", "--tenant", "acme", "--workspace", "support")
    run("bootstrap", "--tenant", "acme", "--workspace", "research")
    assert Tenant.objects.count() == 1
    assert sorted(Workspace.objects.values_list("slug", flat=True)) == ["research", "support"]


@pytest.mark.parametrize(
    ("tenant", "workspace"), [("Bad Slug", "support"), ("acme", "a/b"), ("acme", "x" * 65), ("", "support")]
)
def test_bootstrap_refuses_a_name_no_address_can_hold(tenant: str, workspace: str) -> None:
    """A tenant or workspace is named in the console's and the API's addresses: one they cannot
    hold would be made and never reached (or, past the column, end in a database error)."""
    with pytest.raises(CommandError, match="must be 1 to 64 letters, digits, '-' or '_'"):
        run("bootstrap", "--tenant", tenant, "--workspace", workspace)
    assert not Tenant.objects.exists() and not Workspace.objects.exists()


def test_create_user_creates_then_updates_the_role() -> None:
    run("bootstrap", "--tenant", "acme", "--workspace", "support")
    run("create-user", "carol", "--tenant", "acme", "--role", "operator", "--password", "pw-carol-1")
    run("create-user", "carol", "--tenant", "acme", "--role", "approver")
    membership = Membership.objects.get(user__username="carol")
    assert membership.role == "approver"
    assert membership.user.check_password("pw-carol-1")
    assert membership.allows("operator") and not membership.allows("admin")


def test_create_user_needs_an_existing_tenant() -> None:
    with pytest.raises(CommandError, match="tenant nope not found"):
        run("create-user", "x", "--tenant", "nope", "--role", "viewer")


def test_create_key_prints_the_key_alone_and_stores_only_its_hash() -> None:
    run("bootstrap", "--tenant", "acme", "--workspace", "support")
    out = run("create-key", "--workspace", "acme/support", "--scopes", "ingest,read", "--name", "ci")
    key = out.strip()
    assert out == key + "\n"
    api_key = ApiKey.objects.get()
    assert key not in (api_key.secret_hash, api_key.prefix) and api_key.secret_hash != key
    assert api_key.scopes == ["ingest", "read"] and api_key.name == "ci"
    found = authenticate_key(key)
    assert found == api_key and found.has_scope("read") and not found.has_scope("execute")


def test_tampered_or_revoked_keys_do_not_authenticate() -> None:
    run("bootstrap", "--tenant", "acme", "--workspace", "support")
    key = run("create-key", "--workspace", "acme/support", "--scopes", "read").strip()
    assert authenticate_key(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    assert authenticate_key("Bearer " + key) is None
    revoke_key(ApiKey.objects.get())
    assert authenticate_key(key) is None


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workspace", "acme/nope", "--scopes", "read"], "not found"),
        (["--workspace", "acme", "--scopes", "read"], "TENANT/WORKSPACE"),
        (["--workspace", "acme/support", "--scopes", "read,admin"], "scopes"),
    ],
)
def test_create_key_errors_are_clear(args, message) -> None:
    run("bootstrap", "--tenant", "acme", "--workspace", "support")
    with pytest.raises(CommandError, match=message):
        run("create-key", *args)


def _columns(obj: object) -> dict[str, object]:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}  # type: ignore[attr-defined]


def test_an_authenticated_key_is_the_row_the_orm_reads_with_its_workspace_and_tenant(django_assert_num_queries) -> None:
    # authenticate_key reads the key, its workspace and its tenant with SQL of its own (prepared on
    # PostgreSQL, ledger.tenancy.services._KeyQuery): every column, converted, as the ORM's select_related has it.
    run("bootstrap", "--tenant", "acme", "--workspace", "support")
    key = run("create-key", "--workspace", "acme/support", "--scopes", "ingest,read", "--name", "ci").strip()
    Workspace.objects.update(
        redact_keys=["ssn", "ключ"],
        redact_value_patterns=[r"\d{3}-\d{4}"],
        price_overrides={"openai/gpt-x": {"inputPerMillion": "1.5"}},
        share_hides_inputs=True,
        retention_days=30,
        approval_tools=["payments.send"],
    )
    authenticate_key(key)  # stamps last_used_at
    expected = ApiKey.objects.select_related("workspace__tenant").get()
    for _ in range(7):  # past the point where PostgreSQL would switch a prepared statement to its generic plan
        found = authenticate_key(key)
        assert found is not None
        assert _columns(found) == _columns(expected)
        assert _columns(found.workspace) == _columns(expected.workspace)
        assert _columns(found.workspace.tenant) == _columns(expected.workspace.tenant)
        assert found._state.db == "default" and not found._state.adding
    with django_assert_num_queries(0):  # the related objects came with the key
        assert found.workspace.tenant.slug == "acme" and found.workspace.redact_keys == ["ssn", "ключ"]
    assert authenticate_key("rl_" + "0" * 12 + "_x") is None  # no such prefix
