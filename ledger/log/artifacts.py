"""Content-addressed artifact storage: bytes named by their sha256, re-hashed on every read."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from django.conf import settings

from ..canonical import canonical_bytes
from ..errors import IntegrityFailure, NotFound
from ..models import Artifact, ImportedArtifact, Run, Workspace

# docs/design.md §3: payloads whose canonical JSON is larger than this are stored as artifacts.
INLINE_LIMIT_BYTES = 256_000
REF_PREFIX = "artifact://"
# Little Workflow's refs (`art_` + 16 hex of its identity digest), kept as they are in imported logs.
FOREIGN_REF_RE = re.compile(r"artifact://art_[0-9a-f]{16}")


def _root() -> Path:
    return Path(settings.ARTIFACTS_ROOT)


def storage_key_for(workspace: Workspace, sha256: str) -> str:
    return f"{workspace.tenant_id}/{workspace.pk}/{sha256[:2]}/{sha256}"


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def store_bytes(workspace: Workspace, data: bytes, content_type: str = "application/json") -> Artifact:
    sha256 = hashlib.sha256(data).hexdigest()
    key = storage_key_for(workspace, sha256)
    path = _root() / key
    # The bytes go down before the row that names them; a rolled-back append leaves at most an
    # unreferenced file with the right name, never a row without its bytes.
    if not path.exists() or path.stat().st_size != len(data):
        _write_atomically(path, data)
    artifact, _ = Artifact.objects.get_or_create(
        workspace=workspace,
        sha256=sha256,
        defaults={"size": len(data), "content_type": content_type, "storage_key": key},
    )
    return artifact


def read_bytes(artifact: Artifact) -> bytes:
    path = _root() / artifact.storage_key
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise IntegrityFailure(
            f"artifact {artifact.artifact_id} is missing from storage", artifactId=artifact.artifact_id
        ) from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != artifact.sha256 or len(data) != artifact.size:
        raise IntegrityFailure(
            f"artifact {artifact.artifact_id} does not match its sha256 (stored bytes hash to {actual})",
            artifactId=artifact.artifact_id,
        )
    return data


def open_verified(artifact: Artifact) -> BinaryIO:
    """The artifact's bytes as an open file, rewound, after hashing them in chunks: a download
    streams without holding the whole artifact in memory, and never serves bytes that do not match.
    The handle is the inode just hashed; storage replaces files whole, never rewrites them."""
    try:
        handle = (_root() / artifact.storage_key).open("rb")
    except FileNotFoundError:
        raise IntegrityFailure(
            f"artifact {artifact.artifact_id} is missing from storage", artifactId=artifact.artifact_id
        ) from None
    hasher, size = hashlib.sha256(), 0
    while chunk := handle.read(1 << 20):
        hasher.update(chunk)
        size += len(chunk)
    if hasher.hexdigest() != artifact.sha256 or size != artifact.size:
        handle.close()
        raise IntegrityFailure(
            f"artifact {artifact.artifact_id} does not match its sha256 (stored bytes hash to {hasher.hexdigest()})",
            artifactId=artifact.artifact_id,
        )
    handle.seek(0)
    return handle


def check(artifact: Artifact) -> str:
    """'ok', 'missing' or 'mismatch', without raising: for verify and replay plans."""
    try:
        read_bytes(artifact)
    except IntegrityFailure as exc:
        return "missing" if "missing" in exc.message else "mismatch"
    return "ok"


def delete_file(artifact: Artifact) -> None:
    """Remove an artifact's bytes from storage (retention, after the commit that deleted its row)."""
    (_root() / artifact.storage_key).unlink(missing_ok=True)


def parse_ref(ref: str) -> str | None:
    """The sha256 named by an `artifact://art_<sha256>` ref, or None for a ref that is not ours."""
    if not ref.startswith(REF_PREFIX + "art_"):
        return None
    sha256 = ref[len(REF_PREFIX) + 4 :]
    return sha256 if len(sha256) == 64 and all(c in "0123456789abcdef" for c in sha256) else None


def is_ref(value: str) -> bool:
    """Ours (`art_<sha256>`) or an imported log's (`art_<16 hex>`, resolved by ImportedArtifact)."""
    return parse_ref(value) is not None or FOREIGN_REF_RE.fullmatch(value) is not None


