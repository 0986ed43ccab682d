"""The reference deployment of deploy/ as deploy/README.md documents it, on 127.0.0.1: Debian's nginx
with deploy/nginx/runledger.conf (only its CHANGE lines rewritten: ports, a throwaway self-signed
certificate, the cache folder) in front of two web hosts' worth of processes (two `bin/serve` groups
of two Daphne processes, as deploy/systemd/runledger-web.service starts them), a worker as
runledger-worker.service starts it, PostgreSQL and Redis, every process with deploy/runledger.env.

Through nginx: TLS and the redirect to it, `X-Forwarded-Proto` (no redirect loop, secure cookies),
the static files' cache, the body limit with the API's envelope, a login, appends from several
clients, an SSE stream and a console WebSocket receiving every event in order, an outsider's 404,
a re-execution approved and executed by the worker; then one Daphne SIGKILLed mid-traffic: the
clients' retries land on the others with nothing lost, duplicated or invented, and the dead
process is started again. PostgreSQL + Redis pass only (CI's second pass, where .ci/run installs
nginx when it is absent)."""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import websocket
from django.contrib.auth.models import User

from ledger.models import Event, Run, Workspace
from ledger.runtime.executor import start_run
from ledger.tenancy.services import create_key
from tests.conftest import PASSWORD
from tests.servers import REPO_ROOT, database_url, free_port

pytestmark = [pytest.mark.postgres_only, pytest.mark.redis_only]

DEPLOY = REPO_ROOT / "deploy"
DEADLINE_S = 180  # how long any one thing may take on a loaded 2-core machine before the test fails
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


@dataclass
class Group:
    """One web host's `bin/serve`."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def daphnes(self) -> list[int]:
        found = []
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            for pid in (task / "children").read_text().split():
                try:
                    if "State:\tZ" not in Path(f"/proc/{pid}/status").read_text():
                        found.append(int(pid))
                except FileNotFoundError:
                    pass
        return sorted(found)


@dataclass
class Deployment:
    url: str  # https through nginx
    plain_url: str  # its port 80
    certificate: Path
    env: dict[str, str]  # every process's: the environment file, filled in
    groups: list[Group] = field(default_factory=list)
    others: list[subprocess.Popen[bytes]] = field(default_factory=list)  # the worker, nginx
    logs: list[Path] = field(default_factory=list)

    def client(self, **options: Any) -> httpx.Client:
        trust = ssl.create_default_context(cafile=str(self.certificate))
        return httpx.Client(base_url=self.url, verify=trust, timeout=60, **options)

    def start_group(self, port: int, log: Path) -> Group:
        """A web host's runledger-web.service started (again, for a restart: its log goes on)."""
        with log.open("ab") as out:
            process = subprocess.Popen(
                unit_command("runledger-web.service", self.env, ("127.0.0.1", port)),
                cwd=REPO_ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return Group(process, port, log)

    def tail(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-2000:]}" for log in self.logs)


def environment_file() -> dict[str, str]:
    """deploy/runledger.env's variables as a shell reads the file, the way deploy/README.md's
    steps do (`set -a; . /etc/runledger/runledger.env; set +a`): every line an assignment, nothing
    said on stderr (an unquoted value with a space would run its second word as a command). systemd
    reads quoted values the same way."""
    path = DEPLOY / "runledger.env"
    names = re.findall(r"^(\w+)=", path.read_text(), re.M)
    read = subprocess.run(
        ["sh", "-c", 'set -a; . "$1"; set +a; env -0', "sh", str(path)],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        check=True,
    )
    assert read.stderr == b"", read.stderr.decode()
    shell = dict(entry.partition("=")[::2] for entry in read.stdout.decode().split("\0") if entry)
    assert set(names) <= set(shell), set(names) - set(shell)
    return {name: shell[name] for name in names}


def unit_command(unit: str, env: dict[str, str], host_port: tuple[str, int] | None = None) -> list[str]:
    """A systemd unit's ExecStart, run from this checkout by this virtualenv's python."""
    exec_start = re.search(r"^ExecStart=(.*)$", (DEPLOY / "systemd" / unit).read_text(), re.M)
    assert exec_start, unit
    command = exec_start.group(1).replace("/srv/runledger/.venv/bin/python", sys.executable)
    command = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], command)
    if host_port is not None:
        assert command.endswith(" 0.0.0.0 8000"), command
        command = command.removesuffix(" 0.0.0.0 8000") + f" {host_port[0]} {host_port[1]}"
    return shlex.split(command)


