"""Numbers: an integer is taken exactly when it is a double's shortest ECMAScript form (the
append, the API, the Little import), projections read back the fold's numbers on both backends
(PostgreSQL's jsonb included), and numbers leave the product in ECMAScript form (docs/design.md
§ Canonical JSON)."""

from __future__ import annotations

import io
import itertools
import json
import re
import struct
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ledger import log
from ledger.canonical import NotCanonicalizable, canonical_bytes, canonical_json, ecma_dumps, ecma_number
from ledger.errors import InvalidEvent
from ledger.fold import fold
from ledger.log.envelopes import log_of
from ledger.log.verify import verify_run
from ledger.models import Event, Run, Step, ToolCall, Workspace
from ledger.tenancy.services import create_key
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db

SAFE = 2**53 - 1
SPECIAL = [
    0,
    0.0,
    -0.0,
    5e-324,  # the smallest subnormal
    2.2250738585072009e-308,  # the largest subnormal
    2.2250738585072014e-308,  # the smallest normal
    1e21,
    -1e21,
    1e20,
    6.02214076e23,
    1.7976931348623157e308,
    5e-7,
    1e-7,
    0.1,
    SAFE,
    -SAFE,
    2**53,  # 9007199254740992: a double, and ECMAScript writes it so
    1152921504606847000,
    10**20,
]


