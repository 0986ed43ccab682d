"""`ledger evaluate DATASET --change … --scorer … --fail-if … --wait`: the gate a CI pipeline
calls (docs/evaluations.md "The gate").

Starts an evaluation of the change (`--change`: a model mapping, a prompt, an input or another
registered workflow; CHANGE_FORMS) against the dataset's latest version (or --version) as the
member --as; inside an evaluation policy it starts at once, otherwise it waits for an approver.
With --wait it waits for the verdict (the deployment's worker executes the batch); with --here
this process executes it (and waits, as --wait, for the requests a running worker took first). --junit and --json write the report for CI.

Exit status: 0 passed; 1 the gate failed (--fail-if crossed); 3 budget_exhausted; 4 no verdict
(denied, expired, incomplete, or still waiting when --timeout ran out, or started without
--wait and not finished); 5 refused (bad input, unknown dataset, no permission); 2 a usage error.
"""

from __future__ import annotations

import json
import re
import sys
import time
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger.errors import LedgerError
from ledger.evaluation import evaluations
from ledger.models import Evaluation
from ledger.reads import selectors
from ledger.tenancy import access

from .common import json_arg

NAME = "evaluate"
HELP = "evaluate a change against a dataset of recorded runs and gate on the verdict (exit 0 passed, 1 failed)"
CHANGE = re.compile(r"^model:([^=\s]+)=([^/\s]+)/(\S+)$")
PROMPT = re.compile(r"^(prompt|system):([^=\s]+)=(.*)$", re.DOTALL)
RUN_INPUT = re.compile(r"^input:([^={\s]+)=(.*)$", re.DOTALL)
WORKFLOW = re.compile(r"^workflow:([^@\s]+)(?:@(\S+))?$")
CHANGE_FORMS = (
    "model:SLOT=PROVIDER/MODEL, prompt:STEP=TEXT, system:STEP=TEXT, input:JSON-MERGE-PATCH, "
    "input:RUN=JSON, workflow:NAME[@VERSION] or json:CHANGE"
)
EXIT = {
    Evaluation.Verdict.PASSED: 0,
    Evaluation.Verdict.FAILED: 1,
    Evaluation.Verdict.BUDGET_EXHAUSTED: 3,
    Evaluation.Verdict.INCOMPLETE: 4,
}
REFUSED = 5
MAX_TIMEOUT = 7 * 24 * 3600.0
NO_VERDICT = 4


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("dataset")
    parser.add_argument("--workspace", required=True, help="TENANT/WORKSPACE")
    parser.add_argument(
        "--change",
        action="append",
        required=True,
        help=f"one of {CHANGE_FORMS}; repeat a form for several slots, steps or runs (one kind per evaluation)",
    )
    parser.add_argument(
        "--scorer", action="append", required=True, help='NAME or NAME:JSON-ARGS, e.g. regex:\'{"pattern": "^ok"}\''
    )
    parser.add_argument("--fail-if", default="", help='e.g. "pass_rate < 0.95 or cost_delta > 0.10"')
    parser.add_argument("--reason", default="", help="why (default: the change)")
    parser.add_argument("--as", dest="as_user", required=True, help="the requesting member's username (operator+)")
    parser.add_argument("--version", type=int, help="the dataset version (default: the latest)")
    parser.add_argument("--wait", action="store_true", help="wait for the verdict; exit with it")
    parser.add_argument("--here", action="store_true", help="execute the batch in this process (implies --wait)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds --wait waits (default 3600)")
    parser.add_argument("--junit", type=Path, help="write the report as JUnit XML here")
    parser.add_argument("--json", dest="json_out", type=Path, help="write the evaluation and its report as JSON here")


def _json(value: str, text: str) -> Any:
    return json_arg(text, f"--change {value!r}", returncode=REFUSED)


def _change(values: list[str]) -> dict[str, Any]:
    """The --change values as one change of docs/evaluations.md "Changes"; every value must be
    of the same kind."""
    changes: list[dict[str, Any]] = []
    for value in values:
        if (match := CHANGE.match(value)) is not None:
            changes.append(
                {
                    "kind": "model",
                    "modelOverrides": {match.group(1): {"provider": match.group(2), "model": match.group(3)}},
                }
            )
        elif (match := PROMPT.match(value)) is not None:
            changes.append({"kind": "prompt", "prompts": {match.group(2): {match.group(1): match.group(3)}}})
        elif value.startswith("input:{"):
            changes.append({"kind": "input", "mergePatch": _json(value, value.removeprefix("input:"))})
        elif (match := RUN_INPUT.match(value)) is not None:
            changes.append({"kind": "input", "inputs": {match.group(1): _json(value, match.group(2))}})
        elif (match := WORKFLOW.match(value)) is not None:
            changes.append(
                {
                    "kind": "workflow",
                    "workflow": match.group(1),
                    **({"version": match.group(2)} if match.group(2) else {}),
                }
            )
        elif value.startswith("json:"):
            found = _json(value, value.removeprefix("json:"))
            if not isinstance(found, dict):
                raise CommandError(f"--change {value!r}: json: takes a change object", returncode=REFUSED)
            changes.append(found)
        else:
            raise CommandError(f"--change {value!r}: expected {CHANGE_FORMS}", returncode=REFUSED)
    kinds = {c.get("kind") for c in changes}
    if len(kinds) != 1:
        raise CommandError(
            f"--change: one kind of change per evaluation, got {sorted(map(str, kinds))}", returncode=REFUSED
        )
    if len(changes) == 1:
        return changes[0]
    merged: dict[str, Any] = {"kind": changes[0]["kind"]}
    for change in changes:
        for key, part in change.items():
            if key == "kind":
                continue
            if key not in merged:
                merged[key] = part
            elif isinstance(part, dict) and isinstance(merged[key], dict):
                for name, sub in part.items():  # prompt:STEP and system:STEP of one step combine
                    old = merged[key].get(name)
                    merged[key][name] = {**old, **sub} if isinstance(old, dict) and isinstance(sub, dict) else sub
            else:
                raise CommandError(f"--change: {key} given twice", returncode=REFUSED)
    return merged


