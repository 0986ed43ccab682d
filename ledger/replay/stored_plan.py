"""The replay plan of a stored run: the pure plan, fed with re-hashed artifacts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..fold.pricing import prices_of
from ..log.envelopes import log_of
from ..log.verify import artifact_refs, check_artifacts
from ..models import Run
from .plan import replay_plan


def replay_plan_for(run: Run, log: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The plan of the run's log, or of `log` when the caller has read it already (the whole log
    or a prefix of it: the plan as it was after that event)."""
    log = log_of(run) if log is None else log
    refs = {ref for event in log for ref in artifact_refs(event["payload"])}
    return replay_plan(log, artifact_checks=check_artifacts(run, refs), prices=prices_of(run))
