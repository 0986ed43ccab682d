"""The replay plan of a stored run: the pure plan, fed with re-hashed artifacts."""

from __future__ import annotations

from typing import Any

from .models import Run
from .projection import log_of, prices_for
from .replay import replay_plan
from .verify import artifact_refs, check_artifacts


def replay_plan_for(run: Run) -> dict[str, Any]:
    log = log_of(run)
    refs = {ref for event in log for ref in artifact_refs(event["payload"])}
    return replay_plan(log, artifact_checks=check_artifacts(run, refs), prices=prices_for(run.workspace))
