"""`make run` on a machine whose port 8000 is taken, as a new user meets it: it says so in one line
and how to pick another port, before setting anything up; `make run PORT=N` prints the URL it
serves with that port, and the README's first examples work against it as written once the
user's terminal says `export PORT=N`."""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.readme import block, on_port
from tests.servers import REPO_ROOT, database_url, first_answer, free_port, stop_group

pytestmark = pytest.mark.backend_independent

# The test already runs inside the virtualenv: never let make rebuild it.
MAKE = ["make", "--no-print-directory", "-o", ".venv/.installed"]


@contextmanager
def port_8000_taken() -> Iterator[None]:
    """Another server on 127.0.0.1:8000 (this listener, or whatever already holds the port)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", 8000))
            sock.listen()
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE, exc
        yield


def _env(var_dir: Path, **changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_ALLOW_ASYNC_UNSAFE", "PORT", "RUNLEDGER_URL"}}
    env.update(DJANGO_SETTINGS_MODULE="console.settings", RUNLEDGER_VAR_DIR=str(var_dir), **changes)
    return env


def test_make_run_on_a_taken_port_says_so_and_how_to_pick_another(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    with port_8000_taken():
        done = subprocess.run(
            [*MAKE, "run"], cwd=REPO_ROOT, env=_env(var_dir), capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        "Port 8000 on 127.0.0.1 is taken (another server is listening there): pick another with make run PORT=8001"
    ) in done.stderr.splitlines()
    assert done.stdout == "" and not var_dir.exists()  # stopped before migrating or loading the demo


@pytest.mark.django_db(transaction=True)
def test_make_run_on_another_port_serves_the_readme_examples_as_written(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "make-run.log"
    with port_8000_taken(), log.open("wb") as out:
        process = subprocess.Popen(
            [*MAKE, "run", f"PORT={port}"],
            cwd=REPO_ROOT,
            env=_env(tmp_path / "var", DATABASE_URL=database_url()),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            # Up to 300 s: it migrates and lays out the demo's 300 runs first, on a loaded machine.
            page = first_answer(process, f"{url}/accounts/login/", 300)
            printed = log.read_text()
            assert page is not None and page.status_code == 200, printed[-3000:]
            assert f"Runledger console: {url}/ and the re-execution worker" in printed
            assert re.search(rf"Port {port}; another with make run PORT=8001, then export PORT=8001 ", printed)

            script = block("Send your first run")
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", script],
                cwd=REPO_ROOT,
                env={**on_port(url, _env(tmp_path / "var")), "DATABASE_URL": database_url()},
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr + done.stdout
            run = [json.loads(line) for line in done.stdout.splitlines() if line.strip()][1]
            assert run["runId"] == "run_first" and run["status"] == "running"
        finally:
            stop_group(process)
