"""The crash test: no acknowledged event lost, none duplicated, none invented, while the servers
and the database die under load.

    python reliability/crash.py            # the full run: >= 100 Daphne kills, >= 10 PostgreSQL crashes
    python reliability/crash.py --short    # what .ci/run runs: a few minutes

Everything is private and on 127.0.0.1: a PostgreSQL cluster of its own (initdb in a temporary
directory, its own port; `synchronous_commit=on`, `fsync=on`), two Daphne processes on one Redis
database (the channel layer), client processes, and workflow executors. Nothing outside is touched;
everything it starts it stops, and it stops by itself (bounded in time and in count).

- Clients append batches (1-12 events, each with an idempotency key derived from run, batch and
  index) to their own runs through a random Daphne, one batch after the other per run. Every
  request goes in a history as acknowledged (200), failed (a 4xx: the server refused it, nothing
  written) or indeterminate (no answer, a 5xx, a dropped connection: it may or may not have been
  written, as in Jepsen's histories). An indeterminate batch is sent again with the same keys
  until it is acknowledged; only then does the client go on with that run.
- The controller SIGKILLs a random Daphne at random moments and starts it again, and now and then
  stops PostgreSQL with `pg_ctl stop -m immediate` (a crash: no checkpoint, recovery from the WAL on
  start) and starts it again.
- Workflow executions (the runtime's drill workflow of tests/runtime_workflows.py: model calls,
  tool calls, five steps) run in `manage.py ledger run` processes that die at a random commit (the
  runtime's kill switches, before or after the write) or with the database; a second executor
  resumes each (`ledger resume --take-over`) until it completes.

Then, with everything up and still: every acknowledged event is in the log exactly once, every run
is dense 1..N, no event is there that no client sent, `ledger verify` passes (ids, density,
projections equal to the fold, the daily usage), every execution completed with the output a clean
run gives, no call answered in the log twice, and no call made more often than its executor died.
It prints the counts; exit 0 only when lost = duplicated = invented = 0 and every check holds.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
DAPHNE = str(Path(sys.executable).parent / "daphne")
WORKSPACE = "crash/main"
DRILL_INPUT = {"cities": ["Oslo", "Lisbon"], "to": "ops"}
DRILL_OUTPUT = {"summary": "Lisbon wins.", "notified": "msg-ops"}
DRILL_EVENTS = 37  # the drill's log, end to end (tests/test_runtime_kill.py)
CALLS_IN_FLIGHT = 2  # the most calls one drill executor has made and not yet committed (one model turn's two tools)
MODEL = {"provider": "openai", "modelId": "gpt-4o-mini"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# --- the private PostgreSQL --------------------------------------------------------------------


class Cluster:
    """A PostgreSQL cluster of our own: initdb'd in `root`, on `port`, crashed and restarted at will."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port = root, port
        self.data, self.log = root / "pgdata", root / "postgres.log"
        self.bin = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]
        # initdb and postgres refuse to run as root: the cluster is the postgres user's.
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*self.as_user, *args], capture_output=True, text=True, timeout=120)
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}")
        return done

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.as_user:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()
        self._run(str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "crash")

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=on "
            "-c synchronous_commit=on -c full_page_writes=on -c max_connections=200"
        )
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            "120",
            "-o",
            options,
            "start",
        )

    def crash(self) -> None:
        """No checkpoint, no clean shutdown: the next start recovers from the WAL."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/crash"


# --- servers and commands ----------------------------------------------------------------------


def environment(cluster: Cluster, redis_url: str, var: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "DATABASE_URL": cluster.url,
        "REDIS_URL": redis_url,
        "DEBUG": "1",
        "DJANGO_SETTINGS_MODULE": "console.settings",
        "RUNLEDGER_VAR_DIR": str(var),
        "PYTHONPATH": str(REPO),
    }
    for name in (
        "RUNLEDGER_KILL_AFTER_SEQUENCE",
        "RUNLEDGER_KILL_BEFORE_SEQUENCE",
        "RUNLEDGER_KILL_RUN_ID",
        "RUNLEDGER_TEST_INVOCATIONS",
        "DJANGO_ALLOW_ASYNC_UNSAFE",
    ):
        env.pop(name, None)
    return env


def manage(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


@dataclass
class Server:
    port: int
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [DAPHNE, "-b", "127.0.0.1", "-p", str(self.port), "console.asgi:application"],
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.process.poll() is not None:  # the port was not free yet: try again
                time.sleep(0.2)
                with self.log.open("ab") as out:
                    self.process = subprocess.Popen(
                        [DAPHNE, "-b", "127.0.0.1", "-p", str(self.port), "console.asgi:application"],
                        cwd=REPO,
                        env=self.env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                continue
            try:
                if httpx.get(f"{self.url}/api/v1/runs", timeout=2).status_code == 401:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"Daphne on {self.port} did not start; see {self.log}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


# --- clients -------------------------------------------------------------------------------------


def batch_events(run_id: str, batch: int, size: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    if batch == 0:
        events.append({"type": "RunStarted", "payload": {"workflowVersionId": "wfver_crash", "input": {"run": run_id}}})
    while len(events) < size:
        i = len(events)
        kind = (batch + i) % 3
        if kind == 0:
            events.append({"type": "StepScheduled", "payload": {"stepPath": f"b{batch}.e{i}"}})
        elif kind == 1:
            events.append(
                {
                    "type": "harness.model.responded",
                    "payload": {
                        "turn": 1,
                        "callId": f"b{batch}-m{i}",
                        "stepPath": f"b{batch}",
                        "model": MODEL,
                        "response": {"text": "ok", "usage": {"inputTokens": 100 + i, "outputTokens": 10 + batch % 7}},
                    },
                }
            )
        else:
            events.append({"type": "custom.crash.note", "payload": {"batch": batch, "index": i}})
    for i, event in enumerate(events):
        event["idempotencyKey"] = f"{run_id}/{batch}/{i}"
    return events


def client(index: int, urls: list[str], key: str, runs: list[str], history: Path, stop: Path, drain_s: float) -> None:
    """Append batches to `runs` until `stop` exists; then only finish the batch in hand (its
    retries, for at most `drain_s`), so that nothing stays indeterminate that could be settled."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the controller's handler is not ours
    rng = random.Random(index)
    next_batch = {run: 0 for run in runs}
    headers = {"Authorization": f"Bearer {key}"}
    with history.open("a") as out, httpx.Client(headers=headers, timeout=15) as http:
        while not stop.exists():
            run = rng.choice(runs)
            batch = next_batch[run]
            events = batch_events(run, batch, rng.randint(1, 12))
            keys = [e["idempotencyKey"] for e in events]
            attempt = 0
            drain_until: float | None = None
            while True:
                attempt += 1
                record: dict[str, Any] = {"run": run, "batch": batch, "keys": keys, "attempt": attempt}
                try:
                    response = http.post(f"{rng.choice(urls)}/api/v1/runs/{run}/events", json={"events": events})
                except httpx.HTTPError as exc:
                    record |= {"outcome": "indeterminate", "error": type(exc).__name__}
                else:
                    record["status"] = response.status_code
                    if response.status_code == 200:
                        body = response.json()
                        # the envelopes come back in the order the events were sent
                        record |= {
                            "outcome": "acknowledged",
                            "ids": dict(zip(keys, ([e["eventId"], e["sequence"]] for e in body["events"]))),
                        }
                    elif response.status_code >= 500:
                        record |= {"outcome": "indeterminate", "error": response.text[:200]}
                    else:
                        record |= {"outcome": "failed", "error": response.text[:300]}
                out.write(json.dumps(record) + "\n")
                out.flush()
                if record["outcome"] == "acknowledged":
                    next_batch[run] = batch + 1
                    break
                if record["outcome"] == "failed":
                    break  # a refusal is final; the run goes on with the next batch number
                if stop.exists():
                    drain_until = drain_until or time.monotonic() + drain_s
                    if time.monotonic() > drain_until:
                        break
                time.sleep(0.05 + rng.random() * 0.2)


