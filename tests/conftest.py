"""What every test module shares: the workspaces and their named users (one per role, and an
outsider of another tenant, as healthchecks' tests have), fast passwords, a fake clock, event and
envelope factories, and a logged-in console client.

The users: alice is the admin (the owner) of acme, bob its approver, carol its operator, dave its
viewer; olga is an admin of globex, another tenant, so every page and endpoint can be checked to
be a 404 for her. All of them log in with PASSWORD.
"""

from __future__ import annotations

import fcntl
import io
import os
import re
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from hypothesis import settings as hypothesis_settings

from ledger import log
from ledger.canonical import event_id
from ledger.log import AppendResult
from ledger.models import Workspace
from ledger.tenancy.services import bootstrap, create_user
from tests.servers import Daphne, start_daphne

PASSWORD = "pw-runledger-test"

# Hypothesis fails a test when one example takes over its deadline (200 ms by default) and the same
# example's replay does not ("Unreliable test timings"): on a loaded machine, a process descheduled
# for a fifth of a second fails a property that holds. What a property test proves is its
# assertions, never its speed: no deadline for any of them, unless a test sets one. Loaded here,
# before any test module is imported, so a test's own @settings(...) inherits it.
hypothesis_settings.register_profile("runledger", deadline=None)
hypothesis_settings.load_profile("runledger")


TESTS = Path(__file__).resolve().parent
# What a module that starts other processes or servers names (pyproject.toml's `system` marker).
_STARTS_PROCESSES = re.compile(r"\b(?:subprocess|start_daphne|os\.fork|live_server)\b")


def _starts_processes(path: Path, seen: dict[Path, bool]) -> bool:
    if path not in seen:
        seen[path] = bool(_STARTS_PROCESSES.search(path.read_text()))
    return seen[path]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Markers by where a test is: tests/browser/ is `browser` (and `system`); a module that starts
    servers or subprocesses is `system`, and so is a test served by the shared Daphne. Tests marked
    redis_only belong to the Redis pass (REDIS_URL set, as CI's second pass and docs set it), those
    marked postgres_only to the PostgreSQL pass; the embedded default's pass, on a machine that may
    have neither, leaves them out instead of skipping them. SKIP_BACKEND_INDEPENDENT=1 (CI's
    PostgreSQL pass) leaves out those marked backend_independent, which the SQLite pass runs."""
    seen: dict[Path, bool] = {}
    for item in items:
        path = Path(item.path)
        if (TESTS / "browser") in path.parents:
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.system)
        elif _starts_processes(path, seen) or {"live_server", "daphne"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.system)
    absent = [
        marker
        for marker, present in (
            ("redis_only", bool(os.environ.get("REDIS_URL"))),
            ("postgres_only", os.environ.get("DATABASE_URL", "").startswith("postgres")),
        )
        if not present
    ]
    # CI's PostgreSQL pass leaves out what its SQLite pass, run at the same time, already proves.
    if os.environ.get("SKIP_BACKEND_INDEPENDENT") == "1":
        absent.append("backend_independent")
    left_out = [item for item in items if any(item.get_closest_marker(m) for m in absent)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item not in left_out]
    # The modules with servers, subprocesses or the browser first, each kept whole and in order: they
    # are the long ones, and pytest-xdist hands out modules in this order (make test turns off its
    # reordering by test count, which put the one-test modules, the longest, last).
    starts_processes = {item.path for item in items if item.get_closest_marker("system")}
    items.sort(key=lambda item: item.path not in starts_processes)


@pytest.fixture(autouse=True)
def _artifacts_in_tmp(settings: Any, tmp_path: Path) -> None:
    settings.ARTIFACTS_ROOT = tmp_path / "artifacts"


@pytest.fixture(scope="session", autouse=True)
def _flush_postgresql_by_delete() -> Iterator[None]:
    """Transactional tests end with a flush, on PostgreSQL a TRUNCATE of every table, which makes
    new files for each of them: many times slower than DELETEs of the few rows a test leaves.
    Django's foreign keys are deferred, so the DELETEs' order does not matter in the flush's
    transaction."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(
        self: DatabaseOperations,
        style: Any,
        tables: list[str],
        *,
        reset_sequences: bool = False,
        allow_cascade: bool = False,
    ) -> list[str]:
        if reset_sequences or allow_cascade:
            return truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        return [f"{style.SQL_KEYWORD('DELETE FROM')} {style.SQL_FIELD(self.quote_name(table))};" for table in tables]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DatabaseOperations, "sql_flush", sql_flush)
        yield


