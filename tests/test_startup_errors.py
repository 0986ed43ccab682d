"""A settings error on the command line is one line on stderr and exit status 2, saying what to set
and where it is documented: for every manage.py command and for Daphne, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import REPO_ROOT

DAPHNE = str(Path(sys.executable).parent / "daphne")


def _run(command: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY", "DATABASE_URL"}}
    environment["DJANGO_SETTINGS_MODULE"] = "console.settings"
    environment.update(env)
    return subprocess.run(command, cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=120)


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert done.stdout == ""
    return lines[0]


@pytest.mark.parametrize("command", [["ledger", "--help"], ["ledger", "verify"], ["help"], ["migrate"]])
def test_a_command_without_debug_or_secret_key_says_what_to_set_in_one_line(command: list[str]) -> None:
    line = _one_line(_run([sys.executable, "manage.py", *command]))
    assert line.startswith("Runledger settings: SECRET_KEY must be set when DEBUG is off")
    assert "DEBUG=1" in line and "docs/operations.md § Production" in line


def test_a_bad_value_names_the_setting_and_where_settings_are_documented() -> None:
    line = _one_line(_run([sys.executable, "manage.py", "ledger", "--help"], DEBUG="maybe"))
    assert line == (
        "Runledger settings: DEBUG must be a boolean (1/0, true/false), got 'maybe' "
        "(every setting: docs/operations.md § Settings)"
    )
    assert "## Settings" in (REPO_ROOT / "docs" / "operations.md").read_text()


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("RUNLEDGER_CONN_MAX_AGE", "abc", "RUNLEDGER_CONN_MAX_AGE must be a whole number, got 'abc'"),
        ("RUNLEDGER_CONN_MAX_AGE", "-5", "RUNLEDGER_CONN_MAX_AGE must be 0 or more, got '-5'"),
        ("LOG_LEVEL", "LOUD", "LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got 'LOUD'"),
        ("RUNLEDGER_OPENAI_TIMEOUT_S", "abc", "RUNLEDGER_OPENAI_TIMEOUT_S must be a number of seconds, got 'abc'"),
        ("RUNLEDGER_OPENAI_TIMEOUT_S", "0", "RUNLEDGER_OPENAI_TIMEOUT_S must be above 0 and at most 3600.0, got '0'"),
    ],
)
def test_every_documented_variable_with_a_bad_value_is_one_line(name: str, value: str, expected: str) -> None:
    """These were read raw: a traceback and exit status 1 instead of the documented line (or, for
    the provider's timeout, a refusal only when a run first asked the provider)."""
    done = _run(
        [sys.executable, "manage.py", "ledger", "--help"],
        DEBUG="1",
        DATABASE_URL="postgres://nobody@127.0.0.1:1/none",  # parsed, never connected to
        **{name: value},
    )
    assert _one_line(done) == f"Runledger settings: {expected} (every setting: docs/operations.md § Settings)"


def test_a_database_url_of_another_kind_is_named_without_its_password() -> None:
    line = _one_line(
        _run(
            [sys.executable, "manage.py", "ledger", "--help"],
            DEBUG="1",
            DATABASE_URL="mysqlx://admin:hunter2@db/ledger",
        )
    )
    assert "DATABASE_URL must be sqlite:///PATH or postgres://" in line and "'mysqlx'" in line
    assert "hunter2" not in line


def test_daphne_stops_with_the_same_one_line() -> None:
    line = _one_line(_run([DAPHNE, "-b", "127.0.0.1", "-p", "0", "console.asgi:application"]))
    assert line.startswith("Runledger settings: SECRET_KEY must be set when DEBUG is off")


def test_with_the_settings_made_the_command_runs() -> None:
    done = _run([sys.executable, "manage.py", "ledger", "--help"], SECRET_KEY="a-production-key-" + "x" * 40)
    assert done.returncode == 0, done.stderr
    assert "usage: manage.py ledger" in done.stdout
