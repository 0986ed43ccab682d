"""README's "Record runs from Python" works as written: its Python block is run by a fresh Python
with the client on its path (PYTHONPATH=client, as the README says) against a live Daphne, only
the host and port swapped; then run again, as a user would, and the log holds each event once."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command

from ledger.models import Run, Workspace
from ledger.reads import selectors
from ledger.tenancy.services import create_key
from tests.servers import Daphne, start_daphne

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daphne]:
    daphne = start_daphne(tmp_path_factory.mktemp("daphne"), "readme-client", {})
    yield daphne
    daphne.stop()


def _example() -> str:
    section = (ROOT / "README.md").read_text().split("## Record runs from Python", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README has no Python block under 'Record runs from Python'"
    return match.group(1)


def test_readme_client_example_runs_as_written(server: Daphne, workspace: Workspace, tmp_path: Path) -> None:
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    example = tmp_path / "example.py"
    example.write_text(_example().replace("http://127.0.0.1:8000", server.url))
    env = {**os.environ, "KEY": key, "PYTHONPATH": "client"}
    outputs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(example)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr + done.stdout
        outputs.append(done.stdout.splitlines())

    assert (
        outputs[0]
        == outputs[1]
        == [
            "1 RunStarted",
            "2 harness.session.started",
            "3 harness.model.called",
            "4 harness.model.responded",
            "5 harness.tool_call.started",
            "6 harness.tool_call.succeeded",
            "7 harness.session.completed",
            "8 RunCompleted",
        ]
    )
    run = Run.objects.get(workspace=workspace, run_id="run_python")
    assert run.status == "completed" and run.last_sequence == 8 and run.output == {"greeting": "Hello, Ada!"}
    assert selectors.events(run)[4]["payload"]["toolName"] == "email.send"
    call_command("ledger", "verify", "run_python", "--workspace", "acme/support", stdout=io.StringIO())
