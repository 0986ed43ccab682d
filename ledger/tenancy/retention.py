"""Retention: how long a workspace keeps its runs, and `ledger prune`, which deletes whole runs
past it (docs/design.md §3: retention deletes whole runs, never single events).

What "past retention" means, precisely. A run may go when, at the moment `now`:
- it is finished (`completed` or `failed`): a pending or running run is never pruned, however old;
- its **last activity** — the `recordedAt` of its last event (a `custom.*` note appended after the
  end counts) — is strictly before `now - retention days`;
- nothing still waits on it: no re-execution request naming it (as original or new run) is
  `pending_approval`, `approved` or `running`; no tool call of it is `claimed` or `in_doubt`; its
  run lease is not live.

Sub-runs go with their tree. The unit of pruning is a root run with every run below it (the runs
whose `root_run_id` is the root's id): the tree goes, in one transaction, only when **every** run
of it may go. So a parent never loses a sub-run its evidence lists, and an old sub-run of a parent
still in use stays until the parent may go too. A run with no sub-runs is a tree of one.

What goes with a run, in the one transaction that deletes it: its events (the database allows it
because the run is marked `pruning` in that same transaction, ledger/dbguards.py), its steps,
tool calls, cost entries, feedback, tool-gateway control rows and anything else that hangs off the
run row by a cascading foreign key; its cost entries are subtracted from the daily
usage rollup (ledger/log/rollup.py), so `ledger verify` still finds the rollup equal to the cost
entries left; and the artifacts its events or gateway rows referenced that nothing left in the
workspace references any more (their files are deleted after the commit). One audit entry
(`run.pruned`) per tree, written in the same transaction, names the runs and counts the rows.
Re-execution requests and share links are kept (they name runs by id): what was asked, decided
and shared outlives the run, and a link to a pruned run answers 410 ("run deleted").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.db.models import Max, Q

from .. import audit, clock
from ..errors import LedgerError
from ..fold.pricing import prices_for
from ..limits import written
from ..log import artifacts, rollup
from ..log.bulk import table
from ..log.rules import lease_live
from ..log.states import STATES
from ..models import (
    Artifact,
    CostEntry,
    Event,
    ImportedArtifact,
    ReexecutionRequest,
    Run,
    RunStatus,
    ToolGatewayClaim,
    Workspace,
)

MAX_RETENTION_DAYS = 36_500
OPEN_REQUESTS = (
    ReexecutionRequest.Status.PENDING_APPROVAL,
    ReexecutionRequest.Status.APPROVED,
    ReexecutionRequest.Status.RUNNING,
)
OPEN_CLAIMS = (ToolGatewayClaim.Status.CLAIMED, ToolGatewayClaim.Status.IN_DOUBT)
PRUNE_ACTOR = audit.Actor(name="system:prune")


class InvalidRetention(LedgerError):
    code = "invalid_retention"


# --- the setting ---------------------------------------------------------------------------------


def validate_days(days: int | None) -> int | None:
    if days is not None and not (1 <= days <= MAX_RETENTION_DAYS):
        raise InvalidRetention(f"retention must be 1 to {MAX_RETENTION_DAYS} days, or empty to keep runs forever")
    return days


@transaction.atomic
def set_retention(*, workspace: Workspace, days: int | None, by: audit.Actor | AbstractBaseUser, reason: str) -> bool:
    """Set the workspace's retention (None: keep forever); audited as `retention.changed` with the
    old and new values and the reason. False (and no entry) when the value does not change."""
    validate_days(days)
    reason = written(
        reason, field="reason", label="reason (it is audited)", error=InvalidRetention, workspace=workspace
    )
    locked = Workspace.objects.select_for_update().select_related("tenant").get(pk=workspace.pk)
    old = locked.retention_days
    if old == days:
        return False
    Workspace.objects.filter(pk=locked.pk).update(retention_days=days)
    workspace.retention_days = days
    audit.record(
        actor=by,
        tenant=locked.tenant,
        workspace=locked,
        action=audit.Action.RETENTION_CHANGED,
        target=f"workspace:{locked.tenant.slug}/{locked.slug}",
        reason=reason.strip(),
        details={"oldDays": old, "newDays": days},
    )
    return True


# --- what may go ---------------------------------------------------------------------------------


@dataclass
class TreeOutcome:
    """A tree of runs pruned (or, in a dry run, that would be): its runs and the rows that go."""

    workspace: Workspace
    root_run_id: str
    run_ids: list[str]
    last_activity: datetime
    counts: dict[str, int] = field(default_factory=dict)
    artifact_files: list[str] = field(default_factory=list)  # storage keys deleted after commit

    def as_details(self) -> dict[str, Any]:
        return {
            "runs": self.run_ids,
            "lastActivity": self.last_activity.isoformat().replace("+00:00", "Z"),
            "counts": self.counts,
        }


@dataclass
class Progress:
    examined: int = 0  # candidate runs looked at
    total: int = 0  # candidate runs in all (finished before the cutoff)
    listener: Callable[[Progress], None] | None = None  # told after each candidate (a progress bar)

    def step(self) -> None:
        self.examined += 1
        if self.listener is not None:
            self.listener(self)


def cutoff(days: int, now: datetime) -> datetime:
    return now - timedelta(days=days)


def candidates(workspace: Workspace, before: datetime, now: datetime) -> Any:
    """Finished runs that ended before the cutoff (a run's last event is recorded after its end, so
    only these can be past retention; the rest of the rules are checked per tree), and those whose
    end is still to come: an end a writer dated in the future (`occurredAt`: an OpenTelemetry span
    from a host whose clock is ahead) says nothing of when the run was last active."""
    return Run.objects.filter(
        Q(finished_at__lt=before) | Q(finished_at__gt=now), workspace=workspace, status__in=RunStatus.finished()
    )


def _tree(workspace: Workspace, root: str) -> list[Run]:
    return list(Run.objects.filter(Q(run_id=root) | Q(root_run_id=root), workspace=workspace).order_by("pk"))


def _last_activity(runs: list[Run]) -> datetime | None:
    """The latest `recordedAt` of the runs' last events (one indexed lookup per run)."""
    found = Event.objects.filter(
        Q(*[Q(run_id=r.pk, sequence=r.last_sequence) for r in runs], _connector=Q.OR)
    ).aggregate(last=Max("recorded_at"))["last"]
    return found


