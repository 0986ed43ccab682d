"""Log proofs: `ledger verify`'s checks of a run's log, made once, so that the evidence bundle of a
long run checks only the events appended since (issue 33: the evidence JSON of a run of 100,000
events read and re-hashed the whole log on every request, 40 to 100 s).

A proof (`LogProof`, one per run) says: events 1..N were read, dense, every event id recomputed
from its payload and equal to the stored one, and the projections (run, steps, tool calls, cost
entries) equal to the fold of the log at the run's head when it was made or last extended. It
keeps what the checks need of the prefix without reading it: the stored id of event N, a sha256
chain over the stored ids 1..N (`verify.chain`), the artifact refs events 1..N name and the bytes of
their payloads.

`inspect(run)` answers the integrity checks from the proof when it can:

- event N must still be in the log with the id the proof recorded, and events N+1..head must be
  dense up to the head; each of those is re-hashed as `ledger verify` does;
- every artifact ref of the log (the proof's and the new events') is re-hashed, every time;
- when events were appended since, the projections are compared with the fold again (from the fold
  snapshots) and the proof is extended to the head;
- anything else — no proof, a check that fails, a proof that does not fit the log — is answered by
  `ledger verify`'s full inspection (which then names what is wrong), and a full inspection that
  passes records the proof.

A run that ends with at least PROVE_FROM events gets its proof, and its fold snapshots, from the
worker (`prove_run`, queued by `queue_proof` when the append ends the run), so that the first
person to open its evidence, conversation or state does not pay for the whole log (at 100,000
events, 9 to 14 s for the evidence JSON and 2.7 s for the conversation before this). A shorter run
is proved by its first evidence request, which is cheap enough there; a run that never ends, or
one whose task was lost, is proved by that request too.

What the proof trusts for events 1..N: that stored events are never changed or deleted (the
database refuses it: ledger/dbguards.py) and that projection rows change only by the append path
or `ledger rebuild` (which throws the proof away). `ledger verify` checks the proof itself (its
chain, last id, refs and bytes against the log it reads whole), so a proof that lies is a failing
`projections` check there.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from django_tasks import task

from ..canonical import canonical_json, event_id
from ..fold import RunState
from ..fold.pricing import prices_of
from ..models import LogProof, Run
from .envelopes import decode_payload, log_rows, read_envelopes
from .projection import differences, payload_bytes_of
from .snapshots import EVERY, state_after
from .verify import Check, Inspection, artifact_refs, chain, check_artifacts, inspect_run

log = logging.getLogger(__name__)

# The shortest run the worker proves when it ends: one long enough to have a stored fold snapshot.
# Below it, the first evidence request proves the run in well under a second.
PROVE_FROM = EVERY


@dataclass(frozen=True)
class Inspected:
    """The integrity checks of a run and the artifact re-hashes; `state` (the fold of the whole
    log, from the snapshots) when answered from a proof, `log` (read whole) when not."""

    checks: list[Check]
    artifact_outcomes: dict[str, str]
    state: RunState | None = None
    log: list[dict[str, Any]] | None = None


def inspect(run: Run) -> Inspected:
    """`ledger verify`'s checks of the run (see the module docstring), from its proof when one fits."""
    prices = prices_of(run)
    proof = LogProof.objects.filter(run=run).first()
    if proof is not None and proof.price_version == prices.version and 0 < proof.sequence <= run.last_sequence:
        proved = _from_proof(run, proof, prices.version)
        if proved is not None:
            return proved
    full = inspect_run(run)
    if full.log and all(c.status == "pass" for c in full.checks):
        recorded = _record(run, full, prices.version, replacing=proof)
        if recorded is not None:
            return Inspected(_checks(recorded), full.artifact_outcomes, log=full.log)
    return Inspected(full.checks, full.artifact_outcomes, log=full.log)


