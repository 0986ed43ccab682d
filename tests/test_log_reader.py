"""The plain-cursor log reader returns exactly the envelopes the ORM gives (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from ledger.log.envelopes import log_of
from ledger.log.verify import verify_run
from ledger.models import Event, Run
from ledger.reads import selectors
from tests.conftest import ev, started

# Payloads whose decoding could differ between JSON decoders: escapes, non-BMP text, control
# characters, the integer limits canonical JSON allows, floats, deep nesting, key order.
PAYLOADS: list[dict[str, Any]] = [
    # Every control character but NUL, which the write path refuses (ledger.limits).
    {"text": 'caf\u00e9 \u2603 \U0001f600 "quoted" back\\slash \n\t\u0001\u001f \u2028', "é": 1, "a": 2},
    {
        "big": 2**53 - 1,
        "small": -(2**53 - 1),
        "zero": 0,
        "negative_zero": -0.0,
        "float": 0.1,
        "tiny": 5e-324,
        "huge": 1e21,
        "third": 1 / 3,
        "exp": 1.5e-7,
    },
    {"nested": {"z": [1, [2, [3, {"y": None, "x": True, "w": False}]]], "a": {}}, "list": []},
    {"\U0001f600": "key outside the BMP", "\uffff": "last BMP key", "A": "upper", "a": "lower"},
    {"deep": json.loads("[" * 60 + "]" * 60)},
]
# Times with sub-millisecond parts: recordedAt keeps milliseconds, truncated, never rounded up.
MOMENTS = [
    datetime(2026, 11, 30, 10, 0, 0, 999_999, tzinfo=UTC),
    datetime(2026, 11, 30, 10, 0, 1, 0, tzinfo=UTC),
    datetime(2026, 12, 31, 23, 59, 59, 123_456, tzinfo=UTC),
    datetime(2027, 1, 1, 0, 0, 0, 500, tzinfo=UTC),
]


def orm_envelopes(run: Run, **filters: Any) -> list[dict[str, Any]]:
    """The envelopes as the ORM path built them before the plain-cursor reader (the reference)."""
    rows = Event.objects.filter(run=run, **filters).order_by("sequence")
    out = []
    for e in rows:
        at = e.recorded_at.astimezone(UTC)
        env: dict[str, Any] = {"eventId": e.event_id, "runId": run.run_id, "sequence": e.sequence, "type": e.type}
        if e.occurrence_id is not None:
            env["occurrenceId"] = e.occurrence_id
        env["recordedAt"] = at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"
        env["payload"] = json.loads(e.payload)
        out.append(env)
    return out


def exactly(envelopes: list[dict[str, Any]]) -> str:
    """Equality that also sees key order and int/float/bool types (1 == 1.0 == True otherwise)."""
    return json.dumps(envelopes, ensure_ascii=False)


@pytest.fixture
def rich_run(workspace, append, monkeypatch: pytest.MonkeyPatch) -> Run:
    moments = iter(MOMENTS)
    monkeypatch.setattr("ledger.clock.recorded_now", lambda: next(moments))
    append("run_rich", started(label="rich"), *[ev("custom.blob", **p) for p in PAYLOADS[:2]])
    append("run_rich", {"type": "custom.occurring", "occurrenceId": "occ-1", "payload": PAYLOADS[2]})
    append("run_rich", *[ev("custom.blob", **p) for p in PAYLOADS[2:]], ev("StepScheduled", stepPath="a"))
    append("run_rich", ev("RunCompleted", output={"ok": True}))
    return Run.objects.get(run_id="run_rich")


@pytest.mark.django_db
def test_the_log_reads_exactly_as_the_orm_built_it(rich_run: Run) -> None:
    expected = orm_envelopes(rich_run)
    assert len(expected) == 9
    assert {e["recordedAt"] for e in expected} == {
        "2026-11-30T10:00:00.999Z",
        "2026-11-30T10:00:01.000Z",
        "2026-12-31T23:59:59.123Z",
        "2027-01-01T00:00:00.000Z",
    }
    assert exactly(log_of(rich_run)) == exactly(expected)
    assert log_of(rich_run) == expected


@pytest.mark.django_db
def test_reading_after_a_sequence_with_a_limit_or_a_type_prefix_matches_the_orm(rich_run: Run) -> None:
    assert exactly(selectors.events(rich_run, after=3, limit=4)) == exactly(orm_envelopes(rich_run, sequence__gt=3)[:4])
    assert exactly(selectors.events(rich_run, type_prefix="custom.")) == exactly(
        orm_envelopes(rich_run, type__startswith="custom.")
    )
    # LIKE wildcards in the prefix are literal characters, as the ORM escapes them.
    assert selectors.events(rich_run, type_prefix="custom%") == []
    assert selectors.events(rich_run, after=9) == []


@pytest.mark.django_db
def test_a_log_read_by_the_fast_reader_still_verifies(rich_run: Run) -> None:
    assert [c.status for c in verify_run(rich_run)] == ["pass"] * len(verify_run(rich_run))