def _held(workspace: Workspace, runs: list[Run], now: datetime) -> bool:
    """Whether anything still waits on one of the runs (module docstring)."""
    ids = [r.run_id for r in runs]
    if any(r.status not in RunStatus.finished() for r in runs):
        return True
    if any(lease_live(r.lease_expires_at, now) for r in runs):
        return True
    if ReexecutionRequest.objects.filter(
        Q(original_run_id__in=ids) | Q(new_run_id__in=ids), workspace=workspace, status__in=OPEN_REQUESTS
    ).exists():
        return True
    return ToolGatewayClaim.objects.filter(run__in=runs, status__in=OPEN_CLAIMS).exists()


def _prunable(workspace: Workspace, runs: list[Run], before: datetime, now: datetime) -> datetime | None:
    """The tree's last activity when the whole tree may go, else None."""
    if not runs or _held(workspace, runs, now):
        return None
    last = _last_activity(runs)
    return last if last is not None and last < before else None


def _artifact_candidates(runs: list[Run]) -> set[str]:
    """sha256s the runs' events and gateway rows reference."""
    from ..log.envelopes import decode_payload
    from ..log.verify import artifact_refs

    refs: set[str] = set()
    texts = Event.objects.filter(run__in=runs, payload__contains=artifacts.REF_PREFIX + "art_").values_list(
        "payload", flat=True
    )
    for text in texts.iterator(chunk_size=200):
        refs.update(artifact_refs(decode_payload(text)))
    refs.update(
        ToolGatewayClaim.objects.filter(run__in=runs).exclude(outcome_ref="").values_list("outcome_ref", flat=True)
    )
    imported = ImportedArtifact.objects.filter(run__in=runs).values_list("artifact__sha256", flat=True)
    return {sha for sha in (artifacts.parse_ref(ref) for ref in refs) if sha} | set(imported)


def _unreferenced(workspace: Workspace, runs: list[Run], shas: set[str]) -> list[Artifact]:
    """Of the artifacts named by `shas`, those no run of the workspace outside `runs` references.

    A substring search of the other runs' payloads: there is no reference table, so this reads the
    workspace's events once per artifact (only for runs that have artifacts at all)."""
    gone = []
    for found in Artifact.objects.filter(workspace=workspace, sha256__in=sorted(shas)).order_by("sha256"):
        needle = found.artifact_id
        in_events = (
            Event.objects.filter(run__workspace=workspace, payload__contains=needle).exclude(run__in=runs).exists()
        )
        in_claims = (
            ToolGatewayClaim.objects.filter(run__workspace=workspace, outcome_ref=found.ref)
            .exclude(run__in=runs)
            .exists()
        )
        in_imports = ImportedArtifact.objects.filter(artifact=found).exclude(run__in=runs).exists()
        if not in_events and not in_claims and not in_imports:
            gone.append(found)
    return gone


def _counts(runs: list[Run]) -> dict[str, int]:
    return {
        "runs": len(runs),
        "events": Event.objects.filter(run__in=runs).count(),
        "costEntries": CostEntry.objects.filter(run__in=runs).count(),
    }


# --- pruning -------------------------------------------------------------------------------------


def _subtract_usage(runs: list[Run]) -> dict[int, set[date]]:
    rows: list[dict[str, Any]] = []
    for run in runs:
        entries = CostEntry.objects.filter(run=run).values(
            "recorded_at", "provider", "model_id", *rollup.TOKENS, "cost_usd"
        )
        rows += rollup.cells(run.workspace_id, run.workflow_version_id, entries)
    return rollup.subtract(rows)