def run_ledger(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("ledger", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


# --- which integers are numbers --------------------------------------------------------------


def test_an_integer_is_taken_exactly_when_it_is_a_doubles_shortest_form() -> None:
    assert canonical_bytes({"n": 1152921504606847000}) == b'{"n":1152921504606847000}'
    assert canonical_bytes([2**53, -(2**53), 10**20]) == b"[9007199254740992,-9007199254740992,100000000000000000000]"
    for refused in (1152921504606846976, 2**53 + 1, 10**21, 10**400, -1152921504606846976):
        with pytest.raises(NotCanonicalizable, match="not the shortest form"):
            canonical_bytes({"n": refused})


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_integral_double_is_taken_in_its_ecmascript_digits(x: float) -> None:
    if x != int(x) or abs(x) >= 1e21:
        return
    digits = ecma_number(x)
    assert canonical_bytes(int(digits)) == digits.encode()
    if abs(x) > SAFE:
        # The same double's exact value, when it has other digits, is not its shortest form.
        exact = int(x)
        if str(exact) != digits:
            with pytest.raises(NotCanonicalizable):
                canonical_bytes(exact)


def test_the_append_takes_a_shortest_form_and_refuses_another(workspace: Workspace) -> None:
    written = log.append(workspace=workspace, run_id="run_big", events=[started(nanos=1152921504606847000)])
    assert Event.objects.get(event_id=written.events[0]["eventId"]).payload.startswith('{"nanos":1152921504606847000,')
    before = Event.objects.count()
    with pytest.raises(InvalidEvent, match="1152921504606846976 is not the shortest form"):
        log.append(workspace=workspace, run_id="run_big2", events=[started(nanos=1152921504606846976)])
    assert Event.objects.count() == before


def test_the_api_takes_a_shortest_form_and_refuses_another(workspace: Workspace) -> None:
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    api = Client(HTTP_AUTHORIZATION=f"Bearer {key}", raise_request_exception=False)

    def post(run_id: str, digits: str) -> Any:
        body = '{"events":[{"type":"RunStarted","payload":{"workflowVersionId":"w","nanos":' + digits + "}}]}"
        return api.post(f"/api/v1/runs/{run_id}/events", data=body, content_type="application/json")

    accepted = post("run_ok", "1152921504606847000")
    assert accepted.status_code == 200, accepted.content
    assert accepted.json()["events"][0]["payload"]["nanos"] == 1152921504606847000
    refused = post("run_no", "1152921504606846976")
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "invalid_event" and "1152921504606846976 is not the shortest form" in error["message"]
    assert not Run.objects.filter(run_id="run_no", event_count__gt=0).exists()
    assert not Event.objects.filter(run__run_id="run_no").exists()


# --- projections keep every number -----------------------------------------------------------

_runs = itertools.count()


def _doubles() -> st.SearchStrategy[Any]:
    subnormals = st.integers(min_value=1, max_value=2**52 - 1).map(
        lambda bits: struct.unpack("<d", struct.pack("<Q", bits))[0]
    )
    big_ints = st.floats(min_value=2.0**53, max_value=1e21, exclude_max=True).map(lambda x: int(ecma_number(x)))
    return st.one_of(
        st.sampled_from(SPECIAL),
        st.floats(allow_nan=False, allow_infinity=False),
        subnormals,
        subnormals.map(lambda x: -x),
        st.integers(min_value=-SAFE, max_value=SAFE),
        big_ints,
    )


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # a shrink of database examples takes minutes
)
@given(x=_doubles())
def test_projections_read_back_the_folds_numbers_and_verify_passes(workspace: Workspace, x: Any) -> None:
    """On SQLite and on PostgreSQL (the CI's second pass): Run.input/output, a step's error and
    attempts, a tool call's args and result hold `x` and read back the fold's value exactly."""
    run_id = f"run_num_{next(_runs)}"
    log.append(
        workspace=workspace,
        run_id=run_id,
        events=[
            started(input={"n": x, "list": [x, {"x": x}]}),
            ev("StepScheduled", stepPath="s"),
            ev("StepAttemptStarted", stepPath="s", attempt=1),
            ev("StepFailed", stepPath="s", attempt=1, error={"message": "m", "value": x}),
            ev("harness.tool_call.started", callId="c", caller="code", toolName="t", args={"x": x}),
            ev("harness.tool_call.succeeded", callId="c", result=[x], durationMs=1),
            {"type": "RunCompleted", "payload": {"output": {"x": x}}},
        ],
    )
    run = Run.objects.get(workspace=workspace, run_id=run_id)
    state = fold(log_of(run), run_id=run_id)
    stored = Run.objects.values("input", "output").get(pk=run.pk)
    step = Step.objects.values("error").get(run=run)
    call = ToolCall.objects.values("args", "result").get(run=run)
    for got, expected in (
        (stored["input"], state.input),
        (stored["output"], state.output),
        (step["error"], state.steps["s"].error),
        (call["args"], state.tool_calls["c"].args),
        (call["result"], state.tool_calls["c"].result),
    ):
        assert canonical_json(got) == canonical_json(expected)
    assert canonical_json(stored["input"]["n"]) == canonical_json(x)
    assert [c.status for c in verify_run(run)] == ["pass"] * 4


def test_verify_passes_on_a_run_holding_1e21_and_avogadro(workspace: Workspace) -> None:
    log.append(
        workspace=workspace,
        run_id="run_avogadro",
        events=[
            started(input={"big": 1e21, "avogadro": 6.02214076e23}),
            ev("StepScheduled", stepPath="s"),
            ev("StepAttemptStarted", stepPath="s", attempt=1),
            ev("StepFailed", stepPath="s", attempt=1, error={"message": "m", "mole": 6.02214076e23}),
        ],
    )
    code, out, _ = run_ledger("verify", "run_avogadro")
    assert code == 0 and "ok" in out, out
    assert Run.objects.get(run_id="run_avogadro").input == {"big": 1e21, "avogadro": 6.02214076e23}


# --- numbers leave in ECMAScript form --------------------------------------------------------


def test_ecma_dumps_writes_numbers_as_ecmascript_and_keeps_key_order() -> None:
    value = {"b": 5e-7, "a": [1e-7, 100.0, -0.0, 1e20, 1e21, 1152921504606847000, 2.5], "é": "\u2028"}
    assert ecma_dumps(value).decode() == (
        '{"b":5e-7,"a":[1e-7,100,0,100000000000000000000,1e+21,1152921504606847000,2.5],"é":"\u2028"}'
    )


def test_events_cli_and_ndjson_print_ecmascript_numbers(workspace: Workspace) -> None:
    log.append(
        workspace=workspace,
        run_id="run_small",
        events=[started(rate=5e-7, tiny=1e-7, big=1e21, whole=1e20)],
    )
    _, out, _ = run_ledger("events", "run_small")
    assert (
        '"rate":5e-7' in out
        and '"tiny":1e-7' in out
        and '"big":1e+21' in out
        and '"whole":100000000000000000000' in out
    )
    assert "e-07" not in out
    _, key = create_key(workspace=workspace, scopes=["read"])
    api = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    body = api.get("/api/v1/runs/run_small/events", HTTP_ACCEPT="application/x-ndjson").content.decode()
    assert '"rate":5e-7' in body and '"tiny":1e-7' in body and "e-07" not in body
    assert json.loads(body.splitlines()[0])["payload"]["big"] == 1e21


# A number written in exponent form, as a JSON value: a hash or an id (a string) cannot match it, as
# a bare "1e20" could (a SHA-256 in hex holds it about once in a thousand).
_EXPONENT = re.compile(r"[:\[,]\s*-?\d+(?:\.\d+)?[eE]")


def test_exports_and_evidence_write_ecmascript_numbers(workspace: Workspace, tmp_path: Any) -> None:
    """1e-6 and 1e20 are where Python's (and orjson's) text and ECMAScript's differ: `1e-06` /
    `1e-6` and `1e+20` / `1e20` against `0.000001` and `100000000000000000000`."""
    import zipfile

    log.append(
        workspace=workspace,
        run_id="run_export",
        events=[started(input={"micro": 1e-6, "huge": 1e20, "whole": 100.0}), {"type": "RunCompleted", "payload": {}}],
    )
    target = tmp_path / "runs.jsonl"
    code, _, err = run_ledger("export", "runs", "--workspace", "acme/support", "--output", str(target))
    assert code == 0, err
    text = target.read_text(encoding="utf-8")
    assert '"micro":0.000001' in text and '"huge":100000000000000000000' in text and '"whole":100' in text
    assert _EXPONENT.search(text) is None, _EXPONENT.search(text)
    csv_target = tmp_path / "runs.csv"
    assert run_ledger("export", "runs", "--format", "csv", "--run", "run_export", "--output", str(csv_target))[0] == 0
    assert "0.000001" in csv_target.read_text(encoding="utf-8")
    bundle = tmp_path / "run_export.zip"
    assert run_ledger("export-evidence", "run_export", "--output", str(bundle))[0] == 0
    evidence = zipfile.ZipFile(bundle).read("evidence.json").decode()
    assert '"micro": 0.000001' in evidence and '"huge": 100000000000000000000' in evidence
    assert _EXPONENT.search(evidence) is None, _EXPONENT.search(evidence)
    assert run_ledger("verify", "--bundle", str(bundle))[0] == 0