# --- workflow executions -------------------------------------------------------------------------


@dataclass
class Execution:
    run_id: str
    invocations: Path
    process: subprocess.Popen[str] | None = None
    deaths: int = 0
    attempts: int = 0
    done: bool = False

    def launch(self, env: dict[str, str], rng: random.Random, arm: bool) -> None:
        child_env = {**env, "RUNLEDGER_TEST_INVOCATIONS": str(self.invocations), "RUNLEDGER_KILL_RUN_ID": self.run_id}
        if arm:  # die at a random commit: after it, or before it with its work done (in flight)
            child_env["RUNLEDGER_KILL_AFTER_SEQUENCE" if rng.random() < 0.5 else "RUNLEDGER_KILL_BEFORE_SEQUENCE"] = (
                str(rng.randint(2, DRILL_EVENTS - 1))
            )
        if not self.started(env["DATABASE_URL"]):  # the first try died before its RunStarted committed
            args = [
                "ledger",
                "run",
                "drill",
                "--module",
                "tests.runtime_workflows",
                "--workspace",
                WORKSPACE,
                "--run-id",
                self.run_id,
                "--input",
                json.dumps(DRILL_INPUT),
            ]
        else:
            args = [
                "ledger",
                "resume",
                self.run_id,
                "--take-over",
                "--module",
                "tests.runtime_workflows",
                "--workspace",
                WORKSPACE,
            ]
        self.attempts += 1
        with self.invocations.with_suffix(".log").open("a") as log:
            log.write(f"--- attempt {self.attempts}: {' '.join(args)}\n")
            log.flush()
            self.process = subprocess.Popen(
                [PYTHON, "manage.py", *args], cwd=REPO, env=child_env, text=True, stdout=log, stderr=subprocess.STDOUT
            )

    def started(self, url: str) -> bool:
        with psycopg.connect(url.replace("postgres://", "postgresql://"), connect_timeout=10) as conn:
            return conn.execute("SELECT 1 FROM ledger_run WHERE run_id = %s", (self.run_id,)).fetchone() is not None

    def poll(self) -> bool:
        """True when the process in hand has ended (and says how)."""
        if self.process is None or self.process.poll() is None:
            return False
        if self.process.returncode == 0:
            self.done = True
        else:
            self.deaths += 1
        self.process = None
        return True


