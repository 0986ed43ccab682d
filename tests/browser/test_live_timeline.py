"""Live pages in a real browser: the run page's timeline over the WebSocket, with catch-up after
the socket drops (every sequence exactly once and in order), and the runs list's new runs."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from console.pages.run import LIVE_TIMELINE_KEEP
from ledger.models import Workspace
from tests.browser import data
from tests.browser.conftest import Appender, Daphne, log_in, sequences

pytestmark = pytest.mark.django_db(transaction=True)


def _open_live_run(page: Page, server: Daphne, workspace: Workspace, viewer: User, run_id: str) -> None:
    data.running_run(workspace, run_id)
    log_in(page, server, viewer)
    page.goto(f"{server.url}/w/acme/support/runs/{run_id}/")
    expect(page.locator("#timeline-rows tr.event")).to_have_count(3)
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")


def test_events_appended_by_another_process_appear_without_a_reload(
    page: Page,
    server: Daphne,
    appender: Appender,
    workspace: Workspace,
    viewer: User,
) -> None:
    _open_live_run(page, server, workspace, viewer, "run_live")
    page.evaluate("window.__notReloaded = true")  # gone if the page reloads

    appender.append("run_live", data.ev("StepCompleted", stepPath="extract", attempt=1, output={"n": 1}))
    expect(page.locator('#timeline-rows tr.event[data-sequence="4"]')).to_be_visible()
    appender.append(
        "run_live", *data.step("summarize"), *data.model_call("summarize", 1, "openai", "gpt-4o-mini", (10, 5))
    )
    expect(page.locator("#timeline-rows tr.event")).to_have_count(8)
    assert sequences(page) == list(range(1, 9))
    assert page.evaluate("window.__notReloaded") is True
    assert page.evaluate("window.runledgerLive.lastSequence") == 8
    live_rows = page.locator("#timeline-rows tr.event").all_inner_texts()
    assert "harness.model.responded" in live_rows[-1]

    # The pushed rows come from the template the page itself renders.
    page.reload()
    expect(page.locator("#timeline-rows tr.event")).to_have_count(8)
    assert page.locator("#timeline-rows tr.event").all_inner_texts() == live_rows


def test_a_run_that_ends_while_its_page_is_open_reads_as_ended(
    page: Page,
    server: Daphne,
    appender: Appender,
    workspace: Workspace,
    viewer: User,
) -> None:
    """The header and the timeline's caption follow the run to its end without a reload: no
    "as they arrive" under a run that has finished."""
    _open_live_run(page, server, workspace, viewer, "run_ending")
    page.evaluate("window.__notReloaded = true")
    expect(page.locator("#timeline-caption")).to_have_text("newest events, as they arrive")

    appender.append("run_ending", data.ev("RunCompleted", output={"ok": True}))

    expect(page.locator("#live-status")).to_have_attribute("data-state", "finished")
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator("#timeline-caption")).to_have_text("newest events")
    expect(page.locator("#timeline-caption")).not_to_have_attribute("data-live-src", re.compile(".*"))
    assert page.evaluate("window.__notReloaded") is True
    # As the page reads when opened after the end.
    page.reload()
    expect(page.locator("#timeline-caption")).to_have_text("newest events")


def test_a_dropped_socket_catches_up_from_the_database_without_duplicates(
    page: Page,
    server: Daphne,
    appender: Appender,
    workspace: Workspace,
    viewer: User,
) -> None:
    _open_live_run(page, server, workspace, viewer, "run_drop")
    status = page.locator("#live-status")

    page.evaluate("window.runledgerLive.disconnect(3000)")
    expect(status).to_have_attribute("data-state", "reconnecting")
    appender.append("run_drop", data.ev("StepCompleted", stepPath="extract", attempt=1, output={"n": 1}))
    appender.append("run_drop", *data.step("second"), data.ev("StepCompleted", stepPath="second", attempt=1))
    # Committed while the socket was down (the appender answers within milliseconds of a 3 s
    # outage): these rows can only come from the catch-up after reconnecting.
    assert status.get_attribute("data-state") == "reconnecting"

    expect(page.locator("#timeline-rows tr.event")).to_have_count(7)
    expect(status).to_have_attribute("data-state", "live")
    assert sequences(page) == list(range(1, 8))

    # Live again: the next events arrive over the new socket, and the run's end shows.
    appender.append("run_drop", data.ev("custom.note", text="after the reconnect"))
    expect(page.locator('#timeline-rows tr.event[data-sequence="8"]')).to_be_visible()
    appender.append("run_drop", data.ev("RunCompleted", output={"ok": True}))
    expect(status).to_have_attribute("data-state", "finished")
    expect(page.locator("#timeline-rows tr.event")).to_have_count(9)
    assert sequences(page) == list(range(1, 10))


def test_an_outsider_gets_404_for_the_run_page(
    page: Page,
    server: Daphne,
    workspace: Workspace,
    outsider: User,
) -> None:
    data.running_run(workspace, "run_private")
    log_in(page, server, outsider)
    response = page.goto(f"{server.url}/w/acme/support/runs/run_private/")
    assert response is not None and response.status == 404
    assert page.locator("#timeline-rows").count() == 0


def test_an_idle_page_keeps_its_socket_and_still_receives(
    page: Page,
    server: Daphne,
    appender: Appender,
    workspace: Workspace,
    viewer: User,
) -> None:
    """Nothing happens for longer than the channel layer blocks on a read (5 s on Redis): the
    socket must stay up, not drop and reconnect."""
    _open_live_run(page, server, workspace, viewer, "run_idle")
    page.evaluate("""() => {
        window.__states = [];
        window.__firstSocket = window.runledgerLive.socket;
        new MutationObserver(() => window.__states.push(document.querySelector('#live-status').dataset.state))
            .observe(document.querySelector('#live-status'), {attributes: true, attributeFilter: ['data-state']});
    }""")
    page.wait_for_timeout(6_500)  # the idleness is the behaviour under test
    appender.append("run_idle", data.ev("custom.note", text="after a quiet spell"))
    expect(page.locator('#timeline-rows tr.event[data-sequence="4"]')).to_be_visible()
    assert page.evaluate("window.__states") == []
    assert page.evaluate("window.runledgerLive.socket === window.__firstSocket") is True


def test_the_runs_list_shows_a_new_run_on_top_and_a_finished_one_in_place_without_a_reload(
    page: Page,
    server: Daphne,
    appender: Appender,
    workspace: Workspace,
    viewer: User,
) -> None:
    data.running_run(workspace, "run_older")
    log_in(page, server, viewer)
    page.goto(f"{server.url}/w/acme/support/")
    rows = page.locator("#runs-rows tr.run")
    expect(rows).to_have_count(1)
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    page.evaluate("window.__notReloaded = true")

    appender.append("run_newer", data.started(label="fresh off the harness"))
    expect(rows).to_have_count(2)
    expect(rows.first).to_have_attribute("data-run-id", "run_newer")
    expect(rows.first).to_contain_text("fresh off the harness")

    older = page.locator('#runs-rows tr.run[data-run-id="run_older"]')
    expect(older).to_contain_text("running")
    appender.append("run_older", data.ev("RunCompleted", output={"ok": True}))
    expect(older).to_contain_text("completed")
    expect(rows).to_have_count(2)
    assert page.evaluate("window.__notReloaded") is True


def test_a_page_left_open_on_a_long_run_keeps_its_newest_rows_and_leads_to_the_older(
    page: Page,
    server: Daphne,
    appender: Appender,
    workspace: Workspace,
    viewer: User,
) -> None:
    """The live timeline keeps its newest data-live-keep events (the server renders
    LIVE_TIMELINE_KEEP; five here, set on the open page, so that a handful of events shows it): the
    oldest rows go as new ones arrive, and "← older" leads to the events just before the first kept."""
    _open_live_run(page, server, workspace, viewer, "run_long")
    timeline = page.locator("#timeline")
    assert timeline.get_attribute("data-live-keep") == str(LIVE_TIMELINE_KEEP)
    expect(page.locator(".pager a.older")).to_have_count(0)
    page.evaluate("document.getElementById('timeline').dataset.liveKeep = '5'")

    appender.append("run_long", *(data.ev("custom.note", text=f"note {n}") for n in range(4, 12)))
    expect(page.locator('#timeline-rows tr.event[data-sequence="11"]')).to_be_visible()
    assert sequences(page) == list(range(7, 12))
    older = page.locator(".pager a.older")
    assert older.get_attribute("href") == "/w/acme/support/runs/run_long/timeline/?after=0&limit=6"

    appender.append("run_long", data.ev("custom.note", text="note 12"))
    expect(page.locator('#timeline-rows tr.event[data-sequence="12"]')).to_be_visible()
    assert sequences(page) == list(range(8, 13))
    assert older.get_attribute("href") == "/w/acme/support/runs/run_long/timeline/?after=0&limit=7"

    older.click()
    expect(page).to_have_url(f"{server.url}/w/acme/support/runs/run_long/timeline/?after=0&limit=7")
    expect(page.locator("#timeline-rows tr.event")).to_have_count(7)
    assert sequences(page) == list(range(1, 8))
    assert page.locator("#timeline").get_attribute("data-live") == "0"