def site(ports: list[int], tls: int, plain: int, certificate: Path, key: Path, var_cache: Path) -> str:
    """deploy/nginx/runledger.conf with its CHANGE lines rewritten, and nothing else."""
    text = (DEPLOY / "nginx" / "runledger.conf").read_text()
    for old, new in [
        ("server web1.example.com:8000 ", f"server 127.0.0.1:{ports[0]} "),
        ("server web2.example.com:8000 ", f"server 127.0.0.1:{ports[1]} "),
        # Only the root moves: a /var/cache of the test's own, as bare as Debian's (nginx makes the
        # cache's folder, not its parents).
        ("proxy_cache_path /var/cache/", f"proxy_cache_path {var_cache}/"),
        ("listen 80;", f"listen 127.0.0.1:{plain};"),
        ("return 301 https://$host$request_uri;", f"return 301 https://$host:{tls}$request_uri;"),
        ("listen 443 ssl http2;", f"listen 127.0.0.1:{tls} ssl http2;"),
        ("server_name runledger.example.com;", "server_name 127.0.0.1;"),
        ("/etc/ssl/runledger/fullchain.pem", str(certificate)),
        ("/etc/ssl/runledger/privkey.pem", str(key)),
    ]:
        assert old in text, f"deploy/nginx/runledger.conf no longer has {old!r}"
        text = text.replace(old, new)
    return text


def main_config(folder: Path, site_file: Path) -> str:
    """What Debian's /etc/nginx/nginx.conf gives a site, in a folder of the test's own."""
    for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (folder / name).mkdir(exist_ok=True)
    user = "user root root;\n" if os.geteuid() == 0 else ""  # workers that can read the test's files
    return (
        f"{user}daemon off;\nworker_processes 1;\npid {folder}/nginx.pid;\nerror_log {folder}/error.log notice;\n"
        "events { worker_connections 512; }\n"
        "http {\n  include /etc/nginx/mime.types;\n  default_type application/octet-stream;\n"
        f"  access_log {folder}/access.log;\n  client_body_temp_path {folder}/body;\n"
        f"  proxy_temp_path {folder}/proxy;\n  fastcgi_temp_path {folder}/fastcgi;\n"
        f"  uwsgi_temp_path {folder}/uwsgi;\n  scgi_temp_path {folder}/scgi;\n"
        f"  include {site_file};\n}}\n"
    )


def _wait_up(deployment: Deployment) -> None:
    deadline = time.monotonic() + DEADLINE_S
    with deployment.client() as http:
        while time.monotonic() < deadline:
            assert all(p.poll() is None for p in [*deployment.others, *(g.process for g in deployment.groups)]), (
                deployment.tail()
            )
            try:
                # Both groups answer (nginx tries each in turn: four fresh requests reach both).
                if all(http.get("/accounts/login/").status_code == 200 for _ in range(4)):
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
    raise AssertionError(f"the deployment did not answer through nginx\n{deployment.tail()}")


