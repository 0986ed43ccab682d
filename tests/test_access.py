"""ledger.tenancy.access: the one answer to "which workspace and run, as whom" for every transport."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser

from ledger.errors import LedgerError, NotFound
from ledger.models import Membership, Workspace
from ledger.tenancy import access
from ledger.tenancy.services import bootstrap, create_key
from tests.conftest import started


@pytest.fixture
def runs(workspace: Workspace, other_workspace: Workspace) -> None:
    from ledger.log import append

    append(workspace=workspace, run_id="run_a", events=[started()])
    append(workspace=other_workspace, run_id="run_b", events=[started()])


def test_member_finds_the_run_by_its_id_alone(runs: None, member: Any, workspace: Workspace) -> None:
    found = access.resolve(member, run_id="run_a")
    assert (found.workspace, found.run.run_id, found.role) == (workspace, "run_a", "admin")


def test_another_tenants_run_is_not_found_never_forbidden(runs: None, member: Any) -> None:
    with pytest.raises(NotFound):
        access.resolve(member, run_id="run_b")
    with pytest.raises(NotFound):
        access.resolve(member, workspace="globex/main", run_id="run_b")
    with pytest.raises(NotFound):
        access.resolve(AnonymousUser(), run_id="run_a")


def test_two_workspaces_holding_the_run_need_a_name(runs: None, member: Any) -> None:
    from ledger.log import append

    second = bootstrap(tenant="acme", workspace="research")
    append(workspace=second, run_id="run_a", events=[started()])
    with pytest.raises(access.WorkspaceRequired) as refused:
        access.resolve(member, run_id="run_a")
    assert refused.value.code == "workspace_required" and refused.value.status == 400
    assert access.resolve(member, workspace="acme/research", run_id="run_a").workspace == second


def test_key_scope_and_member_role_are_403(runs: None, workspace: Workspace, viewer: Any) -> None:
    key, _ = create_key(workspace=workspace, scopes=["read"])
    assert access.resolve(key, run_id="run_a", scope="read").api_key == key
    with pytest.raises(access.InsufficientScope):
        access.resolve(key, run_id="run_a", scope="ingest")
    with pytest.raises(access.RoleRequired):
        access.resolve(key, run_id="run_a", role="operator")  # a key never holds a role
    assert access.resolve(viewer, run_id="run_a").role == "viewer"
    with pytest.raises(access.RoleRequired):
        access.resolve(viewer, run_id="run_a", scope="ingest")


def test_a_key_sees_only_its_own_workspace(runs: None, workspace: Workspace) -> None:
    key, _ = create_key(workspace=workspace, scopes=["read"])
    with pytest.raises(NotFound):
        access.resolve(key, workspace="globex/main", run_id="run_b")


def test_the_command_line_sees_every_workspace(runs: None, other_workspace: Workspace) -> None:
    assert access.resolve(access.OPERATOR, run_id="run_b").workspace == other_workspace
    assert access.workspace_by_path("globex/main") == other_workspace
    with pytest.raises(LedgerError, match="TENANT/WORKSPACE"):
        access.workspace_by_path("globex")
    with pytest.raises(NotFound):
        access.resolve(access.OPERATOR, run_id="run_nope")


def test_tenant_usage_needs_an_admin_member(workspace: Workspace, member: Any, viewer: Any) -> None:
    assert access.tenant_admin(member) == workspace.tenant
    with pytest.raises(access.RoleRequired):
        access.tenant_admin(viewer)
    key, _ = create_key(workspace=workspace, scopes=["read"])
    with pytest.raises(access.RoleRequired):
        access.tenant_admin(key)


def test_a_named_workspace_and_the_members_role_are_one_query(
    runs: None, member: Any, viewer: Any, outsider: Any, workspace: Workspace, django_assert_num_queries: Any
) -> None:
    """The workspace and the membership of its tenant come together (every page and API call of a
    member names its workspace): the same Access as read apart, and the same 404s."""
    with django_assert_num_queries(1):
        found = access.resolve(viewer, workspace="acme/support")
    assert (found.workspace, found.role, found.user) == (workspace, "viewer", viewer)
    assert found.membership == Membership.objects.get(user=viewer, tenant=workspace.tenant)
    assert found.membership.tenant == workspace.tenant and found.membership.allows("viewer")
    assert not found.membership.allows("operator")
    with django_assert_num_queries(2):  # and the run
        assert access.resolve(member, workspace="acme/support", run_id="run_a").run.run_id == "run_a"
    for who, path in ((outsider, "acme/support"), (member, "globex/main"), (member, "acme/nope"), (member, "acme")):
        with pytest.raises(NotFound):
            access.resolve(who, workspace=path)
    with pytest.raises(access.RoleRequired):
        access.resolve(viewer, workspace="acme/support", role="operator")


def test_a_members_workspaces_with_their_memberships_are_one_query_and_resolve_alike(
    runs: None, member: Any, viewer: Any, outsider: Any, workspace: Workspace, django_assert_num_queries: Any
) -> None:
    """What the console's pages read once (the switcher's list, with the memberships) gives the
    same Access as `resolve`, and the same 404s and 403s: a workspace of another tenant, even one
    named like one of theirs, is none of theirs."""
    from ledger.reads import selectors

    bootstrap(tenant="globex", workspace="support")  # acme/support's slug, in the outsider's tenant
    with django_assert_num_queries(1):
        mine = selectors.member_workspaces(viewer)
    assert [ws for ws, _ in mine] == list(selectors.workspaces_for(viewer))
    named = next((ws, m) for ws, m in mine if (ws.tenant.slug, ws.slug) == ("acme", "support"))
    found = access.member_in(viewer, named, run_id="run_a")
    same = access.resolve(viewer, workspace="acme/support", run_id="run_a")
    assert (found.workspace, found.run, found.role, found.membership) == (
        same.workspace,
        same.run,
        same.role,
        same.membership,
    )
    theirs = selectors.member_workspaces(outsider)
    assert {(ws.tenant.slug, ws.slug) for ws, _ in theirs} == {("globex", "main"), ("globex", "support")}
    with pytest.raises(NotFound):  # another tenant's run in a workspace of theirs
        access.member_in(outsider, next(f for f in theirs if f[0].slug == "support"), run_id="run_a")
    with pytest.raises(NotFound):  # acme/support's pair, handed to someone else
        access.member_in(outsider, named)
    for who in (outsider, AnonymousUser()):
        with pytest.raises(NotFound):
            access.member_in(who, None)
    with pytest.raises(access.RoleRequired):
        access.member_in(viewer, named, role="operator")
    assert selectors.member_workspaces(AnonymousUser()) == []
