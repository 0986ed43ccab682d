"""`ledger verify`: prove a run's stored log is intact."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import Exists, OuterRef

from ..canonical import canonical_json, event_id
from ..fold import RunStateMismatch, fold
from ..fold.pricing import prices_of
from ..models import CostEntry, Event, LogProof, Run, Step, ToolCall
from . import artifacts, snapshots
from .envelopes import decode_payload, log_rows, row_envelope
from .projection import differences, payload_bytes_of


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass | fail
    detail: str


def artifact_refs(value: Any, *, imported: bool = False) -> Iterator[str]:
    """Every `artifact://art_<sha256>` ref anywhere in a payload; with `imported`, an imported
    log's refs too (artifacts.is_ref), which only ImportedArtifact rows resolve."""
    if isinstance(value, dict):
        for child in value.values():
            yield from artifact_refs(child, imported=imported)
    elif isinstance(value, list):
        for child in value:
            yield from artifact_refs(child, imported=imported)
    elif isinstance(value, str) and (artifacts.is_ref(value) if imported else artifacts.parse_ref(value)):
        yield value


@dataclass(frozen=True)
class Inspection:
    """What verifying a run read, so the evidence bundle and replay plan need not read it again."""

    checks: list[Check]
    log: list[dict[str, Any]]  # the envelopes, in sequence order
    artifact_outcomes: dict[str, str]  # ref -> ok | missing | mismatch


def verify_run(run: Run) -> list[Check]:
    return inspect_run(run).checks


def inspect_run(run: Run) -> Inspection:
    """The integrity checks of `ledger verify`, reading the log once, in a constant number of queries."""
    rows = log_rows(run)
    checks: list[Check] = []

    sequences = [r[0] for r in rows]
    expected = list(range(1, len(rows) + 1))
    if sequences != expected or run.last_sequence != len(rows):
        missing = sorted(set(expected) - set(sequences)) or sorted(
            set(range(1, run.last_sequence + 1)) - set(sequences)
        )
        checks.append(
            Check(
                "dense_sequence", "fail", f"{len(rows)} events, head says {run.last_sequence}; missing {missing[:10]}"
            )
        )
    else:
        checks.append(Check("dense_sequence", "pass", f"1..{len(rows)}"))

    bad_ids: list[int] = []
    refs: set[str] = set()
    log = []
    for row in rows:
        sequence, stored_id, type_, occurrence_id, _, text = row
        payload = decode_payload(text)
        log.append(row_envelope(row, run.run_id, payload))
        recomputed = event_id(
            run_id=run.run_id, sequence=sequence, type=type_, payload=payload, occurrence_id=occurrence_id
        )
        if recomputed != stored_id or canonical_json(payload) != text:
            bad_ids.append(sequence)
        refs.update(artifact_refs(payload, imported=True))
    checks.append(
        Check(
            "event_ids",
            "fail" if bad_ids else "pass",
            f"recomputed ids differ at sequences {bad_ids[:10]}" if bad_ids else f"{len(rows)} ids recomputed",
        )
    )

    outcomes = check_artifacts(run, refs)
    problems = [f"{ref} {state}" for ref, state in sorted(outcomes.items()) if state != "ok"]
    checks.append(
        Check(
            "artifact_hashes",
            "fail" if problems else "pass",
            "; ".join(problems) if problems else f"{len(refs)} artifact(s) re-hashed",
        )
    )

    try:
        state = fold(log, prices=prices_of(run), run_id=run.run_id)
    except RunStateMismatch as exc:
        checks.append(Check("projections", "fail", f"the log cannot be folded: {exc}"))
        return Inspection(checks, log, outcomes)
    diffs = differences(run, state, log) + snapshots.check(run, log) + check_proof(run, log)
    checks.append(
        Check(
            "projections",
            "fail" if diffs else "pass",
            "; ".join(diffs[:10]) + (f" (and {len(diffs) - 10} more)" if len(diffs) > 10 else "")
            if diffs
            else "run, steps, tool calls, cost entries, fold snapshots and the log proof equal the fold",
        )
    )
    return Inspection(checks, log, outcomes)


def check_artifacts(run: Run, refs: set[str]) -> dict[str, str]:
    """ref -> ok | missing | mismatch, re-hashing each artifact of the run's workspace."""
    return {
        ref: "missing" if row is None else artifacts.check(row)
        for ref, row in artifacts.resolve(run, sorted(refs)).items()
    }


def run_references() -> list[Check]:
    """The rows that name their run without a database foreign key (models.Event.run): one check
    per table, failing with the run pks that some row names and no run row has. A scan of each
    table, as the rest of a whole-database `ledger verify` is."""
    checks = []
    for model in (Event, Step, ToolCall, CostEntry):
        missing = list(
            model.objects.filter(~Exists(Run.objects.filter(pk=OuterRef("run_id"))))
            .values_list("run_id", flat=True)
            .distinct()
            .order_by("run_id")[:11]
        )
        name = f"run_reference_{model._meta.model_name}"
        checks.append(
            Check(
                name,
                "fail",
                f"rows name runs that do not exist: pk {missing[:10]}" + (" and more" if len(missing) > 10 else ""),
            )
            if missing
            else Check(name, "pass", f"every {model._meta.verbose_name} row names a run that exists")
        )
    return checks


GENESIS = "runledger log proof v1"


def chain(run_id: str, ids: Iterable[str], digest: str | None = None) -> str:
    """The sha256 chain over stored event ids, from `digest` (a proof's) or from the run's start."""
    link = bytes.fromhex(digest) if digest else hashlib.sha256(f"{GENESIS}\0{run_id}".encode()).digest()
    for stored_id in ids:
        link = hashlib.sha256(link + stored_id.encode()).digest()
    return link.hex()


def check_proof(run: Run, log: Sequence[Mapping[str, Any]]) -> list[str]:
    """What is wrong with the run's log proof (ledger/log/proofs.py) against its whole log."""
    proof = LogProof.objects.filter(run=run).first()
    if proof is None:
        return []
    n = proof.sequence
    if n > len(log) or n < 1:
        return [f"log proof of events 1..{n}: the log has {len(log)} events"]
    prefix = log[:n]
    problems = []
    if prefix[-1].get("eventId") != proof.last_event_id:
        problems.append(f"log proof of events 1..{n}: event {n} has another id")
    if chain(run.run_id, (str(e.get("eventId")) for e in prefix)) != proof.digest:
        problems.append(f"log proof of events 1..{n}: its chain of event ids differs from the log's")
    refs = sorted({ref for e in prefix for ref in artifact_refs(e.get("payload"), imported=True)})
    if refs != sorted(proof.refs):
        problems.append(f"log proof of events 1..{n}: its artifact refs differ from the log's")
    if payload_bytes_of(prefix) != proof.payload_bytes:
        problems.append(f"log proof of events 1..{n}: its payload bytes differ from the log's")
    return problems
