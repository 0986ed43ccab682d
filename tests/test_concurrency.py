"""Dense sequences under concurrent writers (real threads, real connections, real commits)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from ledger.append import append_events
from ledger.models import Event, Run
from ledger.tenancy import bootstrap
from tests.conftest import ev, started

THREADS = 8
APPENDS_PER_THREAD = 200


@pytest.mark.django_db(transaction=True)
def test_eight_writers_leave_a_dense_log() -> None:
    workspace = bootstrap(tenant="acme", workspace="support")
    append_events(workspace=workspace, run_id="run_hot", events=[started()])
    returned: list[list[int]] = [[] for _ in range(THREADS)]
    failures: list[BaseException] = []
    barrier = threading.Barrier(THREADS)

    def writer(n: int) -> None:
        try:
            barrier.wait()
            for i in range(APPENDS_PER_THREAD):
                result = append_events(workspace=workspace, run_id="run_hot",
                                       events=[ev("custom.tick", writer=n, i=i)])
                returned[n].append(result.events[0]["sequence"])
        except BaseException as exc:  # surfaced below with the thread's own traceback
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not failures, failures
    total = 1 + THREADS * APPENDS_PER_THREAD
    stored = list(Event.objects.filter(run__run_id="run_hot").order_by("sequence").values_list("sequence", flat=True))
    assert stored == list(range(1, total + 1))
    everything_returned = sorted(s for seqs in returned for s in seqs)
    assert everything_returned == list(range(2, total + 1))
    for seqs in returned:  # each writer saw its own appends in order
        assert seqs == sorted(seqs)
    assert Run.objects.get(run_id="run_hot").last_sequence == total


@pytest.mark.django_db(transaction=True)
def test_concurrent_first_appends_create_one_run() -> None:
    workspace = bootstrap(tenant="acme", workspace="support")
    outcomes: list[str] = []
    barrier = threading.Barrier(4)

    def starter() -> None:
        try:
            barrier.wait()
            append_events(workspace=workspace, run_id="run_race", events=[started()])
            outcomes.append("ok")
        except Exception as exc:
            outcomes.append(getattr(exc, "code", repr(exc)))
        finally:
            connection.close()

    threads = [threading.Thread(target=starter) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(outcomes) == ["ok", "run_already_started", "run_already_started", "run_already_started"]
    assert Event.objects.filter(run__run_id="run_race").count() == 1
