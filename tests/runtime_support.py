"""What the runtime tests share: every run they leave behind verifies, the executor's death as an
exception, a run's log, the invocation log read as counts of calls, and the round trips a block
of code makes to PostgreSQL."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from ledger.canonical import canonical_json
from ledger.log.envelopes import log_of
from ledger.log.verify import verify_run
from ledger.models import Run, Workspace


@pytest.fixture(autouse=True)
def every_run_verifies(db: None) -> Iterator[None]:
    """`ledger verify` passes on every run a test leaves behind, whatever else it asserts."""
    yield
    failures = {run.run_id: [c.name for c in verify_run(run) if c.status == "fail"] for run in Run.objects.all()}
    assert {run_id: names for run_id, names in failures.items() if names} == {}


class Crash(BaseException):
    """The executor dying mid-call: not an Exception, so nothing in the runtime records it."""


def run_events(workspace: Workspace, run_id: str) -> list[dict[str, Any]]:
    return log_of(Run.objects.get(workspace=workspace, run_id=run_id))


def assert_verified(workspace: Workspace, *run_ids: str) -> None:
    for run_id in run_ids:
        failed = [c for c in verify_run(Run.objects.get(workspace=workspace, run_id=run_id)) if c.status == "fail"]
        assert failed == [], (run_id, failed)


def invocation_counts(path: Path) -> Counter[str]:
    """The model and tool invocations an invocation log holds (tests/runtime_workflows.py)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return Counter(
        f"model {r['stepPath']} turn {r['turn']}"
        if r["kind"] == "model"
        else f"tool {r['tool']} {canonical_json(r['args'])}"
        for r in lines
    )


def invocation_of(event: dict[str, Any], events: list[dict[str, Any]]) -> str:
    """The invocation whose answer `event` records, in invocation_counts' terms."""
    p = event["payload"]
    if event["type"] == "harness.model.responded":
        return f"model {p['stepPath']} turn {p['turn']}"
    started = next(
        e["payload"]
        for e in events
        if e["type"] == "harness.tool_call.started" and e["payload"]["callId"] == p["callId"]
    )
    return f"tool {started['toolName']} {canonical_json(started['args'])}"


@contextmanager
def round_trips() -> Iterator[list[int]]:
    """The round trips this thread's PostgreSQL connection makes inside the block, counted from
    libpq's protocol trace (one ReadyForQuery ends each): the yielded list gets the count at the end.
    On another database it stays empty."""
    counted: list[int] = []
    if connection.vendor != "postgresql":
        yield counted
        return
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile() as trace:
        pgconn.trace(trace.fileno())
        try:
            yield counted
        finally:
            pgconn.untrace()
        trace.seek(0)
        counted.append(sum(1 for line in trace if b"\tReadyForQuery" in line))
