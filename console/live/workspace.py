"""What the workspace-wide live feeds (runs list, approvals) share: the member's workspace from the
URL, one group of announcements, and nothing taken from the browser."""

from __future__ import annotations

from typing import Any, ClassVar

from channels.db import database_sync_to_async

from ledger.errors import LedgerError
from ledger.models import Workspace
from ledger.tenancy import access

from .watch import WatchedConsumer


def _access(user: Any, path: str) -> access.Access | None:
    try:
        return access.resolve(user, workspace=path)
    except LedgerError:
        return None


class WorkspaceFeed(WatchedConsumer):
    """Joins the workspace's announcement groups (`group_of(workspace pk)`, set by each feed as a
    staticmethod, and `also_of`, any more) for a member of the URL's workspace; anyone else is
    refused."""

    group_of: ClassVar[staticmethod[[int], str]]
    also_of: ClassVar[tuple[staticmethod[[int], str], ...]] = ()
    workspace: Workspace | None = None
    joined_groups: list[str] | None = None

    async def joined(self) -> None:
        """Called after the group is joined and before the connection is accepted."""

    async def connect(self) -> None:
        kwargs = self.scope["url_route"]["kwargs"]
        # Anonymous users and other tenants' members are refused alike (docs/design.md §2: 404, not 403).
        path = f"{kwargs['tenant']}/{kwargs['workspace']}"
        found = await database_sync_to_async(_access)(self.scope["user"], path)
        if found is None or not self.take_slot():  # … and so is a user past their streams' cap
            await self.close()
            return
        self.workspace = found.workspace
        self.joined_groups = [self.group_of(self.workspace.pk), *(of(self.workspace.pk) for of in self.also_of)]
        for group in self.joined_groups:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.joined()
        await self.accept()
        self.watch(found, path)

    async def stop_sending(self) -> None:
        if self.joined_groups is not None:
            groups, self.joined_groups = self.joined_groups, None
            for group in groups:
                await self.channel_layer.group_discard(group, self.channel_name)

    async def disconnect(self, code: int) -> None:
        await self.stop_sending()
        await self.stop_watching()
