"""The runs list's live feed: `ws/workspaces/<tenant>/<workspace>/runs/`.

Announcements (ledger.log.announce) say only which run's row moved (it started or finished, its
tokens and cost grew, it began or stopped waiting for a person); the socket passes on `{"type": "run", "runId": …}` for a run of the
workspace, and the page fetches its rows again (static/js/live.js), with its own filters and sort,
so what a push shows is what a reload shows. Nothing of another workspace is ever sent.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from django.urls import path

from ledger.log import announce
from ledger.models import Workspace
from ledger.reads import selectors

from .workspace import WorkspaceFeed


def _holds(workspace: Workspace, run_id: str) -> bool:
    return selectors.find_run(workspace, run_id) is not None


# How many of the workspace's run ids one socket remembers having found in it.
KNOWN_RUNS = 10_000


class RunsListConsumer(WorkspaceFeed):
    group_of = staticmethod(announce.workspace_group_for)
    known: set[str]

    async def joined(self) -> None:
        self.known = set()

    async def ledger_run_changed(self, message: dict[str, Any]) -> None:
        assert self.workspace is not None
        run_id = message["runId"]
        # Only the workspace's own runs are announced to its group; checked all the same, once a
        # run per socket: a run never moves to another workspace, and a busy one is announced at
        # every model call, to every open list.
        if run_id not in self.known:
            if not await database_sync_to_async(_holds)(self.workspace, run_id):
                return
            if len(self.known) < KNOWN_RUNS:
                self.known.add(run_id)
        await self.send_json({"type": "run", "runId": run_id})


websocket_urlpatterns = [
    path("ws/workspaces/<slug:tenant>/<slug:workspace>/runs/", RunsListConsumer.as_asgi()),  # type: ignore[arg-type]  # Channels routes ASGI apps with Django's path(); the stubs allow only views
]
