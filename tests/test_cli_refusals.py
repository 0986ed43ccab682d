"""The command line refuses what it cannot use before it prints an id or writes anything: a clear
message (Django's CommandError, or the message on stderr and exit 1), never a traceback, and no
run, loop or audit entry made for a command that did not start."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from ledger.models import AuditEntry, Event, Run, Workspace

pytestmark = pytest.mark.django_db

LOOP = [
    "loop",
    "start",
    "rt_refine",
    "--input",
    "{}",
    "--workspace",
    "acme/support",
    "--module",
    "tests.loop_workflows",
]
RUN = ["run", "rt_refine", "--workspace", "acme/support", "--module", "tests.loop_workflows"]


def refused(*args: str) -> str:
    """The command's CommandError message; nothing printed on stdout (no id handed out)."""
    out = StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("ledger", *args, stdout=out, stderr=StringIO())
    assert out.getvalue() == ""
    return str(raised.value)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-cycles", "0"], "maxCycles must be a whole number from 1 to 100, got 0"),
        (["--max-cycles", "3"], "outer_loop_requested_without_supervise_adapter"),
    ],
)
def test_a_loop_it_would_refuse_gets_no_id(workspace: Workspace, extra: list[str], message: str) -> None:
    assert message in refused(*LOOP, *extra)
    assert not Run.objects.exists() and not Event.objects.exists()


@pytest.mark.parametrize(
    "args",
    [
        [*RUN, "--input", "{}", "--module", "no_such_module_here"],
        [*LOOP, "--max-cycles", "1", "--module", "no_such_module_here"],
        ["resume", "run_x", "--module", "no_such_module_here"],
    ],
)
def test_a_module_that_cannot_be_imported_is_named(workspace: Workspace, args: list[str]) -> None:
    assert refused(*args) == "cannot import no_such_module_here: No module named 'no_such_module_here'"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--input", "{}", "--run-id", "bad id!"], "run id must match"),
        (["--input", '{"x": NaN}'], "--input is not JSON: NaN is not a JSON number"),
        (["--input", "[" * 100_000 + "]" * 100_000], "--input is nested too deeply to read"),
    ],
)
def test_a_run_it_would_refuse_gets_no_id(workspace: Workspace, extra: list[str], message: str) -> None:
    assert message in refused(*RUN, *extra)
    assert not Run.objects.exists() and not AuditEntry.objects.exists()


@pytest.mark.parametrize("action", ["show", "resume"])
def test_an_unknown_loop_is_said_by_its_own_id(workspace: Workspace, action: str) -> None:
    err = StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command(
            "ledger", "loop", action, "ol_nowhere", "--workspace", "acme/support", stdout=StringIO(), stderr=err
        )
    assert exited.value.code == 1 and err.getvalue().strip() == "outer loop ol_nowhere not found in acme/support"
    assert "workspace acme/nowhere not found" in refused("loop", action, "ol_nowhere", "--workspace", "acme/nowhere")