def _prune_tree(
    workspace: Workspace, root: str, before: datetime, now: datetime, *, by: audit.Actor, reason: str
) -> TreeOutcome | None:
    """Delete one tree in one transaction, after checking again under the runs' row locks (an
    append or a re-execution request may have come since the tree was picked)."""
    with transaction.atomic():
        pks = [r.pk for r in _tree(workspace, root)]
        # The same lock every append takes first (ledger/log/), in pk order.
        runs = list(Run.objects.select_for_update().filter(pk__in=pks).order_by("pk"))
        last = _prunable(workspace, runs, before, now)
        if last is None:
            return None
        outcome = TreeOutcome(workspace, root, [r.run_id for r in runs], last, _counts(runs))
        shas = _artifact_candidates(runs)
        recount = _subtract_usage(runs)
        Run.objects.filter(pk__in=pks).update(pruning=True)
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {table(Event)} WHERE run_id IN ({', '.join(['%s'] * len(pks))})", pks)
        doomed = _unreferenced(workspace, runs, shas)
        _, deleted = Run.objects.filter(pk__in=pks).delete()
        for label, n in sorted(deleted.items()):
            name = label.rsplit(".", 1)[-1]
            if name not in ("Run", "Event", "CostEntry") and n:
                outcome.counts[name[0].lower() + name[1:]] = n
        for workspace_id, days in recount.items():
            rollup.recount(workspace_id, days)
        Artifact.objects.filter(pk__in=[a.pk for a in doomed]).delete()
        outcome.counts["artifacts"] = len(doomed)
        outcome.artifact_files = [a.storage_key for a in doomed]
        audit.record(
            actor=by,
            tenant=workspace.tenant,
            workspace=workspace,
            action=audit.Action.RUN_PRUNED,
            target=f"run:{root}",
            reason=reason,
            details=outcome.as_details(),
        )
        transaction.on_commit(lambda: _delete_files(workspace, doomed))
    prices = prices_for(workspace)
    for run_id in outcome.run_ids:
        STATES.take(workspace.pk, run_id, prices.version)
    return outcome


def _delete_files(workspace: Workspace, doomed: list[Artifact]) -> None:
    """After the commit: the bytes of artifacts whose rows went, unless an append stored the same
    bytes again meanwhile (content addressing gives them the same name)."""
    again = set(
        Artifact.objects.filter(workspace=workspace, sha256__in=[a.sha256 for a in doomed]).values_list(
            "sha256", flat=True
        )
    )
    for found in doomed:
        if found.sha256 not in again:
            artifacts.delete_file(found)


def _dry_tree(workspace: Workspace, root: str, before: datetime, now: datetime) -> TreeOutcome | None:
    runs = _tree(workspace, root)
    last = _prunable(workspace, runs, before, now)
    if last is None:
        return None
    outcome = TreeOutcome(workspace, root, [r.run_id for r in runs], last, _counts(runs))
    doomed = _unreferenced(workspace, runs, _artifact_candidates(runs))
    outcome.counts.update(
        {
            "step": sum(r.steps.count() for r in runs),
            "toolCall": sum(r.tool_calls.count() for r in runs),
            "feedback": sum(r.feedback.count() for r in runs),
            "toolGatewayClaim": sum(r.gateway_claims.count() for r in runs),
            "artifacts": len(doomed),
        }
    )
    outcome.counts = {k: v for k, v in outcome.counts.items() if v or k in ("runs", "events", "artifacts")}
    return outcome


def prune_workspace(
    workspace: Workspace,
    *,
    days: int,
    now: datetime | None = None,
    dry_run: bool = False,
    batch_size: int = 100,
    progress: Progress | None = None,
    by: audit.Actor = PRUNE_ACTOR,
) -> Iterator[TreeOutcome]:
    """Prune (or, `dry_run`, list) every tree of the workspace past `days` of retention, one tree
    per transaction, reading candidates `batch_size` at a time; yields each tree as it goes."""
    validate_days(days)
    if batch_size < 1:
        raise LedgerError("--batch-size must be at least 1")
    now = now or clock.now()
    before = cutoff(days, now)
    reason = f"retention: runs whose last activity is over {days} day(s) old (before {before.isoformat()})"
    seen: set[str] = set()
    after_pk = 0
    while True:
        page = list(
            candidates(workspace, before, now)
            .filter(pk__gt=after_pk)
            .order_by("pk")
            .values_list("pk", "run_id", "root_run_id")[:batch_size]
        )
        if not page:
            return
        after_pk = page[-1][0]
        for _, run_id, root_run_id in page:
            root = root_run_id or run_id
            found = None
            if root not in seen:
                seen.add(root)
                found = (
                    _dry_tree(workspace, root, before, now)
                    if dry_run
                    else _prune_tree(workspace, root, before, now, by=by, reason=reason)
                )
            if progress is not None:
                progress.step()
            if found is not None:
                yield found
