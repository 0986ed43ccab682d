"""The live feed of the Approvals page and of evaluate batches:
`ws/workspaces/<tenant>/<workspace>/reexecutions/`.

ledger.reexecution.services announces every change of a request (asked, approved, denied,
expired, started, finished) to the workspace's re-execution group after commit; a tool call that
starts or stops waiting for an approver is announced to the workspace's group (ledger.log.announce).
The message says only what changed; the page fetches its fragments again from the database
(static/js/live.js), so what a push shows is what a reload shows.

Announcements are lossy and stay inside one process on the in-memory channel layer (a worker
process finishing a request announces into its own), so the consumer also compares the
workspace's per-status counts and waiting tool calls every LEDGER_STREAM_POLL_SECONDS and tells
the page when they moved.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.urls import path

from ledger.log.announce import workspace_group_for
from ledger.models import Workspace
from ledger.reads import attention, reexecutions
from ledger.reexecution.execution import reexecution_group_for

from .workspace import WorkspaceFeed


def _counts(workspace: Workspace) -> dict[str, int]:
    # "listed": what the page lists as pending (requests and tool calls), the navigation's badge;
    # a tool call asking for or getting a decision moves it, so the poll sees those too.
    return {**reexecutions.counts(workspace), "listed": attention.waiting_for_approvers(workspace)}


class ReexecutionsConsumer(WorkspaceFeed):
    poller: asyncio.Task[None] | None = None
    counts: dict[str, int] | None = None

    group_of = staticmethod(reexecution_group_for)
    also_of = (staticmethod(workspace_group_for),)

    async def joined(self) -> None:
        assert self.workspace is not None
        self.counts = await database_sync_to_async(_counts)(self.workspace)
        self.poller = asyncio.create_task(self._poll())

    async def stop_sending(self) -> None:
        if self.poller is not None:
            poller, self.poller = self.poller, None
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        await super().stop_sending()

    async def _poll(self) -> None:
        interval = settings.LEDGER_STREAM_POLL_SECONDS
        while True:
            await asyncio.sleep(interval)
            assert self.workspace is not None
            counts = await database_sync_to_async(_counts)(self.workspace)
            if counts != self.counts:
                self.counts = counts
                await self.send_json({"type": "reexecution", "id": None, "status": None, "pending": counts["listed"]})

    async def ledger_run_changed(self, message: dict[str, Any]) -> None:
        """A run of the workspace started, ended, or a tool call of it began or stopped waiting (or
        its cost grew, which a batch page shows). The counts are not read again here: a busy
        workspace announces every model call to every open page, and the poll reads them anyway
        (a change of them already shown costs the page one more refresh, at most one a poll)."""
        await self.send_json({"type": "run", "runId": message["runId"]})

    async def ledger_reexecution_changed(self, message: dict[str, Any]) -> None:
        assert self.workspace is not None
        self.counts = await database_sync_to_async(_counts)(self.workspace)
        await self.send_json(
            {
                "type": "reexecution",
                "id": message["reexecutionId"],
                "status": message["status"],
                "runId": message["runId"],
                "newRunId": message.get("newRunId"),
                "pending": self.counts["listed"],
            }
        )


websocket_urlpatterns = [
    path("ws/workspaces/<slug:tenant>/<slug:workspace>/reexecutions/", ReexecutionsConsumer.as_asgi()),  # type: ignore[arg-type]  # Channels routes ASGI apps with Django's path(); the stubs allow only views
]
