"""The replay plan of a stored run: the pure plan, fed with re-hashed artifacts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..fold import ARTIFACT_REF_PREFIX, RunState
from ..fold.pricing import prices_of
from ..log.envelopes import decode_payload, log_of
from ..log.verify import artifact_refs, check_artifacts
from ..models import Event, Run
from .plan import dense_check_of, plan_of_state, replay_plan


def replay_plan_for(run: Run, log: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The plan of the run's log, or of `log` when the caller has read it already (the whole log
    or a prefix of it: the plan as it was after that event)."""
    log = log_of(run) if log is None else log
    refs = {ref for event in log for ref in artifact_refs(event["payload"])}
    return replay_plan(log, artifact_checks=check_artifacts(run, refs), prices=prices_of(run))


def replay_plan_at(run: Run, state: RunState) -> dict[str, Any]:
    """The plan of a folded state of the run (a fold snapshot's, ledger/replay/runlog.snapshot):
    the same plan `replay_plan_for` makes of the log up to `state.last_sequence`, reading only the
    events that name an artifact (to re-hash what they name) instead of the whole log."""
    texts = Event.objects.filter(
        run=run, sequence__lte=state.last_sequence, payload__contains=ARTIFACT_REF_PREFIX
    ).values_list("payload", flat=True)
    refs = {ref for text in texts for ref in artifact_refs(decode_payload(text))}
    return plan_of_state(state, dense_check_of(state), check_artifacts(run, refs))
