"""Property-based API conformance: schemathesis drives every operation in /api/schema/ against a
live server and checks that no input produces a server error and that every response matches
the schema. Bounded: SCHEMATHESIS_EXAMPLES examples per operation (default 15)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance

from ledger.demo import load_demo
from ledger.tenancy.access import workspace_by_path
from ledger.tenancy.services import create_key

EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "15"))


@pytest.mark.django_db(transaction=True)
def test_no_server_errors_and_responses_match_the_schema(live_server: Any) -> None:
    load_demo(history_runs=10)
    _, key = create_key(workspace=workspace_by_path("acme/support"), scopes=["ingest", "read", "execute"])
    headers = {"Authorization": f"Bearer {key}"}
    schema = schemathesis.openapi.from_url(f"{live_server.url}/api/schema/")
    operations = [result.ok() for result in schema.get_all_operations()]
    # The stream stays open while its run is live; it has its own tests (tests/test_stream.py).
    operations = [op for op in operations if not op.path.endswith("/stream")]
    assert len(operations) >= 15, [op.path for op in operations]
    failures: dict[str, str] = {}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def check(case: Any) -> None:
            case.call_and_validate(
                base_url=live_server.url, headers=headers, checks=[not_a_server_error, response_schema_conformance]
            )

        try:
            check()
        except Exception as exc:  # collected so that one run reports every failing operation
            failures[f"{operation.method.upper()} {operation.path}"] = str(exc)[:2000]
    print(f"schemathesis: {len(operations)} operations, up to {EXAMPLES} examples each")
    assert not failures, "\n\n".join(f"{op}:\n{text}" for op, text in failures.items())
