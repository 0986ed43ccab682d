"""What the workspace-wide live feeds (runs list, approvals) share: the member's workspace from the
URL, one group of announcements, and nothing taken from the browser."""

from __future__ import annotations

from typing import Any, ClassVar

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from ledger import access
from ledger.errors import LedgerError
from ledger.models import Workspace


def _workspace(user: Any, tenant: str, workspace: str) -> Workspace | None:
    try:
        return access.resolve(user, workspace=f"{tenant}/{workspace}").workspace
    except LedgerError:
        return None


class WorkspaceFeed(AsyncJsonWebsocketConsumer):
    """Joins the workspace's announcement group (`group_of(workspace pk)`, set by each feed as a
    staticmethod) for a member of the URL's workspace; anyone else is refused."""

    group_of: ClassVar["staticmethod[[int], str]"]
    workspace: Workspace | None = None
    group: str | None = None

    async def joined(self) -> None:
        """Called after the group is joined and before the connection is accepted."""

    async def connect(self) -> None:
        kwargs = self.scope["url_route"]["kwargs"]
        # Anonymous users and other tenants' members are refused alike (DESIGN.md §2: 404, not 403).
        self.workspace = await database_sync_to_async(_workspace)(
            self.scope["user"], kwargs["tenant"], kwargs["workspace"])
        if self.workspace is None:
            await self.close()
            return
        self.group = self.group_of(self.workspace.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.joined()
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The feed is one-way; anything a browser sends is ignored."""
