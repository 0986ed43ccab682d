"""`ledger import-little DIR`: a Little Workflow data directory into the ledger, ids and all.

A data directory (docs/operations.md § Importing Little Workflow data) holds the runs' logs (the store
`events/events.db`, and/or `events/<anything>.jsonl` files with one envelope per line, which is what
`little events RUN` prints), artifacts (`artifacts/<art_id>.json` manifests and
`artifacts/blobs/<art_id>.bin` bytes) and outer-loop manifests (`outer-loops/<ol_id>.json`).

The import reads and checks everything first, run by run, and writes the runs nothing is wrong with: every
event id recomputed from its content, sequences dense, every event one the write path takes
(vocabulary, lifecycle, limits) with its payload left as it is by the workspace's redaction,
every artifact re-hashed against its manifest and named by the id its identity gives, every
artifact a log references present, every outer-loop manifest agreeing with the logs. A run with
a problem is refused whole, named by file, run, sequence and reason, and nothing of it is written;
the other runs come in. Then each run goes through the one write path (`ledger.log.append`), its events
grouped by their original `recordedAt`, which each append stamps; the ids the write path
computes must equal the log's, or that append rolls back.

A run the workspace already holds with the same events is skipped; one that holds a prefix of
the directory's log gets the rest appended; one that holds something else is a problem.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.db import transaction

from .. import clock
from ..canonical import NotCanonicalizable, canonical_bytes, digest, event_id
from ..errors import LedgerError
from ..limits import DuplicateKey, TooDeep, loads
from ..log import append, artifacts
from ..log.prepare import MAX_BATCH, RUN_ID_RE, stored_payload
from ..log.rules import lifecycle_refusal
from ..models import Artifact, Event, ImportedArtifact, Run, Workspace

EVENT_ID_RE = re.compile(r"evt_[0-9a-f]{16}")
ARTIFACT_ID_RE = re.compile(r"art_[0-9a-f]{16}")
OUTER_LOOP_ID_RE = re.compile(r"ol_[A-Za-z0-9_-]{1,120}")
SHA256_RE = re.compile(r"sha256:([0-9a-f]{64})")
ENCODINGS = ("json", "utf-8", "binary")
_EVENT_INDEX_PREFIX = re.compile(r"^event \d+: ")


class ImportRefused(LedgerError):
    code = "import_refused"

    def __init__(self, problems: list[str], message: str | None = None) -> None:
        super().__init__(message or f"nothing was imported: {len(problems)} problem(s)", problems=problems)
        self.problems = problems


@dataclass(frozen=True)
class LoggedEvent:
    envelope: dict[str, Any]
    where: str  # "events/x.jsonl:3" or "events/events.db (run_a, sequence 3)"

    @property
    def sequence(self) -> int:
        return int(self.envelope["sequence"])

    @property
    def type(self) -> str:
        return str(self.envelope["type"])

    @property
    def payload(self) -> dict[str, Any]:
        return dict(self.envelope["payload"])


@dataclass(frozen=True)
class LittleArtifact:
    artifact_id: str
    run_id: str
    step_path: str | None
    name: str
    content_type: str
    encoding: str
    size: int
    data: bytes
    created_at: datetime | None
    where: str


@dataclass(frozen=True)
class OuterLoop:
    outer_loop_id: str
    goal: str
    max_cycles: int
    cycles: list[dict[str, Any]]
    done: bool
    pending_run_id: str | None
    where: str


@dataclass
class DataDir:
    runs: dict[str, list[LoggedEvent]] = field(default_factory=dict)
    artifacts: dict[str, LittleArtifact] = field(default_factory=dict)
    outer_loops: list[OuterLoop] = field(default_factory=list)


@dataclass
class Summary:
    lines: list[str] = field(default_factory=list)
    runs_imported: int = 0
    runs_continued: int = 0
    runs_skipped: int = 0
    events_written: int = 0
    artifacts_stored: int = 0
    # What was refused, each `FILE:LINE: [run R, sequence N: ]reason`: a run with any problem is
    # left out whole, the others come in (the exit status says something was refused).
    problems: list[str] = field(default_factory=list)
    runs_refused: list[str] = field(default_factory=list)

    @property
    def refused(self) -> bool:
        return bool(self.problems)

    def line(self, workspace: str) -> str:
        return (
            f"{self.runs_imported} run(s) imported, {self.runs_continued} continued, "
            f"{self.runs_skipped} skipped, {len(self.runs_refused)} refused; {self.events_written} event(s) "
            f"written, {self.artifacts_stored} artifact(s) stored, into {workspace}"
            + (f"; {len(self.problems)} problem(s)" if self.problems else "")
        )


# --- reading ---------------------------------------------------------------------------------


def read_data_dir(root: Path) -> tuple[DataDir, list[str]]:
    """The directory's logs, artifacts and outer loops, and what is malformed in it (as
    `FILE:LINE: message`, paths relative to `root`)."""
    problems: list[str] = []
    data = DataDir()
    if not root.is_dir():
        return data, [f"{root}: not a directory"]
    db, jsonl = root / "events" / "events.db", sorted((root / "events").glob("*.jsonl"))
    if not db.is_file() and not jsonl:
        return data, [f"{root}: not a Little Workflow data directory (no events/events.db, no events/*.jsonl)"]
    logs: dict[str, list[LoggedEvent]] = {}
    if db.is_file():
        _read_store(db, logs, problems)
    for path in jsonl:
        _read_jsonl(root, path, logs, problems)
    data.runs = logs
    _read_artifacts(root, data, problems)
    _read_outer_loops(root, data, problems)
    return data, problems


def _rel(root: Path, path: Path) -> str:
    return str(path.relative_to(root))


def _read_store(db: Path, logs: dict[str, list[LoggedEvent]], problems: list[str]) -> None:
    name = "events/events.db"
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            rows = con.execute(
                "SELECT run_id, sequence, event_id, type, occurrence_id, recorded_at, payload "
                "FROM events ORDER BY run_id, sequence"
            ).fetchall()
        finally:
            con.close()
    except sqlite3.Error as exc:
        problems.append(f"{name}: not a Little Workflow event store ({exc})")
        return
    for run_id, sequence, eid, type_, occurrence_id, recorded_at, text in rows:
        where = f"{name} (run {run_id}, sequence {sequence})"
        try:
            payload = loads(text) if isinstance(text, str) else None
        except ValueError as exc:  # TooDeep too
            problems.append(f"{where}: payload is not JSON ({exc})")
            continue
        env: dict[str, Any] = {"eventId": eid, "runId": run_id, "sequence": sequence, "type": type_}
        if occurrence_id is not None:
            env["occurrenceId"] = occurrence_id
        env.update(recordedAt=recorded_at, payload=payload)
        if (problem := _envelope_problem(env)) is not None:
            problems.append(f"{where}: {problem}")
            continue
        logs.setdefault(run_id, []).append(LoggedEvent(env, where))


def _read_jsonl(root: Path, path: Path, logs: dict[str, list[LoggedEvent]], problems: list[str]) -> None:
    name = _rel(root, path)
    run_of_file: str | None = None
    events: list[LoggedEvent] = []
    try:
        handle = path.open("rb")
    except OSError as exc:  # a directory named *.jsonl, a file that cannot be read
        problems.append(f"{name}:1: unreadable ({exc.strerror or exc})")
        return
    with handle:
        for number, raw in enumerate(handle, start=1):
            where = f"{name}:{number}"
            if not raw.strip():
                continue
            try:
                env = loads(raw)  # nested deeper than the API takes: refused as it refuses it
            except ValueError as exc:
                problems.append(f"{where}: not a JSON envelope ({exc})")
                return
            problem = _envelope_problem(env)
            if problem is not None:
                problems.append(f"{where}: {problem}")
                return
            if run_of_file is None:
                run_of_file = env["runId"]
            elif env["runId"] != run_of_file:
                problems.append(f"{where}: runId {env['runId']} in the log of {run_of_file} (one run per file)")
                return
            events.append(LoggedEvent(env, where))
    if run_of_file is None:
        problems.append(f"{name}:1: empty log")
        return
    if run_of_file in logs:
        stored = [e.envelope for e in logs[run_of_file]]
        if stored != [e.envelope for e in events]:
            problems.append(
                f"{name}:1: run {run_of_file} is also in {logs[run_of_file][0].where.split(' ')[0]} with other events"
            )
        return
    logs[run_of_file] = events


def _envelope_problem(env: Any) -> str | None:
    """What is wrong with the shape of one envelope (§1), or None (a null occurrenceId dropped)."""
    if not isinstance(env, dict):
        return "an envelope must be a JSON object"
    for key, kind in (("eventId", str), ("runId", str), ("type", str), ("recordedAt", str), ("payload", dict)):
        if not isinstance(env.get(key), kind):
            return f"envelope field {key} is missing or not a {'string' if kind is str else 'object'}"
    sequence = env.get("sequence")
    if isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 1:
        return "envelope field sequence must be a positive integer"
    if env.get("occurrenceId") is None:
        env.pop("occurrenceId", None)  # Little Workflow omits a null one; it is not hashed either way
    elif not isinstance(env["occurrenceId"], str):
        return "envelope field occurrenceId must be a string when present"
    if not RUN_ID_RE.fullmatch(env["runId"]):
        return f"invalid run id {env['runId']!r} (Little Workflow's own rule: {RUN_ID_RE.pattern})"
    if not EVENT_ID_RE.fullmatch(env["eventId"]):
        return f"eventId {env['eventId']!r} is not evt_ and 16 hex digits"
    if _recorded_at(env["recordedAt"]) is None:
        return f"recordedAt {env['recordedAt']!r} is not an ISO 8601 UTC time"
    return None


def _recorded_at(text: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return moment.astimezone(UTC)


def _json_file(root: Path, path: Path, problems: list[str]) -> Any:
    try:
        return loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        problems.append(f"{_rel(root, path)}:{exc.lineno}: not JSON ({exc.msg})")
    except (TooDeep, DuplicateKey) as exc:
        problems.append(f"{_rel(root, path)}:1: not JSON the ledger takes ({exc})")
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"{_rel(root, path)}:1: unreadable ({exc})")
    return None


def _read_artifacts(root: Path, data: DataDir, problems: list[str]) -> None:
    for path in sorted((root / "artifacts").glob("*.json")):
        name = _rel(root, path)
        manifest = _json_file(root, path, problems)
        if manifest is None:
            continue
        artifact, problem = _artifact(root, path, manifest)
        if problem is not None:
            problems.append(f"{name}:1: {problem}")
        elif artifact is not None:
            data.artifacts[artifact.artifact_id] = artifact


def _artifact(root: Path, path: Path, m: Any) -> tuple[LittleArtifact | None, str | None]:
    """The artifact a manifest (§7) describes, its blob re-hashed, or what is wrong with it."""
    if not isinstance(m, dict):
        return None, "an artifact manifest must be a JSON object"
    aid = m.get("artifactId")
    if not isinstance(aid, str) or not ARTIFACT_ID_RE.fullmatch(aid) or path.stem != aid:
        return None, f"artifactId {aid!r} must be art_ and 16 hex digits, and name the file"
    if m.get("artifactRef") != artifacts.REF_PREFIX + aid:
        return None, f"artifactRef must be {artifacts.REF_PREFIX}{aid}"
    for key in ("runId", "name", "contentType"):
        if not isinstance(m.get(key), str):
            return None, f"{key} is missing or not a string"
    if not RUN_ID_RE.fullmatch(m["runId"]):
        return None, f"invalid run id {m['runId']!r}"
    if "stepPath" in m and not isinstance(m["stepPath"], str):
        return None, "stepPath must be a string when present"
    if m.get("encoding") not in ENCODINGS:
        return None, f"encoding must be one of {', '.join(ENCODINGS)}"
    sha = SHA256_RE.fullmatch(m["sha256"]) if isinstance(m.get("sha256"), str) else None
    if sha is None:
        return None, "sha256 must be sha256: and 64 hex digits"
    size = m.get("sizeBytes")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        return None, "sizeBytes must be a non-negative integer"
    if len(m["contentType"]) > 100:
        return None, "contentType is longer than 100 characters"
    identity = {k: m[k] for k in ("runId", "stepPath", "name", "contentType", "encoding") if k in m}
    expected = "art_" + digest({**identity, "payloadHash": m["sha256"]})[7:23]
    if expected != aid:
        return None, f"artifactId {aid} does not match its identity, which gives {expected}"
    blob = root / "artifacts" / "blobs" / f"{aid}.bin"
    try:
        data = blob.read_bytes()
    except OSError:
        return None, f"its bytes ({_rel(root, blob)}) are missing"
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha.group(1):
        return None, f"{_rel(root, blob)} hashes to sha256:{actual}, the manifest says {m['sha256']}"
    if len(data) != size:
        return None, f"{_rel(root, blob)} holds {len(data)} bytes, the manifest says {size}"
    created = m.get("createdAt")
    return LittleArtifact(
        aid,
        m["runId"],
        m.get("stepPath"),
        m["name"],
        m["contentType"],
        m["encoding"],
        size,
        data,
        _recorded_at(created) if isinstance(created, str) else None,
        _rel(root, path),
    ), None


def _read_outer_loops(root: Path, data: DataDir, problems: list[str]) -> None:
    for path in sorted((root / "outer-loops").glob("*.json")):
        name = _rel(root, path)
        m = _json_file(root, path, problems)
        if m is None:
            continue
        loop, problem = _outer_loop(path, m, name)
        if problem is not None:
            problems.append(f"{name}:1: {problem}")
        elif loop is not None:
            data.outer_loops.append(loop)


def _outer_loop(path: Path, m: Any, name: str) -> tuple[OuterLoop | None, str | None]:
    """The outer loop a manifest (§6) describes, or what is wrong with it."""
    if not isinstance(m, dict):
        return None, "an outer-loop manifest must be a JSON object"
    oid = m.get("outerLoopId")
    if not isinstance(oid, str) or not OUTER_LOOP_ID_RE.fullmatch(oid) or path.stem != oid:
        return None, f"outerLoopId {oid!r} must start with ol_ and name the file"
    max_cycles, cycles = m.get("maxCycles"), m.get("cycles")
    if isinstance(max_cycles, bool) or not isinstance(max_cycles, int) or max_cycles < 1:
        return None, "maxCycles must be a positive integer"
    if not isinstance(m.get("goal"), dict) or not isinstance(cycles, list):
        return None, "goal (an object) and cycles (a list) are required"
    if len(cycles) > max_cycles:
        return None, f"{len(cycles)} cycles, more than maxCycles={max_cycles}"
    for number, cycle in enumerate(cycles, start=1):
        if (
            not isinstance(cycle, dict)
            or cycle.get("cycleNumber") != number
            or not isinstance(cycle.get("runId"), str)
            or not RUN_ID_RE.fullmatch(cycle["runId"])
        ):
            return None, f"cycle {number} must be an object with cycleNumber {number} and a valid runId"
    result = m.get("result")
    done = isinstance(result, dict) and result.get("kind") == "done"
    if result is not None and not done:
        return None, "result must be {kind: 'done', finalOutput}"
    if done and not cycles:
        # Little Workflow's own words for this manifest (outer-loop.ts).
        return None, (
            f"outer_loop_manifest_corrupt — existing outer loop '{oid}' has result.kind='done' but cycles is empty."
        )
    pending = m.get("pendingCycleRunId")
    if pending is not None and (not isinstance(pending, str) or not RUN_ID_RE.fullmatch(pending)):
        return None, "pendingCycleRunId must be a valid run id"
    description = m["goal"].get("description")
    return OuterLoop(
        oid, description if isinstance(description, str) else "", max_cycles, cycles, done, pending, name
    ), None


# --- checking --------------------------------------------------------------------------------


def _refs(value: Any) -> Iterator[str]:
    """Every `artifact://…` string anywhere in a payload."""
    if isinstance(value, dict):
        for child in value.values():
            yield from _refs(child)
    elif isinstance(value, list):
        for child in value:
            yield from _refs(child)
    elif isinstance(value, str) and value.startswith(artifacts.REF_PREFIX):
        yield value


def check_log(run_id: str, log: list[LoggedEvent], data: DataDir, workspace: Workspace) -> list[str]:
    """What stops `log` from entering the ledger with its ids: the first event whose id does not
    recompute, a gap, an event the write path would refuse or whose payload it would change, a
    missing artifact."""
    problems: list[str] = []
    for expected, event in enumerate(log, start=1):
        env, where = event.envelope, event.where
        if env["sequence"] != expected:
            return [
                f"{where}: run {run_id}: sequence {env['sequence']} where {expected} was expected "
                "(a log's sequences are dense from 1)"
            ]
        try:
            recomputed = event_id(
                run_id=run_id,
                sequence=expected,
                type=env["type"],
                payload=env["payload"],
                occurrence_id=env.get("occurrenceId"),
            )
        except NotCanonicalizable as exc:
            return [f"{where}: run {run_id}, sequence {expected}: payload has no canonical JSON form ({exc})"]
        if recomputed != env["eventId"]:
            return [
                f"{where}: run {run_id}, sequence {expected}: eventId expected {recomputed} (recomputed "
                f"from the event's content), found {env['eventId']}: the log was changed after it was written"
            ]
        try:
            stored = stored_payload(workspace, expected - 1, _item(env))
        except LedgerError as exc:
            problems.append(f"{where}: run {run_id}, sequence {expected}: {_EVENT_INDEX_PREFIX.sub('', exc.message)}")
            continue
        if stored != canonical_bytes(env["payload"]):
            problems.append(
                f"{where}: run {run_id}, sequence {expected}: the workspace's redaction rules would "
                "rewrite this payload (it holds a secret), which would change its event id"
            )
        if len(stored) > artifacts.INLINE_LIMIT_BYTES:
            problems.append(
                f"{where}: run {run_id}, sequence {expected}: the payload is larger than "
                f"{artifacts.INLINE_LIMIT_BYTES} bytes; the ledger would move it into an artifact, "
                "which would change its event id"
            )
        for ref in _refs(env["payload"]):
            aid = ref[len(artifacts.REF_PREFIX) :]
            found = data.artifacts.get(aid)
            if found is None:
                problems.append(
                    f"{where}: run {run_id}, sequence {expected}: references {ref}, which artifacts/ does not hold"
                )
            elif found.run_id != run_id:
                problems.append(
                    f"{where}: run {run_id}, sequence {expected}: references {ref}, which belongs to run {found.run_id}"
                )
    refused = lifecycle_refusal(run_id, [e.type for e in log], imported=True)
    if refused is not None:
        index, error = refused
        problems.append(
            f"{log[index].where}: run {run_id}, sequence {index + 1}: {_EVENT_INDEX_PREFIX.sub('', error.message)}"
        )
    return problems


def _item(env: dict[str, Any]) -> dict[str, Any]:
    """The append request item of a logged envelope."""
    item = {"type": env["type"], "payload": env["payload"]}
    if "occurrenceId" in env:
        item["occurrenceId"] = env["occurrenceId"]
    return item


def _stored_ids(workspace: Workspace, run_ids: list[str]) -> dict[str, list[str]]:
    """The event ids, in sequence order, of those of `run_ids` the workspace holds."""
    present = dict(Run.objects.filter(workspace=workspace, run_id__in=run_ids).values_list("pk", "run_id"))
    ids: dict[str, list[str]] = {run_id: [] for run_id in present.values()}
    rows = Event.objects.filter(run_id__in=list(present)).order_by("run_id", "sequence")
    for run_pk, eid in rows.values_list("run_id", "event_id"):
        ids[present[run_pk]].append(eid)
    return ids


def _check_outer_loop(loop: OuterLoop, data: DataDir, stored: dict[str, list[str]]) -> list[str]:
    """A manifest must agree with the logs it names: each cycle's run in the directory (or the
    workspace), started in this loop, and its recorded supervise decision in this loop."""
    problems = []
    for cycle in loop.cycles:
        run_id, number = cycle["runId"], cycle["cycleNumber"]
        log = data.runs.get(run_id)
        if log is None:
            if run_id not in stored:
                problems.append(
                    f"{loop.where}:1: cycle {number}'s run {run_id} is neither in events/ nor in the workspace"
                )
            continue
        for event in log:
            p = event.envelope["payload"]
            named = p.get("outerLoopId")
            if event.type == "RunStarted" and named is not None and named != loop.outer_loop_id:
                problems.append(
                    f"{event.where}: run {run_id} started in outer loop {named}, "
                    f"{loop.where} lists it as cycle {number} of {loop.outer_loop_id}"
                )
            if (
                event.type == "OuterLoopCycleCompleted"
                and p.get("cycleNumber") == number
                and named != loop.outer_loop_id
            ):
                problems.append(
                    f"{event.where}: cycle {number} of outer loop {named}, "
                    f"{loop.where} lists it in {loop.outer_loop_id}"
                )
    return problems


# --- writing ---------------------------------------------------------------------------------


def _batches(log: list[LoggedEvent]) -> Iterator[list[LoggedEvent]]:
    """Consecutive events with the same `recordedAt` (one append stamps one time), at most MAX_BATCH."""
    batch: list[LoggedEvent] = []
    for event in log:
        if batch and (event.envelope["recordedAt"] != batch[0].envelope["recordedAt"] or len(batch) == MAX_BATCH):
            yield batch
            batch = []
        batch.append(event)
    if batch:
        yield batch


# Who an imported run was started by (Run.started_by): the operator's import, not a person.
IMPORTER = "system:import-little"


def _write_run(workspace: Workspace, run_id: str, log: list[LoggedEvent]) -> None:
    """One append per run of events sharing a `recordedAt`, each in its own transaction: the
    checks above let nothing through that the write path refuses, and a transaction per batch
    lets the write path keep its folded state from one batch to the next (inside one transaction
    it would fold the whole log again for every batch, and hold every state until the commit)."""
    for batch in _batches(log):
        at = _recorded_at(batch[0].envelope["recordedAt"])
        assert at is not None  # checked when read
        try:
            with transaction.atomic(), clock.recorded_at(at):
                result = append(
                    workspace=workspace,
                    run_id=run_id,
                    events=[_item(e.envelope) for e in batch],
                    expected_sequence=batch[0].sequence - 1,
                    imported=True,
                    by=IMPORTER,
                )
                for event, written in zip(batch, result.events):
                    if written["eventId"] != event.envelope["eventId"]:
                        raise ImportRefused(
                            [
                                f"{event.where}: run {run_id}, sequence {event.sequence}: the ledger "
                                f"computed {written['eventId']}, the log says "
                                f"{event.envelope['eventId']}"
                            ]
                        )
        except LedgerError as exc:
            # Only a writer racing the import gets here (the checks passed): what is in stays, and
            # importing again continues the run from there.
            problems = (
                exc.problems
                if isinstance(exc, ImportRefused)
                else [f"{batch[0].where}: run {run_id}: the ledger refused the log: {exc.message}"]
            )
            raise ImportRefused(
                problems,
                f"the import stopped at run {run_id} sequence {batch[0].sequence}; "
                "what was written before stays, and importing again continues from "
                "there",
            ) from exc


def _store_artifact(workspace: Workspace, artifact: LittleArtifact, summary: Summary) -> str:
    """The bytes content-addressed (ledger/log/artifacts.py), and the row that resolves the log's ref."""
    sha256 = hashlib.sha256(artifact.data).hexdigest()
    had = Artifact.objects.filter(workspace=workspace, sha256=sha256).exists()
    ours = artifacts.store_bytes(workspace, artifact.data, artifact.content_type)
    run = Run.objects.get(workspace=workspace, run_id=artifact.run_id)
    _, created = ImportedArtifact.objects.get_or_create(
        run=run,
        ref=artifacts.REF_PREFIX + artifact.artifact_id,
        defaults={
            "artifact": ours,
            "step_path": artifact.step_path or "",
            "name": artifact.name,
            "encoding": artifact.encoding,
            "created_at": artifact.created_at,
        },
    )
    summary.artifacts_stored += created
    return (
        f"artifact {artifact.artifact_id} (run {artifact.run_id}, {artifact.step_path or '-'}/{artifact.name}, "
        f"{artifact.size} bytes) {'stored' if created else 'already stored'} as {ours.artifact_id}"
        + (" (the same bytes as an artifact the workspace had)" if had and created else "")
    )


