"""What a hostile harness or member wrote, as Chromium shows it from the console with DEBUG off:
no bidi control or invisible character reaches a text, a tooltip, an option's label, a
confirmation or the page's title (each is written out, `U+202E` or `[U+202E]`), and the values the
page posts back hold the stored name exactly (tests/test_console_hidden_characters.py checks the
HTML of every page; this, what a browser makes of it)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page

from tests.browser.conftest import log_in, screenshot_dir
from tests.servers import Daphne
from tests.test_console_hidden_characters import (  # noqa: F401 (fixtures)
    MALLORY,
    RUN,
    bidi_run,
    hostile,
    loop,
    waiting,
)

# What the browser shows is the page's: the SQLite pass proves it for both (backend_independent).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]

HIDDEN = re.compile("[\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")

# Every text node outside the marked spans that keep a payload's character in place, every
# attribute a browser shows, each option's label and the document's title.
SHOWN = """() => {
  const found = [document.title];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.parentElement.closest('.hidden-char[data-code]')) found.push(node.data);
  }
  for (const el of document.querySelectorAll('*')) {
    for (const name of ['title', 'aria-label', 'hx-confirm', 'placeholder', 'alt']) {
      if (el.hasAttribute(name)) found.push(el.getAttribute(name));
    }
  }
  for (const option of document.querySelectorAll('option')) found.push(option.label);
  return found;
}"""


def _shown_hidden(page: Page) -> list[str]:
    return [text for text in page.evaluate(SHOWN) if HIDDEN.search(text)]


@pytest.mark.usefixtures("hostile")
def test_chromium_shows_every_hidden_character_written_out(page: Page, production: Daphne, admin: User) -> None:
    log_in(page, production, admin)
    page.goto(f"{production.url}/w/acme/support/settings/members/")
    assert _shown_hidden(page) == []
    assert "malloryU+202Enimda" in page.locator("td.member-name").all_inner_texts()
    assert (
        page.locator("tr.member[data-username] input[name=username]")
        .evaluate_all("inputs => inputs.map(i => i.value)")
        .count(MALLORY)
        == 3
    ), "the role, remove and reset forms post the stored username"
    page.screenshot(path=str(screenshot_dir() / "hidden-characters-members.png"), full_page=True)

    page.goto(f"{production.url}/w/acme/support/runs/{RUN}/reexecute/")
    assert _shown_hidden(page) == []
    options = page.locator("select[name=from_step] option")
    assert "charge[U+202E]dnuf" in options.all_inner_texts()
    assert "charge\u202ednuf" in options.evaluate_all("options => options.map(o => o.value)")

    page.goto(f"{production.url}/w/acme/support/")
    assert _shown_hidden(page) == []
    assert page.locator(".run-error").first.get_attribute("title").startswith("Bad[U+2066]: boom [U+202E]x")
    page.screenshot(path=str(screenshot_dir() / "hidden-characters-runs.png"), full_page=True)
