"""The runs list's live feed: `ws/workspaces/<tenant>/<workspace>/runs/`.

Announcements (ledger.announce) say only which run started or finished; the row is read from the
database and rendered with the page's own row template, so a pushed row is the row a reload shows.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.urls import path

from ledger import access, announce, selectors
from ledger.errors import LedgerError
from ledger.models import Workspace

from ..rows import render_run_row


def _workspace(user: Any, tenant: str, workspace: str) -> Workspace | None:
    try:
        return access.resolve(user, workspace=f"{tenant}/{workspace}").workspace
    except LedgerError:
        return None


def _row_html(workspace: Workspace, run_id: str) -> str | None:
    run = selectors.find_run(workspace, run_id)
    return None if run is None else render_run_row(workspace, run)


class RunsListConsumer(AsyncJsonWebsocketConsumer):
    workspace: Workspace | None = None
    group: str | None = None

    async def connect(self) -> None:
        kwargs = self.scope["url_route"]["kwargs"]
        # Anonymous users and other tenants' members are refused alike (DESIGN.md §2: 404, not 403).
        self.workspace = await database_sync_to_async(_workspace)(
            self.scope["user"], kwargs["tenant"], kwargs["workspace"])
        if self.workspace is None:
            await self.close()
            return
        self.group = announce.workspace_group_for(self.workspace.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The feed is one-way; anything a browser sends is ignored."""

    async def ledger_run_changed(self, message: dict[str, Any]) -> None:
        assert self.workspace is not None
        html = await database_sync_to_async(_row_html)(self.workspace, message["runId"])
        if html is not None:
            await self.send_json({"type": "run", "runId": message["runId"], "html": html})


websocket_urlpatterns = [
    path("ws/workspaces/<slug:tenant>/<slug:workspace>/runs/", RunsListConsumer.as_asgi()),  # type: ignore[arg-type]  # Channels routes ASGI apps with Django's path(); the stubs allow only views
]
