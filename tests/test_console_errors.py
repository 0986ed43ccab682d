"""The console's error pages: 400, 403, 404 and 500 in the console's layout with a way back
(console/pages/errors.py), with DEBUG off as in production; the API keeps its JSON envelope."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpResponse
from django.test import Client, RequestFactory

from console.pages import errors
from ledger.models import Workspace
from tests.conftest import ev, started, without_csrf_tokens

pytestmark = pytest.mark.django_db


def styled(html: str, status: int, title: str) -> None:
    assert '<link rel="stylesheet" href="/static/css/console.css">' in html or "css/console" in html
    assert '<header class="top">' in html and '<main id="main"' in html and 'class="site-footer"' in html
    assert f'data-status="{status}"' in html and f'<h1 id="error-title">{title}</h1>' in html
    assert '<a id="error-home" href="/">Home</a>' in html


def test_debug_is_off_here() -> None:
    assert settings.DEBUG is False  # Django's test runner, as production: the handlers answer


def test_an_unknown_address_is_a_styled_404_with_the_members_workspaces(browser: Client) -> None:
    response = browser.get("/no/such/page/")
    assert response.status_code == 404
    html = response.content.decode()
    styled(html, 404, "Not found")
    assert 'data-workspace="acme/support"' in html  # the switcher: a way back to work


def test_anonymous_404_keeps_the_layout(client: Client) -> None:
    response = client.get("/nothing-here/")
    assert response.status_code == 404
    styled(response.content.decode(), 404, "Not found")


def test_another_tenants_workspace_is_a_404_that_names_nothing_of_it(client: Client, outsider: User, append) -> None:
    append("run_secret", started("wfver_secret_workflow"))
    client.force_login(outsider)
    response = client.get("/w/acme/support/runs/run_secret/")
    assert response.status_code == 404
    html = response.content.decode()
    styled(html, 404, "Not found")
    shown = without_csrf_tokens(html)
    assert "acme" not in shown and "run_secret" not in shown and "secret_workflow" not in shown


def test_a_viewer_opening_audit_gets_the_styled_403_with_the_way_back(client: Client, viewer: User) -> None:
    client.force_login(viewer)
    response = client.get("/t/acme/audit/")
    assert response.status_code == 403
    html = response.content.decode()
    styled(html, 403, "Not allowed")
    assert "the audit log is for the tenant&#x27;s admins." in html
    assert '<a id="error-back" href="/w/acme/support/">Runs of acme/support</a>' in html
    assert 'id="nav-runs" href="/w/acme/support/"' in html  # the workspace's navigation


def test_first_failure_on_a_run_without_one_is_a_styled_400_back_to_the_run(browser: Client, append) -> None:
    append("run_fine", started(), ev("RunCompleted", output="ok"))
    url = "/w/acme/support/runs/run_fine/timeline/"
    response = browser.get(url + "?first=failure")
    assert response.status_code == 400
    html = response.content.decode()
    styled(html, 400, "Bad request")
    assert "this run has no failure" in html
    assert f'<a id="error-back" href="{url}">This page without the parameters</a>' in html


def test_first_failure_is_offered_only_on_a_run_that_has_one(browser: Client, append) -> None:
    append("run_fine", started(), ev("RunCompleted", output="ok"))
    append(
        "run_broke",
        started(),
        ev("StepScheduled", stepPath="fetch"),
        ev("StepAttemptStarted", stepPath="fetch", attempt=1),
        ev("StepFailed", stepPath="fetch", attempt=1, error={"message": "403"}),
        ev("RunFailed", error={"message": "fetch failed"}),
    )
    fine = browser.get("/w/acme/support/runs/run_fine/timeline/").content.decode()
    assert 'id="first-failure"' not in fine and 'id="first-in-doubt"' not in fine
    assert "?first=" not in fine  # no jump that would answer 400
    fine_search = browser.get("/w/acme/support/runs/run_fine/timeline/?type=Run").content.decode()
    assert 'id="first-failure"' not in fine_search

    url = "/w/acme/support/runs/run_broke/timeline/"
    broke = browser.get(url).content.decode()
    assert f'<a id="first-failure" href="{url}?first=failure">First failure</a>' in broke
    assert 'id="first-in-doubt"' not in broke  # it has no in-doubt call
    jumped = browser.get(url + "?first=failure")
    assert jumped.status_code == 302 and jumped["Location"].endswith("#event-4")  # StepFailed


def test_the_header_offers_the_first_failure_once_the_run_has_failed(browser: Client, append) -> None:
    """The header is what follows a live run (static/js/live.js fetches run-header/ again), so a run
    that fails while someone watches gains the jump without a reload."""
    append("run_going", started(), ev("StepScheduled", stepPath="fetch"))
    header_url = "/w/acme/support/runs/run_going/header/"
    assert 'id="run-first-failure"' not in browser.get(header_url).content.decode()
    append(
        "run_going",
        ev("StepAttemptStarted", stepPath="fetch", attempt=1),
        ev("StepFailed", stepPath="fetch", attempt=1, error={"message": "403"}),
        ev("RunFailed", error={"message": "fetch failed"}),
    )
    jump = '<a id="run-first-failure" href="/w/acme/support/runs/run_going/timeline/?first=failure">'
    assert jump in browser.get(header_url).content.decode()
    assert jump in browser.get("/w/acme/support/runs/run_going/").content.decode()
    assert browser.get("/w/acme/support/runs/run_going/timeline/?first=failure").status_code == 302


def test_the_500_page_keeps_the_layout_without_the_database(workspace: Workspace) -> None:
    request = RequestFactory().get("/w/acme/support/")
    response = errors.server_error(request)
    assert response.status_code == 500
    html = response.content.decode()
    styled(html, 500, "Something went wrong")
    assert "logout" not in html


@pytest.mark.urls("tests.crash_urls")
def test_a_crash_answers_the_styled_500(member: User) -> None:
    crashing = Client(raise_request_exception=False)
    crashing.force_login(member)
    response = crashing.get("/crash/")
    assert response.status_code == 500
    html = response.content.decode()
    styled(html, 500, "Something went wrong")
    assert "detail for the log" not in html


def test_the_api_keeps_its_json_envelope(client: Client) -> None:
    response = client.get("/api/v1/no-such-endpoint")
    assert response.status_code == 404 and response["Content-Type"].startswith("application/json")
    assert re.search(r'"code":\s*"not_found"', response.content.decode())


def _stale_form_post(member: User | None, append, referer: str, headers: dict[str, str] | None = None) -> HttpResponse:
    """A console form sent with a token that is no longer the session's (logged in again since)."""
    append("run_form", started())
    client = Client(enforce_csrf_checks=True)
    page = "/w/acme/support/runs/run_form/"
    if member is not None:
        client.force_login(member)
        assert client.get(page).status_code == 200  # the csrftoken cookie, as the browser holds it
    else:
        assert client.get("/accounts/login/").status_code == 200
    stale = "x" * 64
    return client.post(
        f"{page}feedback/",
        {"rating": "4", "csrfmiddlewaretoken": stale},
        headers={"Referer": referer, **(headers or {})},
    )


