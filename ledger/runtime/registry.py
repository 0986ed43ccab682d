"""Named, versioned workflows defined in Python.

A workflow's version is the digest of its definition: the steps in order, each with its kind
and what it runs (a callable counts by its qualified name and the hash of its source). The
tools and model slots a workflow binds are its *capabilities*: they are not part of the
version, they are what an `ai.generate` session's manifest records, so a change to them shows
up as drift on resume rather than as a new workflow.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..canonical import digest
from .errors import UnknownWorkflow
from .providers import ModelProvider

# input, outputs of earlier steps by step id -> a JSON value
StepFn = Callable[[Any, Mapping[str, Any]], Any]
WORKFLOW_MODULES_ENV = "RUNLEDGER_WORKFLOW_MODULES"
BUILTIN_MODULES = ("ledger.runtime.examples",)


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[[Any], Any]  # args -> JSON result; an exception is the call's error
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)  # JSON schema of args
    effect: str = "read"  # read | write
    timeout_s: float | None = None

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": dict(self.parameters),
                "effect": self.effect, "timeoutS": self.timeout_s}


@dataclass(frozen=True)
class CodeRun:
    id: str
    fn: StepFn
    kind: str = "code.run"

    def definition(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "fn": callable_identity(self.fn)}


@dataclass(frozen=True)
class ToolCall:
    id: str
    tool: str
    args: StepFn | Mapping[str, Any] = field(default_factory=dict)
    kind: str = "tool.call"

    def definition(self) -> dict[str, Any]:
        args = callable_identity(self.args) if callable(self.args) else dict(self.args)
        return {"id": self.id, "kind": self.kind, "tool": self.tool, "args": args}


@dataclass(frozen=True)
class AIGenerate:
    id: str
    prompt: StepFn | str
    system: str = ""
    model: str = "default"  # a model slot of the workflow
    tools: tuple[str, ...] = ()
    max_turns: int = 8
    kind: str = "ai.generate"

    def definition(self) -> dict[str, Any]:
        prompt = callable_identity(self.prompt) if callable(self.prompt) else self.prompt
        return {"id": self.id, "kind": self.kind, "prompt": prompt, "system": self.system,
                "model": self.model, "tools": list(self.tools), "maxTurns": self.max_turns}


Step = CodeRun | ToolCall | AIGenerate


@dataclass(frozen=True)
class Workflow:
    name: str
    steps: tuple[Step, ...]
    tools: Mapping[str, Tool] = field(default_factory=dict)
    models: Mapping[str, ModelProvider] = field(default_factory=dict)
    output: StepFn | None = None  # default: the last step's output

    def __post_init__(self) -> None:
        ids = [s.id for s in self.steps]
        if not ids or len(set(ids)) != len(ids):
            raise ValueError(f"workflow {self.name}: step ids must be present and unique, got {ids}")
        for step in self.steps:
            if isinstance(step, (ToolCall,)) and step.tool not in self.tools:
                raise ValueError(f"workflow {self.name}: step {step.id} uses unknown tool {step.tool}")
            if isinstance(step, AIGenerate):
                missing = [t for t in step.tools if t not in self.tools]
                if missing or step.model not in self.models:
                    raise ValueError(f"workflow {self.name}: step {step.id} needs tools {missing} "
                                     f"or model slot {step.model!r} the workflow does not bind")

    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "steps": [s.definition() for s in self.steps],
                "output": callable_identity(self.output) if self.output else None}

    @property
    def version(self) -> str:
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
        raise UnknownWorkflow(f"no workflow named {name!r} is registered (known: {sorted(_WORKFLOWS)}); "
                              f"list modules that define workflows in {WORKFLOW_MODULES_ENV}", workflow=name) from None


def load_modules(extra: Iterable[str] = ()) -> None:
    """Import the modules that register workflows: the built-in examples, those named in
    RUNLEDGER_WORKFLOW_MODULES (comma-separated) and `extra`."""
    named = [m.strip() for m in os.environ.get(WORKFLOW_MODULES_ENV, "").split(",") if m.strip()]
    for module in (*BUILTIN_MODULES, *named, *extra):
        importlib.import_module(module)
