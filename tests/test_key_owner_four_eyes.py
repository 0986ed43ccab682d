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
from ledger.reexecution import services
from ledger.reexecution.errors import SelfApprovalForbidden
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
