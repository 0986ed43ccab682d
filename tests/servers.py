"""A Daphne serving the test database in a subprocess, for the tests that need a real server
(SSE, two processes on one channel layer, the browser): the test database's URL, a free port,
and a start that retries when the port is taken between probing and binding it."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
from django.db import connection

REPO_ROOT = Path(__file__).resolve().parent.parent


def database_url() -> str:
    s = connection.settings_dict  # after django_db_setup: the test database
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(s['NAME']).resolve()}"
    auth = quote(s["USER"] or "", safe="")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"], safe="")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Daphne:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def start_daphne(
    log_dir: Path,
    name: str,
    env: dict[str, str | None],
    probe_headers: dict[str, str] | None = None,
    port: int | None = None,
) -> Daphne:
    """`probe_headers`: what the start-up probe must send to be answered at all (a production
    environment's Host, its proxy's X-Forwarded-Proto). `port`: this one (a server restarted where
    its clients expect it), else a free one."""
    environment = dict(os.environ)
    # The browser tests' process sets it for Playwright; a server keeps Django's async-safety checks.
    environment.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    environment["DATABASE_URL"] = database_url()
    # The daphne script's own directory comes first on its path, not the checkout: name the checkout,
    # so a second worktree's server imports its own code rather than the installed one's.
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), environment.get("PYTHONPATH")]))
    for key, value in env.items():
        if value is None:
            environment.pop(key, None)
        else:
            environment[key] = value
    fixed = port
    for attempt in range(3):  # the free port may be taken between probing and binding it
        port = fixed or free_port()
        log = log_dir / f"daphne-{name}-{attempt}-{time.monotonic_ns()}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "daphne"),
                    "-b",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "console.asgi:application",
                ],
                cwd=REPO_ROOT,
                env=environment,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        server = Daphne(process, f"http://127.0.0.1:{port}", log)
        deadline = time.monotonic() + 90  # a loaded machine with parallel test processes imports slowly
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if (
                    httpx.get(
                        f"{server.url}/api/v1/runs/run_probe/stream", headers=probe_headers, timeout=1
                    ).status_code
                    == 401
                ):
                    return server
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        server.stop()
    raise RuntimeError(f"Daphne did not start; see {log}:\n{log.read_text()[-3000:]}")


def production_env(static_root: Path | None = None) -> dict[str, str | None]:
    """For start_daphne: console/settings.py itself (not the test settings) with DEBUG off and a
    fresh SECRET_KEY, serving `static_root` (collect_static's) when given."""
    env: dict[str, str | None] = {
        "DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_SETTINGS_MODULE": "console.settings",
        "DJANGO_ALLOW_ASYNC_UNSAFE": None,
    }
    if static_root is not None:
        env["RUNLEDGER_STATIC_ROOT"] = str(static_root)
    return env


def collect_static(static_root: Path) -> Path:
    """`manage.py collectstatic` as `make serve` runs it (DEBUG off), into `static_root`."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    for key, value in production_env(static_root).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    done = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return static_root


def first_answer(process: subprocess.Popen[bytes], url: str, seconds: float) -> httpx.Response | None:
    """GET `url` until a server still starting (migrate, collectstatic, a demo) answers it; None if
    `process` exits or `seconds` pass first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        try:
            return httpx.get(url, timeout=2)
        except httpx.TransportError:
            time.sleep(0.3)
    return None


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """Ctrl-C to the process group a server was started in (`start_new_session=True`), as a person
    stops `make run`; SIGKILL if it has not stopped within 30 s."""
    os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
