"""runledger.client in a process forked from the harness (multiprocessing's "fork"), against a
live Daphne: the child writes with the client it inherited, as its own writer of the same run, and
its events are sent by the child (the parent's sending thread does not exist there), on
connections of its own, while the parent goes on writing."""

from __future__ import annotations

import io
import multiprocessing
import sys

import pytest
from django.core.management import call_command

from ledger.models import Workspace
from ledger.tenancy.services import create_key
from runledger.client import Client, RetryPolicy, Undelivered
from tests.client_support import logged
from tests.servers import Daphne

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(sys.platform == "win32", reason="no fork on Windows"),
]


@pytest.fixture
def key(workspace: Workspace) -> str:
    return create_key(workspace=workspace, scopes=["ingest", "read"])[1]


def test_a_forked_child_writes_with_the_client_it_inherited(server: Daphne, key: str, workspace: Workspace) -> None:
    undelivered: list[Undelivered] = []
    client = Client(server.url, key, retry=RetryPolicy(deadline_s=60), on_undelivered=undelivered.append)
    run = client.start_run("wfver_fork", run_id="run_forked", flush_interval=0.05)
    run.emit("custom.parent", {"n": 0})
    run.flush()

    def child(number: int) -> None:
        mine = client.run("run_forked", writer=f"child{number}")
        for n in range(3):
            mine.emit("custom.child", {"child": number, "n": n})
        sent = mine.flush(timeout=30)  # the bound of a test: sent at once when it works
        sys.exit(0 if len(sent) == 3 else 1)

    processes = [multiprocessing.get_context("fork").Process(target=child, args=(n,)) for n in range(2)]
    for process in processes:
        process.start()
    run.emit("custom.parent", {"n": 1})  # the parent goes on meanwhile
    for process in processes:
        process.join(timeout=120)
    assert [p.exitcode for p in processes] == [0, 0]
    run.complete()
    client.close()

    assert undelivered == []
    events = logged(workspace, "run_forked")
    assert [e["type"] for e in events].count("custom.child") == 6 and events[-1]["type"] == "RunCompleted"
    for number in range(2):
        assert [e["payload"]["n"] for e in events if e["payload"].get("child") == number] == [0, 1, 2]
    assert [e["payload"]["n"] for e in events if e["type"] == "custom.parent"] == [0, 1]
    call_command("ledger", "verify", "run_forked", "--workspace", "acme/support", stdout=io.StringIO())