HTMX = {"HX-Request": "true", "HX-Current-URL": "http://testserver/w/acme/support/runs/run_form/"}


def test_an_htmx_form_with_a_stale_csrf_token_gets_its_message_before_the_form(member: User, append) -> None:
    """Not the 403 page, which htmx drops: a message that names where it goes (the element that
    sent the form, before it), so the form and what was typed stay (tests/browser/test_form_refusals.py)."""
    response = _stale_form_post(member, append, HTMX["HX-Current-URL"], HTMX)
    assert response.status_code == 403
    assert response["HX-Retarget"] == "this" and response["HX-Reswap"] == "beforebegin"
    html = response.content.decode()
    assert '<header class="top">' not in html  # a fragment, not a page
    assert 'class="error-box form-expired" role="alert"' in html and "this form expired" in html
    assert f'signed in as <span class="mono">{member.get_username()}</span>' in html
    assert '<a class="form-expired-reload" href="/w/acme/support/runs/run_form/">reload the page</a>' in html


def test_an_htmx_form_with_a_stale_csrf_token_and_no_session_goes_to_the_login(append, workspace) -> None:
    response = _stale_form_post(None, append, HTMX["HX-Current-URL"], HTMX)
    assert response.status_code == 401
    assert response["HX-Redirect"] == "/accounts/login/?next=%2Fw%2Facme%2Fsupport%2Fruns%2Frun_form%2F"


def test_a_form_with_a_stale_csrf_token_gets_the_styled_403_and_a_way_back(member: User, append) -> None:
    response = _stale_form_post(member, append, "http://testserver/w/acme/support/runs/run_form/")
    assert response.status_code == 403
    html = response.content.decode()
    styled(html, 403, "The form expired")
    assert "Reload the page and submit the form again" in html
    assert '<a id="error-back" href="http://testserver/w/acme/support/runs/run_form/">Back to the form</a>' in html
    assert "style=" not in html and "<style" not in html  # nothing the CSP blocks (Django's own page had both)