@pytest.fixture(scope="module")
def deployment(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory, collected_static: Path
) -> Iterator[Deployment]:
    assert Path(NGINX).exists(), "nginx is not installed: apt-get install nginx (.ci/run does)"
    folder = tmp_path_factory.mktemp("deploy")
    certificate, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(certificate)],
        check=True,
        capture_output=True,
    )
    tls, plain, ports = free_port(), free_port(), [free_port(), free_port()]
    env = {
        **os.environ,
        **environment_file(),
        # What an operator fills in for this machine (the CHANGE values of deploy/runledger.env).
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "127.0.0.1",
        "CSRF_TRUSTED_ORIGINS": f"https://127.0.0.1:{tls}",
        "DATABASE_URL": database_url(),
        "REDIS_URL": os.environ["REDIS_URL"],
        "RUNLEDGER_STATIC_ROOT": str(folder / "static"),  # a copy: a test adds a release's file
        "RUNLEDGER_ARTIFACTS_ROOT": str(folder / "artifacts"),
        "RUNLEDGER_PROCESSES": "2",
        # The test's own: this checkout's code, its workflows for the worker, its Redis prefix.
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        "RUNLEDGER_WORKFLOW_MODULES": "tests.runtime_workflows",
        "DJANGO_SETTINGS_MODULE": "tests.settings",
    }
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    shutil.copytree(collected_static, folder / "static")
    deployment = Deployment(f"https://127.0.0.1:{tls}", f"http://127.0.0.1:{plain}", certificate, env)
    try:
        for n, port in enumerate(ports, 1):
            log = folder / f"web{n}.log"
            deployment.logs.append(log)
            deployment.groups.append(deployment.start_group(port, log))
        log = folder / "worker.log"
        deployment.logs.append(log)
        with log.open("wb") as out:
            deployment.others.append(
                subprocess.Popen(
                    unit_command("runledger-worker.service", env),
                    cwd=REPO_ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        site_file, config = folder / "runledger.conf", folder / "nginx.conf"
        (folder / "var-cache").mkdir()
        site_file.write_text(site(ports, tls, plain, certificate, key, folder / "var-cache"))
        config.write_text(main_config(folder, site_file))
        checked = subprocess.run([NGINX, "-t", "-c", str(config), "-p", str(folder)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
        log = folder / "nginx.log"
        deployment.logs += [log, folder / "error.log"]
        with log.open("wb") as out:
            deployment.others.append(
                subprocess.Popen([NGINX, "-c", str(config), "-p", str(folder)], stdout=out, stderr=subprocess.STDOUT)
            )
        _wait_up(deployment)
        yield deployment
    finally:
        for process in [*(g.process for g in deployment.groups), *deployment.others]:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM if process.args[0] != NGINX else signal.SIGQUIT)
        for process in [*(g.process for g in deployment.groups), *deployment.others]:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                if process.args[0] == NGINX:
                    process.kill()
                else:
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


def log_in(deployment: Deployment, username: str) -> httpx.Client:
    """A browser's session through nginx's login form (CSRF over HTTPS checks the Referer)."""
    http = deployment.client(headers={"Referer": f"{deployment.url}/accounts/login/"})
    page = http.get("/accounts/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert page.status_code == 200 and token, page.text[:2000]
    done = http.post(
        "/accounts/login/", data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token.group(1)}
    )
    assert done.status_code == 302, done.text[:2000]
    http.headers["X-CSRFToken"] = http.cookies["csrftoken"]
    return http


def sse_sequences(response: httpx.Response, count: int) -> list[int]:
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


class Writers:
    """Clients appending one event a request (each with its idempotency key) to their own runs
    through nginx, a fresh connection each time. A request with no answer, or nginx's 502/503/504
    (the process that had it died), is indeterminate: sent again with the same key until it is
    answered (a history as in reliability/crash.py)."""

    def __init__(self, deployment: Deployment, key: str, runs: list[str], at_least: int) -> None:
        self.deployment, self.key, self.runs, self.at_least = deployment, key, runs, at_least
        self.acknowledged: dict[str, list[str]] = {run: [] for run in runs}
        self.retried = 0
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._write, args=(run,)) for run in runs]

    def __enter__(self) -> Writers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=DEADLINE_S * 2)
        assert not any(t.is_alive() for t in self.threads), "a writer did not finish"

    def _write(self, run: str) -> None:
        n = 0
        while not self.stopping.is_set() or n < self.at_least:
            name = f"{run}-{n}"
            body = {"events": [{"type": "StepScheduled", "payload": {"stepPath": name}, "idempotencyKey": name}]}
            deadline = time.monotonic() + DEADLINE_S
            while True:
                if time.monotonic() > deadline:
                    self.errors.append(f"{name}: never answered")
                    return
                try:
                    with self.deployment.client(headers={"Authorization": f"Bearer {self.key}"}) as http:
                        answer = http.post(f"/api/v1/runs/{run}/events", json=body)
                except httpx.TransportError:
                    self.retried += 1
                    time.sleep(0.05)
                    continue
                if answer.status_code in (502, 503, 504):
                    self.retried += 1
                    time.sleep(0.05)
                    continue
                if answer.status_code != 200:
                    self.errors.append(f"{name}: {answer.status_code} {answer.text[:300]}")
                    return
                self.acknowledged[run].append(name)
                break
            n += 1

    def total(self) -> int:
        return sum(len(names) for names in self.acknowledged.values())


