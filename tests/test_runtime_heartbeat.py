"""Heartbeats (issue 15): while a step is silent for longer than half the run lease, a background
thread of the executor renews the lease, so a second executor cannot take the run over from a
live one; once the lease is lost anyway (taken over), the executor writes nothing more (`fenced`).

The lease is four seconds here (RUNLEDGER_RUN_LEASE_SECONDS) and the steps really are silent for
three half-lives of it: a renewal only by writes would have let it lapse."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest
from django.test import override_settings

from ledger.errors import Fenced
from ledger.log.leases import LeaseHeld, acquire_run_lease
from ledger.models import Run, Workspace
from ledger.runtime.executor import start_run
from ledger.runtime.registry import CodeRun, Workflow
from tests.runtime_support import (  # noqa: F401  (every_run_verifies is an autouse fixture)
    every_run_verifies,
)
from tests.runtime_support import (
    run_events as _events,
)

pytestmark = pytest.mark.django_db(transaction=True)
LEASE_S = 4.0
HALF = LEASE_S / 2


@override_settings(RUNLEDGER_RUN_LEASE_SECONDS=LEASE_S)
def test_a_step_silent_for_three_lease_half_lives_keeps_its_lease(workspace: Workspace) -> None:
    refused: list[str] = []

    def silent(run_input: Any, outputs: Mapping[str, Any]) -> Any:
        began = time.monotonic()
        for half_lives in (1, 2, 3):  # after each half-life, a second executor tries to take the run
            time.sleep(max(0.0, began + half_lives * HALF + 0.1 - time.monotonic()))
            try:
                acquire_run_lease(workspace=workspace, run_id="run_silent", owner="second-executor", ttl_s=LEASE_S)
            except LeaseHeld as held:
                refused.append(str(held.details["owner"]))
        return {"slept": 3}

    wf = Workflow(name="silent", steps=(CodeRun("wait", silent), CodeRun("after", lambda i, o: o["wait"])))
    outcome = start_run(workspace=workspace, workflow=wf, input={}, run_id="run_silent")

    assert outcome.status == "completed" and outcome.output == {"slept": 3}
    assert len(refused) == 3 and "second-executor" not in refused
    run = Run.objects.get(workspace=workspace, run_id="run_silent")
    assert run.lease_owner == "" and run.fencing_token == 1  # never taken over, given back at the end


@override_settings(RUNLEDGER_RUN_LEASE_SECONDS=LEASE_S)
def test_a_lease_taken_over_during_a_silent_step_stops_the_executor_writing(workspace: Workspace) -> None:
    def silent(run_input: Any, outputs: Mapping[str, Any]) -> Any:
        acquire_run_lease(workspace=workspace, run_id="run_lost", owner="operator-takeover", ttl_s=60, take_over=True)
        time.sleep(HALF + 0.5)  # the heartbeat's next renewal finds the lease gone
        return "done"

    wf = Workflow(name="lost", steps=(CodeRun("wait", silent), CodeRun("after", lambda i, o: o["wait"])))
    with pytest.raises(Fenced):
        start_run(workspace=workspace, workflow=wf, input={}, run_id="run_lost")

    events = _events(workspace, "run_lost")
    assert [e["type"] for e in events][-1] == "StepAttemptStarted"  # nothing after the takeover
    run = Run.objects.get(workspace=workspace, run_id="run_lost")
    assert run.lease_owner == "operator-takeover" and run.fencing_token == 2