def _checks(proof: LogProof) -> list[Check]:
    """The checks a proof answers, worded by the proof alone (the same words whichever request made
    or extended it: two downloads of an unchanged run's evidence are byte-equal)."""
    n = proof.sequence
    made = f"log proof sha256:{proof.digest[:16]}…, {proof.proved_at.isoformat().replace('+00:00', 'Z')}"
    return [
        Check("dense_sequence", "pass", f"1..{n}"),
        Check("event_ids", "pass", f"{n} ids recomputed ({made})"),
        Check("artifact_hashes", "pass", f"{len(proof.refs)} artifact(s) re-hashed"),
        Check(
            "projections",
            "pass",
            f"run, steps, tool calls and cost entries equal the fold at event {n} ({made}); "
            "fold snapshots are compared by ledger verify",
        ),
    ]


def _record(run: Run, full: Inspection, version: str, *, replacing: LogProof | None) -> LogProof | None:
    log = full.log
    fields = {
        "sequence": len(log),
        "last_event_id": log[-1]["eventId"],
        "digest": chain(run.run_id, (e["eventId"] for e in log)),
        "refs": sorted(full.artifact_outcomes),
        "payload_bytes": payload_bytes_of(log),
        "price_version": version,
        "proved_at": timezone.now(),
    }
    try:
        with transaction.atomic():
            if replacing is not None:
                LogProof.objects.filter(pk=replacing.pk).delete()
            return LogProof.objects.create(run=run, **fields)
    except IntegrityError:
        return None  # another reader recorded one first


def _from_proof(run: Run, proof: LogProof, version: str) -> Inspected | None:
    """The checks from the proof and the events after it, or None when only a full inspection can
    answer (something failed, or the proof does not fit the log)."""
    proved = proof.sequence
    last = run.last_sequence
    rows = log_rows(run, after=proved - 1, limit=last - proved + 1)  # not what was appended since `run` was read
    if not rows or rows[0][0] != proved or rows[0][1] != proof.last_event_id:
        return None
    tail = rows[1:]
    if [r[0] for r in tail] != list(range(proved + 1, last + 1)):
        return None
    refs = set(proof.refs)
    tail_bytes = 0
    for sequence, stored_id, type_, occurrence_id, _, text in tail:
        payload = decode_payload(text)
        recomputed = event_id(
            run_id=run.run_id, sequence=sequence, type=type_, payload=payload, occurrence_id=occurrence_id
        )
        if recomputed != stored_id or canonical_json(payload) != text:
            return None
        refs.update(artifact_refs(payload, imported=True))
        tail_bytes += len(text.encode("utf-8"))
    outcomes = check_artifacts(run, refs)
    if any(state != "ok" for state in outcomes.values()):
        return None
    state = state_after(run)
    if tail:
        recorded = read_envelopes(run, sequences=[entry.sequence for entry in state.cost_entries])
        if differences(run, state, recorded, payload_bytes=proof.payload_bytes + tail_bytes):
            return None
        extended = {
            "sequence": last,
            "last_event_id": tail[-1][1],
            "digest": chain(run.run_id, (r[1] for r in tail), proof.digest),
            "refs": sorted(refs),
            "payload_bytes": proof.payload_bytes + tail_bytes,
            "proved_at": timezone.now(),
        }
        if not LogProof.objects.filter(pk=proof.pk, sequence=proved).update(**extended):
            return None  # another reader extended or replaced it meanwhile
        for name, value in extended.items():
            setattr(proof, name, value)
    return Inspected(_checks(proof), outcomes, state=state)


@task()
def prove_run(run_pk: int) -> str:
    """The worker's half of a long run's end: its fold snapshots stored and its log proved, before
    anybody asks. What it found, for the task's result."""
    run = Run.objects.filter(pk=run_pk).first()
    if run is None:
        return "gone"
    state_after(run)
    failed = [c.name for c in inspect(run).checks if c.status != "pass"]
    if failed:
        log.warning("log proof of run %s: checks failed: %s (ledger verify names what is wrong)", run.run_id, failed)
        return "failed: " + ", ".join(failed)
    return f"proved 1..{run.last_sequence}"


def queue_proof(*, run: Run, written: Sequence[Mapping[str, Any]]) -> None:
    """The run-ended hook (hooks.py; registered in ledger/apps.py): a long run's proof queued for
    the worker once the append commits. A task that cannot be queued costs only the warm-up: the
    first request proves the run instead, so the append is never failed for it."""
    if run.last_sequence < PROVE_FROM:
        return
    run_pk = run.pk
    transaction.on_commit(lambda: prove_run.enqueue(run_pk), robust=True)
