"""Re-execution benchmark: simulating a recorded run vs folding the same run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/runledger_bench_reexec \\
        .venv/bin/python bench/reexec.py [--events 1000] [--repeat 5] [--profile]

One run of about --events events is recorded by the runtime (a scripted agent workflow: AI steps
of several model turns, each asking for one tool call), then, in the same process on the same
PostgreSQL:

  fold             ledger.fold.fold over the run's envelopes (pure, in memory)
  read + fold      ledger.log.envelopes.log_of (the ORM read, JSON decoded) then fold
  simulate         ledger.runtime.reexecute.execute_reexecution(mode="simulate") into a fresh
                   run: read and fold the original, execute the workflow's code, serve every
                   model and tool call from the record, append the new run's events through the
                   one write path (projections included), verify nothing diverged

Each figure is the median of --repeat runs, printed with its ratio to `fold` (the first figure
of issue 11) and to `read + fold`. --profile runs one more simulation under cProfile afterwards.
DEBUG is off (Django would keep every query). It runs `migrate` on the target database: use a
scratch database, as above. The bench workspace and its runs are deleted at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: import the bench package from the repository root (bench/common.py)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import cleanup, median_seconds, profile, record, require_postgres, setup_django  # noqa: E402

TURNS = 8  # per AI step: 7 turns asking for a tool call, then the answer
EVENTS_PER_STEP = 5 + 4 * (TURNS - 1) + 2  # scheduled, attempt, session start/end, completed + calls


def lookup(args: Any) -> dict[str, Any]:
    return {"orderId": args["orderId"], "status": "shipped", "lines": [{"sku": f"sku-{i}", "qty": i} for i in range(5)]}


def script(request: Any) -> dict[str, Any]:
    if request.turn < TURNS:
        return {
            "toolCalls": [
                {"id": f"c{request.turn}", "name": "lookup", "args": {"orderId": f"{request.step_path}-{request.turn}"}}
            ],
            "usage": {"inputTokens": 300 + 40 * request.turn, "cachedInputTokens": 200, "outputTokens": 25},
        }
    return {
        "text": f"All {TURNS - 1} orders of {request.step_path} shipped.",
        "usage": {"inputTokens": 700, "outputTokens": 60},
    }


def build_workflow(steps: int) -> Any:
    from ledger.runtime.providers import ScriptedProvider
    from ledger.runtime.registry import AIGenerate, CodeRun, Tool, Workflow, register

    def prepare(run_input: Any, outputs: Any) -> dict[str, Any]:
        return {"customer": run_input["customer"], "steps": steps}

    def prompt(index: int) -> Any:
        def make(run_input: Any, outputs: Any) -> str:
            return f"Check the orders of batch {index} for {outputs['prepare']['customer']}"

        make.__qualname__ = "batch_prompt"
        return make

    return register(
        Workflow(
            name="bench.reexec",
            steps=(
                CodeRun("prepare", prepare),
                *(
                    AIGenerate(f"batch{i}", prompt(i), system="You check orders.", tools=("lookup",), max_turns=TURNS)
                    for i in range(steps)
                ),
            ),
            tools={
                "lookup": Tool(
                    "lookup",
                    lookup,
                    description="Look an order up",
                    parameters={"type": "object", "properties": {"orderId": {"type": "string"}}},
                )
            },
            models={"default": ScriptedProvider(script=script, name="openai", model_id="gpt-4o-mini")},
        )
    )


def commits_of(run: Any) -> int:
    """The transactions that wrote a run's events: rows inserted by one transaction share its xmin."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT count(DISTINCT xmin::text) FROM ledger_event WHERE run_id = %s", [run.pk])
        return int(cur.fetchone()[0])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/reexec.py")
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    require_postgres("bench/reexec.py")
    # DEBUG makes Django keep every query it ran; production runs without it, so the bench does.
    setup_django(production=True)

    from ledger.fold import fold
    from ledger.fold.pricing import prices_for
    from ledger.log.envelopes import log_of
    from ledger.models import Run
    from ledger.replay.divergence import divergence_report
    from ledger.runtime.executor import start_run
    from ledger.runtime.reexecute import execute_reexecution
    from ledger.tenancy.services import bootstrap

    steps = max(1, round((args.events - 3) / EVENTS_PER_STEP))
    workflow = build_workflow(steps)
    workspace = bootstrap(tenant="bench", workspace=f"reexec-{time.strftime('%Y%m%d%H%M%S')}")
    run_ids: list[str] = []
    try:
        original = start_run(workspace=workspace, workflow=workflow, input={"customer": "acme"})
        run_ids.append(original.run_id)
        run = Run.objects.get(workspace=workspace, run_id=original.run_id)
        prices = prices_for(workspace)
        log = log_of(run)

        def simulate() -> None:
            new = "run_sim_" + uuid.uuid4().hex
            run_ids.append(new)
            outcome = execute_reexecution(
                workspace=workspace,
                original_run_id=original.run_id,
                mode="simulate",
                new_run_id=new,
                reexecution_id="bench",
            )
            assert outcome.status == "completed" and outcome.output == original.output, outcome

        simulate()  # warm: imports, plan cache, the prices
        report = divergence_report(workspace=workspace, original_run_id=original.run_id, new_run_id=run_ids[-1])
        assert report["firstDivergence"] is None and report["counts"]["identical"] == steps + 1
        fold_s = median_seconds(lambda: fold(log, prices=prices), args.repeat)
        read_fold_s = median_seconds(lambda: fold(log_of(run), prices=prices), args.repeat)
        simulate_s = median_seconds(simulate, args.repeat)
        simulated = Run.objects.get(workspace=workspace, run_id=run_ids[-1])
        new_events, commits = simulated.last_sequence, commits_of(simulated)

        print(
            f"original: {len(log)} events ({steps} AI steps of {TURNS} turns); a simulation writes "
            f"{new_events} events in {commits} commits ({commits / steps:.1f} per AI step); median of {args.repeat}"
        )
        print(f"{'what':<12} {'ms':>9} {'vs fold':>9} {'vs read+fold':>13}")
        for name, seconds in (("fold", fold_s), ("read + fold", read_fold_s), ("simulate", simulate_s)):
            print(f"{name:<12} {seconds * 1000:9.1f} {seconds / fold_s:8.1f}x {seconds / read_fold_s:12.1f}x")
        print(
            f"\nsimulate / fold: {simulate_s / fold_s:.1f}x ({simulate_s * 1000 / new_events:.2f} ms per event written)"
        )
        record(
            "re-execution: simulate / fold of the original",
            value=simulate_s * 1000,
            unit="ms",
            baseline=fold_s * 1000,
            ratio=simulate_s / fold_s,
            ratio_format="{:.0f}×",
            target="",
            met=None,
        )
        record(
            "re-execution: commits per simulated AI step",
            value=commits / steps,
            unit="commits",
            baseline=None,
            ratio=None,
            target="≤ 3",
            met=commits / steps <= 3,
        )
        if args.profile:
            profile("simulate", simulate, top=30)
    finally:
        cleanup(
            workspace,
            run_ids
            + [r for r in Run.objects.filter(workspace=workspace).values_list("run_id", flat=True) if r not in run_ids],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
