from __future__ import annotations

import gc

from django.apps import AppConfig
from django.conf import settings


class LedgerConfig(AppConfig):
    name = "ledger"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .log import hooks, proofs
        from .reexecution import worker
        from .tenancy import repricing

        # A long run's log proof and fold snapshots, made by the worker when the run ends.
        hooks.on_run_ended(proofs.queue_proof)
        # The worker's sweep queues again a workspace's reprice whose task was lost.
        worker.on_sweep("reprices", repricing.recover_stalled)
        # The cyclic collector's youngest-generation threshold for the whole process
        # (console/settings.py, RUNLEDGER_GC_THRESHOLD); the older generations keep Python's.
        threshold = getattr(settings, "RUNLEDGER_GC_THRESHOLD", None)
        if threshold is not None:
            _, middle, oldest = gc.get_threshold()
            gc.set_threshold(threshold, middle, oldest)