# --- the run ------------------------------------------------------------------------------------


@dataclass
class Counts:
    daphne_kills: int = 0
    daphne_restarts: int = 0
    postgres_crashes: int = 0
    executor_deaths: int = 0
    facts: dict[str, Any] = field(default_factory=dict)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short", action="store_true", help="the CI form: 12 Daphne kills, 3 PostgreSQL crashes")
    parser.add_argument("--daphne-kills", type=int)
    parser.add_argument("--postgres-crashes", type=int)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--runs-per-client", type=int, default=6)
    parser.add_argument("--executions", type=int)
    parser.add_argument("--max-minutes", type=float)
    parser.add_argument("--redis-url", default=os.environ.get("CRASH_REDIS_URL", "redis://127.0.0.1:6379/13"))
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, histories)")
    args = parser.parse_args()
    # Stopped from outside (SIGTERM, Ctrl-C), it still stops everything it started (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    kills = args.daphne_kills or (12 if args.short else 100)
    crashes = args.postgres_crashes or (3 if args.short else 10)
    executions = args.executions or (4 if args.short else 16)
    max_s = 60 * (args.max_minutes or (8 if args.short else 45))
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="runledger-crash-"))
    root.chmod(0o755)  # the cluster's own directory below it belongs to the postgres user
    say(
        f"seed {args.seed}; scratch {root}; targets: {kills} Daphne kills, {crashes} PostgreSQL crashes, "
        f"{args.clients} clients x {args.runs_per_client} runs, {executions} workflow executions"
    )
    cluster = Cluster(root / "pg", free_port())
    servers: list[Server] = []
    clients: list[multiprocessing.Process] = []
    execs: list[Execution] = []
    counts = Counts()
    try:
        cluster.init()
        env = environment(cluster, args.redis_url, root / "var")
        for step in (
            ["migrate", "--noinput", "-v", "0"],
            ["ledger", "bootstrap", "--tenant", "crash", "--workspace", "main"],
        ):
            done = manage(env, *step)
            if done.returncode:
                raise RuntimeError(done.stdout + done.stderr)
        made = manage(env, "ledger", "create-key", "--workspace", WORKSPACE, "--scopes", "ingest,read")
        key = made.stdout.strip().splitlines()[-1]
        servers = [Server(free_port(), env, root / f"daphne-{n}.log") for n in range(2)]
        for server in servers:
            server.start()
        stop = root / "stop"
        for n in range(args.clients):
            runs = [f"run_crash_c{n}_r{r}" for r in range(args.runs_per_client)]
            process = multiprocessing.Process(
                target=client, args=(n, [s.url for s in servers], key, runs, root / f"history-{n}.jsonl", stop, 120.0)
            )
            process.start()
            clients.append(process)
        execs = [Execution(f"run_crash_exec_{n}", root / f"invocations-{n}.jsonl") for n in range(executions)]
        started = time.monotonic()
        say("load running; faults begin")
        while counts.daphne_kills < kills or counts.postgres_crashes < crashes or not all(e.done for e in execs):
            if time.monotonic() - started > max_s:
                raise RuntimeError(f"not done within {max_s / 60:.0f} minutes: {counts}")
            for execution in execs:  # keep two executions going, armed to die until the faults are done
                execution.poll()
            running = [e for e in execs if e.process is not None]
            for execution in [e for e in execs if not e.done and e.process is None][: max(0, 2 - len(running))]:
                faults_left = counts.daphne_kills < kills or counts.postgres_crashes < crashes
                try:
                    execution.launch(env, rng, arm=faults_left and rng.random() < 0.8)
                except psycopg.OperationalError:
                    pass  # the database is starting again: next round
            time.sleep(0.3 + rng.random() * 1.2)
            if counts.daphne_kills >= kills and counts.postgres_crashes >= crashes:
                continue  # only the executions left to finish
            if counts.postgres_crashes < crashes and rng.random() < crashes / (kills + crashes) * 1.5:
                cluster.crash()
                counts.postgres_crashes += 1
                time.sleep(0.5 + rng.random() * 2)
                cluster.start()
                say(f"PostgreSQL crash {counts.postgres_crashes}/{crashes}: stopped -m immediate, started again")
            elif counts.daphne_kills < kills:
                victim = rng.choice(servers)
                victim.kill()
                counts.daphne_kills += 1
                victim.start()
                counts.daphne_restarts += 1
                if counts.daphne_kills % 10 == 0:
                    say(f"Daphne kills {counts.daphne_kills}/{kills}")
        say("faults done; clients finish the batches in hand")
        stop.touch()
        for process in clients:
            process.join(timeout=300)
            if process.exitcode is None:
                process.kill()
                raise RuntimeError("a client did not stop")
        counts.executor_deaths = sum(e.deaths for e in execs)
        return check(env, cluster, root, args.clients, execs, counts)
    finally:
        for process in clients:
            if process.is_alive():
                process.kill()
        for execution in execs:
            if execution.process is not None and execution.process.poll() is None:
                execution.process.kill()
        for server in servers:
            server.stop()
        cluster.stop()
        if args.keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def check(
    env: dict[str, str], cluster: Cluster, root: Path, clients: int, execs: list[Execution], counts: Counts
) -> int:
    sent: set[str] = set()
    acknowledged: dict[str, tuple[str, int]] = {}
    outcomes: Counter[str] = Counter()
    batches: dict[tuple[str, int], str] = {}
    for n in range(clients):
        for line in (root / f"history-{n}.jsonl").read_text().splitlines():
            record = json.loads(line)
            outcomes[record["outcome"]] += 1
            sent.update(record["keys"])
            batch = (record["run"], record["batch"])
            if record["outcome"] == "acknowledged":
                batches[batch] = "acknowledged"
                for k, (event_id, sequence) in record["ids"].items():
                    acknowledged[k] = (event_id, sequence)
            else:
                batches.setdefault(batch, record["outcome"])
    with psycopg.connect(cluster.url.replace("postgres://", "postgresql://")) as conn:
        rows = conn.execute(
            "SELECT r.run_id, e.sequence, e.event_id, e.idempotency_key FROM ledger_event e "
            "JOIN ledger_run r ON r.id = e.run_id"
        ).fetchall()
        runs = conn.execute("SELECT run_id, last_sequence, status, output FROM ledger_run").fetchall()
    in_log: Counter[str] = Counter(k for _, _, _, k in rows if k is not None)
    where = {k: (event_id, sequence) for _, sequence, event_id, k in rows if k is not None}
    lost = [k for k in acknowledged if k not in in_log]
    duplicated = [k for k, n in in_log.items() if n > 1]
    changed = [k for k, (event_id, sequence) in acknowledged.items() if k in where and where[k] != (event_id, sequence)]
    client_runs = {run for run, _, _, _ in rows if run.startswith("run_crash_c")}
    invented = [k for _, _, _, k in rows if k is not None and k not in sent]
    unkeyed = [(run, seq) for run, seq, _, k in rows if k is None and run in client_runs]
    per_run: dict[str, list[int]] = {}
    for run, sequence, _, _ in rows:
        per_run.setdefault(run, []).append(sequence)
    last = {run: last_sequence for run, last_sequence, _, _ in runs}
    gaps = [
        run for run, seqs in per_run.items() if sorted(seqs) != list(range(1, len(seqs) + 1)) or last[run] != len(seqs)
    ]
    verify = manage(env, "ledger", "verify", timeout=1800)
    verified = verify.returncode == 0 and verify.stdout.strip().endswith(": ok")
    # Executions: the clean output, one answer per call, no call made more often than its executor died.
    status = {run: (s, output) for run, _, s, output in runs}
    wrong_output = [e.run_id for e in execs if status.get(e.run_id) != ("completed", DRILL_OUTPUT)]
    with psycopg.connect(cluster.url.replace("postgres://", "postgresql://")) as conn:
        answer_rows = conn.execute(
            "SELECT r.run_id, e.type, e.payload FROM ledger_event e JOIN ledger_run r ON r.id = e.run_id "
            "WHERE r.run_id LIKE 'run_crash_exec_%%' AND e.type IN ('harness.model.responded', 'harness.tool_call.succeeded')"
        ).fetchall()
    answered = Counter((run, kind, json.loads(payload).get("callId")) for run, kind, payload in answer_rows)
    answered_twice = [key for key, n in answered.items() if n > 1]
    repeats_over_bound = []
    repeated_calls = 0
    for execution in execs:
        lines = execution.invocations.read_text().splitlines() if execution.invocations.exists() else []
        made = Counter(lines)
        repeated = sum(n - 1 for n in made.values())
        repeated_calls += repeated
        if repeated > execution.deaths * CALLS_IN_FLIGHT or any(n > 1 + execution.deaths for n in made.values()):
            repeats_over_bound.append((execution.run_id, execution.deaths, repeated))
    unsettled = sum(1 for outcome in batches.values() if outcome == "indeterminate")
    facts = {
        "daphne kills": counts.daphne_kills,
        "daphne restarts": counts.daphne_restarts,
        "postgresql crashes": counts.postgres_crashes,
        "requests": sum(outcomes.values()),
        "acknowledged requests": outcomes["acknowledged"],
        "indeterminate requests": outcomes["indeterminate"],
        "failed requests (4xx)": outcomes["failed"],
        "batches": len(batches),
        "batches left indeterminate": unsettled,
        "acknowledged events": len(acknowledged),
        "events in the log": len(rows),
        "runs": len(runs),
        "lost": len(lost),
        "duplicated": len(duplicated),
        "invented": len(invented) + len(unkeyed),
        "acknowledged id/sequence changed": len(changed),
        "runs not dense": len(gaps),
        "ledger verify": "ok" if verified else "FAILED",
        "workflow executions": len(execs),
        "executor deaths": counts.executor_deaths,
        "executions with a wrong outcome": len(wrong_output),
        "calls answered twice": len(answered_twice),
        "calls repeated (in flight at a death)": repeated_calls,
        "executions over the repeat bound": len(repeats_over_bound),
    }
    width = max(len(k) for k in facts)
    print("\ncrash test")
    for name, value in facts.items():
        print(f"  {name:<{width}}  {value}")
    problems = {
        "lost": lost[:5],
        "duplicated": duplicated[:5],
        "invented": (invented + unkeyed)[:5],
        "changed": changed[:5],
        "not dense": gaps[:5],
        "wrong outcome": wrong_output[:5],
        "answered twice": answered_twice[:5],
        "over the repeat bound": repeats_over_bound[:5],
        "requests refused (4xx)": ["failed"] * min(outcomes["failed"], 1),
    }
    ok = not any(problems.values()) and verified
    if not verified:
        print(verify.stdout[-3000:] + verify.stderr[-3000:])
    for name, examples in problems.items():
        if examples:
            print(f"  !! {name}: {examples}")
    print("PASS" if ok else "FAIL")
    _record(facts, ok)
    return 0 if ok else 1