@pytest.fixture(autouse=True)
def _let_flush_empty_the_log(request: pytest.FixtureRequest) -> Any:
    """Transactional tests end with a flush, which deletes events; the log's triggers allow that
    only for runs marked for pruning, as retention does. The audit log allows no DELETE at all: its
    guard is lifted for that one DELETE, and only when the test left audit rows (most leave none)."""
    marker = request.node.get_closest_marker("django_db")
    transactional = (marker and marker.kwargs.get("transaction")) or any(
        name in request.fixturenames for name in ("transactional_db", "live_server")
    )
    if not transactional:
        yield
        return
    request.getfixturevalue("transactional_db")  # set up first, so torn down after this
    yield
    from django.db import connection

    from ledger import dbguards

    with connection.cursor() as cur:
        cur.execute("UPDATE ledger_run SET pruning = %s WHERE NOT pruning", [True])
        cur.execute("SELECT EXISTS (SELECT 1 FROM ledger_auditentry)")
        (audited,) = cur.fetchone()
    if audited:
        with connection.schema_editor() as editor:
            dbguards.drop_audit(None, editor)
            editor.execute("DELETE FROM ledger_auditentry")
            dbguards.install_audit(None, editor)


@pytest.fixture(autouse=True)
def _forget_read_states() -> Any:
    """The read cache of folded states (ledger/log/snapshots.py) knows a run by its row, id and
    creation time: in a production database no two runs share all three, but tests roll back and
    reuse rows under a frozen clock. Each test starts with the cache empty."""
    from ledger.log.snapshots import HEADS, READS

    READS.clear()
    HEADS.clear()
    yield
    READS.clear()
    HEADS.clear()


