"""What the long-lived streams share, SSE (console/api/stream.py) and the console's WebSockets
(console/live/): a cap on how many one caller holds open, and the re-check of the caller's
credentials while a stream lives (docs/security.md "Streams").

**Re-check.** A stream is authorized once, when it opens, and may then live for hours. Every
`LEDGER_STREAM_KEEPALIVE_SECONDS` (at the latest) it asks `still_allowed`: an API key must still
be unrevoked; a session must still exist (logging out deletes it) and still belong to the same
user, whose password has not changed since; and the caller must still reach the same run or
workspace (a removed member does not). A stream that fails ends: SSE ends its response, a
WebSocket closes with code 4401.

**Cap.** One caller (an API key, or a user over every session) holds at most
`LEDGER_STREAM_MAX_PER_CALLER` streams open at once in one process; the next is refused (SSE:
429 `too_many_streams`; WebSocket: the handshake is refused). The count lives in this process:
with several Daphne processes behind a load balancer, the cap holds per process, so a caller may
hold up to that many per process. A slot is given back when its stream ends, whichever way it
ends (finished, refused later, client gone, task cancelled): `Slot.release` is idempotent and is
called from every exit, and a slot whose owner was dropped without releasing it is released when
it is garbage-collected.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model, load_backend
from django.contrib.auth.models import AnonymousUser
from django.contrib.sessions.backends.base import SessionBase
from django.utils.crypto import constant_time_compare

from ledger.errors import LedgerError
from ledger.models import ApiKey
from ledger.reads import selectors
from ledger.tenancy import access

CLOSE_CREDENTIALS = 4401  # WebSocket close code: the credentials the socket opened with are gone


def keepalive_seconds() -> float:
    return float(settings.LEDGER_STREAM_KEEPALIVE_SECONDS)


def max_per_caller() -> int:
    return int(settings.LEDGER_STREAM_MAX_PER_CALLER)


# --- the cap ---------------------------------------------------------------------------------


class Slot:
    """One open stream of one caller; `release` gives it back (once, however often called)."""

    def __init__(self, slots: StreamSlots, caller: str) -> None:
        self.caller = caller
        self._release = weakref.finalize(self, slots._give_back, caller)

    def release(self) -> None:
        self._release()

    @property
    def held(self) -> bool:
        return self._release.alive


class StreamSlots:
    """Open streams per caller, in this process (threads and event loops alike)."""

    def __init__(self) -> None:
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()

    def take(self, caller: str, limit: int) -> Slot | None:
        with self._lock:
            if self._open[caller] >= limit:
                return None
            self._open[caller] += 1
        return Slot(self, caller)

    def open_for(self, caller: str) -> int:
        with self._lock:
            return self._open[caller]

    def _give_back(self, caller: str) -> None:
        with self._lock:
            self._open[caller] -= 1
            if self._open[caller] <= 0:
                del self._open[caller]


SLOTS = StreamSlots()


def caller_of(principal: Any) -> str:
    """The name a caller's streams are counted under: its key, or its user (all sessions)."""
    if isinstance(principal, ApiKey):
        return f"key:{principal.pk}"
    return f"user:{principal.pk}"


def take_slot(principal: Any) -> Slot | None:
    return SLOTS.take(caller_of(principal), max_per_caller())


# --- the re-check ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    """What a stream was opened with, to be checked again while it lives."""

    api_key_id: int | None
    user_id: int | None
    session_key: str | None
    workspace: str | None  # as the caller named it (?workspace=T/W), or None
    run_id: str | None
    workspace_pk: int
    run_pk: int | None


def grant_for(principal: Any, session: SessionBase | None, *, workspace: str | None, found: access.Access) -> Grant:
    if isinstance(principal, ApiKey):
        return Grant(
            principal.pk,
            None,
            None,
            workspace,
            found.run.run_id if found.run else None,
            found.workspace.pk,
            found.run.pk if found.run else None,
        )
    return Grant(
        None,
        principal.pk,
        session.session_key if session is not None else None,
        workspace,
        found.run.run_id if found.run else None,
        found.workspace.pk,
        found.run.pk if found.run else None,
    )


def signed_for(user: Any, stored_hash: str) -> bool:
    """Whether a session's auth hash is the user's under SECRET_KEY or a key of SECRET_KEY_FALLBACKS
    (docs/operations.md § Rotating SECRET_KEY). Django's page requests accept both, re-signing
    with SECRET_KEY under a new session key; a socket cannot hand the browser that new cookie, so
    it accepts both and writes nothing."""
    if not stored_hash:
        return False
    hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
    return any(constant_time_compare(stored_hash, known) for known in hashes)


def socket_user(session: SessionBase) -> Any:
    """A WebSocket's user from its session, read only (Channels' `get_user` knows no fallback key
    and deletes such a session: every live page reconnecting after the restart that rotated the
    key logged its user out); a session that does not verify is refused, and left for the next page
    request to end."""
    try:
        user_id = get_user_model()._meta.pk.to_python(session[SESSION_KEY])
        backend_path = session[BACKEND_SESSION_KEY]
    except KeyError:
        return AnonymousUser()
    if backend_path not in settings.AUTHENTICATION_BACKENDS:
        return AnonymousUser()
    user = load_backend(backend_path).get_user(user_id)
    if user is None or not signed_for(user, session.get(HASH_SESSION_KEY, "")):
        return AnonymousUser()
    return user


def _session_user(grant: Grant) -> Any:
    """The grant's user if its session still exists, is theirs, and their password is unchanged."""
    if grant.session_key is None or grant.user_id is None:
        return None
    user_id: int = grant.user_id
    engine = import_module(settings.SESSION_ENGINE)
    session = engine.SessionStore(session_key=grant.session_key)
    data = session.load()  # a deleted or expired session loads empty
    if str(data.get(SESSION_KEY, "")) != str(user_id):
        return None
    user = selectors.active_user(user_id)
    if user is None:
        return None
    if not signed_for(user, data.get(HASH_SESSION_KEY, "")):
        return None
    return user


def still_allowed(grant: Grant) -> bool:
    """Whether the stream's caller may still read what it opened (see the module docstring)."""
    principal: Any
    key_id = grant.api_key_id
    if key_id is not None:
        principal = selectors.live_api_key(key_id)
    else:
        principal = _session_user(grant)
    if principal is None:
        return False
    try:
        found = access.resolve(principal, workspace=grant.workspace, run_id=grant.run_id, scope="read")
    except LedgerError:
        return False
    return found.workspace.pk == grant.workspace_pk and (found.run.pk if found.run else None) == grant.run_pk
