"""A client that never hurts the agent (client/runledger/client/outbox.py), against a live Daphne
through a proxy that can go away: a minute-long outage in the middle of a run, which the agent
rides out and finishes, every event stored once; a process that exits without flushing, which
loses nothing; one that exits while the server is away, whose events wait on disk and are sent
later; and a harness restarted from the top after a crash, whose recorded model answer is replayed
from the log (the model now answers otherwise) so the run continues instead of conflicting."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from ledger.models import Run as RunRow
from ledger.models import Workspace
from ledger.tenancy.services import create_key
from runledger.client import Client, RetryPolicy, Undelivered, current_run, observe
from tests.client_support import FaultyProxy, logged
from tests.fake_providers import FakeProviders
from tests.servers import REPO_ROOT, Daphne

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = str(Path(__file__).with_name("client_agent.py"))


@pytest.fixture
def key(workspace: Workspace) -> str:
    return create_key(workspace=workspace, scopes=["ingest", "read"])[1]


@pytest.fixture
def proxy(server: Daphne) -> Iterator[FaultyProxy]:
    p = FaultyProxy(int(server.url.rsplit(":", 1)[1]))
    yield p
    p.close()


def verify(run_id: str) -> None:
    call_command("ledger", "verify", run_id, "--workspace", "acme/support", stdout=io.StringIO())  # exits 1 on failure


def wait_for(condition: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def agent_process(url: str, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RUNLEDGER_URL": url, "RUNLEDGER_KEY": key, "PYTHONPATH": str(REPO_ROOT / "client")}
    return subprocess.run(
        [sys.executable, AGENT, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180
    )


@pytest.mark.parametrize(
    "outage_s",
    [
        # The client's side of a long outage cannot differ by the server's database: CI runs it
        # in the SQLite pass; storing every event once, on both, is the five seconds' subject too.
        pytest.param(60, marks=pytest.mark.backend_independent, id="a minute"),
        pytest.param(5, id="five seconds"),
    ],
)
def test_an_outage_mid_run_is_ridden_out_and_every_event_is_stored_once(
    proxy: FaultyProxy, key: str, workspace: Workspace, outage_s: int
) -> None:
    midway, emitted_while_down, back = threading.Event(), threading.Event(), threading.Event()
    failures: list[BaseException] = []
    undelivered: list[Undelivered] = []

    @observe
    def research(topic: str) -> dict[str, Any]:
        run = current_run()
        assert run is not None
        with run.session(role="researcher") as session:
            for turn in range(3):
                with session.model_call(
                    {"messages": [{"role": "user", "content": f"{topic} #{turn}"}]},
                    provider="openai",
                    model_id="gpt-4o",
                ) as call:
                    call.respond(f"note {turn}", usage={"inputTokens": 10, "outputTokens": 2})
            if midway.is_set():
                emitted_while_down.set()  # all of the above was recorded with the server unreachable
                back.wait()
            with session.tool_call("archive", {"topic": topic}, effect="write") as tool:
                tool.result = {"archived": topic}  # during the outage: the gateway call waits for the server
        return {"topic": topic}

    def agent() -> None:
        try:
            with Client(proxy.url, key, on_undelivered=undelivered.append) as client:  # the default retry policy
                with client.start_run("wfver_outage", run_id="run_outage") as run:
                    research("before")
                    client.flush()
                    midway.set()
                    research("during")
                    research("after")
                    run.output = {"done": True}
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            failures.append(exc)

    thread = threading.Thread(target=agent)
    thread.start()
    wait_for(midway.is_set, "the agent's first step")
    proxy.stop()
    down_at = time.monotonic()
    wait_for(emitted_while_down.is_set, "the agent to record a step while the server is away")
    back.set()  # the agent goes on, to a tool call that needs the server
    time.sleep(max(0.0, outage_s - (time.monotonic() - down_at)))
    assert thread.is_alive(), "the agent cannot have finished: its tool call needs the server"
    proxy.start()
    thread.join(timeout=600)

    assert not thread.is_alive() and failures == [] and undelivered == []
    events = logged(workspace, "run_outage")
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    assert len({e["eventId"] for e in events}) == len(events)
    steps = [e["payload"]["stepPath"] for e in events if e["type"] == "StepScheduled"]
    assert steps == ["research", "research.visit[1]", "research.visit[2]"]
    assert [e["type"] for e in events].count("harness.model.responded") == 9
    assert [e["type"] for e in events].count("harness.tool_call.succeeded") == 3
    assert events[-1]["type"] == "RunCompleted" and events[-1]["payload"] == {"output": {"done": True}}
    verify("run_outage")


def test_exit_without_flush_loses_nothing(server: Daphne, key: str, workspace: Workspace) -> None:
    done = agent_process(server.url, key, "exit-without-flush", "run_exit")
    assert done.returncode == 0 and done.stdout.strip() == "emitted", done.stderr
    assert [e["type"] for e in logged(workspace, "run_exit")] == ["RunStarted"] + ["StepScheduled"] * 3


def test_events_of_a_process_that_exits_while_the_server_is_away_are_spooled_and_sent_later(
    proxy: FaultyProxy, key: str, workspace: Workspace, tmp_path: Path
) -> None:
    proxy.stop()
    done = agent_process(proxy.url, key, "exit-while-down", "run_spooled", str(tmp_path / "spool"))
    assert done.returncode == 0, done.stderr
    reported = [line.split() for line in done.stdout.splitlines() if line.startswith("undelivered")]
    assert [(r[1], int(r[2])) for r in reported] == [("run_spooled", 4)], done.stderr  # RunStarted, three steps
    assert "not delivered" in done.stderr  # the log line
    assert not RunRow.objects.filter(run_id="run_spooled").exists()

    proxy.start()
    with Client(proxy.url, key, spool_dir=tmp_path / "spool", retry=RetryPolicy(deadline_s=30)) as client:
        assert client.deliver_spooled() == 4
        assert client.deliver_spooled() == 0  # sent once, then gone from the spool
    assert [e["type"] for e in logged(workspace, "run_spooled")] == ["RunStarted"] + ["StepScheduled"] * 3


def test_a_harness_restarted_from_the_top_continues_its_run(server: Daphne, key: str, workspace: Workspace) -> None:
    provider = FakeProviders(answer="sunny", say_while_asking=True).start()
    try:
        crashed = agent_process(server.url, key, "weather", "run_restart", provider.url, "crash")
        assert crashed.returncode == 3, crashed.stderr
        assert len(provider.requests) == 1
        provider.answer = "cloudy"  # a non-deterministic model: asked again, it would say otherwise
        restarted = agent_process(server.url, key, "weather", "run_restart", provider.url)
        assert restarted.returncode == 0, restarted.stderr
    finally:
        provider.stop()

    said = json.loads(restarted.stdout.strip().splitlines()[-1])
    assert said == {"first": "Looking it up (sunny)", "final": "cloudy"}  # the first answer from the log
    assert len(provider.requests) == 2  # the restart asked the model only what the log did not answer
    events = logged(workspace, "run_restart")
    types = [e["type"] for e in events]
    assert types.count("harness.model.called") == types.count("harness.model.responded") == 2
    assert types.count("harness.tool_call.started") == 1 and types[-1] == "RunCompleted"
    answers = [e["payload"]["response"]["text"] for e in events if e["type"] == "harness.model.responded"]
    assert answers == ["Looking it up (sunny)", "cloudy"]
    assert RunRow.objects.get(run_id="run_restart").status == "completed"
    assert "IdempotencyConflict" not in restarted.stderr and "not delivered" not in restarted.stderr
    verify("run_restart")


def test_a_tool_call_the_crashed_harness_held_is_claimed_again_once_its_lease_ends(
    server: Daphne, key: str, workspace: Workspace
) -> None:
    """The harness died holding a tool call's lease, before the call's request left: restarted at
    once, it waits for the lease to end (60 s at least) and runs the call, attempt 2, instead of
    failing the run on tool_call_in_progress."""
    with Client(server.url, key) as crashed:
        run = crashed.start_run("wfver_lease", run_id="run_lease")
        held = run.tool_call("lookup", {"q": "x"}, effect="read")
        held.claim()  # and the process died: no outbound, no completion
    assert held.lease_token is not None

    with Client(server.url, key) as restarted:
        with restarted.start_run("wfver_lease", run_id="run_lease") as run:
            assert run.restarted
            with run.tool_call("lookup", {"q": "x"}, effect="read") as call:
                assert not call.replayed
                call.result = {"found": True}
    assert call.status == "succeeded" and call.attempt == 2

    events = logged(workspace, "run_lease")
    assert [e["type"] for e in events][-2:] == ["harness.tool_call.succeeded", "RunCompleted"]
    verify("run_lease")
