"""Share links in a real browser: carol (operator) creates a link from the run page's share panel
(htmx, the URL shown once), someone with no account opens it from a production Daphne (DEBUG=0)
and reads the run with its stylesheets loaded and nothing refused by the browser, carol sees the
open counted and revokes the link in one click, and the next open says it was revoked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from ledger.log import append
from ledger.models import Workspace
from tests.browser.conftest import Daphne, log_in, screenshot_dir
from tests.conftest import ev, started
from tests.servers import start_daphne

pytestmark = pytest.mark.django_db(transaction=True)

RUN = "run_to_share"


@pytest.fixture
def production(tmp_path: Path) -> Iterator[Daphne]:
    """A second Daphne on the same database, as production runs it: DEBUG off."""
    daphne = start_daphne(
        tmp_path,
        "production",
        {
            "DEBUG": "0",
            "SECRET_KEY": "share-test-" + "x" * 40,
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
        },
    )
    yield daphne
    daphne.stop()


def _run(workspace: Workspace) -> None:
    append(
        workspace=workspace,
        run_id=RUN,
        events=[
            started(),
            ev("StepScheduled", stepPath="answer"),
            ev("StepAttemptStarted", stepPath="answer", attempt=1),
            ev(
                "harness.model.called",
                stepPath="answer",
                turn=1,
                callId="m1",
                promptHash="h",
                request={"messages": [{"role": "user", "content": "Where is my parcel?"}]},
            ),
            ev(
                "harness.model.responded",
                stepPath="answer",
                turn=1,
                callId="m1",
                model={"provider": "openai", "modelId": "gpt-4o-mini"},
                response={"text": "It is on its way.", "usage": {"inputTokens": 12, "outputTokens": 6}},
            ),
            ev("StepCompleted", stepPath="answer", attempt=1, output={"text": "It is on its way."}),
            ev("RunCompleted", output={"ok": True}),
        ],
    )
    append(workspace=workspace, run_id="run_to_share_child", events=[started(parentRunId=RUN)])


def test_create_open_count_and_revoke(
    page: Page, open_context: Any, server: Daphne, production: Daphne, operator: User, workspace: Workspace
) -> None:
    _run(workspace)
    log_in(page, server, operator)
    page.goto(f"{server.url}/w/acme/support/runs/{RUN}/")
    panel = page.locator("#share-panel")
    expect(panel).to_contain_text("No share links for this run yet.")
    page.fill("#share-create input[name=expires_in_hours]", "2")
    page.fill("#share-create input[name=max_opens]", "5")
    page.check("#share-create input[name=include_sub_runs]")
    page.click("#share-create button[type=submit]")
    new_url = page.locator("#share-new-url")
    expect(new_url).to_be_visible()
    url = new_url.input_value()
    assert "/s/" in url and RUN not in url
    expect(panel.locator("tr.share-link")).to_have_count(1)
    page.screenshot(path=str(screenshot_dir() / "share-panel.png"), full_page=True)

    # Someone without an account, on the production server.
    shared_url = production.url + url[url.index("/s/") :]
    reader = open_context().new_page()
    refused: list[str] = []
    failed: list[str] = []
    # Every console error counts: a refusal (a Content-Security-Policy's), a script error, and a
    # failed load, which the response listener does not see for Chromium's own favicon request (the
    # shared layout names the console's icon, so there is no /favicon.ico 404).
    reader.on("console", lambda m: refused.append(m.text) if m.type == "error" else None)
    reader.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    answer = reader.goto(shared_url)
    assert answer is not None and answer.status == 200
    assert answer.headers["referrer-policy"] == "no-referrer" and answer.headers["cache-control"] == "no-store"
    expect(reader.locator("h1 .run-id")).to_have_text(RUN)
    expect(reader.locator("#conversation-section")).to_contain_text("It is on its way.")
    expect(reader.locator("#subruns")).to_contain_text("run_to_share_child")
    # The stylesheets loaded and apply: console.css sets the page's font family.
    assert reader.evaluate("document.styleSheets.length") >= 3
    assert "system-ui" in reader.evaluate("getComputedStyle(document.body).fontFamily")
    assert reader.locator("form, button, input").count() == 0
    reader.click("#subruns a:has-text('run_to_share_child')")
    expect(reader).to_have_url(shared_url + "runs/run_to_share_child/")
    assert not failed and not refused, (failed, refused)
    reader.screenshot(path=str(screenshot_dir() / "share-page.png"), full_page=True)

    page.reload()
    row = panel.locator("tr.share-link")
    expect(row).to_contain_text("2 / 5")  # the page and the sub-run's page
    row.locator("button.revoke").click()
    expect(row).to_contain_text("revoked")
    expect(row.locator("button.revoke")).to_have_count(0)

    gone = reader.goto(shared_url)
    assert gone is not None and gone.status == 410
    expect(reader.locator("#refused-message")).to_contain_text("revoked")
