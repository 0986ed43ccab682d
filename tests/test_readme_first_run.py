"""README's "Send your first run" works as written: its shell block is run by bash, with the real
curl, against a live Daphne on a port other than 8000 holding `make run`'s demo data, reached the
way the README says, through `PORT` (nothing in the block is swapped)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from ledger.demo import load_demo
from ledger.models import Run
from tests.readme import URL_LINE, block, on_port
from tests.servers import REPO_ROOT, Daphne, database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]


def test_readme_first_run_names_the_port_once_as_a_variable() -> None:
    script = block("Send your first run")
    assert script.count(URL_LINE) == 1 and script.count("8000") == 1
    assert script.count("$RUNLEDGER_URL/api/v1/") == 3


def test_readme_first_run_commands_work_as_written(server: Daphne) -> None:
    assert shutil.which("curl"), "curl is needed: the README's commands are run as written"
    load_demo(history_runs=10)  # what `make run` does before serving
    script = block("Send your first run")
    env = {**on_port(server.url), "DATABASE_URL": database_url()}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script + "\n" + script],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    outputs = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    appended, run, events, retried = outputs[0], outputs[1], outputs[2], outputs[3]
    assert appended["lastSequence"] == 1 and appended["events"][0]["replayed"] is False
    assert run["runId"] == "run_first" and run["workflowVersionId"] == "wfver_hello" and run["status"] == "running"
    assert run["input"] == {"name": "Ada"}
    assert [e["type"] for e in events["events"]] == ["RunStarted"] and events["next"] is None
    # run twice, as a user would: the retry is a replay, not a second event
    assert retried["events"][0]["replayed"] is True
    assert (
        Run.objects.get(workspace__tenant__slug="acme", workspace__slug="support", run_id="run_first").last_sequence
        == 1
    )
