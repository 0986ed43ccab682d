"""Imported by the browser test's worker process only (RUNLEDGER_WORKFLOW_MODULES): the demo's
support.triage with the same scripted model answering one second later per call, so a person
(and the test) can watch its re-execution stream into the run page. The model provider is the
edge the rules allow a double at; the workflow's definition, and so its version, is unchanged."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from ledger.demo import workflows as demo_workflows
from ledger.runtime.providers import ModelRequest, ScriptedProvider
from ledger.runtime.registry import register

DELAY_S = 1.0

_triage = demo_workflows.SUPPORT_TRIAGE
_model = _triage.models["default"]
assert isinstance(_model, ScriptedProvider) and callable(_model.script)
_script = _model.script


def _slow(request: ModelRequest) -> Mapping[str, Any]:
    time.sleep(DELAY_S)
    return _script(request)


register(
    dataclasses.replace(
        _triage, models={"default": ScriptedProvider(script=_slow, name=_model.name, model_id=_model.model_id)}
    )
)
