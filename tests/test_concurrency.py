"""Dense sequences under concurrent writers (real threads, real connections, real commits)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from ledger.log import append
from ledger.models import Event, Run
from ledger.tenancy.services import bootstrap
from tests.conftest import ev, started

THREADS = 8
APPENDS_PER_THREAD = 200


@pytest.mark.django_db(transaction=True)
def test_eight_writers_leave_a_dense_log() -> None:
    workspace = bootstrap(tenant="acme", workspace="support")
    append(workspace=workspace, run_id="run_hot", events=[started()])
    returned: list[list[int]] = [[] for _ in range(THREADS)]
    failures: list[BaseException] = []
    barrier = threading.Barrier(THREADS)

    def writer(n: int) -> None:
        try:
            barrier.wait()
            for i in range(APPENDS_PER_THREAD):
                result = append(workspace=workspace, run_id="run_hot", events=[ev("custom.tick", writer=n, i=i)])
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
            append(workspace=workspace, run_id="run_race", events=[started()])
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


@pytest.mark.django_db(transaction=True)
def test_a_writer_overtaken_while_it_waits_appends_after_the_winner() -> None:
    """B guesses the head from its process's cache while A holds the run's row lock; A appends and
    commits first. On PostgreSQL B's conditional head update waits for A's row, re-checks its
    guess against A's committed head, misses, writes nothing, and B appends under the lock after
    A. (On SQLite B queues on the database lock.) The log stays dense either way."""
    from ledger.log import holding

    workspace = bootstrap(tenant="acme", workspace="support")
    append(workspace=workspace, run_id="run_race", events=[started()])
    append(workspace=workspace, run_id="run_race", events=[ev("custom.warm")])  # cached at 2
    a_locked, a_may_append = threading.Event(), threading.Event()
    results: dict[str, int] = {}
    failures: list[BaseException] = []

    def writer_a() -> None:
        try:
            with transaction.atomic():
                head = holding(workspace=workspace, run_id="run_race")
                a_locked.set()
                a_may_append.wait(timeout=120)
                results["a"] = head.append([ev("custom.a")]).last_sequence
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    def writer_b() -> None:
        try:
            results["b"] = append(workspace=workspace, run_id="run_race", events=[ev("custom.b")]).last_sequence
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    a = threading.Thread(target=writer_a)
    a.start()
    assert a_locked.wait(timeout=120)
    b = threading.Thread(target=writer_b)
    b.start()
    if connection.vendor == "postgresql":
        _wait_for_head_update_blocked_on_a_lock()
    a_may_append.set()
    a.join(timeout=120)
    b.join(timeout=120)

    assert not failures, failures
    assert results == {"a": 3, "b": 4}
    stored = Event.objects.filter(run__run_id="run_race").order_by("sequence")
    assert [(e.sequence, e.type) for e in stored][2:] == [(3, "custom.a"), (4, "custom.b")]
    assert Run.objects.get(run_id="run_race").last_sequence == 4


def _wait_for_head_update_blocked_on_a_lock() -> None:
    """Until another session's guessed head update (ledger/log/statements.py) waits on a row lock."""
    for _ in range(1200):
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE %s",
                ["WITH head AS (UPDATE%"],
            )
            if cur.fetchone()[0]:
                return
        time.sleep(0.05)
    raise AssertionError("the second writer never waited for the first one's row lock")