def resolve(run: Run, refs: list[str]) -> dict[str, Artifact | None]:
    """ref -> the artifact holding its bytes (None when there is none), for refs in `run`'s log:
    ours by sha256 in the run's workspace, an imported log's through its ImportedArtifact row."""
    ours = {sha: ref for ref in refs if (sha := parse_ref(ref)) is not None}
    found = {a.sha256: a for a in Artifact.objects.filter(workspace_id=run.workspace_id, sha256__in=list(ours))}
    resolved: dict[str, Artifact | None] = {ref: found.get(sha) for sha, ref in ours.items()}
    foreign = [ref for ref in refs if ref not in resolved]
    if foreign:
        mapped = {
            m.ref: m.artifact
            for m in ImportedArtifact.objects.filter(run_id=run.pk, ref__in=foreign).select_related("artifact")
        }
        resolved.update({ref: mapped.get(ref) for ref in foreign})
    return resolved


def carry_imported(source: Run, target: Run, refs: Iterable[str]) -> None:
    """Give `target` the ImportedArtifact rows that resolve `refs` in `source`'s log: a fork copies
    the events before its step as stored, an imported log's refs (`art_<16 hex>`) and all, and only
    a row of the run whose log names such a ref resolves it (`resolve`). Each copy keeps the run the
    other system wrote the artifact in (its id hashes it). Idempotent: a fork resumed after its
    executor died copies again what is missing."""
    foreign = sorted({ref for ref in refs if parse_ref(ref) is None})
    if not foreign:
        return
    rows = ImportedArtifact.objects.filter(run_id=source.pk, ref__in=foreign)
    ImportedArtifact.objects.bulk_create(
        [
            ImportedArtifact(
                run=target,
                ref=row.ref,
                artifact_id=row.artifact_id,
                step_path=row.step_path,
                name=row.name,
                encoding=row.encoding,
                created_at=row.created_at,
                written_in_run=row.written_in_run or source.run_id,
            )
            for row in rows
        ],
        ignore_conflicts=True,
    )


def read_held(workspace: Workspace, ref: str, what: str, **details: Any) -> bytes:
    """The bytes of the artifact our `ref` names in `workspace`, re-hashed, for a ref a row keeps
    outside the log (`what` it holds: a tool call's large outcome). Not stored, gone from storage or
    changed is an IntegrityFailure naming the ref and `what`, as a ref the log names is
    (`read_ref`): the store is what is wrong, never a NotFound."""
    artifact = _stored(workspace, ref)
    if artifact is None:
        raise IntegrityFailure(f"artifact {ref}, {what}, is not stored", **details, ref=ref)
    try:
        return read_bytes(artifact)
    except IntegrityFailure as exc:
        raise IntegrityFailure(f"{exc.message}: {what}", **details, ref=ref) from None


def get_by_ref(workspace: Workspace, ref: str) -> Artifact:
    artifact = _stored(workspace, ref)
    if artifact is None:
        raise NotFound(f"artifact {ref} not found", ref=ref)
    return artifact


def _stored(workspace: Workspace, ref: str) -> Artifact | None:
    """The artifact our `ref` names in `workspace`, or None (not ours, or not stored)."""
    sha256 = parse_ref(ref)
    return Artifact.objects.filter(workspace=workspace, sha256=sha256).first() if sha256 else None


# What the fold counts a model call by stays in its payload when the payload is too large to keep
# inline (docs/operations.md "Large payloads"): the model, and the usage inside the answer, whose
# other members (the text, the messages, the tool calls) move out one by one instead of the whole
# answer. By type: (top-level fields that stay, the field opened, its members that stay).
_KEPT: dict[str, tuple[frozenset[str], str | None, frozenset[str]]] = {
    "harness.model.responded": (frozenset({"model"}), "response", frozenset({"usage"})),
    "ModelCallCompleted": (frozenset({"model", "usage"}), None, frozenset()),
}
_NOTHING_KEPT: tuple[frozenset[str], str | None, frozenset[str]] = (frozenset(), None, frozenset())


def _movable(fields: dict[str, Any], kept: frozenset[str]) -> list[tuple[int, str]]:
    """(canonical size, name) of the fields of `fields` that may move: not kept, not a ref, not a
    field already moved (its `nameRef` present)."""
    return [
        (len(canonical_bytes(v)), k)
        for k, v in fields.items()
        if k not in kept and not k.endswith("Ref") and f"{k}Ref" not in fields
    ]


