"""After-commit announcements of appended events on the channel layer.

The layer is lossy by design: a message carries only the run and its last sequence, and readers
always fetch the events themselves from the database.
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from .models import Run

log = logging.getLogger(__name__)


def group_for(run_pk: int) -> str:
    return f"ledger.run.{run_pk}"


def _send(group: str, run_id: str, sequence: int) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, {"type": "ledger.appended", "runId": run_id, "sequence": sequence})
    except Exception:  # an announcement lost is caught up by readers; the append has committed
        log.warning("announcement for %s seq %s was lost", run_id, sequence, exc_info=True)


def after_commit(run: Run, sequence: int) -> None:
    group, run_id = group_for(run.pk), run.run_id
    # Only after commit: a reader woken by this must find the rows it is told about.
    transaction.on_commit(lambda: _send(group, run_id, sequence))
