"""Rotating SECRET_KEY as docs/operations.md § Rotating SECRET_KEY says, over web hosts restarted
one at a time behind a proxy with no sticky sessions: while two hosts of neighbouring steps serve
side by side, a browser's session and an API list's cursor work on both, whichever host each
request reaches. The one-step swap (new key and old fallback at once) does not: a session that a
restarted host has re-signed is logged out by a host not yet restarted. And the console's live
pages, whose WebSockets reconnect the moment a restart drops them, keep their session when its
signature is a fallback key's."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.test import Client

from ledger import log
from ledger.models import Workspace
from ledger.tenancy.services import create_key
from tests.conftest import started
from tests.live_support import TIMEOUT_S, communicator, session_id

OLD, NEW = "the-key-before-" + "x" * 40, "the-key-after-" + "y" * 40
BEFORE = (OLD, ())
STEP_1 = (OLD, (NEW,))  # every host accepts the new key; nothing is signed with it yet
STEP_2 = (NEW, (OLD,))  # the new key signs; the old one is still accepted everywhere
AFTER = (NEW, ())  # once the old key's sessions and cursors no longer matter

Host = tuple[str, tuple[str, ...]]


def _on(settings: Any, host: Host) -> None:
    """The next request is served by a host with this SECRET_KEY and these fallbacks."""
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = host[0], list(host[1])


@pytest.mark.django_db
@pytest.mark.parametrize(("older", "newer"), [(BEFORE, STEP_1), (STEP_1, STEP_2), (STEP_2, AFTER)])
def test_a_session_and_a_cursor_work_on_hosts_of_neighbouring_steps(
    older: Host, newer: Host, settings: Any, workspace: Workspace, admin: User, client: Client
) -> None:
    _on(settings, older)
    client.force_login(admin)
    for host in (newer, older, newer, older, older, newer):
        _on(settings, host)
        page = client.get("/w/acme/support/")
        assert page.status_code == 200, (host, page.headers.get("Location"))

    for run_id in ("run_a1", "run_a2", "run_a3"):
        log.append(workspace=workspace, run_id=run_id, events=[started()])
    _, key = create_key(workspace=workspace, scopes=["read"])
    api = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    for made_by, opened_by in ((older, newer), (newer, older)):
        _on(settings, made_by)
        cursor = api.get("/api/v1/runs", {"limit": 1}).json()["next"]
        _on(settings, opened_by)
        page = api.get("/api/v1/runs", {"limit": 1, "cursor": cursor})
        assert page.status_code == 200 and [r["runId"] for r in page.json()["runs"]] == ["run_a2"], page.content


@pytest.mark.django_db
def test_the_one_step_swap_logs_out_a_session_that_meets_a_host_not_yet_restarted(
    settings: Any, workspace: Workspace, admin: User, client: Client
) -> None:
    _on(settings, BEFORE)
    client.force_login(admin)
    _on(settings, STEP_2)
    assert client.get("/w/acme/support/").status_code == 200  # re-signed with the new key
    _on(settings, BEFORE)
    gone = client.get("/w/acme/support/")
    assert gone.status_code == 302 and gone.headers["Location"].startswith("/accounts/login/")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("host", [STEP_1, STEP_2])
def test_a_live_page_reconnecting_after_a_restart_keeps_its_session(
    host: Host, settings: Any, workspace: Workspace, admin: User
) -> None:
    """The restart drops every WebSocket and an open run page reconnects at once, before any page
    request has re-signed its session with the new key: the handshake takes a session signed with
    a fallback key as its user's, the stream stays open past its credentials re-check, and the
    session is neither deleted nor re-keyed (a socket cannot hand the browser a new cookie)."""
    log.append(workspace=workspace, run_id="run_live", events=[started()])
    _on(settings, (NEW, ()) if host == STEP_1 else BEFORE)  # signed with the key that is a fallback
    session = session_id(admin)
    _on(settings, host)
    settings.LEDGER_STREAM_KEEPALIVE_SECONDS = 0.2

    async def scenario() -> tuple[bool, list[Any], bool]:
        comm = communicator("/ws/runs/run_live/?after=0&workspace=acme/support", session)
        connected, _ = await comm.connect(timeout=TIMEOUT_S)
        if not connected:
            return False, [], False
        first = await comm.receive_json_from(timeout=TIMEOUT_S)
        open_after_recheck = await comm.receive_nothing(timeout=1.0)
        await comm.disconnect()
        return True, [first["sequence"]], open_after_recheck

    connected, sequences, open_after_recheck = async_to_sync(scenario)()
    assert connected and sequences == [1] and open_after_recheck
    browser = Client()
    browser.cookies["sessionid"] = session
    assert browser.get("/w/acme/support/").status_code == 200