def externalize(workspace: Workspace, event_type: str, payload: dict[str, Any], size: int) -> dict[str, Any]:
    """Move the largest fields of an oversized payload into artifacts, largest first, until it fits.

    Each moved field `name` is replaced by `nameRef` holding the artifact ref (for StepCompleted
    that is Little Workflow's rule exactly: `output` moves out, `outputRef` stays). A model call's
    answer is opened instead of moved: its members move (`response.textRef`), its usage stays (_KEPT).
    """
    kept, opened, kept_inside = _KEPT.get(event_type, _NOTHING_KEPT)
    stored = dict(payload)
    inner: dict[str, Any] | None = None
    if opened is not None and isinstance(payload.get(opened), dict):
        stored[opened] = inner = dict(payload[opened])
        kept = kept | {opened}
    candidates = [(n, name, False) for n, name in _movable(stored, kept)]
    if inner is not None:
        candidates += [(n, name, True) for n, name in _movable(inner, kept_inside)]
    for _, name, inside in sorted(candidates, reverse=True):
        if size <= INLINE_LIMIT_BYTES:
            break
        holder = inner if inside and inner is not None else stored
        artifact = store_bytes(workspace, canonical_bytes(holder.pop(name)))
        holder[f"{name}Ref"] = artifact.ref
        size = len(canonical_bytes(stored))
    return stored


# Fields named like a moved one that are not: ArtifactCreated declares an artifact by its ref.
_NOT_MOVED: dict[str, frozenset[str]] = {"ArtifactCreated": frozenset({"artifactRef"})}


def _moved_in(holder: Mapping[str, Any], skip: frozenset[str] = frozenset()) -> dict[str, str]:
    """name -> ref of each field `externalize` moved out of `holder` (or a writer that follows
    Little Workflow's rule, as imported logs do): `nameRef` holding a ref, `name` absent."""
    return {
        key[:-3]: value
        for key, value in holder.items()
        if len(key) > 3
        and key.endswith("Ref")
        and key not in skip
        and key[:-3] not in holder
        and isinstance(value, str)
        and is_ref(value)
    }


def moved_members(event_type: str, payload: Mapping[str, Any]) -> dict[str, str]:
    """Where each member `externalize` moved out of `payload` went: `name` (a top-level field) or
    `response.name` (a member of a model call's answer) -> its artifact ref. Reads no artifact:
    what a view shows as "stored as an artifact"."""
    moved = _moved_in(payload, _NOT_MOVED.get(event_type, frozenset()))
    opened = _KEPT.get(event_type, _NOTHING_KEPT)[1]
    inner = payload.get(opened) if opened is not None else None
    if isinstance(inner, Mapping):
        moved.update({f"{opened}.{name}": ref for name, ref in _moved_in(inner).items()})
    return moved


def _values(run: Run, refs: list[str]) -> dict[str, Any]:
    """ref -> the JSON value its artifact holds, the bytes re-hashed as they are read."""
    values = {}
    for ref, artifact in resolve(run, refs).items():
        if artifact is None:
            raise IntegrityFailure(f"artifact {ref} named by run {run.run_id}'s log is not stored", ref=ref)
        values[ref] = json.loads(read_bytes(artifact))
    return values


def read_ref(run: Run, ref: str) -> Any:
    """The JSON value held by the artifact `ref` names in `run`'s log (`artifact://art_<sha256>`,
    or an imported log's ref through its ImportedArtifact row), the bytes re-hashed as they are
    read. A ref the log names that no artifact holds, or whose bytes changed, is an
    IntegrityFailure: the log is what is wrong, never a NotFound, never a null."""
    return _values(run, [ref])[ref]


def as_recorded(run: Run, event_type: str, payload: Mapping[str, Any]) -> Mapping[str, Any]:
    """`payload` of an event of `run` as it was recorded: every member `externalize` moved out
    (`outputRef`, `response.textRef`, an older log's whole `responseRef`) read back from its
    artifact in place of its ref. Each artifact is re-hashed as it is read: a mismatch or a
    missing one is an IntegrityFailure, never a value quietly left out. A payload with nothing
    moved is returned as it is, without a read."""
    moved = moved_members(event_type, payload)
    if not moved:
        return payload
    values = _values(run, sorted(set(moved.values())))
    return _put_back(payload, {name: values[ref] for name, ref in moved.items()})


def _put_back(holder: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """`holder` with each `name` of `values` in place of its `nameRef` (`outer.name` inside `outer`)."""
    here = {name: value for name, value in values.items() if "." not in name}
    out = {k: v for k, v in holder.items() if not (k.endswith("Ref") and k[:-3] in here)} | here
    inner: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        if "." in name:
            outer, member = name.split(".", 1)
            inner.setdefault(outer, {})[member] = value
    for outer, members in inner.items():
        out[outer] = _put_back(holder[outer], members)
    return out
