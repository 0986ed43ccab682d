"""README's "Send your first run" works as written: its shell block is run by bash, with the real
curl, against a live server holding `make run`'s demo data (only the host and port are swapped)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ledger.demo import load_demo
from ledger.models import Run
from tests.servers import database_url as _database_url

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent


def _first_run_block() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Send your first run", 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match, "README has no shell block under 'Send your first run'"
    return match.group(1)


def test_readme_first_run_commands_work_as_written(live_server: Any) -> None:
    assert shutil.which("curl"), "curl is needed: the README's commands are run as written"
    load_demo(history_runs=10)  # what `make run` does before serving
    script = _first_run_block().replace("http://127.0.0.1:8000", live_server.url)
    env = {**os.environ, "DATABASE_URL": _database_url()}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script + "\n" + script],
        cwd=ROOT,
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