def history_holds(workspace: Workspace, writers: Writers) -> None:
    """Every acknowledged append in the log exactly once, in the order acknowledged; nothing in the
    log that no client sent; every run dense."""
    for run_id, names in writers.acknowledged.items():
        run = Run.objects.get(workspace=workspace, run_id=run_id)
        rows = list(Event.objects.filter(run=run).order_by("sequence").values_list("sequence", "type", "payload"))
        assert [s for s, _, _ in rows] == list(range(1, len(rows) + 1)) and run.last_sequence == len(rows)
        steps = [json.loads(p)["stepPath"] for _, t, p in rows if t == "StepScheduled"]
        assert steps == names, (run_id, steps[-5:], names[-5:])


def _start_runs(deployment: Deployment, key: str, runs: list[str]) -> None:
    with deployment.client(headers={"Authorization": f"Bearer {key}"}) as http:
        for run in runs:
            body = {"events": [{"type": "RunStarted", "payload": {"workflowVersionId": "wfver_deploy"}}]}
            assert http.post(f"/api/v1/runs/{run}/events", json=body).status_code == 200


# --- the proxy itself --------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_tls_the_forwarded_scheme_and_the_static_files_cache(deployment: Deployment) -> None:
    redirect = httpx.get(f"{deployment.plain_url}/accounts/login/?next=/", timeout=30)
    assert redirect.status_code == 301 and redirect.headers["location"] == f"{deployment.url}/accounts/login/?next=/"
    with deployment.client() as http:
        page = http.get("/accounts/login/")
        # X-Forwarded-Proto reached Django: no redirect to HTTPS (SECURE_SSL_REDIRECT is on), HSTS
        # and secure cookies.
        assert page.status_code == 200
        assert page.headers["strict-transport-security"].startswith("max-age=31536000")
        assert "secure" in page.headers["set-cookie"].lower()
        hashed = re.search(r'href="(/static/css/console\.[0-9a-f]{12}\.css)"', page.text)
        assert hashed, page.text[:2000]
        first, second = http.get(hashed.group(1)), http.get(hashed.group(1))
    assert first.status_code == second.status_code == 200 and first.content == second.content
    assert "immutable" in second.headers["cache-control"]
    assert second.headers["x-cache-status"] == "HIT"


