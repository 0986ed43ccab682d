"""`make serve`, the production start of docs/operations.md § Production: migrate, collectstatic,
Daphne and the worker, with DEBUG off; and it refuses to start without a SECRET_KEY."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.servers import REPO_ROOT, database_url, first_answer, free_port, stop_group

# The test already runs inside the virtualenv: never let make rebuild it.
MAKE = ["make", "--no-print-directory", "-o", ".venv/.installed"]


def _env(**changes: str | None) -> dict[str, str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings"}
    for name in ("DEBUG", "DJANGO_ALLOW_ASYNC_UNSAFE"):
        env.pop(name, None)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def test_make_serve_refuses_to_start_without_a_secret_key() -> None:
    done = subprocess.run(
        [*MAKE, "serve"], cwd=REPO_ROOT, env=_env(SECRET_KEY=None), capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "set SECRET_KEY" in done.stderr


@pytest.mark.django_db(transaction=True)
def test_make_serve_collects_static_files_and_serves_with_debug_off(tmp_path: Path) -> None:
    port = free_port()
    static_root = tmp_path / "static"
    env = _env(
        SECRET_KEY=secrets.token_urlsafe(50),
        DATABASE_URL=database_url(),
        RUNLEDGER_STATIC_ROOT=str(static_root),
        RUNLEDGER_PROCESSES=None,
    )
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*MAKE, "serve", f"PORT={port}"],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        # Up to 300 s: it migrates and collects the static files first, on a loaded machine.
        page = first_answer(process, f"{url}/accounts/login/", 300)
        assert page is not None and page.status_code == 200, log.read_text()[-3000:]
        assert (static_root / "staticfiles.json").exists()
        assert re.search(r'href="/static/css/console\.[0-9a-f]{12}\.css"', page.text)
        missing = httpx.get(f"{url}/no/such/page/", timeout=10)
        assert missing.status_code == 404 and "DEBUG = True" not in missing.text
        assert "production, DEBUG=0" in log.read_text()
        # One Daphne process per core (PROCESSES=auto) and the worker, from the one command.
        started = re.search(
            r"listening on http://127\.0\.0\.1:\d+: (\d+) Daphne process.*, worker \(pid", log.read_text()
        )
        assert started and int(started.group(1)) == len(os.sched_getaffinity(0)), log.read_text()[-3000:]
    finally:
        stop_group(process)


@pytest.mark.django_db(transaction=True)
def test_bin_serve_run_as_a_command_goes_on_in_the_virtualenv(tmp_path: Path) -> None:
    """`bin/serve --processes N [--workers W] HOST PORT` typed as docs/operations.md shows runs under
    its shebang's python3, outside the virtualenv: it used to look for Daphne beside that Python and
    die with a traceback; it goes on in `.venv` and serves."""
    base_python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(base_python), "bin/serve", "--processes", "1", "--workers", "0", "127.0.0.1", str(port)],
            cwd=REPO_ROOT,
            env=_env(DEBUG="1", DATABASE_URL=database_url(), RUNLEDGER_PROCESSES=None),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        page = first_answer(process, f"http://127.0.0.1:{port}/accounts/login/", 120)
        assert page is not None and page.status_code == 200, log.read_text()[-3000:]
        assert "Traceback" not in log.read_text()
    finally:
        stop_group(process)
