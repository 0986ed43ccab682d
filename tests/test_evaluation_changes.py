"""The kinds of change an evaluation makes beyond a model mapping (docs/evaluations.md "Changes"):
a prompt override, an input override (per run and as a merge patch) and another registered
workflow, each through the runtime's evaluate mode with every tool call served from the record
(zero tool invocations), recorded divergences when the record cannot answer, the policy's kinds
of change, scores recorded on the new runs, and the report."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User

from ledger.demo.workflows import SUPPORT_TRIAGE, TERSE, triage_output
from ledger.evaluation import datasets, evaluations, policies
from ledger.evaluation.errors import InvalidEvaluation
from ledger.log.envelopes import log_of
from ledger.models import AuditEntry, Evaluation, Event, ReexecutionRequest, Run, Workspace
from ledger.reexecution import services
from ledger.runtime import registry
from ledger.runtime.registry import CodeRun, Workflow
from tests.conftest import named_user
from tests.evaluation_support import Calls, CountingOrders, count_tool_edge, registered_providers, triage_runs
from tests.runtime_support import every_run_verifies  # noqa: F401  (autouse: ledger verify passes on every run)

pytestmark = [pytest.mark.usefixtures("clock"), pytest.mark.django_db]

Status = Evaluation.Status
Verdict = Evaluation.Verdict
SCORERS = ["exact", {"name": "regex", "args": {"pattern": "^Answer for", "field": "reply"}}]
TERSE_SYSTEM = f"You answer support tickets. {TERSE}"


@pytest.fixture
def people(admin: User, approver: User, operator: User, viewer: User, other_workspace: Workspace) -> dict[str, User]:
    olga = named_user("olga", "approver", tenant="globex")
    return {user.get_username(): user for user in (admin, approver, operator, viewer, olga)}


@pytest.fixture
def providers() -> Iterator[Calls]:
    yield from registered_providers()


@pytest.fixture
def tool_counter(monkeypatch: pytest.MonkeyPatch) -> CountingOrders:
    return count_tool_edge(monkeypatch)


@pytest.fixture
def runs(workspace: Workspace, people: dict[str, User]) -> list[str]:
    ids = triage_runs(workspace)
    datasets.add_runs(workspace=workspace, name="golden", run_ids=ids, by=people["carol"])
    return ids


@pytest.fixture
def every_kind(workspace: Workspace, people: dict[str, User]) -> Any:
    return _policy(workspace, people["bob"], ["model", "prompt", "input", "workflow"])


@pytest.fixture
def triage_v2() -> Iterator[Workflow]:
    """Another registered workflow: the triage workflow whose output also says which version
    answered (every outcome changes), with the same tools and models."""

    def output_v2(run_input: Any, outputs: Any) -> dict[str, Any]:
        return {**triage_output(run_input, outputs), "answeredBy": "v2"}

    workflow = registry.register(
        Workflow(
            name="support.triage-v2",
            steps=(*SUPPORT_TRIAGE.steps, CodeRun("sign", lambda i, o: "v2")),
            tools=SUPPORT_TRIAGE.tools,
            models=SUPPORT_TRIAGE.models,
            output=output_v2,
        )
    )
    yield workflow
    registry._WORKFLOWS.pop(workflow.name, None)


def _policy(workspace: Workspace, bob: User, kinds: list[str]) -> Any:
    return policies.approve_policy(
        workspace=workspace,
        dataset="golden",
        change_kinds=kinds,
        scorers=["exact", "regex"],
        ceiling_per_evaluation_usd="1",
        ceiling_per_day_usd="5",
        ttl_hours=24,
        note="CI on the golden set",
        by=bob,
    )


def _start(workspace: Workspace, by: User, change: dict[str, Any]) -> Evaluation:
    return evaluations.start_evaluation(
        workspace=workspace,
        dataset="golden",
        change=change,
        scorers=SCORERS,
        fail_if="pass_rate < 0.95",
        reason="evaluate a change on the golden set",
        by=by,
    )


def _scored(workspace: Workspace, done: Evaluation) -> list[dict[str, Any]]:
    """The `custom.evaluation.scored` events of the evaluation's new runs."""
    found = []
    for row in done.report["runs"]:
        found += [
            e["payload"]
            for e in log_of(Run.objects.get(workspace=workspace, run_id=row["newRunId"]))
            if e["type"] == "custom.evaluation.scored"
        ]
    return found


