"""The replay plan of a stored run: the pure plan, fed with re-hashed artifacts."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

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
    """The plan of a folded state of the run (a fold snapshot's, from ledger/replay/runlog.py `snapshot`):
    the same plan `replay_plan_for` makes of the log up to `state.last_sequence`, reading only the
    events that name an artifact (to re-hash what they name) instead of the whole log.

    A state read through ledger/log/snapshots.py is shared and never changed, and the refs of a
    prefix of the log never change: both are remembered for the state (`_PLANS`), and the plan is
    made again only when a re-hash answers otherwise than the last time. Every call re-hashes."""
    with _PLANS_LOCK:
        hit = _PLANS.get(id(state))
        if hit is not None and hit[0] is state:
            _PLANS.move_to_end(id(state))
    refs = hit[1] if hit is not None and hit[0] is state else _refs(run, state.last_sequence)
    checks = check_artifacts(run, refs)
    if hit is not None and hit[0] is state and hit[2] == checks:
        return hit[3]
    plan = plan_of_state(state, dense_check_of(state), checks)
    with _PLANS_LOCK:
        _PLANS[id(state)] = (state, refs, checks, plan)
        while len(_PLANS) > 16:
            _PLANS.popitem(last=False)
    return plan


def plan_of_checked(state: RunState, checks: Mapping[str, str]) -> dict[str, Any]:
    """The plan of a folded state whose artifacts the caller has re-hashed (`checks`, ref -> ok |
    missing | mismatch: the evidence bundle's), remembered for the state and those answers as
    `replay_plan_at` remembers its own. Never change what it returns."""
    answers = dict(checks)
    with _PLANS_LOCK:
        hit = _PLANS.get(id(state))
        if hit is not None and hit[0] is state and hit[2] == answers:
            _PLANS.move_to_end(id(state))
            return hit[3]
    plan = plan_of_state(state, dense_check_of(state), answers)
    with _PLANS_LOCK:
        _PLANS[id(state)] = (state, set(answers), answers, plan)
        while len(_PLANS) > 16:
            _PLANS.popitem(last=False)
    return plan


def _refs(run: Run, upto: int) -> set[str]:
    """The artifact refs of the run's events up to `upto`. The log is append-only: the refs found
    up to an earlier sequence are kept per run, and a later state (a live run's page, refreshed as
    it grows) reads only the events after it, not a scan of the whole log each time."""
    # With the pk and its creation: a run deleted and another made in its row is another run.
    key = (run.pk, run.run_id, run.created_at.isoformat() if run.created_at else "")
    with _PLANS_LOCK:
        known = _REFS.get(key)
    start, found = known if known is not None and known[0] <= upto else (0, frozenset[str]())
    if start < upto:
        texts = Event.objects.filter(
            run=run, sequence__gt=start, sequence__lte=upto, payload__contains=ARTIFACT_REF_PREFIX
        ).values_list("payload", flat=True)
        found = found | {ref for text in texts for ref in artifact_refs(decode_payload(text))}
        with _PLANS_LOCK:
            if key not in _REFS or _REFS[key][0] < upto:
                _REFS[key] = (upto, found)
            _REFS.move_to_end(key)
            while len(_REFS) > 64:
                _REFS.popitem(last=False)
    return set(found)


# The plans of recently read states, by the state's identity, the state held so its id is not reused.
_PLANS: OrderedDict[int, tuple[RunState, set[str], dict[str, str], dict[str, Any]]] = OrderedDict()
_PLANS_LOCK = threading.Lock()
# The artifact refs of a run's log up to a sequence, by (run pk, run id, creation): `_refs`.
_REFS: OrderedDict[tuple[int, str, str], tuple[int, frozenset[str]]] = OrderedDict()


class PlanIndex(NamedTuple):
    """Lookups into one plan for a page of its steps: a page of a long run shows a few hundred of
    its tens of thousands of steps, and must not walk the whole plan on every request."""

    should_run: dict[str, bool]  # by step path
    sessions: dict[str, list[tuple[int, dict[str, Any]]]]  # by step path, with their place in the plan
    stepless: list[tuple[int, dict[str, Any]]]  # sessions of no step of the plan


def plan_index(plan: Mapping[str, Any]) -> PlanIndex:
    """The plan's index, made once per plan (plans are remembered and never changed: `_PLANS`)."""
    with _PLANS_LOCK:
        hit = _INDEXES.get(id(plan))
        if hit is not None and hit[0] is plan:
            _INDEXES.move_to_end(id(plan))
            return hit[1]
    should_run = {step["stepPath"]: step["shouldRun"] for step in plan["steps"]}
    sessions: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    stepless: list[tuple[int, dict[str, Any]]] = []
    for place, session in enumerate(plan["sessions"]):
        path = session["stepPath"]
        sessions.setdefault(path, []).append((place, session))
        if path not in should_run:
            stepless.append((place, session))
    index = PlanIndex(should_run, sessions, stepless)
    with _PLANS_LOCK:
        _INDEXES[id(plan)] = (plan, index)
        while len(_INDEXES) > 16:
            _INDEXES.popitem(last=False)
    return index


def sessions_of_steps(plan: Mapping[str, Any], paths: Iterable[str], *, stepless: bool) -> list[dict[str, Any]]:
    """The plan's sessions of the steps `paths` (and, with `stepless`, those of no step of the
    plan), in the plan's order: what a page of the steps lists under them."""
    index = plan_index(plan)
    found = {place: session for path in set(paths) for place, session in index.sessions.get(path, ())}
    if stepless:
        found.update(index.stepless)
    return [found[place] for place in sorted(found)]


# The indexes of recently shown plans, by the plan's identity, the plan held so its id is not reused.
_INDEXES: OrderedDict[int, tuple[Mapping[str, Any], PlanIndex]] = OrderedDict()