def test_a_stale_csrf_token_from_another_sites_page_is_not_sent_back_there(member: User, append) -> None:
    response = _stale_form_post(member, append, "https://elsewhere.example/phish/")
    assert response.status_code == 403
    html = response.content.decode()
    styled(html, 403, "The form expired")
    assert "elsewhere.example" not in html
    assert '<a id="error-back" href="/w/acme/support/">' in html  # the workspace's runs, from its address


def test_a_session_post_without_csrf_under_the_api_keeps_the_json_error(member: User, append) -> None:
    append("run_form", started())
    client = Client(enforce_csrf_checks=True)
    client.force_login(member)
    response = client.post("/api/v1/runs/run_form/feedback", {"rating": 4}, content_type="application/json")
    assert response.status_code == 403 and response["Content-Type"].startswith("application/json")
    assert response.json()["error"]["code"] == "forbidden" and "CSRF" in response.json()["error"]["message"]


def test_djangos_own_403_under_the_api_is_the_error_body(member: User, settings: Any) -> None:
    """A plain Django view under /api/ failing Django's CSRF check answers the API's JSON, never the
    console's page (tests/plain_api_urls.py: no real /api/ view is one today)."""
    settings.ROOT_URLCONF = "tests.plain_api_urls"
    client = Client(enforce_csrf_checks=True)
    client.force_login(member)
    response = client.post("/api/v1/plain", {"x": "1"})
    assert response.status_code == 403 and response["Content-Type"].startswith("application/json")
    assert response.json() == {"error": {"code": "forbidden", "message": "forbidden", "details": {}}}


def test_audit_is_newest_first_with_targets_linked_and_details_readable(
    browser: Client, workspace: Workspace, append
) -> None:
    from ledger.tenancy.services import create_key

    append("run_audited", started())
    key, _ = create_key(workspace=workspace, scopes=["read", "ingest"], name="ci")
    from ledger import audit

    audit.record(
        actor="alice", tenant=workspace.tenant, workspace=workspace, action="run.cancelled", target="run_audited"
    )
    html = browser.get("/t/acme/audit/").content.decode()
    assert html.index("run_audited") < html.index(f"key:{key.prefix}")  # the newer first
    assert '<a href="/w/acme/support/runs/run_audited/">run_audited</a>' in html
    assert f'<a href="/w/acme/support/settings/#key-{key.prefix}">key:{key.prefix}</a>' in html
    assert "<dt>scopes</dt><dd>ingest, read</dd>" in html and "<dt>name</dt><dd>ci</dd>" in html
    assert '"scopes"' not in html  # no raw JSON


def test_audit_details_read_as_words_with_moments_and_dollars_as_everywhere(
    browser: Client, workspace: Workspace
) -> None:
    from ledger import audit

    audit.record(
        actor="carol",
        tenant=workspace.tenant,
        workspace=workspace,
        action="share_link.created",
        target="share_link:shl_1",
        details={"expiresAt": "2027-01-04T23:46:38.451657+00:00", "includeSubRuns": True, "spendUsd": "0.0038199"},
    )
    html = browser.get("/t/acme/audit/").content.decode()
    assert "<dt>expires at</dt><dd>2027-01-04 23:46:38 UTC</dd>" in html
    assert "<dt>include sub runs</dt><dd>yes</dd>" in html
    assert "<dt>spend usd</dt><dd>$0.00382</dd>" in html


def test_one_format_for_counts_and_byte_sizes() -> None:
    from console import format as fmt

    assert [fmt.count(n) for n in (0, 2276, 113776, None)] == ["0", "2,276", "113,776", "—"]
    amounts = [fmt.money(Decimal(a)) for a in ("0.5", "0.000027", "0.12345", "0.99999", "1234.5")]
    assert amounts == ["$0.50", "$0.000027", "$0.1235", "$1.00", "$1,234.50"]
    sizes = [fmt.byte_size(n) for n in (0, 512, 1023, 1024, 4349, 434913, 1_048_575, 1_200_000, 3_000_000_000)]
    assert sizes == ["0 B", "512 B", "1023 B", "1.0 KiB", "4.2 KiB", "424.7 KiB", "1.0 MiB", "1.1 MiB", "2.8 GiB"]
    assert fmt.status_label("pending_approval") == "waiting for approval" and fmt.status_label("in_doubt") == "in doubt"
