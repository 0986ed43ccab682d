"""`manage.py ledger …`: the operations of API.md, one subcommand each."""

from __future__ import annotations

import json
import sys
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger import selectors, tenancy
from ledger.errors import LedgerError
from ledger.models import Run


def _run_for(run_id: str, workspace: str | None) -> Run:
    if workspace:
        return selectors.get_run(tenancy.workspace_by_path(workspace), run_id)
    matches = list(Run.objects.filter(run_id=run_id).select_related("workspace__tenant")[:2])
    if not matches:
        raise LedgerError(f"run {run_id} not found")
    if len(matches) > 1:
        raise LedgerError(f"run id {run_id} exists in several workspaces; pass --workspace T/W")
    return matches[0]


def _json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CommandError(f"--input is not JSON: {exc}") from exc


class Command(BaseCommand):
    help = "Runledger operations (see API.md, Operations)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

        p = sub.add_parser("bootstrap", help="create tenant and workspace if absent")
        p.add_argument("--tenant", required=True)
        p.add_argument("--workspace", required=True)

        p = sub.add_parser("create-user", help="create or update a member")
        p.add_argument("name")
        p.add_argument("--tenant", required=True)
        p.add_argument("--role", required=True, choices=["viewer", "operator", "approver", "admin"])
        p.add_argument("--password")

        p = sub.add_parser("create-key", help="print a new API key, alone on its line")
        p.add_argument("--workspace", required=True, help="TENANT/WORKSPACE")
        p.add_argument("--scopes", required=True, help="comma-separated: ingest,read,execute")
        p.add_argument("--name", default="")

        p = sub.add_parser("demo", help="bootstrap the demo tenants, users and runs (idempotent)")
        p.add_argument("--history-runs", type=int, default=None,
                       help="how many runs to lay out over the last 30 days (default 300)")

        p = sub.add_parser("events", help="one JSON envelope per line, in sequence order")
        p.add_argument("run")
        p.add_argument("--workspace", help="TENANT/WORKSPACE (needed when the run id is ambiguous)")
        p.add_argument("--type", dest="type_filter", help="exact type, or PREFIX* for a prefix")

        p = sub.add_parser("verify", help="integrity of one run or all; exit 1 on any failure")
        p.add_argument("run", nargs="?")
        p.add_argument("--workspace")

        p = sub.add_parser("rebuild", help="rebuild projections of one run or all from the log")
        p.add_argument("run", nargs="?")
        p.add_argument("--workspace")

        sub.add_parser("reprice", help="recompute cost entries from the recorded tokens after a price change")

        p = sub.add_parser("report", help="usage and cost per step")
        p.add_argument("run")
        p.add_argument("--workspace")
        p.add_argument("--table", action="store_true", help="a fixed-width table instead of JSON")

        p = sub.add_parser("replay-plan", help="what a resume would do, without doing it")
        p.add_argument("run")
        p.add_argument("--workspace")

        p = sub.add_parser("run", help="run a registered workflow; prints the run id alone on its line")
        p.add_argument("workflow")
        p.add_argument("--input", required=True, help="the run input, JSON")
        p.add_argument("--workspace", required=True, help="TENANT/WORKSPACE")
        p.add_argument("--run-id", help="the id to start (or resume) under; a new one by default")
        p.add_argument("--module", action="append", default=[], help="import this module to register workflows")

        p = sub.add_parser("resume", help="continue a run from where its log ends")
        p.add_argument("run")
        p.add_argument("--workspace")
        p.add_argument("--input", help="the run input, JSON; must equal the original when given")
        p.add_argument("--take-over", action="store_true", help="take the run lease from a live executor")
        p.add_argument("--module", action="append", default=[], help="import this module to register workflows")

        p = sub.add_parser("reexecute", help="request a re-execution as a member (simulate starts at once; "
                                             "other modes wait for an approver); prints the request id")
        p.add_argument("run")
        p.add_argument("--mode", required=True, choices=["simulate", "evaluate", "resume", "fork", "rerun"])
        p.add_argument("--reason", required=True)
        p.add_argument("--as", dest="as_user", required=True, help="the requesting member's username (operator+)")
        p.add_argument("--workspace", help="TENANT/WORKSPACE (needed when the run id is ambiguous)")
        p.add_argument("--from-step", help="fork: the first step that runs live")
        p.add_argument("--input", help="fork: the new run's input, JSON")

        p = sub.add_parser("worker", help="execute approved re-executions from the queue (django-tasks), sweep "
                                          "expired approvals and stalled requests; Ctrl-C stops it")
        p.add_argument("--batch", action="store_true", help="exit once the queue is empty")
        p.add_argument("--interval", type=float, default=1.0, help="seconds between looks at an empty queue")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        try:
            getattr(self, "_" + action.replace("-", "_"))(**options)
        except LedgerError as exc:
            raise CommandError(exc.message) from exc

    def _reexecute(self, *, run: str, mode: str, reason: str, as_user: str, workspace: str | None,
                   from_step: str | None, input: str | None, **_: Any) -> None:
        from django.contrib.auth import get_user_model

        from ledger.reexecution import services

        the_run = _run_for(run, workspace)
        user = get_user_model().objects.filter(username=as_user).first()
        if user is None:
            raise CommandError(f"no user {as_user}")
        made = services.request_reexecution(
            workspace=the_run.workspace, run_id=the_run.run_id, mode=mode, reason=reason, by=user,
            from_step=from_step, input=_json_arg(input) if input is not None else services.NOT_GIVEN)
        self.stdout.write(f"{made.public_id} {made.status}")

    def _worker(self, *, batch: bool, interval: float, **_: Any) -> None:
        from ledger.reexecution.worker import run_worker

        run_worker(interval=interval, batch=batch)

    def _bootstrap(self, *, tenant: str, workspace: str, **_: Any) -> None:
        ws = tenancy.bootstrap(tenant=tenant, workspace=workspace)
        self.stdout.write(f"workspace {ws.tenant.slug}/{ws.slug} ready")

    def _create_user(self, *, name: str, tenant: str, role: str, password: str | None, **_: Any) -> None:
        m = tenancy.create_user(username=name, tenant=tenant, role=role, password=password)
        self.stdout.write(f"{m.user.username} is {m.role} of {tenant}")

    def _create_key(self, *, workspace: str, scopes: str, name: str, **_: Any) -> None:
        ws = tenancy.workspace_by_path(workspace)
        _api_key, key = tenancy.create_key(workspace=ws, scopes=scopes.split(","), name=name)
        self.stdout.write(key)

    def _demo(self, *, history_runs: int | None = None, **_: Any) -> None:
        from ledger.demo import DEMO_PASSWORD, HISTORY_RUNS, load_demo

        if history_runs is not None and history_runs < 0:
            raise CommandError("--history-runs must be 0 or more")
        summary = load_demo(history_runs=HISTORY_RUNS if history_runs is None else history_runs)
        self.stdout.write(f"demo ready: {summary}")
        self.stdout.write(f"log in as alice (admin), bob (approver), carol (operator) or dave (viewer), "
                          f"password {DEMO_PASSWORD}")

    def _events(self, *, run: str, workspace: str | None, type_filter: str | None, **_: Any) -> None:
        the_run = self._existing(run, workspace)
        prefix, exact = None, None
        if type_filter:
            prefix, exact = (type_filter[:-1], None) if type_filter.endswith("*") else (None, type_filter)
        for env in selectors.events(the_run, type_prefix=prefix):
            if exact is None or env["type"] == exact:
                self.stdout.write(json.dumps(env, ensure_ascii=False, separators=(",", ":")))

    def _runs(self, run: str | None, workspace: str | None) -> Any:
        if run:
            return [_run_for(run, workspace)]
        qs = Run.objects.select_related("workspace__tenant").order_by("pk")
        return qs.filter(workspace=tenancy.workspace_by_path(workspace)) if workspace else qs

    def _rebuild(self, *, run: str | None, workspace: str | None, **_: Any) -> None:
        from ledger.projection import rebuild

        count = 0
        for target in self._runs(run, workspace):
            rebuild(target)
            count += 1
        self.stdout.write(f"rebuilt projections of {count} run(s)")

    def _reprice(self, **_: Any) -> None:
        from ledger.projection import reprice

        runs, changed = reprice(Run.objects.select_related("workspace").order_by("pk"))
        self.stdout.write(f"repriced {runs} run(s): {changed} cost entr{'y' if changed == 1 else 'ies'} changed")

    def _report(self, *, run: str, workspace: str | None, table: bool, **_: Any) -> None:
        from ledger.fold import fold
        from ledger.projection import log_of, prices_for
        from ledger.report import render_report_table, usage_report

        the_run = self._existing(run, workspace)
        report = usage_report(fold(log_of(the_run), prices=prices_for(the_run.workspace), run_id=the_run.run_id))
        if table:
            self.stdout.write(render_report_table(report), ending="")
        else:
            self.stdout.write(json.dumps(report, indent=2))

    def _replay_plan(self, *, run: str, workspace: str | None, **_: Any) -> None:
        from ledger.plans import replay_plan_for

        self.stdout.write(json.dumps(replay_plan_for(self._existing(run, workspace)), indent=2))

    def _run(self, *, workflow: str, input: str, workspace: str, run_id: str | None, module: list[str],
             **_: Any) -> None:
        from ledger.runtime.executor import new_run_id, start_run
        from ledger.runtime.registry import get_workflow, load_modules

        run_input = _json_arg(input)  # before anything is printed or created
        load_modules(module)
        get_workflow(workflow)  # an unknown name is refused before a run id is handed out
        ws = tenancy.workspace_by_path(workspace)
        run_id = run_id or new_run_id()
        self.stdout.write(run_id)
        self.stdout.flush()  # the id is known to the caller even if the executor dies
        outcome = self._report_outcome(lambda: start_run(workspace=ws, workflow=workflow, input=run_input,
                                                         run_id=run_id))
        if outcome.status != "completed":
            sys.exit(1)

    def _resume(self, *, run: str, workspace: str | None, input: str | None, take_over: bool, module: list[str],
                **_: Any) -> None:
        from ledger.runtime.executor import resume_run
        from ledger.runtime.registry import load_modules

        load_modules(module)
        the_run = self._existing(run, workspace)
        kwargs: dict[str, Any] = {"input": _json_arg(input)} if input is not None else {}
        outcome = self._report_outcome(lambda: resume_run(workspace=the_run.workspace, run_id=the_run.run_id,
                                                          take_over=take_over, **kwargs))
        self.stdout.write(json.dumps({"runId": outcome.run_id, "status": outcome.status,
                                      "output": outcome.output, "error": outcome.error}))
        if outcome.status != "completed":
            sys.exit(1)

    def _report_outcome(self, execute: Any) -> Any:
        from ledger.gateway import ToolCallInDoubt
        from ledger.replay import CapabilityDriftError

        try:
            outcome = execute()
        except CapabilityDriftError as exc:
            raise CommandError(f"CapabilityDriftError: {exc}") from exc
        except ToolCallInDoubt as exc:
            raise CommandError(f"ToolCallInDoubt: {exc.message}", returncode=3) from exc
        self.stderr.write(f"run {outcome.run_id} {outcome.status}")
        return outcome

    def _existing(self, run: str, workspace: str | None) -> Run:
        try:
            return _run_for(run, workspace)
        except LedgerError as exc:
            self.stderr.write(exc.message)
            sys.exit(1)

    def _verify(self, *, run: str | None, workspace: str | None, **_: Any) -> None:
        from ledger.verify import verify_run

        targets = self._runs(run, workspace)
        failures = 0
        checked = 0
        for target in targets:
            checked += 1
            report = verify_run(target)
            for check in report:
                if check.status == "fail":
                    failures += 1
                    self.stdout.write(f"FAIL {target.workspace}/{target.run_id} {check.name}: {check.detail}")
        self.stdout.write(f"verified {checked} run(s): {'ok' if not failures else f'{failures} failure(s)'}")
        if failures:
            sys.exit(1)
