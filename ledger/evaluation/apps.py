from __future__ import annotations

from django.apps import AppConfig


class EvaluationConfig(AppConfig):
    """The evaluation package as an app of its own, for the hooks it hangs on re-execution."""

    name = "ledger.evaluation"
    label = "ledger_evaluation"

    def ready(self) -> None:
        from ..reexecution import execution, executor, worker
        from . import budget, evaluations

        # A request of an evaluation's batch changed: score it, and report once the batch is done.
        execution.on_change(evaluations.on_request_change)
        # The built-in executor is done with a request (its run released): score the new run.
        executor.after_request(evaluations.after_request)
        # Each live model call of an evaluation's request is checked against its spend ceiling.
        executor.register_guard_factory(budget.guard_for)
        # The worker's sweep finishes an evaluation whose batch ended while its hook failed.
        worker.on_sweep("evaluations", evaluations.advance_finished_batches)