@pytest.fixture(scope="session")
def daphne_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the shared Daphne stores artifacts (a test that reads them points ARTIFACTS_ROOT here)."""
    return tmp_path_factory.mktemp("daphne-artifacts")


@pytest.fixture(scope="session")
def daphne(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory, daphne_artifacts: Path) -> Iterator[Daphne]:
    """A Daphne with the test settings serving the test database, started once per test process
    and shared by the modules that need a plain server (a start is a whole Django process's
    imports); a module that needs another kind defines its own `server`."""
    shared = start_daphne(
        tmp_path_factory.mktemp("daphne"), "shared", {"RUNLEDGER_ARTIFACTS_ROOT": str(daphne_artifacts)}
    )
    yield shared
    shared.stop()  # before the test database is dropped: it holds connections to it


@pytest.fixture(scope="session")
def server(daphne: Daphne) -> Daphne:
    """The server a test talks to: the shared Daphne, unless its module defines its own."""
    return daphne


@pytest.fixture(scope="session")
def collected_static(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The static files as production serves them (collectstatic, once per test run: the first of
    pytest-xdist's workers to need them collects them into the run's shared temporary folder)."""
    from tests.servers import collect_static

    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        shared = shared.parent  # the run's, above each worker's own
    target = shared / "staticfiles"
    with (shared / "staticfiles.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            collect_static(shared / "staticfiles.partial").rename(target)
    return target


@pytest.fixture
def workspace(db: None) -> Workspace:
    return bootstrap(tenant="acme", workspace="support")


@pytest.fixture
def other_workspace(db: None) -> Workspace:
    return bootstrap(tenant="globex", workspace="main")


# --- named users --------------------------------------------------------------------------------


def named_user(username: str, role: str, tenant: str = "acme") -> User:
    return create_user(username=username, tenant=tenant, role=role, password=PASSWORD).membership.user


@pytest.fixture
def admin(workspace: Workspace) -> User:
    return named_user("alice", "admin")


@pytest.fixture
def member(admin: User) -> User:
    """Someone of the workspace, when the role does not matter: its admin."""
    return admin


@pytest.fixture
def approver(workspace: Workspace) -> User:
    return named_user("bob", "approver")


@pytest.fixture
def operator(workspace: Workspace) -> User:
    return named_user("carol", "operator")


@pytest.fixture
def viewer(workspace: Workspace) -> User:
    return named_user("dave", "viewer")


@pytest.fixture
def outsider(other_workspace: Workspace) -> User:
    return named_user("olga", "admin", tenant="globex")


@pytest.fixture
def browser(client: Client, member: User) -> Client:
    """The console as the workspace's admin sees it (Django's test client, logged in)."""
    client.force_login(member)
    return client


# A page's CSRF token, wherever base.html and {% csrf_token %} write it: 64 random letters and digits.
_CSRF_TOKEN = re.compile(r'(name="csrfmiddlewaretoken" value="|"X-CSRFToken": ")[A-Za-z0-9]{64}"')


def without_csrf_tokens(html: str) -> str:
    """`html` with its CSRF tokens' values left out, for a check that a short word is absent from
    a whole page: a token holds any four given letters by chance (in about one page of 250,000)."""
    return _CSRF_TOKEN.sub(r'\1"', html)


# The base URL of in_process() clients (Django's test host name, allowed in every mode).
IN_PROCESS = "http://testserver"


def ledger_cli(*args: str) -> tuple[int, str]:
    """`manage.py ledger ARGS` in this process: (its exit status, what it wrote to stdout)."""
    out = io.StringIO()
    try:
        call_command("ledger", *args, stdout=out, stderr=io.StringIO())
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


def http_client(base_url: str = IN_PROCESS, **options: Any) -> httpx.Client:
    """httpx, as harnesses use it, against `base_url`; IN_PROCESS: Django's WSGI handler called in
    this thread (the whole middleware stack, CSRF checks included, and no server, socket or thread)
    for the tests whose subject is the API rather than the server that carries it."""
    if base_url == IN_PROCESS:
        from django.core.handlers.wsgi import WSGIHandler

        options.setdefault("transport", httpx.WSGITransport(app=WSGIHandler()))
    return httpx.Client(base_url=base_url, **{"timeout": 30, **options})


def log_in(base_url: str, user: User | str, *, send_csrf: bool = False) -> httpx.Client:
    """An HTTP client with a named user's console session, through the real login form (of a live
    server, or IN_PROCESS). `send_csrf`: send the CSRF token with every request, as the console's
    pages do."""
    client = http_client(base_url)
    page = client.get("/accounts/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert token, page.text
    username = user if isinstance(user, str) else user.get_username()
    done = client.post(
        "/accounts/login/", data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token.group(1)}
    )
    assert done.status_code == 302, done.text
    if send_csrf:
        # Login rotates the CSRF token: the new one is what unsafe requests must send.
        client.headers["X-CSRFToken"] = client.cookies["csrftoken"]
    return client


# --- time ---------------------------------------------------------------------------------------


class FakeClock:
    """`ledger.clock.now`, moved by hand (the `clock` fixture installs it)."""

    def __init__(self) -> None:
        self.moment = timezone.now()

    def now(self) -> datetime:
        return self.moment

    def advance(self, seconds: float = 0, **delta: float) -> None:
        self.moment += timedelta(seconds=seconds, **delta)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    # A live server runs in a thread of this process, so it reads the patched function too.
    monkeypatch.setattr("ledger.clock.now", fake.now)
    return fake


# --- events -------------------------------------------------------------------------------------


def started(workflow: str = "wfver_test", **extra: Any) -> dict[str, Any]:
    return {"type": "RunStarted", "payload": {"workflowVersionId": workflow, **extra}}


def ev(type_: str, **payload: Any) -> dict[str, Any]:
    return {"type": type_, "payload": payload}


def envelopes(items: list[tuple[str, dict[str, Any]]], *, run_id: str, start: int = 1) -> list[dict[str, Any]]:
    """Stored envelopes of (type, payload) items, for the pure functions that read a log (fold,
    replay plan, report): dense sequences from `start` and the ids the server would give them."""
    return [
        {
            "eventId": event_id(run_id=run_id, sequence=sequence, type=event_type, payload=payload),
            "runId": run_id,
            "sequence": sequence,
            "type": event_type,
            "recordedAt": f"2026-11-02T10:{sequence // 60:02d}:{sequence % 60:02d}.000Z",
            "payload": payload,
        }
        for sequence, (event_type, payload) in enumerate(items, start)
    ]


@pytest.fixture
def append(workspace: Workspace) -> Callable[..., AppendResult]:
    def _append(run_id: str, *events: dict[str, Any], **kwargs: Any) -> AppendResult:
        return log.append(workspace=workspace, run_id=run_id, events=list(events), **kwargs)

    return _append
