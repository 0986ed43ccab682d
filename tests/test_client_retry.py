"""runledger.client when the network or the server fails: 503 and 429 retried honouring
Retry-After, a 4xx never retried, the policy giving up, and a server killed (SIGKILL) and restarted
in the middle of a run's batches: nothing lost, nothing written twice. A real TCP proxy between the
client and a live Daphne misbehaves on cue (tests/client_support.py)."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command

from ledger.models import Run as RunRow
from ledger.models import Workspace
from ledger.tenancy.services import create_key
from runledger.client import Client, RetryPolicy, ServerError, Unauthenticated, UnknownEventType
from runledger.client.errors import retry_after_seconds
from tests.client_support import Fault, FaultyProxy, logged
from tests.conftest import ev, started
from tests.servers import Daphne, start_daphne

pytestmark = pytest.mark.django_db(transaction=True)

# Tries until the deadline, not a count: a restarted Daphne can take a minute on a loaded machine.
FAST = RetryPolicy(backoff_s=0.05, max_backoff_s=0.5, deadline_s=180)


@pytest.fixture
def key(workspace: Workspace) -> str:
    return create_key(workspace=workspace, scopes=["ingest", "read"])[1]


@pytest.fixture
def proxy(server: Daphne) -> Iterator[FaultyProxy]:
    p = FaultyProxy(int(server.url.rsplit(":", 1)[1]))
    yield p
    p.close()


def test_503_and_429_are_retried_after_the_time_retry_after_names(
    proxy: FaultyProxy, key: str, workspace: Workspace
) -> None:
    proxy.add(Fault("POST", status=503, retry_after="1"), Fault("POST", status=429, retry_after="1"))
    with Client(proxy.url, key, retry=RetryPolicy(attempts=5, backoff_s=0.001, max_backoff_s=0.002)) as client:
        run = client.start_run("wfver_retry", run_id="run_busy")

    posts = proxy.requests("POST")
    assert len(posts) == 3 and run.last_sequence == 1
    # the backoff alone would have waited 2 ms at most: the server's Retry-After was honoured
    assert posts[1].at - posts[0].at >= 1.0 and posts[2].at - posts[1].at >= 1.0
    assert [e["type"] for e in logged(workspace, "run_busy")] == ["RunStarted"]


def test_retry_after_is_read_as_seconds_or_an_http_date() -> None:
    assert retry_after_seconds("2") == 2.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


def test_a_4xx_is_never_retried(proxy: FaultyProxy, key: str, workspace: Workspace) -> None:
    with Client(proxy.url, key, retry=FAST) as client:
        client.append("run_4xx", [{**started(), "idempotencyKey": "s"}])
        with pytest.raises(UnknownEventType):
            client.append("run_4xx", [{**ev("NoSuchType"), "idempotencyKey": "x"}])
    with Client(proxy.url, "rl_not_a_key", retry=FAST) as stranger, pytest.raises(Unauthenticated) as refused:
        stranger.get_run("run_4xx")
    assert refused.value.status == 401 and refused.value.code == "unauthenticated"
    assert len(proxy.requests("POST")) == 2 and len(proxy.requests("GET")) == 1
    assert len(logged(workspace, "run_4xx")) == 1


def test_the_policy_gives_up_with_the_last_error(proxy: FaultyProxy, key: str, workspace: Workspace) -> None:
    proxy.add(*[Fault("POST", status=503) for _ in range(4)])
    with Client(proxy.url, key, retry=RetryPolicy(attempts=3, backoff_s=0.01)) as client:
        with pytest.raises(ServerError) as gave_up:
            client.append("run_down", [{**started(), "idempotencyKey": "s"}])
        assert gave_up.value.status == 503 and gave_up.value.code == "unavailable"
        assert len(proxy.requests("POST")) == 3
        # an unkeyed batch is never sent twice: a lost answer could mean it was written
        with pytest.raises(ServerError):
            client.append("run_down", [started()])
    assert len(proxy.requests("POST")) == 4
    assert not RunRow.objects.filter(run_id="run_down").exists()


def test_a_server_killed_and_restarted_mid_batch_loses_nothing_and_writes_nothing_twice(
    django_db_setup: None, workspace: Workspace, key: str, tmp_path: Path
) -> None:
    servers = [start_daphne(tmp_path, "victim", {})]
    port = int(servers[0].url.rsplit(":", 1)[1])
    proxy = FaultyProxy(port)
    restarting: list[threading.Thread] = []

    def kill_and_restart() -> None:
        servers[-1].process.kill()  # SIGKILL: no shutdown, no flush, connections cut
        servers[-1].process.wait()
        restart = threading.Thread(target=lambda: servers.append(start_daphne(tmp_path, "victim", {}, port=port)))
        restart.start()
        restarting.append(restart)

    def await_restart() -> None:
        restarting[-1].join(timeout=120)
        assert len(servers) == 1 + len(restarting), "the server did not come back"

    try:
        with Client(proxy.url, key, retry=FAST) as client:
            run = client.start_run("wfver_kill", run_id="run_killed", batch_size=10, flush_interval=0)
            for n in range(25):
                run.emit("StepScheduled", {"stepPath": f"s{n}"})

            run.flush()  # the emitted events go in the background: sent before the fault is armed

            # 1. The server commits the batch and dies before its answer reaches the client.
            proxy.add(Fault("POST", drop=True, action=kill_and_restart))
            resent = run.append([ev("StepScheduled", stepPath=f"s{n}") for n in range(25, 30)])
            await_restart()
            assert [e["replayed"] for e in resent] == [True] * 5, "the retry must be answered from the log"

            # 2. The server dies as a batch sent in the background reaches it; the outbox retries
            # until it is back, and the agent goes on meanwhile.
            proxy.add(Fault("POST", kill=True, action=kill_and_restart))
            for n in range(30, 60):
                run.emit("StepScheduled", {"stepPath": f"s{n}"})
            await_restart()
            run.complete({"steps": 60})
        posts = len(proxy.requests("POST"))
    finally:
        proxy.close()
        for thread in restarting:
            thread.join(timeout=120)
        for daphne in servers:
            if daphne.process.poll() is None:
                daphne.stop()

    events = logged(workspace, "run_killed")
    assert [e["sequence"] for e in events] == list(range(1, 63))
    assert [e["payload"].get("stepPath") for e in events[1:-1]] == [f"s{n}" for n in range(60)]
    assert events[0]["type"] == "RunStarted" and events[-1]["type"] == "RunCompleted"
    assert len({e["eventId"] for e in events}) == 62
    assert posts > 1 + 6 + 1 + 1, "the failures must have been retried"
    call_command("ledger", "verify", "run_killed", "--workspace", "acme/support", stdout=io.StringIO())
