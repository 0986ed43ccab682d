"""Datasets of recorded runs: a name per workspace and frozen versions.

A version is the list of its member runs, each with the last sequence it had when added and its
expected output (the original's output unless a person set another), in run id order, and the
digest of that list. Every change (add, remove, set an expected output) makes the next version
(adding only runs it already holds is no change);
a version is never changed, so a later append to a member run leaves every version as it was and
an evaluation of version N is an evaluation of exactly what version N names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from .. import audit, clock
from ..canonical import NotCanonicalizable, canonical_bytes, digest
from ..errors import InvalidRunId, NotFound
from ..log.prepare import RUN_ID_RE
from ..models import Dataset, DatasetVersion, Run, Workspace
from ..runtime.record import inline_or_ref
from .access import Principal, actor
from .errors import InvalidEvaluation

MAX_MEMBERS = 200
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
Action = audit.Action


def version_digest(name: str, members: Sequence[Mapping[str, Any]]) -> str:
    return digest({"dataset": name, "members": list(members)})


def get_dataset(workspace: Workspace, name: str) -> Dataset:
    dataset = Dataset.objects.filter(workspace=workspace, name=name).first()
    if dataset is None:
        raise NotFound(f"dataset {name} not found", dataset=name)
    dataset.workspace = workspace
    return dataset


def datasets(workspace: Workspace, *, limit: int | None = None, after: str | None = None) -> list[Dataset]:
    """By name; `limit` of them from just after the name `after` (a page's last)."""
    qs = Dataset.objects.filter(workspace=workspace).order_by("name")
    if after is not None:
        qs = qs.filter(name__gt=after)
    return list(qs if limit is None else qs[:limit])


def latest(dataset: Dataset) -> DatasetVersion | None:
    return dataset.versions.order_by("-number").first()


def get_version(dataset: Dataset, number: int | None = None) -> DatasetVersion:
    version = latest(dataset) if number is None else dataset.versions.filter(number=number).first()
    if version is None:
        raise NotFound(f"dataset {dataset.name} has no version {number or ''}".strip(), dataset=dataset.name)
    version.dataset = dataset
    return version


def _new_version(
    dataset: Dataset, members: list[dict[str, Any]], who: audit.Actor, what: dict[str, Any]
) -> DatasetVersion:
    previous = latest(dataset)
    members = sorted(members, key=lambda m: m["runId"])
    if len(members) > MAX_MEMBERS:
        raise InvalidEvaluation(f"a dataset holds at most {MAX_MEMBERS} runs", field="runIds")
    version = DatasetVersion.objects.create(
        dataset=dataset,
        number=(previous.number + 1) if previous else 1,
        members=members,
        digest=version_digest(dataset.name, members),
        created_by=who.name,
        created_at=clock.now(),
    )
    audit.record(
        actor=who,
        tenant=dataset.workspace.tenant,
        workspace=dataset.workspace,
        action=Action.DATASET_CHANGED,
        target=f"dataset:{dataset.name}",
        details={"version": version.number, "digest": version.digest, "size": len(members), **what},
    )
    return version


def _well_formed(run_ids: Iterable[str], field: str = "runIds") -> None:
    """A run id of the wrong form names no run: 400 invalid_run_id naming it, not 404."""
    for index, run_id in enumerate(run_ids):
        if not RUN_ID_RE.fullmatch(run_id):
            raise InvalidRunId(f"run id must match {RUN_ID_RE.pattern}", runId=run_id, field=f"{field}.{index}")


def _runs(workspace: Workspace, run_ids: Iterable[Any]) -> list[Run]:
    ids = list(run_ids)
    if not ids or not all(isinstance(r, str) and r for r in ids) or len(ids) > MAX_MEMBERS:
        raise InvalidEvaluation(f"runIds must list 1 to {MAX_MEMBERS} run ids", field="runIds")
    _well_formed(ids)
    found = {r.run_id: r for r in Run.objects.filter(workspace=workspace, run_id__in=ids)}
    missing = [r for r in ids if r not in found]
    if missing:
        raise NotFound(f"run {missing[0]} not found", runId=missing[0])
    for run in found.values():
        if not run.finished:
            raise InvalidEvaluation(
                f"run {run.run_id} is {run.status}; a dataset holds finished runs", runId=run.run_id
            )
    return [found[r] for r in dict.fromkeys(ids)]


@dataclass(frozen=True)
class Added:
    version: DatasetVersion
    made: bool  # False: every run named was already in the latest version, which is returned


@transaction.atomic
def add_runs(*, workspace: Workspace, name: str, run_ids: Sequence[Any], by: Principal | str) -> Added:
    """Add finished runs (creating the dataset on first use): the next version. A run already in
    it keeps its expected output; when every run named is already in it nothing changed, so no
    version is made and nothing is audited: the latest version is the answer."""
    who = actor(by, workspace)
    if not isinstance(name, str) or not NAME.match(name):
        raise InvalidEvaluation(
            "a dataset name is 1-100 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit",
            field="name",
        )
    runs = _runs(workspace, run_ids)
    dataset, _ = Dataset.objects.get_or_create(
        workspace=workspace, name=name, defaults={"created_by": who.name, "created_at": clock.now()}
    )
    dataset = Dataset.objects.select_for_update().get(pk=dataset.pk)
    dataset.workspace = workspace
    previous = latest(dataset)
    members = {m["runId"]: dict(m) for m in (previous.members if previous else [])}
    added = [r.run_id for r in runs if r.run_id not in members]
    if previous is not None and not added:
        previous.dataset = dataset
        return Added(previous, made=False)
    for run in runs:
        if run.run_id not in members:
            # The expected output as recorded: read back when it was too large to keep inline.
            expected = inline_or_ref(run, run.output, run.output_ref or None)
            members[run.run_id] = {"runId": run.run_id, "lastSequence": run.last_sequence, "expected": expected}
    return Added(_new_version(dataset, list(members.values()), who, {"added": added}), made=True)


@transaction.atomic
def remove_runs(*, workspace: Workspace, name: str, run_ids: Sequence[Any], by: Principal | str) -> DatasetVersion:
    who = actor(by, workspace)
    ids = set(r for r in run_ids if isinstance(r, str))
    if not ids:
        raise InvalidEvaluation("runIds must list the runs to remove", field="runIds")
    _well_formed(r for r in run_ids if isinstance(r, str))
    dataset = get_dataset(workspace, name)
    Dataset.objects.select_for_update().filter(pk=dataset.pk).first()
    previous = get_version(dataset)
    strangers = sorted(ids - {m["runId"] for m in previous.members})
    if strangers:  # removing it would change nothing: no version, no audit entry, as set_expected
        raise NotFound(f"run {strangers[0]} is not in dataset {name}", runId=strangers[0])
    members = [m for m in previous.members if m["runId"] not in ids]
    return _new_version(dataset, members, who, {"removed": sorted(ids)})


@transaction.atomic
def set_expected(*, workspace: Workspace, name: str, run_id: str, expected: Any, by: Principal | str) -> DatasetVersion:
    """A person's expected output for one member run (any JSON value): the next version."""
    who = actor(by, workspace)
    if not isinstance(run_id, str) or not RUN_ID_RE.fullmatch(run_id):
        raise InvalidRunId(f"run id must match {RUN_ID_RE.pattern}", runId=run_id, field="runId")
    dataset = get_dataset(workspace, name)
    Dataset.objects.select_for_update().filter(pk=dataset.pk).first()
    previous = get_version(dataset)
    try:
        canonical_bytes(expected)
    except NotCanonicalizable as exc:
        raise InvalidEvaluation(f"expected has no canonical JSON form: {exc}", field="expected") from None
    members = [dict(m) for m in previous.members]
    member = next((m for m in members if m["runId"] == run_id), None)
    if member is None:
        raise NotFound(f"run {run_id} is not in dataset {name}", runId=run_id)
    member["expected"] = expected
    member["expectedEditedBy"] = who.name
    return _new_version(dataset, members, who, {"expectedSet": run_id})


def version_json(version: DatasetVersion) -> dict[str, Any]:
    return {
        "dataset": version.dataset.name,
        "version": version.number,
        "digest": version.digest,
        "createdBy": version.created_by,
        "createdAt": clock.iso(version.created_at),
        "members": version.members,
    }


def dataset_json(dataset: Dataset) -> dict[str, Any]:
    version = latest(dataset)
    return {
        "name": dataset.name,
        "createdBy": dataset.created_by,
        "createdAt": clock.iso(dataset.created_at),
        "latestVersion": version.number if version else None,
        "size": len(version.members) if version else 0,
        "digest": version.digest if version else None,
    }
