"""A secret rule an admin adds is applied by every append that starts after it commits, in every
process, however long that process has held its Workspace (a runtime executor through a run, a
worker): the append checks the redaction rules it prepared its batch with against the stored
ones in the statement it writes with (ledger/log/rules.py `settings_in_force`), and on a miss
takes the stored ones under the run's head lock and redacts the batch again before writing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from ledger import log
from ledger.log.states import STATES
from ledger.models import Event, Run, Workspace
from ledger.runtime.executor import start_run
from ledger.runtime.providers import ModelRequest, ScriptedProvider
from ledger.tenancy import redaction_settings
from ledger.tenancy.services import bootstrap
from tests.conftest import ev, ledger_cli, named_user, started
from tests.runtime_support import round_trips
from tests.runtime_workflows import SCRIPT, build_drill

pytestmark = pytest.mark.django_db

SECRET = "ACME-VAULT-8812"
PATTERN = r"ACME-VAULT-\d+"


@pytest.fixture
def no_cached_states() -> Iterator[None]:
    STATES.clear()
    yield
    STATES.clear()


def said(text: str, turn: int) -> dict[str, Any]:
    return ev(
        "harness.model.responded",
        stepPath="s",
        turn=turn,
        callId=f"m{turn}",
        model={"provider": "openai", "modelId": "gpt-4o"},
        response={"text": text, "usage": {"inputTokens": 10, "outputTokens": 2}},
    )


def added_elsewhere(workspace: Workspace) -> None:
    """The secret's pattern added as the Redaction page adds it, on a Workspace loaded for it, as
    another process would: `workspace`, what a long-lived process holds, is left as it was."""
    redaction_settings.set_extra_rules(
        workspace=Workspace.objects.get(pk=workspace.pk), keys=[], patterns=[PATTERN], by=named_user("alice", "admin")
    )
    assert workspace.redact_value_patterns == []


def logged(run_id: str) -> str:
    return json.dumps([e.payload for e in Event.objects.filter(run__run_id=run_id).order_by("sequence")])


@pytest.mark.django_db(transaction=True)  # the states cached outside a test's transaction, as in production
@pytest.mark.parametrize("calls", [1, 250], ids=["one_call", "a_long_batch"])
def test_a_process_holding_its_workspace_from_before_a_new_secret_rule_redacts_by_it(
    calls: int, no_cached_states: None
) -> None:
    held = bootstrap(tenant="acme", workspace="support")  # what a long-lived process loaded once
    log.append(workspace=held, run_id="run_a", events=[started(), said("hello", 1)])
    log.append(workspace=held, run_id="run_a", events=[said("again", 2)])  # its state cached here
    added_elsewhere(held)
    log.append(workspace=held, run_id="run_a", events=[said(f"the key is {SECRET}", t) for t in range(3, calls + 3)])
    log.append(workspace=held, run_id="run_b", events=[started(), said(f"and {SECRET}", 1)])  # a run it starts now
    for run_id in ("run_a", "run_b"):
        assert SECRET not in logged(run_id) and "[REDACTED]" in logged(run_id)
    assert held.redact_value_patterns == [PATTERN]  # found out: the process holds the stored rules now
    # Found out once: the process's appends are one statement again (the second, as in test_reprice).
    log.append(workspace=held, run_id="run_a", events=[said(SECRET, calls + 3)])
    with round_trips() as sent:
        log.append(workspace=held, run_id="run_a", events=[said(SECRET, calls + 4)])
    assert sent == ([1] if connection.vendor == "postgresql" else [])
    assert SECRET not in logged("run_a")
    assert ledger_cli("verify")[0] == 0


def test_a_run_executing_across_a_new_secret_rule_redacts_its_later_events(
    workspace: Workspace, no_cached_states: None
) -> None:
    def reply(request: ModelRequest) -> dict[str, Any]:
        step = request.step_path.split(".")[0]
        if (step, request.turn) == ("research", 2):  # an admin adds the rule while the run executes
            added_elsewhere(workspace)
        answer = SCRIPT[step][request.turn - 1]
        return {**answer, "text": f"the vault key is {SECRET}"} if step == "summarize" else answer

    provider = ScriptedProvider(script=reply, name="openai", model_id="gpt-4o")
    outcome = start_run(
        workspace=workspace, workflow=build_drill(provider=provider), input={"cities": ["Oslo"], "to": "ops"}
    )
    assert outcome.status == "completed"
    text = logged(outcome.run_id)
    assert SECRET not in text and "the vault key is [REDACTED]" in text
    assert SECRET not in json.dumps(Run.objects.get(run_id=outcome.run_id).output)
    assert ledger_cli("verify", outcome.run_id)[0] == 0
