"""Browser tests: Debian's headless Chromium driven by Playwright against a live Daphne.

The Daphne processes serve the test database (transactional tests: they only see committed rows).
Events are appended "from another process": a long-lived helper process that POSTs them to the
API with an ingest key, so on the in-memory channel layer the announcement is made inside the
Daphne that serves the page, and on Redis (the PostgreSQL pass) it goes to a second Daphne and has
to cross Redis to reach the browser.

Playwright never downloads a browser here: it launches /usr/bin/chromium, and the tests fail (not
skip) when that is missing, because CI installs it (.ci/run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, expect, sync_playwright

from ledger.demo import DEMO_PASSWORD, load_demo
from ledger.models import Workspace
from ledger.tenancy.services import create_key
from tests.conftest import PASSWORD
from tests.servers import REPO_ROOT, Daphne, database_url, production_env, start_daphne

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
]
REDIS_URL = os.environ.get("REDIS_URL", "")
# Generous: the CI machine has two cores and runs the suite while other things happen.
WAIT_MS = 15_000

expect.set_options(timeout=WAIT_MS)


def screenshot_dir() -> Path:
    """Where the tests leave their screenshots for a person to look at (README "Screenshots")."""
    folder = Path(settings.VAR_DIR) / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# --- Daphne in a subprocess (the pattern of tests/test_stream.py) -------------------------------


@pytest.fixture(scope="session")
def production(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory, collected_static: Path
) -> Iterator[Daphne]:
    """As `make serve` runs it: console/settings.py with DEBUG off, the static files collected
    (hashed names); one per test process, for the modules that check the console in production."""
    daphne = start_daphne(tmp_path_factory.mktemp("daphne"), "production", production_env(collected_static))
    yield daphne
    daphne.stop()  # before the test database is dropped: it holds connections to it


@pytest.fixture(scope="session")
def ingest_server(server: Daphne, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daphne]:
    """Where appends go: on Redis another Daphne, so live rows must cross the channel layer;
    on the in-memory layer the same one (an announcement cannot leave its process)."""
    if not REDIS_URL:
        yield server
        return
    daphne = start_daphne(tmp_path_factory.mktemp("daphne"), "ingest", {})
    yield daphne
    daphne.stop()


# --- appends from another OS process ------------------------------------------------------------

_APPENDER = """
import json, sys, httpx
with httpx.Client(timeout=30) as client:
    for line in sys.stdin:
        command = json.loads(line)
        response = client.post(command["url"], json=command["body"],
                               headers={"Authorization": "Bearer " + command["key"]})
        print(json.dumps({"status": response.status_code, "body": response.text}), flush=True)
"""


class Appender:
    """A separate process, started once, that appends batches through the HTTP API;
    it is already running when a test needs it, so an append takes milliseconds, not a start-up."""

    def __init__(self, server: Daphne) -> None:
        self.server = server
        self.key = ""
        self.process = subprocess.Popen(
            [sys.executable, "-c", _APPENDER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def append(self, run_id: str, *events: dict[str, Any]) -> dict[str, Any]:
        assert self.key, "use the appender fixture, which creates an ingest key for the test"
        assert self.process.stdin is not None and self.process.stdout is not None
        command = {
            "url": f"{self.server.url}/api/v1/runs/{run_id}/events",
            "key": self.key,
            "body": {"events": list(events)},
        }
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"the appender process ended (exit code {self.process.poll()})"
        answer = json.loads(line)
        assert answer["status"] == 200, answer
        return json.loads(answer["body"])

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture(scope="session")
def _appender_process(ingest_server: Daphne) -> Iterator[Appender]:
    appender = Appender(ingest_server)
    yield appender
    appender.close()


@pytest.fixture
def appender(_appender_process: Appender, workspace: Workspace) -> Appender:
    """The appender, with an ingest key of this test's workspace (keys go with each flush)."""
    _, _appender_process.key = create_key(workspace=workspace, scopes=["ingest"])
    return _appender_process


# --- the browser --------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _playwright() -> Iterator[Playwright]:
    """Per module, and set up before any test's database fixtures: Playwright's sync API keeps an
    asyncio loop running in this thread, which makes Django refuse ORM calls as "async unsafe".
    They are not: the loop only waits on the browser. So the refusal is lifted while Playwright
    runs and restored after, for the modules that follow."""
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            yield playwright
    finally:
        if previous is None:
            del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture(scope="module")
