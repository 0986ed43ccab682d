"""The command line refuses what it cannot use before it prints an id or writes anything: a clear
message (Django's CommandError, or the message on stderr and exit 1), never a traceback, and no
run, loop or audit entry made for a command that did not start."""

from __future__ import annotations

import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from ledger.log import append
from ledger.models import (
    ApiKey,
    AuditEntry,
    DatasetVersion,
    Evaluation,
    Event,
    Membership,
    ReexecutionRequest,
    Run,
    Workspace,
)
from tests.servers import REPO_ROOT

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


# --- the audit of every action (each case refused before anything is printed or written) ----------


def written() -> dict[str, int]:
    """How many of each thing a command could make: a refused one makes none."""
    models = (Run, Event, AuditEntry, ApiKey, Membership, Evaluation, ReexecutionRequest, DatasetVersion, User)
    return {model.__name__: model.objects.count() for model in models}


def refused_nothing_written(*args: str) -> CommandError:
    before = written()
    out = StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("ledger", *args, stdout=out, stderr=StringIO())
    assert out.getvalue() == "" and written() == before
    return raised.value


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["events", "run_\udcff"], "RUN is not valid UTF-8 text"),
        (["state", "run_demo", "--workspace", "acme/\udcff"], "--workspace is not valid UTF-8 text"),
        (["disable-user", "d\udcffve"], "NAME is not valid UTF-8 text"),
        (
            ["create-user", "zed", "--tenant", "acme", "--role", "viewer", "--password", "pass\udcffword-long"],
            "--password is not valid UTF-8 text",
        ),  # fmt: skip
        (["keys", "revoke", "\udcff"], "PREFIX is not valid UTF-8 text"),
        (
            ["limits", "acme/support", "--events-per-run", "5", "--reason", "r\udcff"],
            "--reason is not valid UTF-8 text",
        ),
        (
            ["create-key", "--workspace", "acme/support", "--scopes", "read", "--owner", "o\udcff"],
            "--owner is not valid UTF-8 text",
        ),  # fmt: skip
        ([*RUN, "--input", "{}", "--requested-by", "c\udcffrol"], "--requested-by is not valid UTF-8 text"),
        (
            ["dataset", "add", "golden", "run_a", "--workspace", "acme/support", "--as", "c\udcff"],
            "--as is not valid UTF-8 text",
        ),  # fmt: skip
    ],
)
def test_text_that_is_not_utf8_is_refused_by_its_argument(
    workspace: Workspace, operator: User, args: list[str], message: str
) -> None:
    """Bytes that are not UTF-8 on the command line (Python hands them over as lone surrogates)
    can be neither stored nor looked up: before, the database driver's UnicodeEncodeError."""
    assert str(refused_nothing_written(*args)) == message


