"""`bin/serve --processes N`: one listening socket, N Daphne processes on it (`daphne --fd`) and the
worker; a dead process started again after a back-off, with a line in the log; all of them stopped
together. Against a real `bin/serve` with two processes on 127.0.0.1 (docs/operations.md §
Production, docs/scaling.md): requests, an SSE stream and a console WebSocket through it, appends
that keep landing while one Daphne is SIGKILLed, and an outsider's 404 on both streams."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import websocket

from ledger.models import Event, Run, Workspace
from ledger.tenancy.services import create_key
from tests.live_support import session_id
from tests.servers import REPO_ROOT, database_url, free_port

REDIS_URL = os.environ.get("REDIS_URL", "")
DEADLINE_S = 90  # how long anything here may take on a loaded 2-core machine before the test fails
MAKE = ["make", "--no-print-directory", "-o", ".venv/.installed"]


@dataclass
class Serve:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def children(self) -> dict[int, str]:
        """The running children of bin/serve: pid -> command line."""
        found: dict[int, str] = {}
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            for pid in (task / "children").read_text().split():
                try:
                    command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                    state = Path(f"/proc/{pid}/status").read_text()
                except FileNotFoundError:
                    continue
                if "State:\tZ" not in state:
                    found[int(pid)] = command
        return found

    def daphnes(self) -> list[int]:
        return sorted(pid for pid, command in self.children().items() if "daphne" in command)

    def wait_for(self, pattern: str) -> re.Match[str]:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text())
            if found:
                return found
            assert self.process.poll() is None, self.text()[-3000:]
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} not in the log:\n{self.text()[-3000:]}")


def _env(**changes: str | None) -> dict[str, str]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        # Without Redis each process has its own in-memory layer: the streams deliver by polling.
        "LEDGER_STREAM_POLL_SECONDS": "30" if REDIS_URL else "0.2",
    }
    env.pop("RUNLEDGER_PROCESSES", None)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def start_serve(log_dir: Path, *args: str, env: dict[str, str] | None = None) -> Serve:
    port = free_port()
    log = log_dir / f"serve-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "bin/serve", *args, "127.0.0.1", str(port)],
            cwd=REPO_ROOT,
            env=env or _env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as in a terminal
        )
    return Serve(process, f"http://127.0.0.1:{port}", log)


def until_up(serve: Serve) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and serve.process.poll() is None:
        try:
            if httpx.get(f"{serve.url}/api/v1/runs/run_probe/stream", timeout=2).status_code == 401:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"bin/serve did not answer:\n{serve.text()[-3000:]}")


def stop(serve: Serve) -> int:
    if serve.process.poll() is None:
        serve.process.send_signal(signal.SIGTERM)
    try:
        return serve.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(serve.process.pid, signal.SIGKILL)
        serve.process.wait(timeout=10)
        raise


@pytest.fixture(scope="module")
def serve(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    server = start_serve(tmp_path_factory.mktemp("serve"), "--processes", "2")
    try:
        until_up(server)
        yield server
    finally:
        stop(server)  # before the test database is dropped: its processes hold connections to it


def _key(workspace: Workspace, scopes: list[str]) -> dict[str, str]:
    _, key = create_key(workspace=workspace, scopes=scopes)
    return {"Authorization": f"Bearer {key}"}


def _started(http: httpx.Client, run_id: str) -> None:
    body = {"events": [{"type": "RunStarted", "payload": {"workflowVersionId": "wfver_serve"}}]}
    assert http.post(f"/api/v1/runs/{run_id}/events", json=body).status_code == 200


def _sse_events(response: httpx.Response, count: int) -> list[int]:
    """The sequences of the first `count` ledger.event messages of an SSE response."""
    assert response.status_code == 200, response.read()
    sequences: list[int] = []
    event, ident = "message", None
    for line in response.iter_lines():
        if line == "":
            if event == "ledger.event" and ident is not None:
                sequences.append(int(ident))
                if len(sequences) == count:
                    return sequences
            event, ident = "message", None
        elif line.startswith("event:"):
            event = line.partition(":")[2].strip()
        elif line.startswith("id:"):
            ident = line.partition(":")[2].strip()
    raise AssertionError(f"the stream closed after {sequences}")


# --- started as asked ------------------------------------------------------------------------------


def _connections(pids: list[int], port: int) -> dict[int, int]:
    """Established connections to `port` held by each process (its socket fds, /proc/net/tcp)."""
    established: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                established.add(fields[9])
    held: dict[int, int] = {}
    for pid in pids:
        inodes = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        held[pid] = len(inodes & established)
    return held


def test_two_daphne_processes_listen_on_the_one_port_beside_the_worker(serve: Serve) -> None:
    commands = list(serve.children().values())
    daphnes = [c for c in commands if "daphne" in c]
    assert len(daphnes) == 2 and all(re.search(r"--fd \d+ console\.asgi:application", c) for c in daphnes), commands
    assert sum("ledger worker" in c for c in commands) == 1, commands
    assert re.search(r"listening on http://127\.0\.0\.1:\d+: 2 Daphne processes \(pids \d+ \d+\), worker", serve.text())
    # Neither Daphne bound a port of its own: the sockets are bin/serve's, inherited.
    port = int(serve.url.rsplit(":", 1)[1])
    assert f"-p {port}" not in " ".join(commands)

    # Clients connecting at once are spread over both processes by the kernel (one socket shared by
    # both would let the first to wake take nearly all of them, and keep them). SO_REUSEPORT hands
    # each connection to either socket by a hash of its source port: all of 16 went to one process
    # once in 33,000 runs (2 x 2^-16); of 40, once in 5 x 10^11.
    clients = [httpx.Client(base_url=serve.url, timeout=DEADLINE_S) for _ in range(40)]
    barrier = threading.Barrier(len(clients))
    answers: list[int] = []

    def connect(client: httpx.Client) -> None:
        barrier.wait()
        answers.append(client.get("/api/v1/runs").status_code)

    threads = [threading.Thread(target=connect, args=(c,)) for c in clients]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert answers == [401] * len(clients)
        held = _connections(serve.daphnes(), port)
        assert sum(held.values()) == len(clients) and all(held.values()), held
    finally:
        for c in clients:
            c.close()


@pytest.mark.django_db(transaction=True)
def test_requests_an_sse_stream_and_a_websocket_go_through_the_processes(
    serve: Serve, workspace: Workspace, other_workspace: Workspace, member: Any, outsider: Any
) -> None:
    headers = _key(workspace, ["ingest", "read"])
    with httpx.Client(base_url=serve.url, headers=headers, timeout=30) as http:
        for _ in range(20):  # fresh connections: the kernel hands each to either process
            with httpx.Client(base_url=serve.url, headers=headers, timeout=30) as fresh:
                assert fresh.get("/api/v1/runs").status_code == 200
        _started(http, "run_serve")
        socket_url = serve.url.replace("http://", "ws://") + "/ws/runs/run_serve/?after=0"
        ws = websocket.create_connection(
            socket_url, header=[f"Cookie: sessionid={session_id(member)}"], origin=serve.url, timeout=DEADLINE_S
        )
        try:
            with http.stream("GET", "/api/v1/runs/run_serve/stream?after=0", timeout=DEADLINE_S) as stream:
                for n in range(1, 6):
                    body = {"events": [{"type": "StepScheduled", "payload": {"stepPath": f"s{n}"}}]}
                    assert http.post("/api/v1/runs/run_serve/events", json=body).status_code == 200
                assert _sse_events(stream, 6) == [1, 2, 3, 4, 5, 6]
            frames = [json.loads(ws.recv()) for _ in range(6)]
            assert [(f["type"], f["sequence"]) for f in frames] == [("event", n) for n in range(1, 7)]
        finally:
            ws.close()

    # Another tenant: 404 on the stream, the socket's handshake refused.
    with httpx.Client(base_url=serve.url, headers=_key(other_workspace, ["read"]), timeout=30) as h:
        assert h.get("/api/v1/runs/run_serve/stream").status_code == 404
    with pytest.raises(websocket.WebSocketException):
        websocket.create_connection(
            socket_url, header=[f"Cookie: sessionid={session_id(outsider)}"], origin=serve.url, timeout=DEADLINE_S
        ).recv()


@pytest.mark.django_db(transaction=True)
def test_a_killed_daphne_is_started_again_and_appends_keep_landing(serve: Serve, workspace: Workspace) -> None:
    headers = _key(workspace, ["ingest", "read"])
    with httpx.Client(base_url=serve.url, headers=headers, timeout=30) as http:
        _started(http, "run_kill")
    acknowledged: list[int] = []
    errors: list[str] = []
    stop_writing = threading.Event()

    def write() -> None:
        # One event a request on a fresh connection each (as clients land on either process); a
        # request that got no answer is sent again with the same idempotency key until it does.
        n = 0
        while not stop_writing.is_set() or n < 40:
            body = {"events": [{"type": "StepScheduled", "payload": {"stepPath": f"k{n}"}, "idempotencyKey": f"k{n}"}]}
            for _ in range(200):
                try:
                    with httpx.Client(base_url=serve.url, headers=headers, timeout=30) as fresh:
                        answer = fresh.post("/api/v1/runs/run_kill/events", json=body)
                except httpx.TransportError:
                    time.sleep(0.05)
                    continue
                if answer.status_code == 200:
                    acknowledged.append(n)
                    break
                errors.append(f"{answer.status_code} {answer.text[:200]}")
                return
            else:
                errors.append(f"k{n} never answered")
                return
            n += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(acknowledged) < 5 and writer.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        before = serve.daphnes()
        assert len(before) == 2
        victim = before[0]
        os.kill(victim, signal.SIGKILL)
        found = serve.wait_for(
            rf"daphne (\d) \(pid {victim}\) killed by SIGKILL after [\d.]+ s; starting it again in 1 s"
        )
        restarted = serve.wait_for(rf"daphne {found.group(1)} started again \(pid (\d+), restart 1\)")
        new_pid = int(restarted.group(1))
        assert new_pid != victim and new_pid in serve.daphnes()
    finally:
        stop_writing.set()
        writer.join(timeout=DEADLINE_S * 2)
    assert not writer.is_alive() and not errors, errors
    assert sorted(serve.daphnes()) == sorted({*before} - {victim} | {new_pid})

    # Nothing lost, nothing twice: every acknowledged append once, the run dense.
    run = Run.objects.get(workspace=workspace, run_id="run_kill")
    steps = list(
        Event.objects.filter(run=run, type="StepScheduled").order_by("sequence").values_list("payload", flat=True)
    )
    assert [json.loads(p)["stepPath"] for p in steps] == [f"k{n}" for n in acknowledged]
    assert run.last_sequence == 1 + len(acknowledged) == Event.objects.filter(run=run).count()

    # Killed again at once, the same process waits longer: the back-off doubles.
    os.kill(new_pid, signal.SIGKILL)
    serve.wait_for(
        rf"daphne {found.group(1)} \(pid {new_pid}\) killed by SIGKILL after [\d.]+ s; starting it again in 2 s"
    )
    serve.wait_for(rf"daphne {found.group(1)} started again \(pid \d+, restart 2\)")
    until_up(serve)


def test_a_killed_worker_is_started_again(serve: Serve) -> None:
    [worker] = [pid for pid, command in serve.children().items() if "ledger worker" in command]
    os.kill(worker, signal.SIGKILL)
    serve.wait_for(rf"worker \(pid {worker}\) killed by SIGKILL after [\d.]+ s; starting it again in 1 s")
    restarted = serve.wait_for(r"worker started again \(pid (\d+), restart 1\)")
    assert "ledger worker" in serve.children()[int(restarted.group(1))]


# --- stopped together ------------------------------------------------------------------------------


def test_auto_is_one_process_per_core_and_sigterm_stops_them_all(tmp_path: Path, django_db_setup: None) -> None:
    server = start_serve(tmp_path, env=_env(RUNLEDGER_PROCESSES="auto"))
    try:
        until_up(server)
        children = list(server.children())
        assert len(server.daphnes()) == len(os.sched_getaffinity(0)) and len(children) == len(server.daphnes()) + 1
    finally:
        status = stop(server)
    assert status == 0, server.text()[-3000:]
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    assert server.text().rstrip().endswith("serve: stopped")


def test_sigterm_while_the_processes_start_stops_them_quietly(tmp_path: Path, django_db_setup: None) -> None:
    """A stop that comes while Daphne and the worker still import Django (`systemctl restart` twice
    in a row) ends them as it ends running ones, with no traceback in the log."""
    server = start_serve(tmp_path, "--processes", "2")
    try:
        server.wait_for(r"serve: listening on .*worker \(pid \d+\)")
        children = list(server.children())
    finally:
        status = stop(server)
    assert status == 0 and len(children) == 3, server.text()[-3000:]
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    assert "Traceback" not in server.text() and server.text().rstrip().endswith("serve: stopped"), server.text()[-3000:]


def test_a_wrong_setting_stops_everything_with_status_2(tmp_path: Path, django_db_setup: None) -> None:
    # DEBUG off without a SECRET_KEY: every process would fail the same way again; no restart loop.
    server = start_serve(tmp_path, "--processes", "2", env=_env(DEBUG="0", SECRET_KEY=None))
    assert server.process.wait(timeout=DEADLINE_S * 2) == 2
    text = server.text()
    assert "SECRET_KEY must be set" in text and "exited with status 2 (a setting is wrong" in text
    assert "started again" not in text


def test_a_bad_process_count_or_a_taken_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    for env in ({"RUNLEDGER_PROCESSES": "0"}, {"RUNLEDGER_PROCESSES": "many"}):
        done = subprocess.run(
            [sys.executable, "bin/serve", "127.0.0.1", str(free_port())],
            cwd=REPO_ROOT,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and "must be a number >= 1 or 'auto'" in done.stderr, done.stderr
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "bin/serve", "--processes", "2", "127.0.0.1", str(port)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in done.stderr, done.stderr


def test_make_run_asks_for_one_process_and_make_serve_for_one_per_core() -> None:
    def planned(target: str, **env: str) -> str:
        environment = {k: v for k, v in os.environ.items() if k != "RUNLEDGER_PROCESSES"} | env
        done = subprocess.run(
            [*MAKE, "-n", target, "SECRET_KEY=x"], cwd=REPO_ROOT, env=environment, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return next(line for line in done.stdout.splitlines() if "bin/serve" in line)

    assert planned("run").endswith("bin/serve --processes 1 127.0.0.1 8000")
    assert planned("serve").endswith("bin/serve --processes auto 127.0.0.1 8000")
    assert planned("serve", RUNLEDGER_PROCESSES="3").endswith("bin/serve --processes 3 127.0.0.1 8000")
    assert "--processes 4 " in planned("run", RUNLEDGER_PROCESSES="4")