def _started(workspace: Workspace, run_id: str) -> dict[str, Any]:
    return log_of(Run.objects.get(workspace=workspace, run_id=run_id))[0]["payload"]


def _outcomes(done: Evaluation) -> dict[str, str]:
    return {r["runId"]: r["outcome"] for r in done.report["runs"]}


# --- prompt -------------------------------------------------------------------------------------


def test_a_prompt_change_regresses_the_runs_it_spoils_and_is_recorded_on_each_new_run(
    workspace, runs, people, every_kind, providers, tool_counter: CountingOrders
) -> None:
    lookups = tool_counter.lookups
    made = _start(workspace, people["carol"], {"kind": "prompt", "prompts": {"draft": {"system": TERSE_SYSTEM}}})
    assert made.status == Status.RUNNING and made.policy == every_kind
    requests = list(ReexecutionRequest.objects.filter(batch_id=made.batch_id))
    assert {r.status for r in requests} == {ReexecutionRequest.Status.APPROVED}
    assert all(r.prompt_overrides == {"draft": {"system": TERSE_SYSTEM}} for r in requests)
    done = evaluations.execute_here(made)
    assert (done.status, done.verdict) == (Status.FINISHED, Verdict.FAILED)
    aggregates = done.report["aggregates"]
    # The two tickets about order C-3 (lost parcels) get a useless answer; the rest hold.
    assert aggregates["passRate"] == 0.8 and aggregates["passRateBefore"] == 1.0 and aggregates["changed"] == 2
    assert [r for r, o in _outcomes(done).items() if o == "changed"] == [runs[2], runs[6]]
    changed = [r for r in done.report["runs"] if r["outcome"] == "changed"]
    assert all(r["firstDivergence"] == "draft" and not r["scores"]["exact"]["after"]["passed"] for r in changed)
    # Zero tool invocations: every tool call was served from the record.
    assert tool_counter.lookups == lookups and aggregates["liveToolCalls"] == 0 and aggregates["unansweredCalls"] == 0
    # The new run records the override it ran with (a resumed run keeps it) and its own version.
    new_run = changed[0]["newRunId"]
    started = _started(workspace, new_run)
    assert started["reexecution"]["promptOverrides"] == {"draft": {"system": TERSE_SYSTEM}}
    assert started["workflowVersionId"] != _started(workspace, runs[2])["workflowVersionId"]
    called = [
        e for e in log_of(Run.objects.get(workspace=workspace, run_id=new_run)) if e["type"] == "harness.model.called"
    ]
    assert called[0]["payload"]["request"]["messages"][0] == {"role": "system", "content": TERSE_SYSTEM}
    # Scores recorded on each new run, before and after.
    scored = _scored(workspace, done)
    assert len(scored) == 10 and all(s["evaluationId"] == done.public_id for s in scored)
    assert sum(1 for s in scored if not s["scores"]["exact"]["passed"]) == 2
    assert all(s["before"]["exact"]["passed"] for s in scored)


def test_a_prompt_template_quotes_the_original_prompt(workspace, runs, people, every_kind, tool_counter) -> None:
    """`{original}` is the prompt the workflow's code built: the same text keeps every outcome,
    a preamble changes every answer (the scripted model echoes the prompt) but no tool call."""
    lookups = tool_counter.lookups
    same = evaluations.execute_here(
        _start(workspace, people["carol"], {"kind": "prompt", "prompts": {"draft": {"prompt": "{original}"}}})
    )
    assert same.verdict == Verdict.PASSED and same.report["aggregates"]["changed"] == 0
    preamble = evaluations.execute_here(
        _start(workspace, people["carol"], {"kind": "prompt", "prompts": {"draft": {"prompt": "Urgent. {original}"}}})
    )
    assert preamble.report["aggregates"]["changed"] == 10 and preamble.verdict == Verdict.FAILED
    first = Run.objects.get(workspace=workspace, run_id=preamble.report["runs"][0]["newRunId"])
    assert first.output["reply"].startswith("Answer for: Urgent. Customer says: ")
    assert tool_counter.lookups == lookups and preamble.report["aggregates"]["liveToolCalls"] == 0


