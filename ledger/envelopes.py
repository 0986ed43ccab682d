"""The event envelope as clients see it: {eventId, runId, sequence, type, occurrenceId?, recordedAt, payload}."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from .models import Event


def format_recorded_at(moment: datetime) -> str:
    """ISO 8601, UTC, milliseconds, `Z` (Little Workflow's form)."""
    moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def envelope(
    *,
    event_id: str,
    run_id: str,
    sequence: int,
    type: str,
    occurrence_id: str | None,
    recorded_at: datetime,
    payload: Any,
) -> dict[str, Any]:
    env: dict[str, Any] = {"eventId": event_id, "runId": run_id, "sequence": sequence, "type": type}
    if occurrence_id is not None:
        env["occurrenceId"] = occurrence_id
    env["recordedAt"] = format_recorded_at(recorded_at)
    env["payload"] = payload
    return env


def event_envelope(event: Event, run_id: str) -> dict[str, Any]:
    return envelope(
        event_id=event.event_id,
        run_id=run_id,
        sequence=event.sequence,
        type=event.type,
        occurrence_id=event.occurrence_id,
        recorded_at=event.recorded_at,
        payload=json.loads(event.payload),
    )
