"""What a replay answers with is the record as it was made, also when the log moved part of it
into an artifact (docs/operations.md "Large payloads"): a model answer past the inline limit keeps
its usage inline and its text in `response.textRef`, a tool result past it is `resultRef`. A
resumed run, a simulation and an evaluation read those back (each artifact re-hashed) instead of
replaying null; the conversation tab shows them as stored, without loading them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import Client

from ledger import errors
from ledger.canonical import canonical_bytes
from ledger.evaluation import datasets
from ledger.fold import fold
from ledger.log import append, artifacts
from ledger.log.artifacts import INLINE_LIMIT_BYTES
from ledger.models import Run, Workspace
from ledger.replay.divergence import divergence_report
from ledger.replay.stored_plan import replay_plan_for
from ledger.runtime.executor import resume_run, start_run
from ledger.runtime.providers import ModelRequest, ScriptedProvider
from ledger.runtime.record import read_record
from ledger.runtime.reexecute import execute_reexecution
from ledger.runtime.registry import AIGenerate, Tool, Workflow, register
from tests.conftest import envelopes, ev, started
from tests.runtime_support import (  # noqa: F401  (every_run_verifies is an autouse fixture)
    Crash,
    every_run_verifies,
    run_events,
)

pytestmark = pytest.mark.django_db

WORKFLOW = "long_answers"
# Turn 1's answer and the lookup's result, each past the inline limit on its own.
LONG_TEXT = "".join(f"Finding {n}: the parcel left depot {n % 7}.\n" for n in range(9000))
BIG_RESULT = {"rows": [f"order {n} shipped" for n in range(20_000)]}
EXPECTED = f"turn 1 said {len(LONG_TEXT)} characters; the lookup found 20000 rows"


class Script:
    """Turn 1 answers at length and asks for the lookup; turn 2 answers from what the
    conversation holds by then (what a replay handed back), and dies once when armed."""

    def __init__(self) -> None:
        self.armed = False
        self.variant = "parcel"  # "packet": another long answer of the same length
        self.conversations: list[list[dict[str, Any]]] = []

    def __call__(self, request: ModelRequest) -> dict[str, Any]:
        if request.turn == 1:
            return {
                "text": LONG_TEXT.replace("parcel", self.variant),
                "toolCalls": [{"id": "t1", "name": "lookup", "args": {"q": "all"}}],
                "usage": {"inputTokens": 1000, "outputTokens": 90_000},
            }
        if self.armed:
            self.armed = False
            raise Crash("the executor died after turn 1")
        messages = list(request.body["messages"])
        self.conversations.append(messages)
        said = next(m["content"] for m in messages if m["role"] == "assistant")
        found = next(m["result"] for m in messages if m["role"] == "tool")
        return {"text": f"turn 1 said {len(said or '')} characters; the lookup found {len(found['rows'])} rows"}


@pytest.fixture
def script() -> Iterator[Script]:
    script = Script()
    register(
        Workflow(
            name=WORKFLOW,
            steps=(AIGenerate("agent", "Where are the parcels?", tools=("lookup",), max_turns=3),),
            tools={"lookup": Tool("lookup", lambda args: BIG_RESULT)},
            models={"default": ScriptedProvider(script=script)},
        )
    )
    yield script


def _turn_two_saw(script: Script) -> tuple[Any, Any]:
    messages = script.conversations[-1]
    said = next(m["content"] for m in messages if m["role"] == "assistant")
    found = next(m["result"] for m in messages if m["role"] == "tool")
    return said, found


def _stored(workspace: Workspace, run_id: str, event_type: str) -> dict[str, Any]:
    return next(e["payload"] for e in run_events(workspace, run_id) if e["type"] == event_type)


def _as_recorded(workspace: Workspace, run_id: str, event_type: str) -> Any:
    run = Run.objects.get(workspace=workspace, run_id=run_id)
    return artifacts.as_recorded(run, event_type, _stored(workspace, run_id, event_type))


def _crashed_after_turn_one(workspace: Workspace, script: Script, run_id: str) -> None:
    script.armed = True
    with pytest.raises(Crash):
        start_run(workspace=workspace, workflow=WORKFLOW, input={}, run_id=run_id)
    # What makes the case: the answer's text and the tool's result are artifacts, the usage is not.
    response = _stored(workspace, run_id, "harness.model.responded")["response"]
    assert "text" not in response and response["textRef"].startswith("artifact://art_")
    assert response["usage"] == {"inputTokens": 1000, "outputTokens": 90_000}
    assert len(canonical_bytes(LONG_TEXT)) > INLINE_LIMIT_BYTES
    assert "result" not in _stored(workspace, run_id, "harness.tool_call.succeeded")
    assert script.conversations == []


def test_ledger_resume_replays_a_long_answer_and_a_long_tool_result_as_recorded(
    workspace: Workspace, script: Script
) -> None:
    _crashed_after_turn_one(workspace, script, "run_long")
    plan = replay_plan_for(Run.objects.get(workspace=workspace, run_id="run_long"))
    assert plan["replayReady"]["missing"] == ["model:agent:turn2:response"]  # only the call in flight
    assert [(c["kind"], c["action"]) for c in plan["sessions"][0]["calls"]] == [
        ("model", "replay"),
        ("tool", "replay"),
        ("model", "reinvoke"),
    ]

    out = StringIO()
    call_command("ledger", "resume", "run_long", "--workspace", "acme/support", stdout=out, stderr=StringIO())

    assert json.loads(out.getvalue().splitlines()[-1])["output"] == EXPECTED
    said, found = _turn_two_saw(script)
    assert said == LONG_TEXT and found == BIG_RESULT
    types = [e["type"] for e in run_events(workspace, "run_long")]
    assert types.count("harness.model.responded") == 2 and types.count("harness.tool_call.succeeded") == 1


def test_a_resumed_run_refuses_an_answer_whose_artifact_changed(workspace: Workspace, script: Script) -> None:
    _crashed_after_turn_one(workspace, script, "run_tampered")
    ref = _stored(workspace, "run_tampered", "harness.model.responded")["response"]["textRef"]
    path = Path(settings.ARTIFACTS_ROOT) / artifacts.get_by_ref(workspace, ref).storage_key
    path.write_bytes(canonical_bytes(LONG_TEXT.replace("parcel", "packet")))
    run = Run.objects.get(workspace=workspace, run_id="run_tampered")
    before = run.last_sequence
    # The replay plan says so first: the answer it would replay fails its re-hash.
    ready = replay_plan_for(run)["replayReady"]
    assert ready["status"] == "fail" and f"artifact:{ref}" in ready["missing"]

    with pytest.raises(errors.IntegrityFailure):
        resume_run(workspace=workspace, run_id="run_tampered")

    assert Run.objects.get(workspace=workspace, run_id="run_tampered").last_sequence == before
    assert script.conversations == []
    path.write_bytes(canonical_bytes(LONG_TEXT))  # the run verifies again (every_run_verifies)


@pytest.mark.parametrize("mode", ["simulate", "evaluate"])
def test_a_reexecution_replays_the_long_answer_and_tool_result_as_recorded(
    workspace: Workspace, script: Script, mode: str
) -> None:
    original = start_run(workspace=workspace, workflow=WORKFLOW, input={}, run_id="run_original")
    assert original.output == EXPECTED
    script.conversations.clear()

    outcome = execute_reexecution(
        workspace=workspace,
        original_run_id="run_original",
        mode=mode,
        new_run_id=f"run_{mode}",
        reexecution_id=f"rx_{mode}",
    )

    assert (outcome.status, outcome.output) == ("completed", EXPECTED)
    new = fold(run_events(workspace, f"run_{mode}"), run_id=f"run_{mode}")
    assert new.divergences == []
    if mode == "simulate":
        assert script.conversations == []  # no model was asked: both turns came from the record
        response = _as_recorded(workspace, f"run_{mode}", "harness.model.responded")["response"]
        assert response["text"] == LONG_TEXT
    else:
        said, found = _turn_two_saw(script)
        assert said == LONG_TEXT and found == BIG_RESULT
    assert _as_recorded(workspace, f"run_{mode}", "harness.tool_call.succeeded")["result"] == BIG_RESULT
    report = divergence_report(workspace=workspace, original_run_id="run_original", new_run_id=f"run_{mode}")
    assert report["firstDivergence"] is None


def test_the_divergence_report_compares_long_answers_by_content_without_reading_them(
    workspace: Workspace, script: Script
) -> None:
    start_run(workspace=workspace, workflow=WORKFLOW, input={}, run_id="run_original")
    script.variant = "packet"
    execute_reexecution(
        workspace=workspace,
        original_run_id="run_original",
        mode="evaluate",
        new_run_id="run_other",
        reexecution_id="rx_other",
    )

    report = divergence_report(workspace=workspace, original_run_id="run_original", new_run_id="run_other")

    (step,) = report["steps"]
    assert (step["status"], step["changes"]) == ("changed", ["modelOutputs"])
    turns = [(m["text"], set(m["stored"])) for m in (step["original"]["modelCalls"][0], step["new"]["modelCalls"][0])]
    assert turns == [(None, {"text"}), (None, {"text"})]
    assert step["original"]["modelCalls"][0]["stored"]["text"] != step["new"]["modelCalls"][0]["stored"]["text"]
    assert "(stored as an artifact: artifact://art_" in step["diff"]["modelOutputs"]
    assert LONG_TEXT[:100] not in step["diff"]["modelOutputs"]


def test_an_answer_moved_whole_by_an_older_log_is_replayed_whole(workspace: Workspace) -> None:
    """Before members moved one by one, the whole `response` moved (`responseRef`): the fold counts
    such a call with no usage (the log is not rewritten); a replay reads the whole answer back."""
    append(workspace=workspace, run_id="run_old", events=[started()])
    run = Run.objects.get(workspace=workspace, run_id="run_old")
    answer = {"text": LONG_TEXT, "toolCalls": [], "usage": {"inputTokens": 10, "outputTokens": 20}}
    ref = artifacts.store_bytes(workspace, canonical_bytes(answer)).ref
    log = envelopes(
        [
            ("RunStarted", started()["payload"]),
            (
                "harness.model.responded",
                {
                    "turn": 1,
                    "callId": "agent:turn1",
                    "stepPath": "agent",
                    "model": {"provider": "openai", "modelId": "gpt-4o"},
                    "responseRef": ref,
                },
            ),
        ],
        run_id="run_old",
    )

    record = read_record("run_old", log, run=run)

    (call,) = record.state.model_calls
    assert (call.status, call.response, call.usage) == ("responded", None, None)
    assert record.state.usage.input_tokens == 0
    assert record.response(call) == answer


def test_the_conversation_shows_moved_members_as_stored_without_loading_them(
    workspace: Workspace, script: Script, browser: Client, client: Client, outsider: Any
) -> None:
    start_run(workspace=workspace, workflow=WORKFLOW, input={}, run_id="run_shown")
    text_ref = _stored(workspace, "run_shown", "harness.model.responded")["response"]["textRef"]
    result_ref = _stored(workspace, "run_shown", "harness.tool_call.succeeded")["resultRef"]

    html = browser.get("/w/acme/support/runs/run_shown/conversation/").content.decode()

    assert "Response text stored as an artifact" in html and "Result stored as an artifact" in html
    assert LONG_TEXT[:200] not in html and "order 19999 shipped" not in html
    download = f"/api/v1/artifacts/{text_ref.removeprefix('artifact://')}/content?workspace=acme/support"
    assert f'href="{download}"' in html and result_ref.removeprefix("artifact://") in html
    assert html.count(text_ref.removeprefix("artifact://")[:20]) == 1  # one link, not a chip beside it
    assert json.loads(b"".join(browser.get(download).streaming_content)) == LONG_TEXT

    client.force_login(outsider)
    assert client.get(download).status_code == 404
    assert client.get("/w/acme/support/runs/run_shown/conversation/").status_code == 404


def test_a_dataset_expects_a_long_output_as_recorded_not_null(workspace: Workspace, admin: Any) -> None:
    append(workspace=workspace, run_id="run_done", events=[started(), ev("RunCompleted", output=BIG_RESULT)])
    assert Run.objects.get(workspace=workspace, run_id="run_done").output_ref  # what makes the case

    version = datasets.add_runs(workspace=workspace, name="long", run_ids=["run_done"], by=admin).version

    assert version.members[0]["expected"] == BIG_RESULT