def test_a_prompt_change_names_a_prompt_of_the_workflow(workspace, runs, people, every_kind) -> None:
    before = (ReexecutionRequest.objects.count(), Evaluation.objects.count(), Event.objects.count())
    for prompts in (
        {"confirm": {"system": "x"}},  # a tool step has no prompt
        {"nope": {"system": "x"}},
        {"draft": {"temperature": "1"}},
        {"draft": {}},
        {"draft": {"prompt": "  "}},
        {"draft": "x"},
        {"draft": {"system": "x" * 100_001}},
        {},
    ):
        with pytest.raises(InvalidEvaluation) as refused:
            _start(workspace, people["carol"], {"kind": "prompt", "prompts": prompts})
        assert refused.value.status == 400
    with pytest.raises(InvalidEvaluation, match="ai.generate steps: \\['draft'\\]"):
        _start(workspace, people["carol"], {"kind": "prompt", "prompts": {"nope": {"system": "x"}}})
    assert (ReexecutionRequest.objects.count(), Evaluation.objects.count(), Event.objects.count()) == before


def test_a_policy_of_model_mappings_makes_a_prompt_change_wait_for_an_approver(
    workspace, runs, people, providers
) -> None:
    _policy(workspace, people["bob"], ["model"])
    made = _start(workspace, people["carol"], {"kind": "prompt", "prompts": {"draft": {"system": TERSE_SYSTEM}}})
    assert made.status == Status.PENDING_APPROVAL and made.policy is None
    started = AuditEntry.objects.get(target=made.public_id, action="evaluation.started")
    assert started.details["waitsForApproval"] is True and started.details["change"]["kind"] == "prompt"
    requests = ReexecutionRequest.objects.filter(batch_id=made.batch_id).order_by("pk")
    assert {r.status for r in requests} == {ReexecutionRequest.Status.PENDING_APPROVAL}
    # The approval binds to the override: a request whose stored prompt changed is plan_changed.
    first = requests.first()
    assert first is not None
    assert first.digest != services.request_digest(
        mode="evaluate",
        from_step=None,
        input=services.NOT_GIVEN,
        model_overrides={},
        last_sequence=first.last_sequence,
        plan_digest=first.plan_digest,
    )
    services.approve(workspace=workspace, reexecution_id=first.public_id, by=people["bob"], note="go")
    done = evaluations.execute_here(evaluations.advance(made.pk) or made)
    assert (done.status, done.verdict) == (Status.FINISHED, Verdict.FAILED)
    assert done.report["aggregates"]["changed"] == 2


# --- input --------------------------------------------------------------------------------------


def test_an_input_merge_patch_the_workflow_ignores_keeps_every_outcome(
    workspace, runs, people, every_kind, tool_counter
) -> None:
    lookups = tool_counter.lookups
    made = _start(workspace, people["carol"], {"kind": "input", "mergePatch": {"channel": "email"}})
    requests = ReexecutionRequest.objects.filter(batch_id=made.batch_id).order_by("original_run_id")
    original = _started(workspace, runs[0])["input"]
    assert requests[0].has_input and requests[0].input == {**original, "channel": "email"}
    done = evaluations.execute_here(made)
    assert done.verdict == Verdict.PASSED and done.report["aggregates"]["changed"] == 0
    assert _started(workspace, done.report["runs"][0]["newRunId"])["input"] == {**original, "channel": "email"}
    assert tool_counter.lookups == lookups and len(_scored(workspace, done)) == 10