def import_data_dir(root: Path, workspace: Workspace) -> Summary:
    """Import `root` into `workspace` (module docstring), run by run: a run with a problem is
    refused whole (`Summary.problems` names the file, run, sequence and reason) and the others
    come in. ImportRefused only when the directory holds nothing to import."""
    data, problems = read_data_dir(root)
    if not data.runs and problems:
        raise ImportRefused(problems)
    # A file that could not be read is named in `problems` by file and line: a log file stops at
    # its first bad line and its run is not read at all; a bad row of events.db leaves a gap in its
    # run's log, which check_log refuses.
    summary = Summary(problems=problems)
    stored = _stored_ids(workspace, sorted(data.runs))
    plan: list[tuple[str, list[LoggedEvent], str]] = []  # run, events to write, how
    refused: set[str] = set()
    for run_id, log in sorted(data.runs.items()):
        run_problems = check_log(run_id, log, data, workspace)
        ids = [e.envelope["eventId"] for e in log]
        have = stored.get(run_id)
        how = "imported"
        if have is None:
            pass
        elif have[: len(ids)] == ids:
            how = "skipped"
        elif ids[: len(have)] == have:
            how = "continued"
        else:
            first = next(i for i, (a, b) in enumerate(zip(have, ids), start=1) if a != b)
            run_problems.append(
                f"{log[first - 1].where}: run {run_id} is already in the workspace with other events "
                f"(sequence {first}: {have[first - 1]} there, {ids[first - 1]} here)"
            )
        if run_problems or run_id in refused:
            summary.problems += run_problems
            refused.add(run_id)
        elif how == "skipped":
            summary.runs_skipped += 1
            summary.lines.append(f"skipped {run_id}: already present ({len(have or [])} events)")
        else:
            plan.append((run_id, log if have is None else log[len(have) :], how))
    ok_loops = []
    for loop in data.outer_loops:
        loop_problems = _check_outer_loop(loop, data, stored)
        if loop_problems:
            summary.problems += loop_problems
            refused.update(c["runId"] for c in loop.cycles if c["runId"] in data.runs)
        else:
            ok_loops.append(loop)
    plan = [entry for entry in plan if entry[0] not in refused]
    summary.runs_refused = sorted(refused)
    for run_id in summary.runs_refused:
        summary.lines.append(f"refused {run_id}: nothing of it written (the problems are listed)")
    artifacts_to_store = []
    for artifact in data.artifacts.values():
        if artifact.run_id in refused:
            continue
        if artifact.run_id not in data.runs and artifact.run_id not in stored:
            summary.problems.append(
                f"{artifact.where}:1: belongs to run {artifact.run_id}, which is neither in events/ "
                "nor in the workspace"
            )
            continue
        artifacts_to_store.append(artifact)

    for run_id, events, how in plan:
        _write_run(workspace, run_id, events)
        summary.events_written += len(events)
        if how == "imported":
            summary.runs_imported += 1
            summary.lines.append(f"imported {run_id}: {len(events)} events")
        else:
            summary.runs_continued += 1
            summary.lines.append(f"continued {run_id}: events {events[0].sequence}..{events[-1].sequence}")
    for artifact in sorted(artifacts_to_store, key=lambda a: a.artifact_id):
        with transaction.atomic():
            summary.lines.append(_store_artifact(workspace, artifact, summary))
    for loop in ok_loops:
        if any(c["runId"] in refused for c in loop.cycles):
            summary.lines.append(f"outer loop {loop.outer_loop_id}: not complete here, a cycle's run was refused")
            continue
        runs = ", ".join(c["runId"] for c in loop.cycles) or "none"
        state = (
            "done" if loop.done else (f"pending cycle in {loop.pending_run_id}" if loop.pending_run_id else "not done")
        )
        summary.lines.append(
            f"outer loop {loop.outer_loop_id}: {len(loop.cycles)} of at most {loop.max_cycles} "
            f"cycle(s) ({runs}), {state}; goal: {json.dumps(loop.goal, ensure_ascii=False)}"
        )
    return summary
