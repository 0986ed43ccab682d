"""`ledger run` and `ledger resume` show progress: steps done of the workflow's, the step running,
the cost so far; one line rewritten in place on a terminal (a real pseudo-terminal here), plain
lines otherwise."""

from __future__ import annotations

import json
import os
import select
from io import StringIO
from typing import Any

from django.core.management import call_command

from ledger.models import Run, Workspace
from ledger.runtime.progress import cost_text
from tests.runtime_support import every_run_verifies  # noqa: F401  (an autouse fixture)

REFUND_INPUT = json.dumps({"ticket": "refund please", "orderId": "A-1"})


def _run_refund(run_id: str, *, stdout: Any = None, stderr: Any = None) -> None:
    """`ledger run support.refund` in acme/support as `run_id`; its output where the test reads it."""
    call_command(
        "ledger",
        "run",
        "support.refund",
        "--input",
        REFUND_INPUT,
        "--workspace",
        "acme/support",
        "--run-id",
        run_id,
        stdout=StringIO() if stdout is None else stdout,
        stderr=StringIO() if stderr is None else stderr,
    )


def test_plain_lines_when_not_a_terminal(workspace: Workspace) -> None:
    out, err = StringIO(), StringIO()

    _run_refund("run_progress", stdout=out, stderr=err)

    lines = err.getvalue().splitlines()
    assert "\r" not in err.getvalue()
    progress = [line for line in lines if line.startswith("run_progress: ")]
    assert progress[0] == "run_progress: 0/3 steps done · starting · $0.0000"
    assert "run_progress: 0/3 steps done · step normalize · $0.0000" in progress
    assert any(line.startswith("run_progress: 1/3 steps done · step assess") for line in progress)
    assert any(line.startswith("run_progress: 2/3 steps done · step refund") for line in progress)
    last = progress[-1]
    assert last.startswith("run_progress: 3/3 steps done · done · $0.0")
    assert last != "run_progress: 3/3 steps done · done · $0.0000"  # gpt-4o's calls cost something
    assert len(progress) == len(set(progress))  # a line only when something changed
    assert lines[-1] == "run run_progress completed"


def test_one_line_rewritten_in_place_on_a_terminal(workspace: Workspace) -> None:
    master, slave = os.openpty()
    terminal = open(slave, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    try:
        _run_refund("run_tty", stderr=terminal)
        terminal.flush()
        shown = _read_all(master)
    finally:
        terminal.close()
        os.close(master)

    progress, _, after = shown.partition("\r\n")  # the line ends once, when the run is over
    assert progress.startswith("\rrun_tty: 0/3 steps done")
    assert "\n" not in progress and progress.count("\r") >= 4
    assert progress.split("\r")[-1].startswith("run_tty: 3/3 steps done · done · $")
    assert after.startswith("run run_tty completed")


def test_resume_counts_the_steps_its_log_already_completed(workspace: Workspace) -> None:
    _run_refund("run_again")
    err = StringIO()

    call_command("ledger", "resume", "run_again", stdout=StringIO(), stderr=err)

    assert err.getvalue().splitlines()[0].startswith("run_again: 3/3 steps done · done · $0.0")


def test_resume_starts_from_the_cost_its_log_already_recorded(workspace: Workspace) -> None:
    _run_refund("run_priced")
    run = Run.objects.get(workspace=workspace, run_id="run_priced")
    assert run.cost_usd and run.cost_usd > 0
    err = StringIO()

    call_command("ledger", "resume", "run_priced", stdout=StringIO(), stderr=err)

    # The cost so far is the run's, not $0 until the resume writes a model answer of its own.
    assert err.getvalue().splitlines()[0] == f"run_priced: 3/3 steps done · done · {cost_text(run.cost_usd, 0)}"


def _read_all(fd: int) -> str:
    chunks = []
    while select.select([fd], [], [], 0)[0]:
        chunks.append(os.read(fd, 65536))
    return b"".join(chunks).decode()