def test_an_input_the_record_cannot_answer_diverges_and_changes_the_outcome(
    workspace, runs, people, every_kind, tool_counter
) -> None:
    """A run given another order asks the tools for what its original never looked up: the
    evaluation answers the model with an error and the tool step fails, each recorded as a
    divergence, and still no tool is invoked."""
    lookups = tool_counter.lookups
    patched = {"ticket": "Where is my other parcel?", "orderId": "Z-9"}
    made = _start(workspace, people["carol"], {"kind": "input", "inputs": {runs[0]: patched}})
    requests = {r.original_run_id: r for r in ReexecutionRequest.objects.filter(batch_id=made.batch_id)}
    assert requests[runs[0]].input == patched and not requests[runs[1]].has_input
    done = evaluations.execute_here(made)
    rows = {r["runId"]: r for r in done.report["runs"]}
    assert rows[runs[0]]["outcome"] == "changed" and rows[runs[0]]["status"] == "failed"
    assert rows[runs[0]]["unansweredCalls"] == 2  # the model's look-up and the confirm step's
    assert all(rows[r]["outcome"] == "kept" for r in runs[1:])
    diverged = Event.objects.filter(run__run_id=rows[runs[0]]["newRunId"], type="harness.replay.diverged")
    assert {json.loads(e.payload)["reason"] for e in diverged} == {"not_in_record"}
    assert done.report["aggregates"]["failed"] == 1 and done.verdict == Verdict.FAILED
    assert tool_counter.lookups == lookups and done.report["aggregates"]["liveToolCalls"] == 0
    assert not rows[runs[0]]["scores"]["exact"]["after"]["passed"]


def test_an_input_change_is_refused_when_malformed(workspace, runs, people, every_kind) -> None:
    for change in (
        {"kind": "input"},
        {"kind": "input", "inputs": {runs[0]: 1}, "mergePatch": {}},
        {"kind": "input", "inputs": {"run_elsewhere": {}}},
        {"kind": "input", "inputs": {}},
        {"kind": "input", "mergePatch": [1]},
        {"kind": "input", "mergePatch": {}, "modelOverrides": {}},
    ):
        with pytest.raises(InvalidEvaluation):
            _start(workspace, people["carol"], change)
    assert not Evaluation.objects.exists() and not ReexecutionRequest.objects.exists()


def test_merge_patch_follows_rfc_7396() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}}
    assert evaluations.merge_patch(target, {"a": "z", "c": {"f": None}}) == {"a": "z", "c": {"d": "e"}}
    assert evaluations.merge_patch({"a": [1]}, {"a": [2]}) == {"a": [2]}
    assert evaluations.merge_patch("text", {"a": 1}) == {"a": 1}
    assert evaluations.merge_patch({"a": 1}, {"b": {"c": None}}) == {"a": 1, "b": {}}


# --- workflow -----------------------------------------------------------------------------------


def test_another_registered_workflow_is_evaluated_against_the_record(
    workspace, runs, people, every_kind, triage_v2: Workflow, tool_counter
) -> None:
    lookups = tool_counter.lookups
    made = _start(workspace, people["carol"], {"kind": "workflow", "workflow": "support.triage-v2"})
    assert made.change == {"kind": "workflow", "workflow": "support.triage-v2", "version": triage_v2.version_id}
    requests = list(ReexecutionRequest.objects.filter(batch_id=made.batch_id))
    assert {(r.workflow, r.workflow_version, r.executor) for r in requests} == {
        ("support.triage-v2", triage_v2.version_id, "builtin")
    }
    done = evaluations.execute_here(made)
    assert done.report["aggregates"]["changed"] == 10 and done.verdict == Verdict.FAILED
    row = done.report["runs"][0]
    new = Run.objects.get(workspace=workspace, run_id=row["newRunId"])
    assert (
        new.output["answeredBy"] == "v2"
        and new.output["reply"] == Run.objects.get(workspace=workspace, run_id=runs[0]).output["reply"]
    )
    started = _started(workspace, row["newRunId"])
    assert started["workflow"] == "support.triage-v2" and started["workflowVersionId"] == triage_v2.version_id
    assert started["reexecution"]["workflowVersionId"] == triage_v2.version_id
    assert tool_counter.lookups == lookups and done.report["aggregates"]["liveToolCalls"] == 0
    assert len(_scored(workspace, done)) == 10


def test_a_workflow_with_the_same_behaviour_keeps_every_outcome(workspace, runs, people, every_kind) -> None:
    """support.triage-premium is the same workflow bound to another (scripted) model: same
    answers, another price."""
    done = evaluations.execute_here(
        _start(workspace, people["carol"], {"kind": "workflow", "workflow": "support.triage-premium"})
    )
    assert done.verdict == Verdict.PASSED and done.report["aggregates"]["changed"] == 0
    assert done.report["aggregates"]["costDelta"] is not None and done.report["aggregates"]["costDelta"] > 0


