"""Evaluation benchmark: a regression evaluation of 100 recorded runs vs folding the same runs.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/runledger_bench_eval \\
        .venv/bin/python bench/evaluation.py [--runs 100] [--profile]

--runs recorded `support.triage` runs (the demo's workflow: a code step, an AI step of two
scripted model turns that asks for one tool call, a tool step; 16 events each) go into a dataset;
an approver's evaluation policy covers it; then one evaluation of a model mapping (the same
scripted answers under another model id, so every outcome is kept) with the `exact` scorer runs
inside the policy, executed in this process (`execute_here`, what `ledger evaluate --here` does):
every run re-executed in mode `evaluate` (models live through the scripted provider, every tool
call served from the record), scored (a `custom.evaluation.scored` event appended to each new
run), and reported (a divergence report per run, the aggregates, the verdict).

The baselines, in the same process on the same PostgreSQL: `fold` (ledger.fold.fold over every
run's envelopes, in memory) and `read + fold` (log_of, then fold). The figure is the evaluation's
wall time as a ratio to each, and where the time goes: starting (the batch of requests, the
policy's approval), executing the re-executions, scoring, and the report (timed again alone:
it is read-only). DEBUG is off. It runs `migrate`: use a scratch database. Its rows are deleted
at the end; the workspace stays with its audit entries (the audit log is insert-only).
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: import the bench package from the repository root (bench/common.py)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import cleanup, median_seconds, profile, record, require_postgres, setup_django  # noqa: E402

TICKETS = [
    ("Where is my parcel?", "A-1"),
    ("My order is late.", "B-2"),
    ("Parcel lost.", "C-3"),
    ("Wrong door.", "D-4"),
]


def _delete_evaluation_rows(workspace: Any) -> None:
    from ledger.models import Dataset, DatasetVersion, Evaluation, EvaluationPolicy

    Evaluation.objects.filter(workspace=workspace).delete()
    EvaluationPolicy.objects.filter(workspace=workspace).delete()
    DatasetVersion.objects.filter(dataset__workspace=workspace).delete()
    Dataset.objects.filter(workspace=workspace).delete()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/evaluation.py")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3, help="repeats of each baseline (the evaluation runs once)")
    parser.add_argument("--profile", action="store_true", help="profile a second evaluation")
    args = parser.parse_args(argv)
    require_postgres("bench/evaluation.py")
    setup_django(production=True)

    from ledger.evaluation import datasets, evaluations, policies
    from ledger.fold import fold
    from ledger.fold.pricing import prices_for
    from ledger.log.envelopes import log_of
    from ledger.models import Evaluation, Run
    from ledger.reexecution import executor
    from ledger.runtime.executor import start_run
    from ledger.tenancy.services import bootstrap, create_user

    slug = f"eval-{time.strftime('%Y%m%d%H%M%S')}"
    workspace = bootstrap(tenant="bench", workspace=slug)
    operator = create_user(
        username=f"bench-op-{slug}", tenant="bench", role="operator", password=secrets.token_urlsafe(12)
    ).membership.user
    approver = create_user(
        username=f"bench-ap-{slug}", tenant="bench", role="approver", password=secrets.token_urlsafe(12)
    ).membership.user
    try:
        run_ids = []
        for i in range(args.runs):
            ticket, order = TICKETS[i % len(TICKETS)]
            outcome = start_run(
                workspace=workspace,
                workflow="support.triage",
                run_id=f"run_bench_eval_{i:04d}",
                input={"ticket": f"{ticket} #{i}", "orderId": order},
            )
            run_ids.append(outcome.run_id)
        runs = list(Run.objects.filter(workspace=workspace, run_id__in=run_ids))
        prices = prices_for(workspace)
        logs = [log_of(r) for r in runs]
        events = sum(len(log) for log in logs)
        fold_s = median_seconds(lambda: [fold(log, prices=prices) for log in logs], args.repeat)
        read_fold_s = median_seconds(lambda: [fold(log_of(r), prices=prices) for r in runs], args.repeat)

        datasets.add_runs(workspace=workspace, name="bench", run_ids=run_ids, by=operator)
        policies.approve_policy(
            workspace=workspace,
            dataset="bench",
            change_kinds=["model"],
            scorers=["exact"],
            ceiling_per_evaluation_usd="100",
            ceiling_per_day_usd="1000",
            ttl_hours=1,
            by=approver,
        )

        scored = [0.0]  # seconds inside evaluations._score (the after_request hook's scoring)
        original_score = evaluations._score

        def timed_score(*a: Any, **k: Any) -> Any:
            began = time.perf_counter()
            try:
                return original_score(*a, **k)
            finally:
                scored[0] += time.perf_counter() - began

        evaluations._score = timed_score  # type: ignore[assignment]  # the bench's stopwatch, its own process

        def evaluate(*, timed: dict[str, float] | None = None) -> Evaluation:
            scored[0] = 0.0
            t0 = time.perf_counter()
            made = evaluations.start_evaluation(
                workspace=workspace,
                dataset="bench",
                change={"kind": "model", "modelOverrides": {"default": {"provider": "scripted", "model": "gpt-4o"}}},
                scorers=["exact"],
                fail_if="pass_rate < 0.95",
                reason="bench",
                by=operator,
            )
            t1 = time.perf_counter()
            execute_s = 0.0
            for pk in sorted(made_requests(made)):
                a = time.perf_counter()
                executor.run_request(request_pk=pk, owner=None)  # its after_request hook scores the run
                execute_s += time.perf_counter() - a
            b = time.perf_counter()
            done = evaluations.advance(made.pk) or made
            t2 = time.perf_counter()
            if timed is not None:
                timed.update(
                    start=t1 - t0, execute=execute_s - scored[0], score=scored[0], finish=t2 - b, total=t2 - t0
                )
            return done

        def made_requests(made: Evaluation) -> list[int]:
            from ledger.models import ReexecutionRequest

            return list(ReexecutionRequest.objects.filter(batch_id=made.batch_id).values_list("pk", flat=True))

        timed: dict[str, float] = {}
        done = evaluate(timed=timed)
        assert done.verdict == "passed" and done.report is not None, (done.status, done.verdict)
        aggregates = done.report["aggregates"]
        assert aggregates["runs"] == args.runs and aggregates["passRate"] == 1.0 and aggregates["liveToolCalls"] == 0
        requests = made_requests(done)
        report_s = median_seconds(lambda: evaluations.build_report(done, _requests(done)), 1)
        total = timed["total"]
        print(f"{args.runs} recorded runs, {events} events; evaluation {done.public_id}: {done.verdict}")
        execute_s = total - timed["start"] - timed["score"] - report_s
        print(f"{'what':<34} {'ms':>10} {'share':>7}")
        for name, seconds, share in (
            ("fold (baseline)", fold_s, False),
            ("read + fold (baseline)", read_fold_s, False),
            ("evaluation, whole", total, False),
            ("  start: batch + policy approval", timed["start"], True),
            ("  execute the re-executions", execute_s, True),
            ("  score, append the scored events", timed["score"], True),
            ("  report: a divergence per run", report_s, True),
        ):
            print(f"{name:<34} {seconds * 1000:10.1f} {f'{seconds / total:6.0%}' if share else '':>7}")
        print(
            f"\nevaluation / fold: {total / fold_s:.0f}x; / read + fold: {total / read_fold_s:.0f}x; "
            f"{total * 1000 / len(requests):.1f} ms per run"
        )
        record(
            "evaluation of 100 recorded runs / fold of the same runs",
            value=total * 1000,
            unit="ms",
            baseline=fold_s * 1000,
            ratio=total / fold_s,
            ratio_format="{:.0f}×",
            target="",
            met=None,
        )
        record(
            "evaluation of 100 recorded runs / read + fold of the same runs",
            value=total * 1000,
            unit="ms",
            baseline=read_fold_s * 1000,
            ratio=total / read_fold_s,
            ratio_format="{:.0f}×",
            target="",
            met=None,
        )
        if args.profile:
            profile("evaluation", evaluate, top=30)
    finally:
        _delete_evaluation_rows(workspace)
        cleanup(workspace, list(Run.objects.filter(workspace=workspace).values_list("run_id", flat=True)))
    return 0


def _requests(evaluation: Any) -> list[Any]:
    from ledger.models import ReexecutionRequest

    return list(ReexecutionRequest.objects.filter(batch_id=evaluation.batch_id).order_by("original_run_id"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
