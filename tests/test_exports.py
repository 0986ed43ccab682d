"""Exports (docs/api.md "Export and interop"): `GET /api/v1/export/{runs|events|costs|audit}` through httpx
into Django's request handling in the test's process (and once over real HTTP through Daphne's
ASGI stack) and `ledger export`; each
file re-verified offline by `ledger verify --export FILE`, which must also catch what was changed
or cut out of one."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from ledger import clock
from ledger.demo.data import _summarize_run
from ledger.interop import exports
from ledger.log import append
from ledger.models import AuditEntry, Event, Workspace
from ledger.tenancy.services import create_key
from tests.conftest import IN_PROCESS, ev, http_client, log_in, started

pytestmark = pytest.mark.django_db(transaction=True)

V1 = "/api/v1"
FORMULA = '=HYPERLINK("http://evil.example/","x")'
DANGEROUS = ("=", "+", "-", "@", "\t", "\r")


# --- fixtures and helpers ------------------------------------------------------------------


@pytest.fixture
def key_client() -> Iterator[Callable[..., httpx.Client]]:
    clients: list[httpx.Client] = []

    def make(workspace: Workspace, scopes: str = "read") -> httpx.Client:
        _, key = create_key(workspace=workspace, scopes=scopes.split(","))
        client = http_client(headers={"Authorization": f"Bearer {key}"}, timeout=60)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def api(workspace: Workspace, key_client: Callable[..., httpx.Client]) -> httpx.Client:
    return key_client(workspace)


def seed(workspace: Workspace) -> None:
    """run_a: a finished run with priced model calls, a tool call and cells a spreadsheet would
    take for formulas; run_b: started only."""
    append(
        workspace=workspace,
        run_id="run_a",
        events=[
            *_summarize_run(("openai", "gpt-4o-mini"), finish=False),
            {"type": "custom.note", "payload": {"text": FORMULA, "quote": "'=1+1", "n": 1.5}, "occurrenceId": "=occ"},
            {"type": "custom.note", "payload": {"text": 'line\nbreak, "quoted"', "é": "ü"}},
        ],
    )
    append(workspace=workspace, run_id="run_b", events=[started("wfver_b", input={"x": "-1"})])


def error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["error"]["code"] == code, body
    return body["error"]["details"]


def jsonl(text: str) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    lines = [json.loads(line) for line in text.splitlines()]
    return lines[0], lines[1:-1], lines[-1]


def csv_parts(text: str) -> tuple[dict[str, Any], list[str], list[list[str]], str]:
    first, _, rest = text.partition("\r\n")
    assert first.startswith("# ")
    rows = list(csv.reader(io.StringIO(rest)))
    return json.loads(first[2:]), rows[0], rows[1:-1], rows[-1][0]


def verify_export(path: Path) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("ledger", "verify", "--export", str(path), stdout=out, stderr=io.StringIO())
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue()


def saved(tmp_path: Path, body: bytes, name: str = "export") -> Path:
    path = tmp_path / name
    path.write_bytes(body)
    return path


def stored_ids(workspace: Workspace) -> list[tuple[str, int, str]]:
    return list(
        Event.objects.filter(run__workspace=workspace)
        .order_by("run_id", "sequence")
        .values_list("run__run_id", "sequence", "event_id")
    )


# --- formats --------------------------------------------------------------------------------


def test_events_jsonl_names_its_schema_carries_ids_and_reverifies(workspace, api, tmp_path) -> None:
    seed(workspace)
    response = api.get(f"{V1}/export/events")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/x-ndjson"
    assert response.headers["content-disposition"].startswith('attachment; filename="runledger-events-')
    head, rows, end = jsonl(response.text)
    assert head["schemaVersion"] == 1 and head["export"] == "events" and head["format"] == "jsonl"
    assert end == {"end": {"rows": len(rows)}}
    assert [(r["runId"], r["sequence"], r["eventId"]) for r in rows] == stored_ids(workspace)
    assert {r["workspace"] for r in rows} == {"acme/support"}
    # The events are the envelopes GET …/events gives, plus the workspace.
    served = api.get(f"{V1}/runs/run_a/events?limit=500").json()["events"]
    assert [{k: v for k, v in r.items() if k != "workspace"} for r in rows if r["runId"] == "run_a"] == served
    code, out = verify_export(saved(tmp_path, response.content))
    assert code == 0, out
    assert f"{len(rows)} ids recomputed" in out and "2 run(s) dense from 1" in out


def test_events_csv_reverifies_and_no_cell_is_a_formula(workspace, api, tmp_path) -> None:
    seed(workspace)
    response = api.get(f"{V1}/export/events?format=csv")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/csv; charset=utf-8"
    head, columns, rows, end = csv_parts(response.text)
    assert head["schemaVersion"] == 1 and head["export"] == "events" and head["format"] == "csv"
    assert columns == exports.COLUMNS["events"]
    assert json.loads(end[2:]) == {"end": {"rows": len(rows)}}
    for row in rows:
        assert not any(cell.startswith(DANGEROUS) for cell in row), row
    note = next(r for r in rows if r[columns.index("occurrenceId")])
    assert note[columns.index("occurrenceId")] == "'=occ"
    assert [(r[1], int(r[2]), r[3]) for r in rows] == stored_ids(workspace)
    code, out = verify_export(saved(tmp_path, response.content))
    assert code == 0, out


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_runs_and_costs_exports(workspace, api, fmt) -> None:
    seed(workspace)
    runs = api.get(f"{V1}/export/runs?format={fmt}")
    costs = api.get(f"{V1}/export/costs?format={fmt}")
    assert runs.status_code == costs.status_code == 200
    if fmt == "jsonl":
        head, run_rows, _ = jsonl(runs.text)
        assert head["export"] == "runs"
        assert [(r["runId"], r["status"], r["lastSequence"]) for r in run_rows] == [
            ("run_a", "running", Event.objects.filter(run__run_id="run_a").count()),
            ("run_b", "running", 1),
        ]
        assert run_rows[0]["pricedCalls"] == 2 and run_rows[1]["input"] == {"x": "-1"}
        head, cost_rows, end = jsonl(costs.text)
        assert head["export"] == "costs" and end == {"end": {"rows": 2}}
        assert [(c["runId"], c["modelId"], c["inputTokens"]) for c in cost_rows] == [
            ("run_a", "gpt-4o-mini", 1200),
            ("run_a", "gpt-4o-mini", 1600),
        ]
        assert all(c["costUsd"] > 0 for c in cost_rows)
    else:
        _, columns, run_rows, _ = csv_parts(runs.text)
        assert columns == exports.COLUMNS["runs"]
        assert [r[1] for r in run_rows] == ["run_a", "run_b"]
        assert run_rows[1][columns.index("input")] == '{"x":"-1"}'
        _, columns, cost_rows, _ = csv_parts(costs.text)
        assert columns == exports.COLUMNS["costs"]
        assert [r[columns.index("inputTokens")] for r in cost_rows] == ["1200", "1600"]


# --- filters, keyset chunks ------------------------------------------------------------------


def test_filters_by_run_and_time(workspace, api) -> None:
    old = datetime(2026, 1, 10, 12, tzinfo=UTC)
    with clock.backdated(old):
        append(
            workspace=workspace,
            run_id="run_old",
            events=[started(), *_summarize_run(("openai", "gpt-4o-mini"), finish=False)[1:6]],
        )
    seed(workspace)

    def run_ids(query: str, kind: str = "events") -> list[str]:
        response = api.get(f"{V1}/export/{kind}?{query}")
        assert response.status_code == 200, response.text
        return sorted({row["runId"] for row in jsonl(response.text)[1]})

    assert run_ids("runId=run_b") == ["run_b"]
    assert run_ids("to=2026-01-10") == ["run_old"]  # that whole day
    assert run_ids("from=2026-01-11") == ["run_a", "run_b"]
    assert run_ids("from=2026-01-10T00:00:00Z&to=2026-01-10T12:00:01Z", "runs") == ["run_old"]
    assert run_ids("from=2026-01-10&to=2026-01-10", "costs") == ["run_old"]
    assert run_ids("runId=run_a", "costs") == ["run_a"]
    head = jsonl(api.get(f"{V1}/export/events?runId=run_b&from=2026-01-01").text)[0]
    assert head["filters"] == {"runId": "run_b", "from": "2026-01-01"}


def test_keyset_chunks_cover_every_row_once_in_order(workspace, api, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(exports, "CHUNK_ROWS", 3)
    monkeypatch.setattr(exports, "RUN_CHUNK", 2)
    sizes = [1, 4, 7, 3, 2]
    for n, size in enumerate(sizes):
        append(
            workspace=workspace,
            run_id=f"run_{n}",
            events=[started(), *[ev("custom.tick", i=i) for i in range(size - 1)]],
        )
    response = api.get(f"{V1}/export/events")
    _, rows, end = jsonl(response.text)
    assert [(r["runId"], r["sequence"]) for r in rows] == [
        (f"run_{n}", s) for n, size in enumerate(sizes) for s in range(1, size + 1)
    ]
    assert end == {"end": {"rows": sum(sizes)}}
    assert verify_export(saved(tmp_path, response.content))[0] == 0
    runs = jsonl(api.get(f"{V1}/export/runs").text)[1]
    assert [r["runId"] for r in runs] == [f"run_{n}" for n in range(len(sizes))]
    csv_rows = csv_parts(api.get(f"{V1}/export/events?format=csv").text)[2]
    assert len(csv_rows) == sum(sizes)


# --- verify --export catches tampering --------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_verify_export_catches_a_tampered_line_a_gap_and_a_cut(workspace, api, tmp_path, fmt) -> None:
    seed(workspace)
    body = api.get(f"{V1}/export/events?format={fmt}").content
    separator = b"\n" if fmt == "jsonl" else b"\r\n"
    lines = body.split(separator)
    first_event = 1 if fmt == "jsonl" else 2
    assert verify_export(saved(tmp_path, body))[0] == 0

    tampered = list(lines)
    target = next(i for i, line in enumerate(lines) if b"Bearer sk-demo-secret" not in line and b"ticket 4711" in line)
    tampered[target] = tampered[target].replace(b"ticket 4711", b"ticket 4712")
    code, out = verify_export(saved(tmp_path, separator.join(tampered), "tampered"))
    assert code == 1 and "FAIL" in out and "event_ids" in out and "does not recompute" in out
    assert "dense_sequence: " in out and "FAIL" not in out.split("dense_sequence")[0].splitlines()[-1]

    gap = lines[: first_event + 4] + lines[first_event + 5 :]
    code, out = verify_export(saved(tmp_path, separator.join(gap), "gap"))
    assert code == 1
    failed = {line.split()[2].rstrip(":") for line in out.splitlines() if line.startswith("FAIL")}
    assert failed == {"dense_sequence", "complete"}, out
    assert "sequence 6 follows 4 (missing 5)" in out

    cut = lines[:-2] + [b""]
    code, out = verify_export(saved(tmp_path, separator.join(cut), "cut"))
    assert code == 1 and "the file was cut short" in out


def test_verify_export_refuses_a_file_that_is_not_an_export(tmp_path) -> None:
    code, out = verify_export(saved(tmp_path, b'{"hello": 1}\n'))
    assert code == 1 and "header" in out


# --- bad input, isolation, roles, audit ---------------------------------------------------------


def test_bad_filters_are_400_and_unknown_exports_404(workspace, api) -> None:
    seed(workspace)
    before = Event.objects.count()
    assert error(api.get(f"{V1}/export/events?format=xml"), 400, "invalid_parameter") == {"parameter": "format"}
    assert error(api.get(f"{V1}/export/events?from=yesterday"), 400, "invalid_parameter") == {"parameter": "from"}
    assert error(api.get(f"{V1}/export/runs?to=2026-13-01"), 400, "invalid_parameter") == {"parameter": "to"}
    assert error(api.get(f"{V1}/export/runs?from=0001-01-01"), 400, "invalid_parameter") == {"parameter": "from"}
    assert error(api.get(f"{V1}/export/costs?from=2026-02-01&to=2026-01-01"), 400, "invalid_parameter") == {
        "parameter": "from"
    }
    error(api.get(f"{V1}/export/events?runId=not-a-run"), 400, "invalid_run_id")
    error(api.get(f"{V1}/export/events?runId=run_missing"), 404, "not_found")
    error(api.get(f"{V1}/export/everything"), 404, "not_found")
    assert Event.objects.count() == before
    assert not AuditEntry.objects.filter(action="export.downloaded").exists()


def test_a_key_exports_its_own_workspace_only_and_another_tenants_run_is_404(
    workspace, other_workspace, key_client
) -> None:
    seed(workspace)
    append(workspace=other_workspace, run_id="run_theirs", events=[started()])
    outsider = key_client(other_workspace)
    assert {r["runId"] for r in jsonl(outsider.get(f"{V1}/export/events").text)[1]} == {"run_theirs"}
    assert {r["runId"] for r in jsonl(outsider.get(f"{V1}/export/runs").text)[1]} == {"run_theirs"}
    assert jsonl(outsider.get(f"{V1}/export/costs").text)[1] == []
    error(outsider.get(f"{V1}/export/events?runId=run_a"), 404, "not_found")
    # A key acts in its own workspace: naming another is 404, as for a member who cannot see it.
    error(outsider.get(f"{V1}/export/events?workspace=acme/support"), 404, "not_found")
    assert {r["runId"] for r in jsonl(outsider.get(f"{V1}/export/events?workspace=globex/main").text)[1]} == {
        "run_theirs"
    }
    error(key_client(workspace, "ingest").get(f"{V1}/export/events"), 403, "insufficient_scope")


def test_sessions_roles_and_the_audit_export(workspace, admin, viewer, outsider, api) -> None:
    seed(workspace)
    anonymous = http_client()
    error(anonymous.get(f"{V1}/export/events"), 401, "unauthenticated")
    error(anonymous.get(f"{V1}/export/audit"), 401, "unauthenticated")
    dave = log_in(IN_PROCESS, viewer)
    assert len(jsonl(dave.get(f"{V1}/export/events").text)[1]) == Event.objects.count()
    error(dave.get(f"{V1}/export/audit"), 403, "forbidden")
    error(api.get(f"{V1}/export/audit"), 403, "forbidden")  # keys never read the audit log

    olga = log_in(IN_PROCESS, outsider)
    error(olga.get(f"{V1}/export/events?workspace=acme/support"), 404, "not_found")
    error(olga.get(f"{V1}/export/events?runId=run_a&workspace=acme/support"), 404, "not_found")
    error(olga.get(f"{V1}/export/audit?tenant=acme"), 404, "not_found")
    assert jsonl(olga.get(f"{V1}/export/events").text)[1] == []

    alice = log_in(IN_PROCESS, admin)
    error(alice.get(f"{V1}/export/audit?runId=run_a"), 400, "invalid_parameter")
    response = alice.get(f"{V1}/export/audit")
    head, entries, end = jsonl(response.text)
    assert head["export"] == "audit" and end == {"end": {"rows": len(entries)}}
    # Every export so far was audited, in order, with what was asked; this one too.
    downloads = [e for e in entries if e["action"] == "export.downloaded"]
    assert [(e["actor"], e["target"], e["details"]["format"]) for e in downloads] == [
        ("dave", "export:events", "jsonl"),
        ("alice", "export:audit", "jsonl"),
    ]
    assert all(e["tenant"] == "acme" for e in entries)
    assert downloads[0]["workspace"] == "acme/support"
    _, columns, rows, _ = csv_parts(alice.get(f"{V1}/export/audit?format=csv").text)
    assert columns == exports.COLUMNS["audit"] and len(rows) == len(entries) + 1
    assert [r[0] for r in rows] == [e["id"] for e in entries] + [rows[-1][0]]
    # olga's export is in her own tenant's log, not acme's.
    assert AuditEntry.objects.get(actor="olga").tenant.slug == "globex"
    for client in (anonymous, dave, olga, alice):
        client.close()


def test_key_exports_are_audited_with_their_filters(workspace, api) -> None:
    seed(workspace)
    assert api.get(f"{V1}/export/costs?format=csv&runId=run_a&from=2026-01-01").status_code == 200
    entry = AuditEntry.objects.get(action="export.downloaded")
    assert entry.actor.startswith("key:") and entry.target == "export:costs"
    assert entry.workspace == workspace
    assert entry.details == {
        "export": "costs",
        "format": "csv",
        "workspaces": ["acme/support"],
        "filters": {"runId": "run_a", "from": "2026-01-01"},
    }


# --- the command line ----------------------------------------------------------------------------


def cli(*args: str) -> tuple[int, str]:
    err = io.StringIO()
    try:
        call_command("ledger", *args, stdout=io.StringIO(), stderr=err)
        return 0, err.getvalue()
    except SystemExit as exc:
        return int(exc.code or 0), err.getvalue()


def test_ledger_export_writes_the_same_rows_and_is_audited(workspace, other_workspace, api, tmp_path) -> None:
    seed(workspace)
    append(workspace=other_workspace, run_id="run_theirs", events=[started()])
    target = tmp_path / "events.csv"
    assert cli("export", "events", "--workspace", "acme/support", "--format", "csv", "-o", str(target))[0] == 0
    assert verify_export(target)[0] == 0
    from_api = csv_parts(api.get(f"{V1}/export/events?format=csv").text)[2]
    assert csv_parts(target.read_bytes().decode())[2] == from_api
    everything = tmp_path / "all.jsonl"
    assert cli("export", "events", "-o", str(everything))[0] == 0
    rows = jsonl(everything.read_text())[1]
    assert {(r["workspace"], r["runId"]) for r in rows} == {
        ("acme/support", "run_a"),
        ("acme/support", "run_b"),
        ("globex/main", "run_theirs"),
    }
    assert verify_export(everything)[0] == 0
    entries = AuditEntry.objects.filter(action="export.downloaded", actor="system:cli").order_by("pk")
    assert [(e.tenant.slug, e.workspace_id is not None) for e in entries] == [
        ("acme", True),
        ("acme", False),
        ("globex", False),
    ]
    audit_file = tmp_path / "audit.jsonl"
    assert cli("export", "audit", "--tenant", "acme", "-o", str(audit_file))[0] == 0
    assert {e["tenant"] for e in jsonl(audit_file.read_text())[1]} == {"acme"}
    with pytest.raises(Exception, match="--tenant"):
        call_command("ledger", "export", "audit", stdout=io.StringIO())
    with pytest.raises(Exception, match="--from"):
        call_command("ledger", "export", "runs", "--from", "soon", stdout=io.StringIO())


def test_the_command_line_refuses_a_path_it_cannot_write_and_records_no_export(
    workspace: Workspace, tmp_path: Path
) -> None:
    seed(workspace)
    before = AuditEntry.objects.count()
    for path in (tmp_path / "missing" / "events.jsonl", tmp_path):  # no such folder; a folder
        with pytest.raises(CommandError, match=f"cannot write {path}"):
            call_command("ledger", "export", "events", "-o", str(path), stdout=io.StringIO())
    assert AuditEntry.objects.count() == before  # no "export.downloaded" of an export never made


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["runs", "--from", "2026-01-01", "--to", "2025-01-01"], "--from must be before --to"),
        (["events", "--run", "bad id!"], "run id must match"),
        (["events", "--run", "run_nowhere"], "run run_nowhere not found"),
        (["costs", "--run", "run_a", "--workspace", "globex/main"], "run run_a not found"),
    ],
)
def test_the_command_line_refuses_what_the_api_refuses(
    workspace: Workspace, other_workspace: Workspace, args: list[str], message: str
) -> None:
    """The same questions the API answers 400 or 404 to: not an empty export, audited."""
    seed(workspace)
    before = AuditEntry.objects.count()
    out = io.StringIO()
    with pytest.raises(CommandError, match=message):
        call_command("ledger", "export", *args, stdout=out)
    assert out.getvalue() == "" and AuditEntry.objects.count() == before


# --- through Daphne (ASGI) ---------------------------------------------------------------------------


def test_an_export_streams_through_daphne_across_chunks(workspace, daphne, tmp_path) -> None:
    """ASGI serves a sync iterator only after reading it whole; the view hands Daphne an async one.
    1,200 events cross a keyset chunk (1,000 rows) and many 64 KiB pieces."""
    append(workspace=workspace, run_id="run_long", events=[started()])
    for batch in range(12):
        append(
            workspace=workspace,
            run_id="run_long",
            events=[ev("custom.tick", i=batch * 100 + i, pad="x" * 200) for i in range(100 if batch < 11 else 99)],
        )
    _, key = create_key(workspace=workspace, scopes=["read"])
    pieces = 0
    with httpx.Client(base_url=daphne.url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        with client.stream("GET", f"{V1}/export/events") as response:
            assert response.status_code == 200
            assert "content-length" not in response.headers
            body = b""
            for chunk in response.iter_raw():
                body += chunk
                pieces += 1
    assert pieces > 2
    _, rows, end = jsonl(body.decode())
    assert [r["sequence"] for r in rows] == list(range(1, 1201)) and end == {"end": {"rows": 1200}}
    assert verify_export(saved(tmp_path, body))[0] == 0


@pytest.mark.django_db
def test_a_head_of_an_export_the_evidence_zip_or_the_otlp_export_is_not_audited(workspace: Workspace) -> None:
    """HEAD is safe (RFC 9110): it answers GET's checks and headers, downloads nothing, and so
    writes no `export.downloaded`, `evidence_bundle.downloaded` or `run.otlp_exported` entry, which
    would say a download happened."""
    append(workspace=workspace, run_id="run_head", events=[started(), ev("RunCompleted", output=1)])
    _, key = create_key(workspace=workspace, scopes=["read"])
    api = Client(HTTP_AUTHORIZATION=f"Bearer {key}", raise_request_exception=False)
    urls = {
        "/api/v1/export/events?runId=run_head": "application/x-ndjson",
        "/api/v1/export/runs?format=csv": "text/csv",
        "/api/v1/runs/run_head/evidence.zip": "application/zip",
        "/api/v1/runs/run_head/otlp": "application/json",
    }
    audited = AuditEntry.objects.count()
    for url, media_type in urls.items():
        head = api.head(url)
        assert head.status_code == 200 and head["Content-Type"].startswith(media_type), (url, head.content[:200])
    assert AuditEntry.objects.count() == audited
    assert api.head("/api/v1/runs/run_elsewhere/evidence.zip").status_code == 404  # the same checks as GET
    for url in urls:
        assert api.get(url).status_code == 200
    assert AuditEntry.objects.count() == audited + len(urls)