def test_a_workflow_change_names_a_registered_workflow_at_its_version(
    workspace, runs, people, every_kind, triage_v2
) -> None:
    for change in (
        {"kind": "workflow", "workflow": "support.nope"},
        {"kind": "workflow", "workflow": "support.triage-v2", "version": "wfver_support.triage-v2_000000000000"},
        {"kind": "workflow", "workflow": ""},
        {"kind": "workflow", "workflow": "support.triage-v2", "prompts": {}},
    ):
        with pytest.raises(InvalidEvaluation) as refused:
            _start(workspace, people["carol"], change)
        assert refused.value.status == 400
    assert not Evaluation.objects.exists() and not ReexecutionRequest.objects.exists()
    pinned = _start(
        workspace,
        people["carol"],
        {"kind": "workflow", "workflow": "support.triage-v2", "version": triage_v2.version_id},
    )
    assert pinned.status == Status.RUNNING


# --- finishing without a hook -----------------------------------------------------------------


def test_the_worker_sweep_finishes_an_evaluation_its_hooks_missed(
    workspace, runs, people, every_kind, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledger.reexecution import execution, executor, worker

    made = _start(workspace, people["carol"], {"kind": "input", "mergePatch": {"channel": "chat"}})
    with monkeypatch.context() as patched:  # the hooks that score and judge fail to reach it
        patched.setattr(execution, "_CHANGE_LISTENERS", [])
        patched.setattr(executor, "_AFTER_REQUEST", [])
        for pk in ReexecutionRequest.objects.filter(batch_id=made.batch_id).values_list("pk", flat=True):
            executor.run_request(request_pk=pk)
    made.refresh_from_db()
    assert made.status == Status.RUNNING and made.scores == {}
    assert worker.sweep()["evaluations"] == [made.public_id]
    made.refresh_from_db()
    assert (made.status, made.verdict) == (Status.FINISHED, Verdict.PASSED) and len(made.scores) == 10
    assert worker.sweep()["evaluations"] == []


def test_a_killed_evaluate_run_resumes_under_the_change_it_started_with(workspace, tool_counter) -> None:
    """The change is in the new run's RunStarted: executing the request again after the worker
    died resumes the same run with the same prompt, even when the caller names none."""
    from ledger.demo import workflows as demo_workflows
    from ledger.runtime.reexecute import execute_reexecution

    [original] = triage_runs(workspace, count=3)[2:]
    lookups = tool_counter.lookups
    demo_workflows.CRASH_ON_TURN["Customer says: Parcel lost, help. (order C-3)"] = 2
    prompts = {"draft": {"system": TERSE_SYSTEM}}
    with pytest.raises(demo_workflows.DemoCrash):
        execute_reexecution(
            workspace=workspace,
            original_run_id=original,
            mode="evaluate",
            new_run_id="run_eval_killed",
            reexecution_id="rx_killed",
            prompt_overrides=prompts,
        )
    assert Run.objects.get(workspace=workspace, run_id="run_eval_killed").status == "running"
    outcome = execute_reexecution(
        workspace=workspace,
        original_run_id=original,
        mode="evaluate",
        new_run_id="run_eval_killed",
        reexecution_id="rx_killed",
    )
    assert outcome.status == "completed"
    new = Run.objects.get(workspace=workspace, run_id="run_eval_killed")
    assert new.output["reply"] == "Sorry, I could not find anything about that."
    assert _started(workspace, "run_eval_killed")["reexecution"]["promptOverrides"] == prompts
    assert tool_counter.lookups == lookups
    # A prompt override is a change of mode evaluate only, and names a prompt of the workflow.
    from ledger.runtime.errors import InvalidReexecution

    for mode, overrides in (("rerun", prompts), ("evaluate", {"confirm": {"system": "x"}})):
        with pytest.raises(InvalidReexecution):
            execute_reexecution(
                workspace=workspace,
                original_run_id=original,
                mode=mode,
                new_run_id=f"run_refused_{mode}",
                reexecution_id="rx_refused",
                prompt_overrides=overrides,
            )
