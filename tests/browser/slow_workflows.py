"""Imported by the browser test's worker process only (RUNLEDGER_WORKFLOW_MODULES): the demo's
support.triage with the same scripted model answering one second later per call, so a person
(and the test) can watch its re-execution stream into the run page. The model provider is the
edge the rules allow a double at; the workflow's definition, and so its version, is unchanged.

With RUNLEDGER_TEST_MODEL_GATE naming a file, each call first waits (a minute at most) for that
file to exist: a test that must see the run go on after its page has loaded opens the gate then,
instead of racing the run on a slow machine."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ledger.demo import workflows as demo_workflows
from ledger.runtime.providers import ModelRequest, ScriptedProvider
from ledger.runtime.registry import register

DELAY_S = 1.0

_triage = demo_workflows.SUPPORT_TRIAGE
_model = _triage.models["default"]
assert isinstance(_model, ScriptedProvider) and callable(_model.script)
_script = _model.script


GATE_WAIT_S = 60.0


def _gate() -> None:
    gate = os.environ.get("RUNLEDGER_TEST_MODEL_GATE")
    deadline = time.monotonic() + GATE_WAIT_S
    while gate and not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _slow(request: ModelRequest) -> Mapping[str, Any]:
    _gate()
    time.sleep(DELAY_S)
    return _script(request)


register(
    dataclasses.replace(
        _triage, models={"default": ScriptedProvider(script=_slow, name=_model.name, model_id=_model.model_id)}
    )
)
