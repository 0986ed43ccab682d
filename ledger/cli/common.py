"""What several subcommands share: finding runs, parsing JSON flags, reporting an execution."""

from __future__ import annotations

import json
import sys
from argparse import ArgumentParser
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

from django.core.management.base import BaseCommand, CommandError

from ledger.canonical import NotCanonicalizable, canonical_bytes
from ledger.errors import LedgerError
from ledger.limits import MAX_JSON_DEPTH, DuplicateKey, json_depth_exceeds, nul_path, unique_object
from ledger.models import Run, RunStatus
from ledger.reads import selectors
from ledger.replay.gateway import ToolCallInDoubt
from ledger.replay.plan import CapabilityDriftError
from ledger.runtime.errors import WAITING_APPROVAL
from ledger.runtime.executor import RunOutcome
from ledger.runtime.registry import load_modules
from ledger.tenancy import access


def add_run_arguments(parser: ArgumentParser, *, optional: bool = False, workspace_help: str | None = None) -> None:
    """RUN (optional: every run) and --workspace T/W, as every subcommand about runs takes them."""
    parser.add_argument("run", nargs="?" if optional else None)
    parser.add_argument("--workspace", help=workspace_help)


def find_run(run_id: str, workspace: str | None) -> Run:
    """The run by id (anywhere, or in `workspace` TENANT/WORKSPACE); LedgerError when none or
    when the id is ambiguous."""
    run = access.resolve(access.OPERATOR, workspace=workspace, run_id=run_id).run
    assert run is not None
    return run


def existing_run(cmd: BaseCommand, run_id: str, workspace: str | None) -> Run:
    """`find_run`, or the message on stderr and exit 1 (nothing on stdout)."""
    try:
        return find_run(run_id, workspace)
    except LedgerError as exc:
        cmd.stderr.write(exc.message)
        sys.exit(1)


def runs_for(run_id: str | None, workspace: str | None) -> Iterable[Run]:
    """One run, a workspace's runs, or every run, in creation order."""
    if run_id:
        return [find_run(run_id, workspace)]
    return selectors.all_runs(access.workspace_by_path(workspace) if workspace else None)


def audited_in(tenants: Iterable[str]) -> str:
    """Where an account change was audited: each tenant the user is a member of (the audit log is
    a tenant's), said when there is none."""
    names = list(tenants)
    if not names:
        return "they are a member of no tenant, so no tenant's audit log records it"
    return "audited in " + ", ".join(names)


def json_arg(text: str, flag: str = "--input", *, returncode: int = 1) -> Any:
    """`text` parsed as the API parses a JSON body (docs/security.md "Input limits"), or the
    command's error naming `flag`: NaN and Infinity, an object naming a key twice, nesting deeper
    than MAX_JSON_DEPTH, a NUL character, and a value with no canonical JSON form (a number past a
    double's range, a lone surrogate) are refused here, before anything is printed or written."""
    if json_depth_exceeds(text):
        raise CommandError(
            f"{flag} is nested too deeply to read: JSON may nest arrays and objects at most {MAX_JSON_DEPTH} levels deep",
            returncode=returncode,
        )
    try:
        value = json.loads(text, parse_constant=_not_json, object_pairs_hook=unique_object)
    except DuplicateKey as exc:
        raise CommandError(
            f"{flag} is not JSON the API takes: {exc}: name each key once", returncode=returncode
        ) from exc
    except ValueError as exc:
        raise CommandError(f"{flag} is not JSON: {exc}", returncode=returncode) from exc
    except RecursionError as exc:
        raise CommandError(f"{flag} is nested too deeply to read", returncode=returncode) from exc
    if nul_path(value) is not None:
        raise CommandError(f"{flag}: strings may not contain the NUL character (U+0000)", returncode=returncode)
    try:
        canonical_bytes(value)
    except NotCanonicalizable as exc:
        raise CommandError(f"{flag} has no canonical JSON form: {exc}", returncode=returncode) from exc
    return value


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_workflow_modules(names: Iterable[str]) -> None:
    """The modules that register workflows (the setting's and `--module`'s), or a clear error
    naming the one that cannot be imported."""
    try:
        load_modules(names)
    except ImportError as exc:
        raise CommandError(f"cannot import {exc.name or 'a workflow module'}: {exc}") from exc


def report_outcome(cmd: BaseCommand, execute: Callable[[], RunOutcome]) -> RunOutcome:
    """Run `execute` and say how the run ended on stderr; drift and an in-doubt tool call are
    errors with their own exit codes (1 and 3)."""
    try:
        outcome = execute()
    except CapabilityDriftError as exc:
        raise CommandError(f"CapabilityDriftError: {exc}") from exc
    except ToolCallInDoubt as exc:
        raise CommandError(f"ToolCallInDoubt: {exc.message}", returncode=3) from exc
    cmd.stderr.write(f"run {outcome.run_id} {outcome.status}")
    if outcome.status == WAITING_APPROVAL and isinstance(outcome.error, dict):
        cmd.stderr.write(
            f"tool call {outcome.error.get('callId')} ({outcome.error.get('toolName')}) in step "
            f"{outcome.error.get('stepPath')} waits for an approver (not the run's requester) on the workspace's "
            f"Approvals page; after the decision the worker (ledger worker) resumes the run by itself "
            f"(with no worker running: ledger resume {outcome.run_id})"
        )
    return outcome


def exit_unless_completed(outcome: RunOutcome) -> None:
    """Exit 0 when the run completed, 4 when it waits for a tool call's approval, else 1."""
    if outcome.status == WAITING_APPROVAL:
        sys.exit(4)
    if outcome.status != RunStatus.COMPLETED:
        sys.exit(1)


@contextmanager
def failed_write(path: str) -> Iterator[None]:
    """A file that fails while it is written (a full disk, a quota, an I/O error) as the command's
    clear error rather than a traceback; the export was recorded when it began, as the API's is.
    A reader that went away (BrokenPipeError) stays the dispatcher's to handle."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc.strerror or exc}; what was written is incomplete") from exc


def writable(path: str) -> BinaryIO:
    """`path` opened for writing, or the command's clear error: opened before anything is
    recorded, so a path that cannot be written leaves no audit entry of an export never made."""
    try:
        return open(path, "wb")  # the caller's `with` closes it
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc.strerror or exc}") from exc