def _record(facts: dict[str, Any], ok: bool) -> None:
    """The counts as rows of `make bench`'s table (bench/results.md), when it runs this."""
    sys.path.insert(0, str(REPO))
    from bench.common import record

    bad = facts["lost"] + facts["duplicated"] + facts["invented"]
    record(
        "crash: acknowledged events lost + duplicated + invented",
        value=bad,
        unit="events",
        baseline=facts["acknowledged events"],
        ratio=None,
        target="0",
        met=bad == 0 and ok,
        note=(
            f"{facts['daphne kills']} Daphne SIGKILLs, {facts['postgresql crashes']} PostgreSQL crashes, "
            f"{facts['requests']} requests ({facts['indeterminate requests']} indeterminate, retried), "
            f"verify {facts['ledger verify']}"
        ),
    )
    record(
        "crash: workflow executions killed and resumed, wrong outcome or call answered twice",
        value=facts["executions with a wrong outcome"] + facts["calls answered twice"],
        unit="executions",
        baseline=facts["workflow executions"],
        ratio=None,
        target="0",
        met=facts["executions with a wrong outcome"] + facts["calls answered twice"] == 0,
        note=f"{facts['executor deaths']} executor deaths, {facts['calls repeated (in flight at a death)']} in-flight calls repeated",
    )


if __name__ == "__main__":
    sys.exit(main())