@pytest.mark.django_db(transaction=True)
def test_a_body_over_the_limit_is_refused_with_the_apis_envelope(deployment: Deployment, workspace: Workspace) -> None:
    _, key = create_key(workspace=workspace, scopes=["ingest"])
    body = b'{"events": [{"type": "RunStarted", "payload": {"pad": "' + b"x" * (10 * 1024 * 1024) + b'"}}]}'
    with deployment.client(headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"}) as http:
        answer = http.post("/api/v1/runs/run_big/events", content=body)
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "payload_too_large"
    assert not Run.objects.filter(run_id="run_big").exists()


# --- the application through it ----------------------------------------------------------------------


@pytest.fixture
def drill(workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A finished run of the test drill workflow (model and tool calls), recorded in-process."""
    from tests.runtime_workflows import INVOCATIONS_ENV, reset_registrations

    monkeypatch.delenv(INVOCATIONS_ENV, raising=False)
    monkeypatch.setenv("RUNLEDGER_WORKFLOW_MODULES", "tests.runtime_workflows")
    reset_registrations()
    outcome = start_run(
        workspace=workspace, workflow="drill", input={"cities": ["Oslo", "Lisbon"], "to": "ops"}, run_id="run_drill"
    )
    assert outcome.status == "completed"
    yield outcome.run_id
    reset_registrations()


@pytest.mark.django_db(transaction=True)
def test_logins_live_views_appends_and_a_reexecution_through_nginx(
    deployment: Deployment,
    workspace: Workspace,
    other_workspace: Workspace,
    approver: User,
    admin: User,
    drill: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.utils import timezone

    monkeypatch.setattr("ledger.clock.now", timezone.now)  # the servers read the real clock
    # Made by an admin, who owns it: an unowned key's requests only an admin may approve.
    _, key = create_key(workspace=workspace, scopes=["ingest", "read", "execute"], by=admin)
    bob = log_in(deployment, "bob")
    runs = [f"run_nginx_{n}" for n in range(4)]
    _start_runs(deployment, key, runs)

    # A console WebSocket (wss, bob's session) and an SSE stream of the first run, open while four
    # clients append ten events each to their runs.
    socket = websocket.create_connection(
        deployment.url.replace("https://", "wss://") + f"/ws/runs/{runs[0]}/?after=0",
        header=[f"Cookie: sessionid={bob.cookies['sessionid']}"],
        origin=deployment.url,
        sslopt={"ca_certs": str(deployment.certificate)},
        timeout=DEADLINE_S,
    )
    try:
        with deployment.client(headers={"Authorization": f"Bearer {key}"}) as http:
            with http.stream("GET", f"/api/v1/runs/{runs[0]}/stream?after=0", timeout=DEADLINE_S) as stream:
                with Writers(deployment, key, runs, at_least=10) as writers:
                    pass
                assert not writers.errors, writers.errors
                assert sse_sequences(stream, 11) == list(range(1, 12))
        frames = [json.loads(socket.recv()) for _ in range(11)]
        assert [(f["type"], f["sequence"]) for f in frames] == [("event", n) for n in range(1, 12)]
    finally:
        socket.close()
    history_holds(workspace, writers)

    # Another tenant's key: 404 through the proxy as without it.
    _, other = create_key(workspace=other_workspace, scopes=["read"])
    with deployment.client(headers={"Authorization": f"Bearer {other}"}) as http:
        assert http.get(f"/api/v1/runs/{runs[0]}/stream").status_code == 404

    # A re-execution asked for by a key, approved by bob's session, executed by the worker.
    with deployment.client(headers={"Authorization": f"Bearer {key}"}) as http:
        made = http.post(f"/api/v1/runs/{drill}/reexecutions", json={"mode": "rerun", "reason": "behind nginx"})
        assert made.status_code == 201, made.text
        request_id = made.json()["id"]
        approved = bob.post(f"/api/v1/reexecutions/{request_id}/approve", json={"note": "ok"})
        assert approved.status_code == 200, approved.text
        deadline = time.monotonic() + DEADLINE_S
        while True:
            state = http.get(f"/api/v1/reexecutions/{request_id}").json()
            if state["status"] in ("succeeded", "failed") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert state["status"] == "succeeded", (state, deployment.tail())
    new, original = Run.objects.get(run_id=state["newRunId"]), Run.objects.get(run_id=drill)
    assert new.status == "completed" and new.output == original.output

    # A share link made through the proxy names the address the client used, its port included
    # (nginx passes the Host as asked), and opens there with no login; so do the API docs page and
    # the run's evidence zip.
    link = bob.post(f"/api/v1/runs/{drill}/share-links", json={"expiresInHours": 1, "includeSubRuns": False})
    assert link.status_code == 201, link.text
    assert link.json()["url"].startswith(f"{deployment.url}/s/"), link.json()
    with deployment.client() as anonymous:
        assert anonymous.get(link.json()["url"]).status_code == 200
        assert anonymous.get("/api/docs/").status_code == 200
    with deployment.client(headers={"Authorization": f"Bearer {key}"}) as http:
        bundle = http.get(f"/api/v1/runs/{drill}/evidence.zip")
    assert bundle.status_code == 200 and bundle.content[:2] == b"PK", bundle.text[:300]
    bob.close()


@pytest.mark.django_db(transaction=True)
def test_a_daphne_killed_mid_traffic_loses_nothing_and_is_started_again(
    deployment: Deployment, workspace: Workspace
) -> None:
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    runs = [f"run_kill_{n}" for n in range(4)]
    _start_runs(deployment, key, runs)
    group = deployment.groups[0]
    with Writers(deployment, key, runs, at_least=15) as writers:
        deadline = time.monotonic() + DEADLINE_S
        while writers.total() < 20 and not writers.errors and time.monotonic() < deadline:
            time.sleep(0.05)
        victims = group.daphnes()
        assert len(victims) == 2
        os.kill(victims[0], signal.SIGKILL)
        deadline = time.monotonic() + DEADLINE_S
        while f"(pid {victims[0]}) killed by SIGKILL" not in group.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        mark = writers.total()
        while writers.total() < mark + 20 and not writers.errors and time.monotonic() < deadline:
            time.sleep(0.05)
    assert not writers.errors, writers.errors
    history_holds(workspace, writers)

    deadline = time.monotonic() + DEADLINE_S
    while "started again" not in group.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    log = group.log.read_text()
    restarted = re.search(r"daphne \d started again \(pid (\d+), restart 1\)", log)
    assert f"(pid {victims[0]}) killed by SIGKILL" in log and restarted, log[-3000:]
    assert int(restarted.group(1)) in group.daphnes() and len(group.daphnes()) == 2


@pytest.mark.django_db(transaction=True)
def test_a_rolling_restart_of_one_web_host_loses_nothing_and_serves_the_new_static_files(
    deployment: Deployment, workspace: Workspace
) -> None:
    """deploy/README.md's order of a deploy on one web host while clients append: the new release's
    static files collected (a new hashed name in STATIC_ROOT), then `systemctl restart runledger-web`
    (SIGTERM to bin/serve, started again). The old group's processes are gone, the requests it was
    serving are sent again and nothing is lost, and while only the restarted host knows the new
    file (WhiteNoise lists STATIC_ROOT when it starts), nginx answers it on every request: the
    other host's 404 is tried on the next."""
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    runs = [f"run_roll_{n}" for n in range(4)]
    _start_runs(deployment, key, runs)
    release = "/static/css/release.0123456789ab.css"
    (Path(deployment.env["RUNLEDGER_STATIC_ROOT"]) / release.removeprefix("/static/")).write_text("/* next */\n")
    group = deployment.groups[0]
    with Writers(deployment, key, runs, at_least=15) as writers:
        deadline = time.monotonic() + DEADLINE_S
        while writers.total() < 20 and not writers.errors and time.monotonic() < deadline:
            time.sleep(0.05)
        old = group.daphnes()
        group.process.send_signal(signal.SIGTERM)
        assert group.process.wait(timeout=DEADLINE_S) == 0, group.log.read_text()[-3000:]
        assert not [pid for pid in old if Path(f"/proc/{pid}").exists()], old
        deployment.groups[0] = group = deployment.start_group(group.port, group.log)
        direct = {"Host": "127.0.0.1", "X-Forwarded-Proto": "https"}
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{group.port}/accounts/login/", headers=direct).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        mark = writers.total()
        while writers.total() < mark + 20 and not writers.errors and time.monotonic() < deadline:
            time.sleep(0.05)
    assert not writers.errors, writers.errors
    history_holds(workspace, writers)
    assert len(group.daphnes()) == 2
    with deployment.client() as http:  # each try a new key of nginx's cache, so each reaches a host
        answers = [http.get(f"{release}?try={n}").status_code for n in range(4)]
    assert answers == [200] * 4, answers


def test_the_environment_file_is_operations_production_environment() -> None:
    """deploy/runledger.env holds § Production's block of docs/operations.md, value for value
    (bin/check-deploy checks that block with `check --deploy`), and four settings of this layout."""
    operations = (REPO_ROOT / "docs" / "operations.md").read_text()
    block = operations.split("## Production", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    documented = {}
    for line in block.splitlines():
        found = re.match(r"export (\w+)=(.*?)(\s+#.*)?$", line.strip())
        if found:
            documented[found.group(1)] = found.group(2).strip("'\"")
    env = environment_file()
    assert documented and {k: v for k, v in env.items() if k in documented and k != "SECRET_KEY"} == {
        k: v for k, v in documented.items() if k != "SECRET_KEY"
    }
    assert set(env) - set(documented) == {
        "RUNLEDGER_TRUSTED_PROXIES",
        "RUNLEDGER_STATIC_ROOT",
        "RUNLEDGER_ARTIFACTS_ROOT",
        "RUNLEDGER_PROCESSES",
    }