def _scorers(values: list[str]) -> list[dict[str, Any]]:
    specs = []
    for value in values:
        name, _, args = value.partition(":")
        specs.append({"name": name, "args": json_arg(args, f"--scorer {value!r}", returncode=REFUSED) if args else {}})
    return specs


def _can_write(path: Path | None) -> None:
    """Refused now, not after the evaluation started (its runs, audit entries and spend made),
    when `path` cannot be written; a file that was not there is not left behind."""
    if path is None:
        return
    existed = path.exists()
    try:
        with path.open("ab"):
            pass
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc.strerror or exc}", returncode=REFUSED) from exc
    if not existed:
        path.unlink()


def handle(
    cmd: BaseCommand,
    *,
    dataset: str,
    workspace: str,
    change: list[str],
    scorer: list[str],
    fail_if: str,
    reason: str,
    as_user: str,
    version: int | None,
    wait: bool,
    here: bool,
    timeout: float,
    junit: Path | None,
    json_out: Path | None,
    **_: Any,
) -> None:
    if not 0 <= timeout <= MAX_TIMEOUT:  # NaN too: compared with it, the deadline never comes
        raise CommandError(f"--timeout must be a number of seconds from 0 to {MAX_TIMEOUT:g}", returncode=REFUSED)
    _can_write(json_out)
    _can_write(junit)
    user = selectors.user_named(as_user)
    if user is None:
        raise CommandError(f"no user {as_user}", returncode=REFUSED)
    try:
        ws = access.workspace_by_path(workspace)
        made = evaluations.start_evaluation(
            workspace=ws,
            dataset=dataset,
            version=version,
            change=_change(change),
            scorers=_scorers(scorer),
            fail_if=fail_if,
            reason=reason or f"evaluate {', '.join(change)} on {dataset}",
            by=user,
        )
    except LedgerError as exc:
        raise CommandError(exc.message, returncode=REFUSED) from exc
    cmd.stderr.write(f"evaluation {made.public_id} {made.status}")
    if made.status == Evaluation.Status.PENDING_APPROVAL:
        cmd.stderr.write("outside every evaluation policy: it waits for an approver on the Approvals page")
    evaluation = made
    if wait or here:
        deadline = time.monotonic() + timeout
        while True:
            # --here executes what is approved in this process; a request a worker of the
            # deployment took first is its to finish, so --here waits for it like --wait does.
            evaluation = evaluations.execute_here(made) if here else evaluations.advance(made.pk) or made
            if evaluation.status not in (Evaluation.Status.PENDING_APPROVAL, Evaluation.Status.RUNNING):
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(0.5)
    document = evaluations.evaluation_json(evaluation)
    if json_out is not None:
        json_out.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if junit is not None and evaluation.status == Evaluation.Status.FINISHED:
        junit.write_text(evaluations.junit_xml(evaluation) + "\n", encoding="utf-8")
    aggregates = (evaluation.report or {}).get("aggregates") or {}
    cmd.stdout.write(
        json.dumps(
            {
                "id": evaluation.public_id,
                "status": evaluation.status,
                "verdict": evaluation.verdict or None,
                "passRate": aggregates.get("passRate"),
                "changed": aggregates.get("changed"),
                "costDelta": aggregates.get("costDelta"),
                "spendUsd": aggregates.get("spendUsd"),
                "unpricedCalls": document["unpricedCalls"],  # above 0: spendUsd is a lower bound
            },
            sort_keys=True,
        )
    )
    if not (wait or here):
        return
    code = (
        EXIT.get(Evaluation.Verdict(evaluation.verdict), NO_VERDICT)
        if evaluation.status == Evaluation.Status.FINISHED
        else NO_VERDICT
    )
    if code:
        why = (evaluation.budget_reason or {}).get("message")  # which ceiling stopped it, and why
        cmd.stderr.write(f"verdict: {evaluation.verdict or evaluation.status}" + (f": {why}" if why else ""))
        sys.exit(code)
