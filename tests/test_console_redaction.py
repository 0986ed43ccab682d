"""The workspace's redaction page: every member reads the policy in force, admins change the
workspace's extras (checked, audited, applied to the next append), outsiders get 404."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from ledger.log.redaction import BUILTIN_VALUE_RULES, REDACTED
from ledger.models import AuditEntry, Event, Workspace
from tests.conftest import ev, started

URL = "/w/acme/support/settings/redaction/"


def _changes() -> Any:
    return AuditEntry.objects.filter(action="redaction.changed")


def _save(client: Client, keys: str = "", patterns: str = "", reason: str = "") -> Any:
    return client.post(URL, {"keys": keys, "patterns": patterns, "reason": reason})


def test_a_member_reads_the_builtins_and_the_workspace_extras(client: Client, viewer, workspace: Workspace) -> None:
    workspace.redact_keys, workspace.redact_value_patterns = ["customerEmail"], [r"ord_\d{5}"]
    workspace.save()
    client.force_login(viewer)
    page = client.get(URL)
    assert page.status_code == 200
    html = page.content.decode()
    for rule in BUILTIN_VALUE_RULES:
        assert f'<td class="mono">{rule.name}</td>' in html
    assert '<code class="extra-key">customerEmail</code>' in html and r"ord_\d{5}" in html
    assert 'id="redaction-form"' not in html  # a viewer reads, the admins change
    assert 'id="nav-redaction"' in html


def test_a_non_admin_cannot_change_the_rules(client: Client, operator, workspace: Workspace) -> None:
    client.force_login(operator)
    assert _save(client, keys="x").status_code == 403
    workspace.refresh_from_db()
    assert workspace.redact_keys == [] and not _changes().exists()


@pytest.mark.parametrize("method", ["get", "post"])
def test_an_outsider_gets_404(client: Client, outsider, workspace: Workspace, method: str) -> None:
    client.force_login(outsider)
    assert getattr(client, method)(URL).status_code == 404
    assert client.get("/w/acme/nope/settings/redaction/").status_code == 404


def test_anonymous_is_sent_to_log_in(client: Client, workspace: Workspace) -> None:
    page = client.get(URL)
    assert page.status_code == 302 and page["Location"].startswith("/accounts/login/")


def test_an_admin_saves_extras_audited_and_the_next_append_uses_them(
    browser: Client, workspace: Workspace, append
) -> None:
    done = _save(
        browser, keys="customerEmail\n  internal-note \n\ncustomerEmail", patterns=r"ord_\d{5}", reason="ticket 14"
    )
    assert done.status_code == 302 and done["Location"] == URL + "?saved=1"
    workspace.refresh_from_db()
    assert workspace.redact_keys == ["customerEmail", "internal-note"]
    assert workspace.redact_value_patterns == [r"ord_\d{5}"]
    entry = _changes().get()
    assert (entry.action, entry.actor, entry.target, entry.reason) == (
        "redaction.changed",
        "alice",
        "workspace:acme/support",
        "ticket 14",
    )
    assert entry.details == {
        "before": {"keys": [], "patterns": []},
        "after": {"keys": ["customerEmail", "internal-note"], "patterns": [r"ord_\d{5}"]},
    }
    assert 'id="redaction-saved"' in browser.get(done["Location"]).content.decode()

    append("run_a", started())
    append("run_a", ev("custom.note", customer_email="a@b.c", text="order ord_12345 shipped"))
    stored = json.loads(Event.objects.get(run__run_id="run_a", sequence=2).payload)
    assert stored == {"customer_email": REDACTED, "text": f"order {REDACTED} shipped"}

    # The same rules again: nothing changes, nothing more is audited.
    assert _save(browser, keys="customerEmail\ninternal-note", patterns=r"ord_\d{5}").status_code == 302
    assert _changes().count() == 1


@pytest.mark.parametrize(
    ("patterns", "message"),
    [
        ("(unclosed", "cannot be used: missing )"),
        ("(?=x)y", "lookarounds"),
        ("x?", "matches the empty string"),
    ],
)
def test_a_bad_pattern_is_a_form_error_and_nothing_changes(
    browser: Client, workspace: Workspace, patterns: str, message: str
) -> None:
    page = _save(browser, keys="customerEmail", patterns=f"ord_\\d+\n{patterns}")
    assert page.status_code == 400
    assert message in page.content.decode()
    assert "ord_\\d+" in page.content.decode()  # the form keeps what was typed
    workspace.refresh_from_db()
    assert (workspace.redact_keys, workspace.redact_value_patterns) == ([], [])
    assert not _changes().exists()


def test_a_key_name_with_a_bidi_override_is_a_form_error(browser: Client, workspace: Workspace) -> None:
    page = _save(browser, keys="customerEmail\nssn\u202e")
    assert page.status_code == 400
    assert "control or invisible formatting characters (U+202E)" in page.content.decode()
    workspace.refresh_from_db()
    assert workspace.redact_keys == [] and not _changes().exists()


def test_too_many_rules_are_a_form_error(browser: Client, workspace: Workspace) -> None:
    page = _save(browser, patterns="\n".join(f"p{i}x" for i in range(51)))
    assert page.status_code == 400 and "at most 50 extra value patterns" in page.content.decode()


def test_a_pattern_stored_before_checks_is_shown_as_not_applied(browser: Client, workspace: Workspace) -> None:
    workspace.redact_value_patterns = ["(?=a)a+$", "ok+"]
    workspace.save()
    html = browser.get(URL).content.decode()
    assert 'id="invalid-patterns"' in html and "<li><code>(?=a)a+$</code></li>" in html
