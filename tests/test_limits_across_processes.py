"""A size limit the operator changes (`ledger limits`, in a process of its own) holds at once in
every process that appends, without a restart (docs/security.md § Limits): a long-lived writer
(a runtime executor or a worker, which loaded its Workspace when the run began) and a running
server alike. The change is made by a real `manage.py ledger limits` subprocess; nothing in this
process is told of it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from ledger import log
from ledger.errors import RunTooLarge
from ledger.models import Event, Workspace
from ledger.tenancy.services import create_key
from tests.conftest import ev, started
from tests.servers import REPO_ROOT, Daphne, database_url

pytestmark = pytest.mark.django_db(transaction=True)


def _operator_sets(*args: str) -> None:
    """`ledger limits acme/support ARGS` run by the operator: another process, its own connection."""
    done = subprocess.run(
        [sys.executable, "manage.py", "ledger", "limits", "acme/support", *args],
        cwd=REPO_ROOT,
        env={**os.environ, "DATABASE_URL": database_url()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "1 limit(s) changed" in done.stderr


def _notes(n: int) -> list[dict[str, object]]:
    return [ev("custom.note", n=i) for i in range(n)]


def test_a_long_lived_writer_is_held_to_a_limit_lowered_by_another_process(workspace: Workspace) -> None:
    held = Workspace.objects.select_related("tenant").get(pk=workspace.pk)  # loaded once, as an executor does
    log.append(workspace=held, run_id="run_long", events=[started(), *_notes(2)])
    log.append(workspace=held, run_id="run_long", events=_notes(1))  # this process now holds the run's state too

    _operator_sets("--events-per-run", "5", "--reason", "a run that never ends")

    log.append(workspace=held, run_id="run_long", events=_notes(1))
    with pytest.raises(RunTooLarge) as refused:
        log.append(workspace=held, run_id="run_long", events=_notes(1))
    assert refused.value.details == {"index": 0, "limit": 5, "which": "events"}
    assert Event.objects.filter(run__run_id="run_long").count() == 5


def test_a_long_lived_writer_may_go_on_under_a_limit_raised_by_another_process(workspace: Workspace) -> None:
    _operator_sets("--events-per-run", "3")
    held = Workspace.objects.select_related("tenant").get(pk=workspace.pk)
    log.append(workspace=held, run_id="run_long", events=[started(), *_notes(2)])
    with pytest.raises(RunTooLarge):
        log.append(workspace=held, run_id="run_long", events=_notes(1))

    _operator_sets("--events-per-run", "default")

    log.append(workspace=held, run_id="run_long", events=_notes(2))
    assert Event.objects.filter(run__run_id="run_long").count() == 5


def test_a_byte_limit_lowered_by_another_process_holds_for_a_long_lived_writer(workspace: Workspace) -> None:
    held = Workspace.objects.select_related("tenant").get(pk=workspace.pk)
    log.append(workspace=held, run_id="run_big", events=[started(), ev("custom.note", text="x" * 600)])

    _operator_sets("--bytes-per-run", "1024")

    with pytest.raises(RunTooLarge) as refused:
        log.append(workspace=held, run_id="run_big", events=[ev("custom.note", text="x" * 600)])
    assert refused.value.details == {"index": 0, "limit": 1024, "which": "bytes"}


@pytest.fixture
def api(server: Daphne, workspace: Workspace) -> Iterator[httpx.Client]:
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {key}"}) as client:
        yield client


def _append(api: httpx.Client, run_id: str, events: list[dict[str, object]]) -> httpx.Response:
    return api.post(f"/api/v1/runs/{run_id}/events", json={"events": events})


def test_a_running_server_holds_a_run_to_a_limit_changed_by_another_process(api: httpx.Client) -> None:
    assert _append(api, "run_served", [started(), *_notes(2)]).status_code == 200
    assert _append(api, "run_served", _notes(1)).status_code == 200

    _operator_sets("--events-per-run", "4")

    refused = _append(api, "run_served", _notes(1))
    assert refused.status_code == 413, refused.text
    assert refused.json()["error"]["details"] == {"index": 0, "limit": 4, "which": "events"}

    _operator_sets("--events-per-run", "default")

    assert _append(api, "run_served", _notes(1)).status_code == 200


def test_a_running_server_holds_a_key_to_a_rate_changed_by_another_process(api: httpx.Client) -> None:
    assert _append(api, "run_rated", [started(), *_notes(2)]).status_code == 200

    _operator_sets("--events-per-minute-per-key", "1")

    refused = _append(api, "run_rated", _notes(2))  # two events are past one a minute, whichever minute
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["details"]["limit"] == 1
