"""Verifying what left the ledger, from the file alone (no database): an export
(`ledger verify --export FILE`, ledger/interop/exports.py) or an evidence bundle (`ledger verify --bundle
FILE`, ledger/interop/bundle.py). The checks are `ledger verify`'s that a file can answer: event ids
recomputed from the canonical JSON of each payload, each run's sequences dense from 1, artifact
bytes re-hashed; plus the file's own: its header, its end marker (a file cut short), its sums.
"""

from __future__ import annotations

import csv
import hashlib
import io
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from ..canonical import NotCanonicalizable, digest, event_id
from ..log import artifacts
from ..log.envelopes import decode_payload
from ..log.verify import Check, artifact_refs
from . import bundle, exports
from .csvcells import read_cell

MAX_LISTED = 10


def _check(name: str, problems: list[str], passed: str) -> Check:
    if not problems:
        return Check(name, "pass", passed)
    more = f" (and {len(problems) - MAX_LISTED} more)" if len(problems) > MAX_LISTED else ""
    return Check(name, "fail", "; ".join(problems[:MAX_LISTED]) + more)


class _Events:
    """Event ids and per-run density over a stream of envelopes, in file order. Runs must come
    whole and in one piece, each from sequence 1 (exports and bundles write them so)."""

    def __init__(self) -> None:
        self.id_problems: list[str] = []
        self.density_problems: list[str] = []
        self.runs_seen: set[tuple[str, str]] = set()
        self.current: tuple[str, str] | None = None
        self.last = 0
        self.count = 0
        self.refs: set[str] = set()

    def add(
        self,
        where: str,
        workspace: str,
        run_id: Any,
        sequence: Any,
        stored_id: Any,
        type_: Any,
        occurrence_id: Any,
        payload: Any,
    ) -> None:
        self.count += 1
        key = (workspace, str(run_id))
        if key != self.current:
            if key in self.runs_seen:
                self.density_problems.append(f"{where}: run {run_id} appears again after other runs")
            self.runs_seen.add(key)
            self.current, self.last = key, 0
        if sequence != self.last + 1:
            self.density_problems.append(
                f"{where}: run {run_id} sequence {sequence} follows {self.last or 'the start'} "
                f"(missing {self.last + 1}"
                + (f"..{sequence - 1})" if isinstance(sequence, int) and sequence > self.last + 2 else ")")
            )
        if isinstance(sequence, int):
            self.last = sequence
        try:
            recomputed = event_id(
                run_id=run_id, sequence=sequence, type=type_, payload=payload, occurrence_id=occurrence_id
            )
        except (NotCanonicalizable, TypeError):
            recomputed = None
        if recomputed != stored_id:
            self.id_problems.append(
                f"{where}: run {run_id} sequence {sequence}: id {stored_id} does not recompute ({recomputed})"
            )
        self.refs.update(artifact_refs(payload, imported=True))

    def checks(self) -> list[Check]:
        return [
            _check("event_ids", self.id_problems, f"{self.count} ids recomputed"),
            _check("dense_sequence", self.density_problems, f"{len(self.runs_seen)} run(s) dense from 1"),
        ]


# --- exports ---------------------------------------------------------------------------------


