"""Per-workspace size limits (docs/security.md § Limits): the deployment's settings are the
defaults; the operator overrides them for one workspace with `ledger limits` (audited
`limits.changed`), and the override is what the write path and the per-key rate limit enforce, with
the limit in force in the error's details. A workspace's admins see the limits in force on the
Settings page, read-only; members below admin and other tenants do not see them."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from ledger import limits
from ledger.errors import RunTooLarge
from ledger.models import AuditEntry, Event, Run, Workspace
from ledger.tenancy.limits_settings import InvalidLimit, set_limits
from ledger.tenancy.services import CLI, create_key
from tests.conftest import ev, http_client, started

PAGE = "/w/acme/support/settings/"


def _limits(path: str, *args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("ledger", "limits", path, *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def _fresh(workspace: Workspace) -> Workspace:
    # As a request loads it (the API key's read, a page's lookup): the row as it is now.
    return Workspace.objects.select_related("tenant").get(pk=workspace.pk)


@pytest.fixture(autouse=True)
def defaults(settings: Any) -> None:
    settings.LEDGER_MAX_EVENTS_PER_RUN = 100
    settings.LEDGER_MAX_BYTES_PER_RUN = 1_000_000
    settings.LEDGER_MAX_EVENTS_PER_MINUTE_PER_KEY = 1000


@pytest.mark.django_db
def test_the_operator_lowers_a_workspace_limit_and_only_that_workspace_is_held_to_it(
    workspace: Workspace, other_workspace: Workspace
) -> None:
    out, err = _limits("acme/support", "--events-per-run", "3", "--reason", "a noisy harness")
    assert "1 limit(s) changed" in err
    assert "events-per-run\t3\t100\toverride" in out and "bytes-per-run\t1000000\t1000000\tdefault" in out
    from ledger import log

    ws = _fresh(workspace)
    log.append(workspace=ws, run_id="run_a", events=[started(), ev("custom.note"), ev("custom.note")])
    with pytest.raises(RunTooLarge) as refused:
        log.append(workspace=ws, run_id="run_a", events=[ev("custom.note")])
    assert refused.value.status == 413
    assert refused.value.details == {"index": 0, "limit": 3, "which": "events"}
    log.append(workspace=ws, run_id="run_a", events=[ev("RunCompleted", output="ok")])  # its ending still goes
    assert Run.objects.get(workspace=ws, run_id="run_a").status == "completed"
    # Another tenant's workspace keeps the deployment's default.
    log.append(workspace=other_workspace, run_id="run_a", events=[started(), *[ev("custom.note")] * 10])
    assert Event.objects.filter(run__workspace=other_workspace).count() == 11


@pytest.mark.django_db
def test_a_lower_bytes_override_is_enforced_and_default_puts_the_setting_back(workspace: Workspace) -> None:
    from ledger import log

    _limits("acme/support", "--bytes-per-run", "1024")
    ws = _fresh(workspace)
    log.append(workspace=ws, run_id="run_b", events=[started()])
    with pytest.raises(RunTooLarge) as refused:
        log.append(workspace=ws, run_id="run_b", events=[ev("custom.note", text="x" * 2000)])
    assert refused.value.details == {"index": 0, "limit": 1024, "which": "bytes"}
    out, _ = _limits("acme/support", "--bytes-per-run", "default")
    assert "bytes-per-run\t1000000\t1000000\tdefault" in out
    log.append(workspace=_fresh(workspace), run_id="run_b", events=[ev("custom.note", text="x" * 2000)])
    assert Workspace.objects.get(pk=workspace.pk).max_bytes_per_run is None


@pytest.mark.django_db(transaction=True)
def test_a_lower_per_key_override_answers_429_with_the_limit_in_force(
    workspace: Workspace, other_workspace: Workspace, clock: Any
) -> None:
    clock.moment = clock.moment.replace(second=0, microsecond=0)
    _limits("acme/support", "--events-per-minute-per-key", "2")
    ours = http_client(headers={"Authorization": f"Bearer {create_key(workspace=workspace, scopes=['ingest'])[1]}"})
    theirs = http_client(
        headers={"Authorization": f"Bearer {create_key(workspace=other_workspace, scopes=['ingest'])[1]}"}
    )
    batch = {"events": [started(), ev("custom.note"), ev("custom.note")]}
    refused = ours.post("/api/v1/runs/run_k/events", json=batch)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limited"
    assert refused.json()["error"]["details"]["limit"] == 2
    assert not Event.objects.filter(run__workspace=workspace).exists()
    assert theirs.post("/api/v1/runs/run_k/events", json=batch).status_code == 200  # the default there
    too_big = ours.post("/api/v1/runs/run_k/events", json={"events": [started(), *[ev("custom.note")] * 200]})
    assert too_big.status_code == 429  # the default (1000) would have let it through


@pytest.mark.django_db
def test_every_change_is_audited_and_a_no_change_is_not(workspace: Workspace) -> None:
    _limits("acme/support", "--events-per-run", "50", "--events-per-minute-per-key", "20", "--reason", "abuse")
    entry = AuditEntry.objects.get(action="limits.changed")
    assert (entry.actor, entry.target, entry.reason) == ("system:cli", "workspace:acme/support", "abuse")
    assert entry.workspace_id == workspace.pk
    assert entry.details == {
        "changed": {
            "max_events_per_run": {"old": None, "new": 50, "default": 100},
            "max_events_per_minute_per_key": {"old": None, "new": 20, "default": 1000},
        }
    }
    _, err = _limits("acme/support", "--events-per-run", "50")
    assert "nothing changed" in err
    assert AuditEntry.objects.filter(action="limits.changed").count() == 1
    _limits("acme/support", "--events-per-run", "default")
    last = AuditEntry.objects.filter(action="limits.changed").order_by("-pk").first()
    assert last is not None and last.details["changed"] == {
        "max_events_per_run": {"old": 50, "new": None, "default": 100}
    }


@pytest.mark.django_db
def test_out_of_range_or_unknown_values_are_refused_and_change_nothing(workspace: Workspace) -> None:
    for flag, value in [
        ("--events-per-run", "0"),
        ("--events-per-run", "-5"),
        ("--events-per-run", "lots"),
        ("--bytes-per-run", "1023"),  # below the setting's own floor
        ("--events-per-minute-per-key", "10000001"),
    ]:
        with pytest.raises(CommandError):
            _limits("acme/support", flag, value)
    with pytest.raises(CommandError, match="not found"):
        _limits("acme/nowhere", "--events-per-run", "5")
    with pytest.raises(InvalidLimit):
        set_limits(workspace=workspace, overrides={"max_events_per_run": 0}, by=CLI)
    assert not AuditEntry.objects.filter(action="limits.changed").exists()
    assert limits.effective(_fresh(workspace))[0] == {
        "name": "max_events_per_run",
        "label": "Events per run",
        "unit": "events",
        "value": 100,
        "default": 100,
        "overridden": False,
    }


@pytest.mark.django_db
def test_admins_see_the_limits_in_force_read_only_members_and_outsiders_do_not(
    workspace: Workspace, admin: Any, approver: Any, viewer: Any, outsider: Any
) -> None:
    _limits("acme/support", "--events-per-run", "42")
    page = _client(admin).get(PAGE)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="limits"' in html
    assert "42 events" in html and "set by the operator for this workspace" in html
    # The default, shown as such, in the console's formats (docs/operations.md "Words and numbers"):
    # bytes in binary units with the exact count on hover, counts thousands-separated.
    assert '<span title="1,000,000 bytes">976.6 KiB</span>' in html
    assert "manage.py ledger limits" in html
    section = html[html.index('id="limits"') : html.index("</section>", html.index('id="limits"'))]
    assert "1,000 events" in section and "1000000 bytes" not in section
    assert "<form" not in section and "<input" not in section  # nothing to change here
    for user in (approver, viewer):
        refused = _client(user).get(PAGE)
        assert refused.status_code == 403 and "42 events" not in refused.content.decode()
    assert _client(outsider).get(PAGE).status_code == 404


@pytest.mark.django_db
def test_a_tenant_admin_cannot_raise_their_limit_through_the_console(workspace: Workspace, admin: Any) -> None:
    _limits("acme/support", "--events-per-run", "5")
    client = _client(admin)
    # The settings forms take only what they name: a smuggled field changes nothing.
    client.post(PAGE + "retention/", {"days": "30", "reason": "tidy", "max_events_per_run": "9999999"})
    client.post(PAGE + "keys/", {"name": "k", "scopes": ["read"], "max_events_per_run": "9999999"})
    assert Workspace.objects.get(pk=workspace.pk).max_events_per_run == 5
    assert AuditEntry.objects.filter(action="limits.changed").count() == 1


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client