def browser(_playwright: Playwright, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"the browser tests need Debian's Chromium at {CHROMIUM}: apt-get install -y chromium "
            "chromium-driver (.ci/run does this). Playwright must not download a browser of its own.",
            pytrace=False,
        )
    browser = _playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
    yield browser
    browser.close()


@pytest.fixture
def open_context(browser: Browser, transactional_db: None) -> Iterator[Any]:
    """New browser contexts (own cookies, own colour scheme), closed before the database is
    flushed so that no open socket reads it meanwhile."""
    contexts: list[BrowserContext] = []

    def _open(**options: Any) -> BrowserContext:
        context = browser.new_context(**{"viewport": {"width": 1280, "height": 860}, **options})
        context.set_default_timeout(WAIT_MS)
        contexts.append(context)
        return context

    yield _open
    for context in contexts:
        context.close()


@pytest.fixture
def page(open_context: Any) -> Page:
    return open_context().new_page()


class Worker:
    """`manage.py ledger worker` in its own process, on the test database (what `make run` starts
    beside Daphne); stopped with SIGTERM (its graceful stop), killed if it does not go."""

    def __init__(self, log: Path, model_gate: Path | None = None) -> None:
        environment = dict(os.environ)
        environment["DATABASE_URL"] = database_url()
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), environment.get("PYTHONPATH")]))
        environment.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        # The same workflow with a model that takes a second per call: the run streams visibly.
        environment["RUNLEDGER_WORKFLOW_MODULES"] = "tests.browser.slow_workflows"
        if model_gate is not None:  # its model calls wait for this file (tests/browser/slow_workflows.py)
            environment["RUNLEDGER_TEST_MODEL_GATE"] = str(model_gate)
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "ledger", "worker", "--interval", "0.2"],
                cwd=REPO_ROOT,
                env=environment,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[list[Worker]]:
    """The `Worker`s a test starts when it wants the queue worked; always stopped before the
    database is flushed (this fixture is torn down first)."""
    started: list[Worker] = []
    yield started
    for process in started:
        process.stop()


def log_in(page: Page, server: Daphne, user: User, next_path: str = "") -> None:
    """Through the real login form, as a person would."""
    query = f"?next={quote(next_path)}" if next_path else ""
    page.goto(f"{server.url}/accounts/login/{query}")
    page.fill("input[name=username]", user.get_username())
    page.fill("input[name=password]", PASSWORD)
    page.click("form:has(input[name=password]) [type=submit]")
    page.wait_for_url(lambda url: "/accounts/login/" not in url)


@pytest.fixture
def demo(transactional_db: None) -> None:
    """The runs `ledger demo` lays out (no history), for the views that show what they show; not its
    evaluations, which cost three times the rest and which these views do not show."""
    load_demo(history_runs=0, evaluations_too=False)


@pytest.fixture
def demo_with_evaluations(transactional_db: None) -> None:
    """The demo with its dataset, policy and evaluations, for the pages that show them."""
    load_demo(history_runs=0)


def log_in_to_demo(page: Page, server: Daphne, username: str = "alice") -> None:
    """As a demo member, with the demo's password."""
    page.goto(f"{server.url}/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", DEMO_PASSWORD)
    page.click("form:has(input[name=password]) [type=submit]")
    page.wait_for_url(lambda url: "/accounts/login/" not in url)


def live_reaches(page: Page, counter: str, value: int) -> None:
    """Wait until the page's live mechanism (window.runledgerLive, static/js/live.js) counts at least
    `value` of `counter`: "refreshes" done, fragments found "unchanged". Polled, as the CSP
    refuses wait_for_function."""
    probe = f"window.runledgerLive ? window.runledgerLive.{counter} : 0"
    for _ in range(600):
        if page.evaluate(probe) >= value:
            return
        page.wait_for_timeout(25)
    raise AssertionError(f"runledgerLive.{counter} stayed at {page.evaluate(probe)}, below {value}")


def sequences(page: Page) -> list[int]:
    return page.locator("#timeline-rows tr.event").evaluate_all("rows => rows.map(row => Number(row.dataset.sequence))")
