"""Run leases and fencing: a taken-over executor can no longer write."""

from __future__ import annotations

import pytest

from ledger import errors
from ledger.log.leases import LeaseHeld, acquire_run_lease, release_run_lease
from ledger.models import Event
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db


def test_leased_run_needs_the_current_token(workspace, append) -> None:
    append("run_a", started())
    lease = acquire_run_lease(workspace=workspace, run_id="run_a", owner="worker-1")
    with pytest.raises(errors.Fenced):
        append("run_a", ev("StepScheduled", stepPath="s"))
    assert append("run_a", ev("StepScheduled", stepPath="s"), fencing_token=lease.fencing_token).last_sequence == 2


def test_stale_token_is_fenced_after_a_take_over_and_the_log_stays_dense(workspace, append) -> None:
    append("run_a", started())
    zombie = acquire_run_lease(workspace=workspace, run_id="run_a", owner="worker-1")
    with pytest.raises(LeaseHeld):
        acquire_run_lease(workspace=workspace, run_id="run_a", owner="worker-2")
    fresh = acquire_run_lease(workspace=workspace, run_id="run_a", owner="worker-2", take_over=True)
    assert fresh.fencing_token > zombie.fencing_token
    append("run_a", ev("StepScheduled", stepPath="new"), fencing_token=fresh.fencing_token)
    with pytest.raises(errors.Fenced):
        append("run_a", ev("StepScheduled", stepPath="zombie"), fencing_token=zombie.fencing_token)
    stored = Event.objects.filter(run__run_id="run_a").order_by("sequence")  # no ORDER BY: any order on PostgreSQL
    assert list(stored.values_list("sequence", flat=True)) == [1, 2]


def test_stale_token_is_fenced_even_after_the_lease_expired(workspace, append) -> None:
    append("run_a", started())
    old = acquire_run_lease(workspace=workspace, run_id="run_a", owner="w1", ttl_s=-1)
    new = acquire_run_lease(workspace=workspace, run_id="run_a", owner="w2", ttl_s=-1)
    with pytest.raises(errors.Fenced):
        append("run_a", ev("StepScheduled", stepPath="s"), fencing_token=old.fencing_token)
    # With no live lease, a writer without a token may append again.
    assert append("run_a", ev("StepScheduled", stepPath="s")).last_sequence == 2
    release_run_lease(workspace=workspace, lease=new)


def test_released_lease_lets_unleased_writers_in(workspace, append) -> None:
    append("run_a", started())
    lease = acquire_run_lease(workspace=workspace, run_id="run_a", owner="w1")
    release_run_lease(workspace=workspace, lease=lease)
    assert append("run_a", ev("StepScheduled", stepPath="s")).last_sequence == 2


def test_lease_of_another_workspaces_run_is_not_found(other_workspace, append) -> None:
    append("run_a", started())
    with pytest.raises(errors.NotFound):
        acquire_run_lease(workspace=other_workspace, run_id="run_a", owner="w")
