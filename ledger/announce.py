"""After-commit announcements of appended events on the channel layer, and hearing them.

The layer is lossy by design: a message carries only the run and its last sequence (or, to a
workspace's runs list, only the run id), and readers always fetch what changed from the database.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import BaseChannelLayer, InMemoryChannelLayer, get_channel_layer
from django.db import transaction

from .models import Run

log = logging.getLogger(__name__)


def group_for(run_pk: int) -> str:
    return f"ledger.run.{run_pk}"


def workspace_group_for(workspace_pk: int) -> str:
    return f"ledger.workspace.{workspace_pk}"


# The events that move a run in or through its workspace's runs list (new row, final status).
_LIFECYCLE = frozenset({"RunStarted", "RunCompleted", "RunFailed"})


_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _background_loop() -> asyncio.AbstractEventLoop:
    """One event loop per process for announcements sent from plain sync code (CLI, workers),
    so channels_redis keeps its connections instead of opening one per announcement."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="ledger-announce", daemon=True).start()
        return _loop


def _report(future: concurrent.futures.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("an announcement was lost", exc_info=future.exception())


def _send(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        # Inside Daphne (sync code under sync_to_async) async_to_sync runs on the server's loop.
        # The in-memory layer's queues belong to whichever loop reads them, so it always takes
        # that path; a network layer from plain sync code goes to the background loop instead.
        if isinstance(layer, InMemoryChannelLayer) or _has_outer_loop():
            async_to_sync(layer.group_send)(group, message)
        else:
            asyncio.run_coroutine_threadsafe(layer.group_send(group, message), _background_loop()) \
                .add_done_callback(_report)
    except Exception:  # an announcement lost is caught up by readers; the append has committed
        log.warning("announcement %s to %s was lost", message, group, exc_info=True)


def _has_outer_loop() -> bool:
    return getattr(SyncToAsync.threadlocal, "main_event_loop", None) is not None


def after_commit(run: Run, sequence: int, written: Iterable[Mapping[str, Any]] = ()) -> None:
    """Announce a committed batch to the run's group; and to the workspace's group when the batch
    started or finished the run. `written` are the batch's new envelopes (no query is made)."""
    group, run_id = group_for(run.pk), run.run_id
    appended = {"type": "ledger.appended", "runId": run_id, "sequence": sequence}
    lifecycle = any(e["type"] in _LIFECYCLE for e in written)
    workspace_group = workspace_group_for(run.workspace_id)

    def send() -> None:
        _send(group, appended)
        if lifecycle:
            _send(workspace_group, {"type": "ledger.run_changed", "runId": run_id})

    # Only after commit: a reader woken by this must find the rows it is told about.
    transaction.on_commit(send)


def send_after_commit(group: str, message: dict[str, Any]) -> None:
    """Send `message` to `group` once the current transaction commits (re-execution changes,
    ledger/reexecution); lossy like every announcement, readers fetch the state themselves."""
    transaction.on_commit(lambda: _send(group, message))


class Subscription:
    """A channel of this process's own in a run's group (ledger.follow listens on it). Joining
    and leaving never fail the reader: without the layer it only hears nothing, and polls."""

    def __init__(self, run_pk: int) -> None:
        self.group = group_for(run_pk)
        self.layer: BaseChannelLayer | None = None
        self.channel: str | None = None

    async def join(self) -> bool:
        layer = get_channel_layer()
        if layer is None:
            return False
        try:
            channel = await layer.new_channel()
            await layer.group_add(self.group, channel)
        except Exception:
            log.warning("could not join %s; polling the database only", self.group, exc_info=True)
            return False
        self.layer, self.channel = layer, channel
        return True

    async def receive(self) -> dict[str, Any]:
        assert self.layer is not None and self.channel is not None
        return await self.layer.receive(self.channel)

    async def refresh(self) -> None:
        """Layers expire group membership (a day by default); a long reader renews it."""
        if self.layer is not None and self.channel is not None:
            try:
                await self.layer.group_add(self.group, self.channel)
            except Exception:
                log.warning("could not renew %s", self.group, exc_info=True)

    async def leave(self) -> None:
        if self.layer is not None and self.channel is not None:
            try:
                await self.layer.group_discard(self.group, self.channel)
            except Exception:
                log.warning("could not leave %s", self.group, exc_info=True)