def _jsonl_records(lines: Iterable[bytes]) -> Iterator[tuple[int, Any]]:
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                yield number, decode_payload(line.decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                yield number, None


def _comment(text: str) -> Any:
    try:
        return decode_payload(text.lstrip("#").strip())
    except ValueError:
        return None


def _csv_records(handle: io.TextIOBase) -> Iterator[tuple[int, Any]]:
    """(line, header or end dict | row dict | None when unreadable). The header comment is read as
    a line (its JSON has commas); the end marker's JSON has none, so it reads as a one-cell row."""
    yield 1, _comment(handle.readline())
    columns: list[str] | None = None
    reader = csv.reader(handle)
    for row in reader:
        number = reader.line_num + 1
        if len(row) == 1 and row[0].startswith("#"):
            yield number, _comment(row[0])
        elif columns is None:
            columns = row
        else:
            yield (
                number,
                {c: read_cell(v) for c, v in zip(columns, row, strict=True)} if len(row) == len(columns) else None,
            )


def _csv_event(row: dict[str, str]) -> tuple[Any, ...]:
    sequence: Any = int(row["sequence"]) if row["sequence"].isdigit() else row["sequence"]
    return (
        row["workspace"],
        row["runId"],
        sequence,
        row["eventId"],
        row["type"],
        row["occurrenceId"] or None,
        decode_payload(row["payload"]),
    )


def verify_export(path: Path) -> list[Check]:
    """The checks of one export file (JSONL or CSV, told apart by its first byte)."""
    with path.open("rb") as raw:
        first = raw.read(1)
    with path.open("rb") as raw:
        if first == b"#":
            text = io.TextIOWrapper(raw, encoding="utf-8", newline="")
            return _verify_records(_csv_records(text), csv_file=True)
        return _verify_records(_jsonl_records(raw), csv_file=False)


def _verify_records(records: Iterator[tuple[int, Any]], *, csv_file: bool) -> list[Check]:
    first = next(records, None)
    head = first[1] if first else None
    if (
        not isinstance(head, dict)
        or head.get("schemaVersion") != exports.SCHEMA_VERSION
        or head.get("export") not in exports.KINDS
    ):
        return [
            Check("header", "fail", f"the first line is not a schemaVersion {exports.SCHEMA_VERSION} export header")
        ]
    kind = head["export"]
    checks = [Check("header", "pass", f"{kind} export, schemaVersion {head['schemaVersion']}")]
    events = _Events()
    unreadable: list[str] = []
    end: Any = None
    rows = 0
    after_end = False
    for number, record in records:
        where = f"line {number}"
        if end is not None:
            after_end = True
            continue
        if isinstance(record, dict) and set(record) == {"end"}:
            end = record["end"]
            continue
        if not isinstance(record, dict):
            unreadable.append(f"{where} is not a row")
            continue
        rows += 1
        if kind != "events":
            continue
        try:
            if csv_file:
                fields = _csv_event(record)
            else:
                fields = (
                    record["workspace"],
                    record["runId"],
                    record["sequence"],
                    record["eventId"],
                    record["type"],
                    record.get("occurrenceId"),
                    record["payload"],
                )
        except (KeyError, ValueError):
            unreadable.append(f"{where} is not an event")
            continue
        events.add(where, *fields)
    checks.append(_check("rows", unreadable, f"{rows} row(s) read"))
    if end is None:
        checks.append(Check("complete", "fail", f"no end marker after {rows} row(s): the file was cut short"))
    elif not isinstance(end, dict) or end.get("rows") != rows or after_end:
        checks.append(
            Check(
                "complete",
                "fail",
                f"the end marker says {end!r}, the file holds {rows} row(s)"
                + (" and lines after the end" if after_end else ""),
            )
        )
    else:
        checks.append(Check("complete", "pass", f"end marker counts {rows} row(s)"))
    if kind == "events":
        checks.extend(events.checks())
    return checks


# --- bundles ---------------------------------------------------------------------------------


def _sums(text: str) -> tuple[dict[str, str], list[str]]:
    listed: dict[str, str] = {}
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64:
            problems.append(f"{bundle.SUMS} line {number} is not '<sha256>  <path>'")
        else:
            listed[name] = digest
    return listed, problems


def verify_bundle(path: Path) -> list[Check]:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        return [Check("zip", "fail", f"not a readable zip: {exc}")]
    with archive:
        try:
            contents = {name: archive.read(name) for name in archive.namelist()}
        except (zipfile.BadZipFile, OSError, ValueError) as exc:  # a CRC that does not match, among others
            return [Check("zip", "fail", f"an entry cannot be read: {exc}")]
    checks = [Check("zip", "pass", f"{len(contents)} entries")]
    missing = [n for n in (bundle.SUMS, bundle.MANIFEST, bundle.EVENTS, bundle.EVIDENCE) if n not in contents]
    if missing:
        return [*checks, Check("entries", "fail", f"missing {', '.join(missing)}")]

    listed, problems = _sums(contents[bundle.SUMS].decode("utf-8", "replace"))
    actual = {name: hashlib.sha256(data).hexdigest() for name, data in contents.items() if name != bundle.SUMS}
    problems += [f"{name} is not listed in {bundle.SUMS}" for name in sorted(set(actual) - set(listed))]
    problems += [f"{name} is listed but absent" for name in sorted(set(listed) - set(actual))]
    problems += [
        f"{name} does not match its sum" for name in sorted(set(listed) & set(actual)) if listed[name] != actual[name]
    ]
    checks.append(_check("sha256sums", problems, f"{len(listed)} file(s) match {bundle.SUMS}"))

    try:
        manifest = orjson.loads(contents[bundle.MANIFEST])
        evidence = orjson.loads(contents[bundle.EVIDENCE])
        run_id, last = manifest["runId"], manifest["lastSequence"]
        described = {f["path"]: f for f in manifest["files"]}
    except (ValueError, KeyError, TypeError) as exc:
        return [*checks, Check("manifest", "fail", f"manifest or evidence unreadable: {exc}")]
    problems = []
    if manifest.get("schemaVersion") != bundle.SCHEMA_VERSION or manifest.get("bundle") != bundle.BUNDLE:
        problems.append("not a schemaVersion 1 runledger.evidence manifest")
    payload_files = {n for n in contents if n not in (bundle.SUMS, bundle.MANIFEST)}
    problems += [f"{n} is not in the manifest" for n in sorted(payload_files - set(described))]
    problems += [f"the manifest lists {n}, absent" for n in sorted(set(described) - payload_files)]
    problems += [
        f"{n}: the manifest's sha256 or size differs"
        for n in sorted(payload_files & set(described))
        if described[n].get("sha256") != actual[n] or described[n].get("size") != len(contents[n])
    ]
    if not isinstance(evidence, dict) or evidence.get("run", {}).get("runId") != run_id:
        problems.append(f"{bundle.EVIDENCE} is not the evidence of {run_id}")
    checks.append(_check("manifest", problems, f"run {run_id}, {len(described)} file(s) described"))

    events = _Events()
    unreadable = []
    for number, record in _jsonl_records(contents[bundle.EVENTS].splitlines()):
        where = f"{bundle.EVENTS} line {number}"
        if not isinstance(record, dict) or record.get("runId") != run_id:
            unreadable.append(f"{where} is not an event of {run_id}")
            continue
        events.add(
            where,
            manifest.get("workspace", ""),
            run_id,
            record.get("sequence"),
            record.get("eventId"),
            record.get("type"),
            record.get("occurrenceId"),
            record.get("payload"),
        )
    if events.count != last:
        unreadable.append(f"{events.count} event(s), the manifest says the last sequence is {last}")
    checks.append(_check("events", unreadable, f"{events.count} event(s) of {run_id}"))
    checks.extend(events.checks())

    problems = []
    listed_artifacts = {a.get("ref"): a for a in manifest.get("artifacts", []) if isinstance(a, dict)}
    for ref in sorted(events.refs):
        sha256 = artifacts.parse_ref(ref)
        if sha256 is None:
            sha256, problem = _imported_sha256(ref, listed_artifacts.get(ref))
            if problem is not None:
                problems.append(problem)
                continue
        data = contents.get(f"{bundle.ARTIFACTS_DIR}art_{sha256}")
        if data is None:
            problems.append(f"{ref} is not in the bundle")
        elif hashlib.sha256(data).hexdigest() != sha256:
            problems.append(f"{ref} does not match its sha256")
    checks.append(_check("artifact_hashes", problems, f"{len(events.refs)} artifact(s) re-hashed"))
    return checks


def _imported_sha256(ref: str, listed: Any) -> tuple[str, str | None]:
    """The sha256 of the bytes an imported log's ref (`artifact://art_<16 hex>`, Little Workflow's
    id) names: the manifest's, once the ref's id recomputes from the manifest's identity and that
    sha256 (Little Workflow's artifactId rule), so that bytes swapped with the manifest and
    SHA256SUMS rewritten do not pass."""
    if not isinstance(listed, dict) or not isinstance(listed.get("identity"), dict):
        return "", f"{ref}: the manifest gives no identity for this imported artifact"
    sha256 = listed.get("sha256")
    if not isinstance(sha256, str) or len(sha256) != 64:
        return "", f"{ref}: the manifest gives no sha256 for it"
    try:
        expected = "art_" + digest({**listed["identity"], "payloadHash": "sha256:" + sha256})[7:23]
    except (NotCanonicalizable, TypeError):
        expected = None
    if artifacts.REF_PREFIX + str(expected) != ref:
        return "", f"{ref}: its id does not recompute from the manifest's identity and sha256 ({expected})"
    return sha256, None
