"""Run leases with fencing tokens: one executor writes a run at a time (docs/design.md §3).

Taking a lease bumps the run's fencing token; appends carrying an older token are `fenced`, which
is what stops a paused or zombie executor from writing after another one took the run over. A
holder renews its lease (same token, later expiry) while it works, on a write it makes anyway
(`renew_locked`, in that write's transaction); a renewal after a takeover is `fenced` too. Time is `ledger.clock.now()`, so tests move it instead of sleeping.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F

from .. import clock
from ..errors import Conflict, Fenced, NotFound
from ..models import Run, Workspace
from . import rules


class LeaseHeld(Conflict):
    code = "run_leased"


@dataclass(frozen=True)
class Lease:
    run_id: str
    owner: str
    fencing_token: int
    expires_at: datetime
    ttl_s: float = 60.0

    def due_for_renewal(self, now: datetime) -> bool:
        """More than half the lease has passed."""
        return now >= self.expires_at - timedelta(seconds=self.ttl_s / 2)


def new_owner() -> str:
    """`host:pid:random`: an executor process as a lease owner, so that one of this host that died
    (killed, crashed), and so cannot give its lease back, is recognised by `owner_is_dead`."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def owner_is_dead(owner: str) -> bool:
    """True when `owner` names a process of this host that no longer exists."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


@transaction.atomic
def acquire_run_lease(
    *, workspace: Workspace, run_id: str, owner: str, ttl_s: float = 60, take_over: bool = False
) -> Lease:
    """Lease the run to `owner`. A live lease of another owner is refused unless `take_over`."""
    run = Run.objects.filter(workspace=workspace).select_for_update().filter(run_id=run_id).first()
    if run is None:
        raise NotFound(f"run {run_id} not found", runId=run_id)
    now = clock.now()
    live = rules.lease_live(run.lease_expires_at, now)
    if live and run.lease_owner != owner and not take_over:
        raise LeaseHeld(
            f"run {run_id} is leased to {run.lease_owner} until {run.lease_expires_at:%H:%M:%S}", owner=run.lease_owner
        )
    expires = now + timedelta(seconds=ttl_s)
    Run.objects.filter(pk=run.pk).update(
        lease_owner=owner, lease_expires_at=expires, fencing_token=F("fencing_token") + 1
    )
    run.refresh_from_db(fields=["fencing_token"])
    return Lease(run_id=run_id, owner=owner, fencing_token=run.fencing_token, expires_at=expires, ttl_s=ttl_s)


@transaction.atomic
def renew_run_lease(*, workspace: Workspace, lease: Lease) -> Lease:
    """Extend `lease` by its TTL from now, keeping its fencing token; Fenced if it was taken over."""
    expires = clock.now() + timedelta(seconds=lease.ttl_s)
    renewed = (
        Run.objects.filter(workspace=workspace)
        .filter(run_id=lease.run_id, fencing_token=lease.fencing_token)
        .update(lease_owner=lease.owner, lease_expires_at=expires)
    )
    if not renewed:
        raise _taken_over(lease)
    return replace(lease, expires_at=expires)


def renew_locked(*, run: Run, lease: Lease) -> Lease:
    """`renew_run_lease` in the caller's transaction, on the run's head row it holds locked
    (`ledger.log.holding`): the holder's next write carries the renewal, no commit of its own."""
    if run.fencing_token != lease.fencing_token:
        raise _taken_over(lease)
    expires = clock.now() + timedelta(seconds=lease.ttl_s)
    Run.objects.filter(pk=run.pk).update(lease_owner=lease.owner, lease_expires_at=expires)
    run.lease_owner, run.lease_expires_at = lease.owner, expires  # the caller's head row stays current
    return replace(lease, expires_at=expires)


def _taken_over(lease: Lease) -> Fenced:
    return Fenced(
        f"the lease on run {lease.run_id} was taken over; fencing token {lease.fencing_token} is stale",
        runId=lease.run_id,
    )


@transaction.atomic
def release_run_lease(*, workspace: Workspace, lease: Lease) -> None:
    """Give the run back; a no-op if the lease was already taken over."""
    Run.objects.filter(workspace=workspace).filter(run_id=lease.run_id, fencing_token=lease.fencing_token).update(
        lease_owner="", lease_expires_at=None
    )