DEEP = '{"a": ' + "[" * 64 + "]" * 64 + "}"  # 65 levels: one past what the API takes


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"a": 1, "a": 2}', 'the key "a" appears twice in one object: name each key once'),
        ('{"a": 1e999}', "--input has no canonical JSON form: inf is not representable"),
        ('{"a": "\\ud800"}', "--input has no canonical JSON form"),
        ('{"a": "\\u0000"}', "--input: strings may not contain the NUL character (U+0000)"),
        (DEEP, "JSON may nest arrays and objects at most 64 levels deep"),
    ],
)
def test_a_json_flag_is_refused_as_the_api_refuses_it(workspace: Workspace, value: str, message: str) -> None:
    """What an API body may not hold (docs/security.md "Input limits") is refused before a run or
    loop id is printed; before, the run id was printed and the write refused it (or a repeated key
    was taken, its last value winning)."""
    assert message in str(refused_nothing_written(*RUN, "--input", value))
    assert message in str(refused_nothing_written(*LOOP[:3], "--input", value, *LOOP[5:], "--max-cycles", "1"))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--change", 'input:{"a": 1, "a": 2}', "--scorer", "exact"], 'the key "a" appears twice in one object'),
        (
            ["--change", "model:default=scripted/gpt-4o", "--scorer", 'regex:{"pattern": "a", "pattern": "b"}'],
            'the key "pattern" appears twice in one object',
        ),  # fmt: skip
        (
            ["--change", "model:default=scripted/gpt-4o", "--scorer", "exact", "--timeout", "nan"],
            "--timeout must be a number of seconds from 0 to 604800",
        ),  # fmt: skip
        (["--change", "model:default=scripted/gpt-4o", "--scorer", "exact", "--json", "."], "cannot write .: "),
        (
            ["--change", "model:default=scripted/gpt-4o", "--scorer", "exact", "--junit", "/nonexistent/e.xml"],
            "cannot write /nonexistent/e.xml: No such file or directory",
        ),  # fmt: skip
    ],
)
def test_an_evaluation_it_cannot_report_is_not_started(
    workspace: Workspace, operator: User, extra: list[str], message: str
) -> None:
    """Refused with exit 5 before the evaluation starts: before, a report file that could not be
    written failed with a traceback after its runs were queued, and --timeout nan never ended."""
    error = refused_nothing_written("evaluate", "golden", "--workspace", "acme/support", "--as", "carol", *extra)
    assert message in str(error) and error.returncode == 5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*RUN, "--input", "{}", "--requested-by", "nobody"], "--requested-by: no user nobody"),
        (
            ["create-key", "--workspace", "acme/support", "--scopes", "read", "--name", "k" * 201],
            "a key name has at most 200 characters",
        ),  # fmt: skip
        (["demo", "--history-runs", str(10**12)], "--history-runs must be from 0 to 10,000, got 1000000000000"),
        (["worker", "--batch", "--interval", "nan"], "--interval must be a number of seconds from 0 to 3600, got nan"),
        (["worker", "--interval", "-1"], "--interval must be a number of seconds from 0 to 3600, got -1"),
        (["verify", "--bundle", "."], ".: a directory, not a file"),
    ],
)
def test_an_out_of_range_or_unknown_value_is_refused(workspace: Workspace, args: list[str], message: str) -> None:
    """A requester nobody is (they could approve their own tool call), a key name its column cannot
    hold, a demo that would fill the database, a worker that fails at its first empty queue."""
    assert str(refused_nothing_written(*args)) == message


@pytest.mark.parametrize(
    ("layout", "problem"),
    [
        ({"events/x.jsonl/": None}, "events/x.jsonl:1: unreadable (Is a directory)"),
        ({"events/x.jsonl": "[" * 100_000 + "]" * 100_000}, "events/x.jsonl:1: not a JSON envelope (JSON is nested"),
    ],
)
def test_import_little_names_a_file_it_cannot_read(
    workspace: Workspace, tmp_path: Path, layout: dict[str, str | None], problem: str
) -> None:
    """The problem by file and line on stderr, exit 1, nothing imported; before, a traceback."""
    for name, text in layout.items():
        if text is None:
            (tmp_path / name).mkdir(parents=True)
        else:
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(text)
    before, out, err = written(), StringIO(), StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("ledger", "import-little", str(tmp_path), "--workspace", "acme/support", stdout=out, stderr=err)
    assert exited.value.code == 1 and out.getvalue() == "" and written() == before
    assert err.getvalue().splitlines()[0].startswith(problem)


@pytest.mark.parametrize(
    "args",
    [
        ["export", "audit", "--tenant", "acme", "--output", "/dev/full"],
        ["export-evidence", "run_full", "--workspace", "acme/support", "--output", "/dev/full"],
    ],
)
def test_an_export_the_disk_cannot_hold_is_a_clear_error(workspace: Workspace, args: list[str]) -> None:
    """A full disk while the file is written: one line, not an OSError's traceback. The export was
    recorded when it began (as the API records one), and the message says the file is incomplete."""
    append(
        workspace=workspace,
        run_id="run_full",
        events=[{"type": "RunStarted", "payload": {"workflowVersionId": "wfver_x", "input": {}}}],
    )
    assert refused(*args) == "cannot write /dev/full: No space left on device; what was written is incomplete"


def test_an_answer_the_disk_cannot_hold_is_one_line(tmp_path: Path) -> None:
    """`ledger verify --export FILE > /dev/full` (any subcommand whose stdout fails): the error on
    one line and exit 1; before, a traceback from Django's output wrapper."""
    export = tmp_path / "events.jsonl"
    export.write_text("not an export\n")
    environment = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "SECRET_KEY"}}
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "manage.py", "ledger", "verify", "--export", str(export)],
            cwd=REPO_ROOT,
            env={**environment, "DEBUG": "1", "DJANGO_SETTINGS_MODULE": "console.settings"},
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert (done.returncode, done.stderr) == (1, "CommandError: No space left on device\n")
