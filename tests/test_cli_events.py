"""`ledger events`, `ledger verify` and `ledger demo`."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from tests.conftest import ev, started
from tests.servers import REPO_ROOT, database_url

pytestmark = pytest.mark.django_db


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("ledger", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_events_prints_one_envelope_per_line_in_order(append) -> None:
    written = append(
        "run_a",
        started(),
        ev("StepScheduled", stepPath="s"),
        ev("harness.tool_call.started", callId="c", caller="model", toolName="t", args={}),
    ).events
    code, out, _ = run("events", "run_a")
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert lines == [{k: v for k, v in e.items() if k != "replayed"} for e in written]


def test_events_filters_by_type_prefix_and_exact_type(append) -> None:
    append(
        "run_a",
        started(),
        ev("harness.tool_call.started", callId="c", caller="model", toolName="t", args={}),
        ev("harness.tool_call.succeeded", callId="c", result=1, durationMs=3),
        ev("StepScheduled", stepPath="s"),
    )
    _, out, _ = run("events", "run_a", "--type", "harness.tool_call.*")
    assert [json.loads(x)["sequence"] for x in out.splitlines()] == [2, 3]
    _, out, _ = run("events", "run_a", "--type", "StepScheduled")
    assert [json.loads(x)["sequence"] for x in out.splitlines()] == [4]


def test_events_of_an_unknown_run_prints_nothing_and_exits_1(workspace) -> None:
    code, out, err = run("events", "run_missing")
    assert (code, out) == (1, "") and "not found" in err


def test_events_needs_the_workspace_when_the_run_id_is_ambiguous(workspace, other_workspace, append) -> None:
    from ledger import log

    append("run_same", started())
    log.append(workspace=other_workspace, run_id="run_same", events=[started(), ev("StepScheduled", stepPath="x")])
    code, _, err = run("events", "run_same")
    assert code == 1 and "--workspace" in err
    _, out, _ = run("events", "run_same", "--workspace", "globex/main")
    assert len(out.splitlines()) == 2


def test_verify_passes_on_an_intact_log_and_fails_on_a_forged_event(append) -> None:
    append("run_a", started(), ev("StepScheduled", stepPath="s"))
    assert run("verify", "run_a")[0] == 0
    # Forge a row the way only someone with raw database access could: triggers off, then edit.
    with transaction.atomic(), connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute("SET LOCAL session_replication_role = replica")
            cur.execute('UPDATE ledger_event SET payload = \'{"stepPath":"forged"}\' WHERE sequence = 2')
            cur.execute("SET LOCAL session_replication_role = origin")
        else:
            cur.execute("DROP TRIGGER ledger_event_no_update")
            cur.execute('UPDATE ledger_event SET payload = \'{"stepPath":"forged"}\' WHERE sequence = 2')
    code, out, _ = run("verify", "run_a")
    assert code == 1 and "event_ids" in out and "[2]" in out


def test_demo_is_idempotent_and_verifies() -> None:
    _, first, _ = run("demo", "--history-runs", "5")
    _, second, _ = run("demo", "--history-runs", "5")
    created = int(first.split("demo ready: ")[1].split(" ")[0])
    assert created >= 14 and f"0 run(s) created, {created} already present" in second
    code, out, _ = run("verify")
    assert code == 0 and f"verified {created} run(s): ok" in out


@pytest.mark.django_db(transaction=True)
def test_a_reader_that_stops_early_gets_no_traceback(append) -> None:
    """`ledger events RUN | head -1`: once head has its line and leaves, the command stops quietly.
    It used to end in a BrokenPipeError traceback on stderr."""
    append("run_long", started(), *(ev("StepScheduled", stepPath=f"step_{n}_" + "x" * 200) for n in range(600)))
    process = subprocess.Popen(
        [sys.executable, "manage.py", "ledger", "events", "run_long"],
        cwd=REPO_ROOT,
        env={**os.environ, "DEBUG": "1", "DATABASE_URL": database_url()},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    first = json.loads(process.stdout.readline())
    process.stdout.close()  # the reader leaves with 600 lines (about 170 kB) still to come
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 1
    assert first["sequence"] == 1
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
