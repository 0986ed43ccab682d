"""The runs list's live feed: `ws/workspaces/<tenant>/<workspace>/runs/`.

Announcements (ledger.log.announce) say only which run started or finished; the row is read from the
database and rendered with the page's own row template, so a pushed row is the row a reload shows.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from django.urls import path

from ledger.log import announce
from ledger.models import Workspace
from ledger.reads import selectors

from ..rows import render_run_row
from .workspace import WorkspaceFeed


def _row_html(workspace: Workspace, run_id: str) -> str | None:
    run = selectors.find_run(workspace, run_id)
    return None if run is None else render_run_row(workspace, run)


class RunsListConsumer(WorkspaceFeed):
    group_of = staticmethod(announce.workspace_group_for)

    async def ledger_run_changed(self, message: dict[str, Any]) -> None:
        assert self.workspace is not None
        html = await database_sync_to_async(_row_html)(self.workspace, message["runId"])
        if html is not None:
            await self.send_json({"type": "run", "runId": message["runId"], "html": html})


websocket_urlpatterns = [
    path("ws/workspaces/<slug:tenant>/<slug:workspace>/runs/", RunsListConsumer.as_asgi()),  # type: ignore[arg-type]  # Channels routes ASGI apps with Django's path(); the stubs allow only views
]
