"""Named, versioned workflows defined in Python.

A workflow's version is the digest of its definition: the steps in order, each with its kind
and what it runs (a callable counts by its qualified name and the hash of its source). The
tools and model slots a workflow binds are its *capabilities*: they are not part of the
version, they are what an `ai.generate` session's manifest records, so a change to them shows
up as drift on resume rather than as a new workflow.

Step kinds (every one takes `retries=N` and `backoff=Backoff(…)`: a failed attempt is recorded as
StepFailed with `error.retriable: true` and `error.retryAt`, the moment the next attempt may start,
then attempt N+1 starts at that moment; see `Backoff`):

- `CodeRun(id, fn)`: `fn(input, outputs)` -> a JSON value.
- `ToolStep(id, tool, args)`: one call of a workflow tool through the tool gateway (`ToolCall`
  is the same class under its former name).
- `AIGenerate(id, prompt, system=, model=, tools=)`: an agent loop in a harness session.
- `Decision(id, route, max_visits=3, loop_to=None)`: `route(input, outputs)` returns the id of
  the step to go to next, or None to go on in order. Its output is `{"target": id-or-None}`.
  Routing back needs `loop_to` (the one earlier step it may return to): the steps from `loop_to`
  through the decision are a loop region, and every step in it is recorded as
  `<id>.visit[N]` (N = 0, 1, …) on every pass. A pass beyond `max_visits` fails the decision
  with `max_visits_exceeded`. Later steps see the newest visit's output under the plain id.
  Loop regions may not overlap.
- `Parallel(id, items, branch, max_branches=16, max_concurrency=4, allow_failure=False)`:
  `items(input, outputs)` is a list or dict; `branch` (a CodeRun, ToolStep, AIGenerate or
  SubWorkflow) runs once per item at the path `<id>[<key>]` (list index or dict key), its
  callables called as `fn(item, outputs)`. The output is the list (or dict) of branch outputs,
  in item order whatever order they finished in. Branches run concurrently, in threads: at most
  `max_concurrency` of them at a time, and at most the process's RUNLEDGER_PARALLEL_THREADS
  (executor.py); more than `max_branches` items fail the step. Retries are the branch's own. A
  failed branch fails the group (failureMode `fail_fast`): branches not yet started are not
  started, those running finish and are recorded. With `allow_failure` (failureMode
  `allow_failure`) it does not stop its siblings: its output is
  `{"status": "failed", "error": …}` and the group completes.
- `SubWorkflow(id, workflow, input, allow_failure=False)`: runs the registered workflow `workflow`
  as a run of its own (`parentRunId` = this run) and outputs its output. A failed sub-run fails
  the step, unless `allow_failure`: then the step outputs
  `{"status": "failed", "subRunId": …, "error": …}` and the workflow goes on. Its id is
  `sub_run_id(parent, step path)` (executor.py): the same step always names the same sub-run.

Step callables should be deterministic functions of their arguments: a resume calls them again
for every step that has not completed (a completed step's output, and a completed decision's
target, come from the log instead).

A ScriptedProvider's script is keyed by the step path up to its first `.` or `[`, so a loop's
visits and a parallel group's branches share the script of their step.

    register(Workflow(name="research_topic", steps=(
        CodeRun("read", lambda i, o: {"topic": i["topic"], "words": len(i["topic"])}),)))
    register(Workflow(
        name="review",
        steps=(
            CodeRun("draft", lambda i, o: {"n": o.get("draft", {"n": 0})["n"] + 1}),
            Decision("gate", lambda i, o: "draft" if o["draft"]["n"] < 3 else None,
                     max_visits=3, loop_to="draft"),
            Parallel("fan", lambda i, o: i["topics"],
                     SubWorkflow("research", "research_topic", lambda item, o: {"topic": item},
                                 allow_failure=True)),
            CodeRun("finish", lambda i, o: {"drafts": o["draft"]["n"], "research": o["fan"]}),
        ),
    ))

`start_run(workspace=ws, workflow="review", input={"topics": ["tides", "moons"]})` records
draft.visit[0..2] and gate.visit[0..2], then fan[0] and fan[1] (each a sub-run whose
RunStarted names this run as parentRunId), then finish.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from django.conf import settings

from ..canonical import digest
from .errors import UnknownWorkflow
from .providers import ModelProvider

# input, outputs of earlier steps by step id -> a JSON value
StepFn = Callable[[Any, Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[[Any], Any]  # args -> JSON result; an exception is the call's error
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)  # JSON schema of args
    effect: str = "read"  # read | write
    timeout_s: float | None = None  # enforced (timeouts.py): a read call fails, a write call is in doubt
    approval: str | None = None  # "required": every call waits for a human approver (ledger/replay/toolapproval.py)

    def spec(self) -> dict[str, Any]:
        spec = {
            "name": self.name,
            "description": self.description,
            "parameters": dict(self.parameters),
            "effect": self.effect,
            "timeoutS": self.timeout_s,
        }
        # Only when set, so the manifests recorded before the field existed keep their hash.
        return {**spec, "approval": self.approval} if self.approval else spec


@dataclass(frozen=True)
class Backoff:
    """The delay before a retry: attempt n+1 of a step (or try n+1 of a model call) starts
    `min(max_s, initial_s * factor ** (n - 1))` seconds after attempt n failed, of which the
    last `jitter` fraction is random (equal jitter: with the default 0.5, a delay d becomes a
    uniform pick in [d/2, d]), so a fleet of runs failing together does not retry together.
    The chosen moment is recorded (`retryAt`), so a resumed run waits only for what is left of
    it. No backoff (the default) retries at once."""

    initial_s: float = 1.0
    factor: float = 2.0
    max_s: float = 60.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.initial_s < 0 or self.max_s < 0 or self.factor < 1 or not 0 <= self.jitter <= 1:
            raise ValueError(
                f"a Backoff needs initial_s >= 0, max_s >= 0, factor >= 1 and 0 <= jitter <= 1, got {self}"
            )

    def delay_s(self, failed_attempt: int, draw: float) -> float:
        """The delay after attempt `failed_attempt` (1-based) failed; `draw` is uniform in [0, 1)."""
        full = min(self.max_s, self.initial_s * self.factor ** max(0, failed_attempt - 1))
        return full * (1 - self.jitter) + full * self.jitter * draw

    def definition(self) -> dict[str, Any]:
        return {"initialS": self.initial_s, "factor": self.factor, "maxS": self.max_s, "jitter": self.jitter}


@dataclass(frozen=True)
class ModelPolicy:
    """How the model calls of one slot are made (`Workflow.model_policies[slot]`): a call that
    raises or outlives `timeout_s` (enforced: the call is abandoned, ledger/runtime/timeouts.py) is
    recorded as `harness.model.failed` and made again up to `retries` more times, after `backoff`'s
    delay (`retryAt` recorded on the failure, so a resumed run waits only for what is left of it);
    then the step fails (`ModelCallFailed`, which the step's own retries may retry). The default:
    two retries at once, no timeout."""

    timeout_s: float | None = None
    retries: int = 2
    backoff: Backoff | None = None

    def __post_init__(self) -> None:
        if self.retries < 0 or (self.timeout_s is not None and self.timeout_s <= 0):
            raise ValueError(f"a ModelPolicy needs retries >= 0 and a positive timeout_s, got {self}")


def _with_retries(definition: dict[str, Any], retries: int, backoff: Backoff | None = None) -> dict[str, Any]:
    # Only a non-default count (or backoff) enters the definition, so adding the field kept older versions.
    definition = {**definition, "retries": retries} if retries else definition
    return {**definition, "backoff": backoff.definition()} if backoff is not None else definition


@dataclass(frozen=True)
class CodeRun:
    id: str
    fn: StepFn
    kind: str = "code.run"
    retries: int = field(default=0, kw_only=True)
    backoff: Backoff | None = field(default=None, kw_only=True)

    def definition(self) -> dict[str, Any]:
        return _with_retries(
            {"id": self.id, "kind": self.kind, "fn": callable_identity(self.fn)}, self.retries, self.backoff
        )


@dataclass(frozen=True)
class ToolStep:
    id: str
    tool: str
    args: StepFn | Mapping[str, Any] = field(default_factory=dict)
    kind: str = "tool.call"
    retries: int = field(default=0, kw_only=True)
    backoff: Backoff | None = field(default=None, kw_only=True)

    def definition(self) -> dict[str, Any]:
        args = callable_identity(self.args) if callable(self.args) else dict(self.args)
        return _with_retries(
            {"id": self.id, "kind": self.kind, "tool": self.tool, "args": args}, self.retries, self.backoff
        )


@dataclass(frozen=True)
class AIGenerate:
    id: str
    prompt: StepFn | str
    system: str = ""
    model: str = "default"  # a model slot of the workflow
    tools: tuple[str, ...] = ()
    max_turns: int = 8
    kind: str = "ai.generate"
    retries: int = field(default=0, kw_only=True)
    backoff: Backoff | None = field(default=None, kw_only=True)

    def definition(self) -> dict[str, Any]:
        prompt = callable_identity(self.prompt) if callable(self.prompt) else self.prompt
        return _with_retries(
            {
                "id": self.id,
                "kind": self.kind,
                "prompt": prompt,
                "system": self.system,
                "model": self.model,
                "tools": list(self.tools),
                "maxTurns": self.max_turns,
            },
            self.retries,
            self.backoff,
        )


@dataclass(frozen=True)
class SubWorkflow:
    id: str
    workflow: str  # a registered workflow's name
    input: StepFn | Mapping[str, Any] = field(default_factory=dict)
    allow_failure: bool = False
    kind: str = "sub.workflow"
    retries: int = field(default=0, kw_only=True)
    backoff: Backoff | None = field(default=None, kw_only=True)

    def definition(self) -> dict[str, Any]:
        value = callable_identity(self.input) if callable(self.input) else dict(self.input)
        return _with_retries(
            {
                "id": self.id,
                "kind": self.kind,
                "workflow": self.workflow,
                "input": value,
                "allowFailure": self.allow_failure,
            },
            self.retries,
            self.backoff,
        )


@dataclass(frozen=True)
class Decision:
    id: str
    route: StepFn  # (input, outputs) -> the id of the next step, or None for the one after
    max_visits: int = 3
    loop_to: str | None = None  # the earlier step a route may go back to
    kind: str = "decision"
    retries: int = field(default=0, kw_only=True)
    backoff: Backoff | None = field(default=None, kw_only=True)

    def definition(self) -> dict[str, Any]:
        return _with_retries(
            {
                "id": self.id,
                "kind": self.kind,
                "route": callable_identity(self.route),
                "maxVisits": self.max_visits,
                "loopTo": self.loop_to,
            },
            self.retries,
            self.backoff,
        )


# The step's name before the fold's record (ToolCallState) and the gateway's model (ToolCall) made
# three things of that name; workflow code written with it keeps working.
ToolCall = ToolStep

BranchStep = CodeRun | ToolStep | AIGenerate | SubWorkflow


@dataclass(frozen=True)
class Parallel:
    id: str
    items: StepFn  # (input, outputs) -> list | dict
    branch: BranchStep  # its callables get (item, outputs)
    max_branches: int = 16
    kind: str = "parallel"
    retries: int = field(default=0, kw_only=True)
    backoff: Backoff | None = field(default=None, kw_only=True)
    max_concurrency: int = field(default=4, kw_only=True)  # branches at a time (and the process's cap)
    allow_failure: bool = field(default=False, kw_only=True)  # a failed branch does not stop the others

    @property
    def failure_mode(self) -> str:
        return "allow_failure" if self.allow_failure else "fail_fast"

    def definition(self) -> dict[str, Any]:
        definition = _with_retries(
            {
                "id": self.id,
                "kind": self.kind,
                "items": callable_identity(self.items),
                "branch": self.branch.definition(),
                "maxBranches": self.max_branches,
            },
            self.retries,
            self.backoff,
        )
        # Non-default values only, as for retries: older versions keep their hash.
        if self.max_concurrency != 4:
            definition["maxConcurrency"] = self.max_concurrency
        if self.allow_failure:
            definition["allowFailure"] = True
        return definition


Step = CodeRun | ToolStep | AIGenerate | SubWorkflow | Decision | Parallel


@dataclass(frozen=True)
class LoopRegion:
    start: int  # index of the `loop_to` step
    end: int  # index of the decision
    decision: Decision


@dataclass(frozen=True)
class Workflow:
    name: str
    steps: tuple[Step, ...]
    tools: Mapping[str, Tool] = field(default_factory=dict)
    models: Mapping[str, ModelProvider] = field(default_factory=dict)
    output: StepFn | None = None  # default: the last step's output
    # Per model slot: timeout, retries and backoff of its calls (default ModelPolicy()). Operational
    # policy, like the providers themselves: not part of the workflow's version.
    model_policies: Mapping[str, ModelPolicy] = field(default_factory=dict)

    def model_policy(self, slot: str) -> ModelPolicy:
        return self.model_policies.get(slot) or ModelPolicy()

    def __post_init__(self) -> None:
        unknown = sorted(set(self.model_policies) - set(self.models))
        if unknown:
            raise ValueError(f"workflow {self.name}: model_policies name slots it does not bind: {unknown}")
        ids = [s.id for s in self.steps]
        if not ids or len(set(ids)) != len(ids):
            raise ValueError(f"workflow {self.name}: step ids must be present and unique, got {ids}")
        for step in self.steps:
            if any(c in step.id for c in ".[]:"):
                raise ValueError(f"workflow {self.name}: step id {step.id!r} may not contain . [ ] or :")
            if step.retries < 0:
                raise ValueError(f"workflow {self.name}: step {step.id} has negative retries")
            self._check_step(step)
            if isinstance(step, Parallel):
                if step.retries:
                    raise ValueError(
                        f"workflow {self.name}: parallel step {step.id} cannot retry as a whole; "
                        "give its branch step `retries` instead"
                    )
                if step.max_branches < 1 or step.max_concurrency < 1:
                    raise ValueError(
                        f"workflow {self.name}: parallel step {step.id} needs max_branches >= 1 "
                        "and max_concurrency >= 1"
                    )
                if not isinstance(step.branch, (CodeRun, ToolStep, AIGenerate, SubWorkflow)):
                    raise ValueError(
                        f"workflow {self.name}: the branch of {step.id} must be a CodeRun, ToolStep, "
                        "AIGenerate or SubWorkflow"
                    )
                self._check_step(step.branch)
            if isinstance(step, Decision) and step.max_visits < 1:
                raise ValueError(f"workflow {self.name}: decision {step.id} needs max_visits >= 1")
        self.loop_regions()  # raises on a bad loop_to or overlapping loops

    def _check_step(self, step: Step) -> None:
        if isinstance(step, ToolStep) and step.tool not in self.tools:
            raise ValueError(f"workflow {self.name}: step {step.id} uses unknown tool {step.tool}")
        if isinstance(step, AIGenerate):
            missing = [t for t in step.tools if t not in self.tools]
            if missing or step.model not in self.models:
                raise ValueError(
                    f"workflow {self.name}: step {step.id} needs tools {missing} "
                    f"or model slot {step.model!r} the workflow does not bind"
                )

    def loop_regions(self) -> list[LoopRegion]:
        index = {s.id: i for i, s in enumerate(self.steps)}
        regions: list[LoopRegion] = []
        for end, step in enumerate(self.steps):
            if not isinstance(step, Decision) or step.loop_to is None:
                continue
            start = index.get(step.loop_to)
            if start is None or start > end:
                raise ValueError(
                    f"workflow {self.name}: decision {step.id} loops to {step.loop_to!r}, "
                    "which is not a step at or before it"
                )
            for other in regions:
                if start <= other.end and other.start <= end:
                    raise ValueError(
                        f"workflow {self.name}: the loops of {other.decision.id} and {step.id} "
                        "overlap; loop regions must be disjoint"
                    )
            regions.append(LoopRegion(start, end, step))
        return regions

    def definition(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "steps": [s.definition() for s in self.steps],
            "output": callable_identity(self.output) if self.output else None,
        }

    @cached_property
    def version(self) -> str:
        """Computed once: the definition is immutable, and each callable's identity re-reads its
        source (inspect.getsource), which an executor would otherwise pay on every step it runs."""
        return digest(self.definition())

    @property
    def version_id(self) -> str:
        return f"wfver_{self.name}_{self.version.removeprefix('sha256:')[:12]}"


def callable_identity(fn: Callable[..., Any]) -> dict[str, str]:
    """A callable as a definition sees it: its name and the hash of its source, not its module,
    so one workflow imported under two module names still has one version."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = ""
    return {"name": getattr(fn, "__qualname__", repr(fn)), "source": hashlib.sha256(source.encode()).hexdigest()}


_WORKFLOWS: dict[str, Workflow] = {}


def register(workflow: Workflow) -> Workflow:
    """Make `workflow` runnable by name; a later registration of the same name replaces it."""
    _WORKFLOWS[workflow.name] = workflow
    return workflow


def get_workflow(name: str) -> Workflow:
    load_modules()
    try:
        return _WORKFLOWS[name]
    except KeyError:
        raise UnknownWorkflow(
            f"no workflow named {name!r} is registered (known: {sorted(_WORKFLOWS)}); "
            "list modules that define workflows in RUNLEDGER_WORKFLOW_MODULES",
            workflow=name,
        ) from None


def load_modules(extra: Iterable[str] = ()) -> None:
    """Import the modules that register workflows: those of the RUNLEDGER_WORKFLOW_MODULES setting
    (the demo's, and those the environment variable of that name adds) and `extra`."""
    for module in (*settings.RUNLEDGER_WORKFLOW_MODULES, *extra):
        importlib.import_module(module)
