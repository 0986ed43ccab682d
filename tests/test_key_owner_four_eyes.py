"""Four eyes on people, not keys (docs/security.md "Roles"): a key made with `ledger create-key
--owner USERNAME` belongs to that member, and what it requests counts as theirs, so they cannot
approve a re-execution their key asked for; another approver can. A key made without an owner is
unowned (its requests are nobody's)."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from ledger import audit
from ledger.models import ApiKey, ReexecutionRequest
from ledger.reads.reexecutions import as_dict
from ledger.reexecution import services
from ledger.reexecution.errors import Forbidden, SelfApprovalForbidden
from ledger.tenancy.services import authenticate_key
from tests.conftest import ev, started

pytestmark = pytest.mark.usefixtures("clock")


def _key(*extra: str) -> ApiKey:
    out = io.StringIO()
    call_command("ledger", "create-key", "--workspace", "acme/support", "--scopes", "execute,read", *extra, stdout=out)
    key = authenticate_key(out.getvalue().strip())
    assert key is not None
    return key


@pytest.fixture
def run(append) -> str:
    append("run_k", started(), ev("RunCompleted", output="ok"))
    return "run_k"


def test_a_keys_owner_cannot_approve_what_the_key_requested(workspace, run, approver, admin) -> None:
    key = _key("--owner", approver.get_username())
    assert audit.key_owner_id(key) == approver.pk
    asked = services.request_reexecution(workspace=workspace, run_id=run, mode="rerun", reason="nightly", by=key)
    with pytest.raises(SelfApprovalForbidden, match="owner of the key"):
        services.approve(workspace=workspace, reexecution_id=asked.public_id, by=approver, note="mine")
    assert ReexecutionRequest.objects.get(pk=asked.pk).status == ReexecutionRequest.Status.PENDING_APPROVAL
    [approved] = services.approve(workspace=workspace, reexecution_id=asked.public_id, by=admin, note="fine")
    assert approved.status == ReexecutionRequest.Status.APPROVED


def test_a_keys_owner_cannot_deny_what_the_key_requested_either(workspace, run, approver, admin) -> None:
    key = _key("--owner", approver.get_username())
    asked = services.request_reexecution(workspace=workspace, run_id=run, mode="rerun", reason="nightly", by=key)
    with pytest.raises(SelfApprovalForbidden, match="owner of the key"):
        services.deny(workspace=workspace, reexecution_id=asked.public_id, by=approver, note="mine after all")
    assert ReexecutionRequest.objects.get(pk=asked.pk).status == ReexecutionRequest.Status.PENDING_APPROVAL


def test_a_key_without_an_owner_is_nobodys_and_an_unknown_owner_is_refused(
    workspace, other_workspace, run, approver
) -> None:
    assert audit.key_owner_id(_key()) is None
    with pytest.raises(CommandError, match="not a member"):
        _key("--owner", "nobody-here")
    from tests.conftest import named_user

    olga = named_user("olga", "admin", tenant="globex")
    with pytest.raises(CommandError, match="not a member"):  # a member of another tenant cannot own this tenant's key
        _key("--owner", olga.get_username())


def test_a_request_made_with_an_unowned_key_is_approved_only_by_an_admin(workspace, run, approver, admin) -> None:
    key = _key()  # no --owner: nobody answers for it
    asked = services.request_reexecution(workspace=workspace, run_id=run, mode="rerun", reason="nightly", by=key)
    assert audit.requested_by_unowned_key(asked)
    assert as_dict(ReexecutionRequest.objects.select_related("workspace__tenant").get(pk=asked.pk))["unownedKey"]
    with pytest.raises(Forbidden, match="belongs to nobody") as refused:
        services.approve(workspace=workspace, reexecution_id=asked.public_id, by=approver, note="looks fine")
    assert refused.value.details.get("role") == "admin"
    assert ReexecutionRequest.objects.get(pk=asked.pk).status == ReexecutionRequest.Status.PENDING_APPROVAL
    [approved] = services.approve(workspace=workspace, reexecution_id=asked.public_id, by=admin, note="checked")
    assert approved.status == ReexecutionRequest.Status.APPROVED


def test_an_approver_may_still_deny_an_unowned_keys_request_and_an_owned_one_carries_no_flag(
    workspace, run, approver, operator
) -> None:
    asked = services.request_reexecution(workspace=workspace, run_id=run, mode="rerun", reason="r", by=_key())
    [denied] = services.deny(workspace=workspace, reexecution_id=asked.public_id, by=approver, note="who is this")
    assert denied.status == ReexecutionRequest.Status.DENIED
    owned = services.request_reexecution(
        workspace=workspace, run_id=run, mode="rerun", reason="r", by=_key("--owner", operator.get_username())
    )
    assert not audit.requested_by_unowned_key(owned)
    [approved] = services.approve(workspace=workspace, reexecution_id=owned.public_id, by=approver, note="ok")
    assert approved.status == ReexecutionRequest.Status.APPROVED


def test_the_approvals_page_warns_and_hides_approve_from_non_admins(client, workspace, run, approver, admin) -> None:
    asked = services.request_reexecution(workspace=workspace, run_id=run, mode="rerun", reason="r", by=_key())
    approve_url = f"/w/acme/support/approvals/{asked.public_id}/approve/"
    client.force_login(approver)
    html = client.get("/w/acme/support/approvals/").content.decode()
    assert "belongs to nobody" in html and "Only an admin may approve it." in html
    assert f'formaction="{approve_url}"' not in html
    client.post(approve_url, {"note": "anyway"})
    assert ReexecutionRequest.objects.get(pk=asked.pk).status == ReexecutionRequest.Status.PENDING_APPROVAL
    client.force_login(admin)
    html = client.get("/w/acme/support/approvals/").content.decode()
    assert "belongs to nobody" in html and f'formaction="{approve_url}"' in html


def test_the_owner_of_the_requesting_key_has_no_approve_button(client, workspace, run, approver) -> None:
    key = _key("--owner", approver.get_username())
    asked = services.request_reexecution(workspace=workspace, run_id=run, mode="rerun", reason="r", by=key)
    client.force_login(approver)
    html = client.get("/w/acme/support/approvals/").content.decode()
    assert f'formaction="/w/acme/support/approvals/{asked.public_id}/approve/"' not in html
    assert "belongs to nobody" not in html


def test_key_lists_name_the_owner_or_flag_the_key_unowned(client, workspace, other_workspace, approver, admin) -> None:
    owned, unowned = _key("--owner", approver.get_username()), _key()
    out = io.StringIO()
    call_command("ledger", "keys", "list", "--workspace", "acme/support", stdout=out)
    lines = {line.split("\t")[0]: line.split("\t") for line in out.getvalue().splitlines()}
    assert lines["PREFIX"][4] == "OWNER"
    assert lines[owned.prefix][4] == approver.get_username()
    assert lines[unowned.prefix][4] == "(unowned)"
    client.force_login(admin)
    html = client.get("/w/acme/support/settings/").content.decode()
    row = html.split(f'id="key-{unowned.prefix}"')[1].split("</tr>")[0]
    assert 'class="warn unowned">unowned<' in row
    row = html.split(f'id="key-{owned.prefix}"')[1].split("</tr>")[0]
    assert f'<td class="owner">{approver.get_username()}</td>' in row
    from tests.conftest import named_user

    client.force_login(named_user("olga", "admin", tenant="globex"))  # another tenant: the settings page is 404
    assert client.get("/w/acme/support/settings/").status_code == 404
