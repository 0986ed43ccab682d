"""README's "Record runs from Python" works as written: its Python block saved as example.py and
its shell block run by bash (a key made, the client on the path, the example run) against a live
Daphne on a port other than 8000, reached through `PORT` as the README says (only where
example.py was saved differs); then run again, as a user would, and the log holds each event once."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pytest
from django.core.management import call_command

from ledger.models import Run, Workspace
from ledger.reads import selectors
from tests.readme import URL_LINE, blocks, on_port
from tests.servers import REPO_ROOT, Daphne, database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]


def _example() -> tuple[str, str]:
    (python,) = blocks("Record runs from Python", "python")
    (commands,) = blocks("Record runs from Python", "sh")
    return python, commands


def test_readme_client_example_names_the_port_once_as_a_variable() -> None:
    python, commands = _example()
    assert 'os.environ["RUNLEDGER_URL"]' in python and "8000" not in python
    assert commands.count(URL_LINE) == 1 and commands.count("8000") == 1


def test_readme_client_example_runs_as_written(server: Daphne, workspace: Workspace, tmp_path: Path) -> None:
    python, commands = _example()
    (tmp_path / "example.py").write_text(python)
    # The README runs `example.py` from the repository root, where the reader saved it.
    script = commands.replace("example.py", str(tmp_path / "example.py"))
    env = {**on_port(server.url), "DATABASE_URL": database_url()}
    outputs = []
    for _ in range(2):
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
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
