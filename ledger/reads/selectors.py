"""Reads, always scoped: every selector takes the workspace (or the user) it answers for.

An object outside the caller's workspace raises NotFound, never a permission error: its existence
is not revealed (docs/design.md §2).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, TypeVar

from django.contrib.auth.models import AnonymousUser, User
from django.db import connection
from django.db.models import Avg, Count, Exists, F, Max, Model, OuterRef, Q, QuerySet, Subquery, Sum, Window
from django.utils import timezone

from ..errors import NotFound
from ..log import snapshots
from ..log.envelopes import decode_payload, envelope, read_envelopes, read_stored_envelopes
from ..models import (
    ApiKey,
    Artifact,
    CostEntry,
    Event,
    Feedback,
    Membership,
    ReexecutionRequest,
    Run,
    RunStatus,
    Step,
    ToolCall,
    Workspace,
)
from .attention import matching as needing

M = TypeVar("M", bound=Model)


def runs(workspace: Workspace) -> QuerySet[Run]:
    return Run.objects.filter(workspace=workspace)


def find_run(workspace: Workspace, run_id: str) -> Run | None:
    run = runs(workspace).filter(run_id=run_id).first()
    if run is not None:
        run.workspace = workspace  # the same row, loaded with its tenant by whoever found it
    return run


def get_run(workspace: Workspace, run_id: str) -> Run:
    run = find_run(workspace, run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found", runId=run_id)
    return run


def all_runs(workspace: Workspace | None = None) -> QuerySet[Run]:
    """Every run (of one workspace, or of all: the command line's view), in creation order."""
    qs = Run.objects.select_related("workspace__tenant").order_by("pk")
    return qs.filter(workspace=workspace) if workspace is not None else qs


# The run row with its events after a position joined on (and not past its last sequence), newest
# last. Plain SQL: a live reader runs it once per announcement, and compiling it through the ORM
# (FilteredRelation) took twice as long as running it (bench/console.py).
_TAIL_SQL = (
    f"SELECT r.status, r.last_sequence, e.sequence, e.event_id, e.type, e.occurrence_id, e.recorded_at, e.payload "
    f"FROM {Run._meta.db_table} r LEFT JOIN {Event._meta.db_table} e "
    f"ON e.run_id = r.id AND e.sequence > %s AND e.sequence <= r.last_sequence "
    f"WHERE r.id = %s ORDER BY e.sequence LIMIT %s"
)


def run_tail(run: Run, *, after: int, limit: int) -> tuple[str, int, list[dict[str, Any]]] | None:
    """The run's status and last sequence as committed now, and up to `limit` of its events after
    `after` and not past that last sequence; None once retention deleted the run.

    One statement, so the head and the events come from one snapshot and a live reader waits for
    one round trip, not two."""
    with connection.cursor() as cursor:
        cursor.execute(_TAIL_SQL, [after, run.pk, limit])
        rows = cursor.fetchall()
    if not rows:
        return None
    status, last_sequence = rows[0][:2]
    return (
        status,
        last_sequence,
        [
            envelope(
                event_id=event_id,
                run_id=run.run_id,
                sequence=sequence,
                type=type_,
                occurrence_id=occurrence_id,
                # SQLite hands datetimes back naive, in the connection's time zone, as the ORM would read them.
                recorded_at=at if at.tzinfo else timezone.make_aware(at, connection.timezone),
                payload=decode_payload(payload),
            )
            for _, _, sequence, event_id, type_, occurrence_id, at, payload in rows
            if sequence is not None
        ],
    )


def events(
    run: Run, *, after: int = 0, limit: int | None = None, type_prefix: str | None = None
) -> list[dict[str, Any]]:
    return read_envelopes(run, after=after, limit=limit, type_prefix=type_prefix)


def events_as_stored(run: Run, *, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
    """`events` for a writer of JSON: each payload its stored canonical text, as an orjson
    Fragment (ledger.log.envelopes.as_stored)."""
    return read_stored_envelopes(run, after=after, limit=limit)


def artifact_in(workspaces: Iterable[Workspace], sha256: str) -> Artifact | None:
    """The first stored copy of these bytes in any of the workspaces."""
    return Artifact.objects.filter(workspace__in=list(workspaces), sha256=sha256).order_by("pk").first()


def user_named(username: str) -> User | None:
    return User.objects.filter(username=username).first()


def active_user(pk: int) -> User | None:
    """The user with this id, if still active (a stream re-checking its session's user)."""
    return User.objects.filter(pk=pk, is_active=True).first()


def live_api_key(pk: int) -> ApiKey | None:
    """The API key with this id, with its workspace, unless revoked (a stream re-checking its key)."""
    return ApiKey.objects.select_related("workspace__tenant").filter(pk=pk, revoked_at__isnull=True).first()


def memberships(user: User | AnonymousUser, *, tenant_slug: str | None = None) -> list[Membership]:
    if isinstance(user, AnonymousUser) or not user.is_authenticated:
        return []
    qs = Membership.objects.filter(user=user).select_related("tenant").order_by("tenant__slug")
    return list(qs.filter(tenant__slug=tenant_slug) if tenant_slug else qs)


def membership(user: User, tenant_id: int) -> Membership | None:
    return Membership.objects.filter(user=user, tenant_id=tenant_id).first()


def all_workspaces() -> QuerySet[Workspace]:
    """Every workspace of every tenant: the command line's view (it holds the database anyway)."""
    return Workspace.objects.select_related("tenant").order_by("tenant__slug", "slug")


def workspace_named(tenant_slug: str, workspace_slug: str) -> Workspace | None:
    return all_workspaces().filter(tenant__slug=tenant_slug, slug=workspace_slug).first()


def workspaces_for(user: User | AnonymousUser) -> QuerySet[Workspace]:
    """The workspaces of every tenant the user is a member of."""
    if isinstance(user, AnonymousUser) or not user.is_authenticated:
        return Workspace.objects.none()
    return (
        Workspace.objects.filter(tenant__memberships__user=user)
        .select_related("tenant")
        .order_by("tenant__slug", "slug")
    )


def member_workspace(
    user: User | AnonymousUser, tenant_slug: str, workspace_slug: str
) -> tuple[Workspace, Membership] | None:
    """The workspace `TENANT/WORKSPACE` with the user's membership of its tenant, in one query (the
    membership's columns as subqueries on the (user, tenant) key); None when there is no such
    workspace or the user is no member of its tenant: what `workspaces_for(user)` would not hold."""
    if isinstance(user, AnonymousUser) or not user.is_authenticated:
        return None
    mine = Membership.objects.filter(user=user, tenant=OuterRef("tenant_id"))
    ws = (
        Workspace.objects.filter(tenant__slug=tenant_slug, slug=workspace_slug)
        .select_related("tenant")
        .annotate(membership_pk=Subquery(mine.values("pk")[:1]), membership_role=Subquery(mine.values("role")[:1]))
        .first()
    )
    if ws is None or ws.membership_pk is None:
        return None
    membership = Membership(pk=ws.membership_pk, user=user, tenant=ws.tenant, role=ws.membership_role)
    membership._state.adding, membership._state.db = False, ws._state.db  # as read from the database
    return ws, membership


def member_workspaces(user: User | AnonymousUser) -> list[tuple[Workspace, Membership]]:
    """Every workspace of the user's tenants (`workspaces_for(user)`, in its order), each with the
    user's membership of its tenant, in one query: the console's pages show the first list in
    their workspace switcher and find the named workspace and its membership in it."""
    if isinstance(user, AnonymousUser) or not user.is_authenticated:
        return []
    mine = Membership.objects.filter(user=user, tenant=OuterRef("tenant_id"))
    found: list[tuple[Workspace, Membership]] = []
    for ws in workspaces_for(user).annotate(
        membership_pk=Subquery(mine.values("pk")[:1]), membership_role=Subquery(mine.values("role")[:1])
    ):
        membership = Membership(pk=ws.membership_pk, user=user, tenant=ws.tenant, role=ws.membership_role)
        membership._state.adding, membership._state.db = False, ws._state.db  # as read from the database
        found.append((ws, membership))
    return found


def filtered_runs(
    workspace: Workspace,
    *,
    status: str | None = None,
    workflow: str | None = None,
    parent_run_id: str | None = None,
    q: str | None = None,
) -> QuerySet[Run]:
    """The workspace's runs, newest first (ties broken by the row id, so a cursor is stable)."""
    qs = runs(workspace).select_related("workspace__tenant")
    if status:
        qs = qs.filter(status=status)
    if workflow:
        qs = qs.filter(workflow_version_id=workflow)
    if parent_run_id:
        qs = qs.filter(parent_run_id=parent_run_id)
    if q:
        qs = qs.filter(Q(run_id__icontains=q) | Q(workflow_version_id__icontains=q) | Q(label__icontains=q))
    return qs.order_by("-created_at", "-pk")


def older_than(qs: QuerySet[M], position: tuple[datetime, int] | None) -> QuerySet[M]:
    """A newest-first list (ordered by -created_at, -pk) from just after `position`, the last row
    of the previous page as a `{t, id}` cursor gives it."""
    if position is None:
        return qs
    created_at, pk = position
    # created_at <= the cursor's as well: the range an index on (workspace, -created_at) starts
    # at; the OR alone is a filter only, and a deep page would read every newer row first.
    return qs.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, pk__lt=pk), created_at__lte=created_at)


def runs_page(qs: QuerySet[Run], *, limit: int, after: tuple[datetime, int] | None) -> tuple[list[Run], bool]:
    """One page of a newest-first run list, strictly after (created_at, pk); and whether more follow."""
    page = list(older_than(qs, after)[: limit + 1])
    return page[:limit], len(page) > limit


def children_counts(workspace: Workspace, run_ids: Iterable[str]) -> dict[str, int]:
    """Direct sub-runs per run, in one query for a whole page."""
    ids = list(run_ids)
    if not ids:
        return {}
    rows = (
        runs(workspace)
        .filter(parent_run_id__in=ids)
        .values("parent_run_id")
        .annotate(n=Count("pk"))
        .values_list("parent_run_id", "n")
    )
    return dict(rows)


ANY_MODEL = "*"


def _utc_day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def search_runs(
    workspace: Workspace,
    *,
    status: str | None = None,
    workflow: str | None = None,
    q: str | None = None,
    start: date | None = None,
    end: date | None = None,
    has_failures: bool = False,
    cost_above: Decimal | None = None,
    min_rating: int | None = None,
    model: tuple[str, str] | str | None = None,
    attention: str | None = None,
    workflow_name: str | None = None,
) -> QuerySet[Run]:
    """The console's runs list: filtered_runs plus the console's filters, newest first.

    `start`/`end` are UTC days, both inclusive, and select runs by the day they were created
    (`created_at`, the list's order) — except with `model`, where they select the model calls
    instead (by the day they were recorded, as the usage report counts them), so a drill-down from
    a day of the usage chart lists exactly the runs behind it. `model` is (provider, modelId) or
    ANY_MODEL (any model call). `has_failures`: the run failed, one of its steps failed, or a
    sub-run below it failed (a direct sub-run; for a root run, any run of its tree).
    `min_rating`: the average of the run's ratings is at least this. `cost_above`: strictly above,
    so an unpriced run (NULL cost) never matches. `attention`: attention.ANY or a kind
    (ledger/reads/attention.py). `workflow_name`: part of the workflow version id
    (`wfver_<name>_<hash>`), any case — a name finds every version; `workflow` is exact.
    """
    qs = filtered_runs(workspace, status=status, workflow=workflow, q=q)
    if attention:
        qs = needing(qs, workspace, attention)
    if workflow_name:
        qs = qs.filter(workflow_version_id__icontains=workflow_name)
    since = _utc_day_start(start) if start else None
    until = _utc_day_start(end + timedelta(days=1)) if end else None
    if model is not None:
        calls = CostEntry.objects.filter(run=OuterRef("pk"))
        if not isinstance(model, str):  # ANY_MODEL is the one string `model` may be
            provider, model_id = model
            calls = calls.filter(provider=provider, model_id=model_id)
        if since:
            calls = calls.filter(recorded_at__gte=since)
        if until:
            calls = calls.filter(recorded_at__lt=until)
        qs = qs.filter(Exists(calls))
    else:
        if since:
            qs = qs.filter(created_at__gte=since)
        if until:
            qs = qs.filter(created_at__lt=until)
    if has_failures:
        failed_below = runs(workspace).filter(status=RunStatus.FAILED).exclude(parent_run_id="")
        qs = qs.filter(
            Q(status=RunStatus.FAILED)
            | Exists(Step.objects.filter(run=OuterRef("pk"), status="failed"))
            | Q(run_id__in=failed_below.values("parent_run_id"))
            | Q(run_id__in=failed_below.exclude(root_run_id="").values("root_run_id"))
        )
    if cost_above is not None:
        qs = qs.filter(cost_usd__gt=cost_above)
    if min_rating is not None:
        rated = (
            Feedback.objects.filter(run__workspace=workspace)
            .values("run")
            .annotate(average=Avg("rating"))
            .filter(average__gte=min_rating)
            .values("run")
        )
        qs = qs.filter(pk__in=rated)
    return qs


def ratings_for(run_pks: Iterable[int]) -> dict[int, tuple[float, int]]:
    """(average rating, number of ratings) per rated run, in one query for a whole page."""
    pks = list(run_pks)
    if not pks:
        return {}
    rows = (
        Feedback.objects.filter(run_id__in=pks)
        .values("run_id")
        .annotate(average=Avg("rating"), n=Count("pk"))
        .values_list("run_id", "average", "n")
    )
    return {pk: (float(average), n) for pk, average, n in rows}


# --- one run, for its page -----------------------------------------------------------------------


def newest_workspace_for(user: User | AnonymousUser) -> Workspace | None:
    """The member's workspace where a run started last (those without runs last, by name)."""
    return (
        workspaces_for(user)
        .annotate(newest=Max("runs__created_at"))
        .order_by(F("newest").desc(nulls_last=True), "tenant__slug", "slug")
        .first()
    )


@dataclass(frozen=True)
class FeedbackSummary:
    count: int
    average: float | None
    latest: list[Feedback]


@dataclass(frozen=True)
class Neighbourhood:
    """Whether anything around a run holds rows for its page to list: a run naming it as parent
    (`runlog.children_of`'s rows), a re-execution request naming it (to re-execute it, or as the
    run one made), a rating."""

    sub_runs: bool
    requests: bool
    ratings: bool


NOTHING_AROUND = Neighbourhood(sub_runs=False, requests=False, ratings=False)


def neighbourhood(run: Run) -> Neighbourhood:
    """`Neighbourhood` of `run` in one query: most runs have none of the three, and their header
    then reads none of the three lists (run_family, reexecutions.around_run, feedback_summary)."""
    below = runs(run.workspace).filter(parent_run_id=run.run_id)  # itself too, were it to name itself
    named = ReexecutionRequest.objects.filter(workspace=run.workspace).filter(
        Q(original_run_id=run.run_id) | Q(new_run_id=run.run_id)
    )
    found = (
        Run.objects.filter(pk=run.pk)
        .annotate(sub_runs=Exists(below), requests=Exists(named), ratings=Exists(Feedback.objects.filter(run=run)))
        .values_list("sub_runs", "requests", "ratings")
        .first()
    )
    if found is None:  # deleted meanwhile (retention): nothing around it to list
        return NOTHING_AROUND
    return Neighbourhood(*(bool(flag) for flag in found))


def feedback_summary(run: Run, *, latest: int) -> FeedbackSummary:
    """How many ratings, their average, and the newest `latest` of them (with their authors)."""
    # One query: the count and the average over all of the run's ratings ride on each of the
    # newest rows as window aggregates (computed before the LIMIT); no rating, no row, none of either.
    rows = list(
        Feedback.objects.filter(run=run)
        .select_related("author", "api_key")
        .annotate(ratings_total=Window(Count("pk")), ratings_average=Window(Avg("rating")))
        .order_by("-created_at", "-pk")[:latest]
    )
    if not rows:
        if latest > 0:
            return FeedbackSummary(0, None, [])
        summary = Feedback.objects.filter(run=run).aggregate(count=Count("pk"), average=Avg("rating"))
        count, average = summary["count"], summary["average"]
        return FeedbackSummary(count, None if average is None else float(average), [])
    count, average = rows[0].ratings_total, rows[0].ratings_average
    return FeedbackSummary(count, None if average is None else float(average), list[Feedback](rows))


def steps_page(run: Run, *, start: int, size: int) -> tuple[list[Step], int]:
    """Steps at positions start .. start+size-1, and how many the run has. Positions are dense
    from 0 (the fold numbers steps by first appearance), so a page is a range."""
    steps = list(Step.objects.filter(run=run, position__gte=start, position__lt=start + size).order_by("position"))
    return steps, snapshots.at_head(run, "steps", Step.objects.filter(run=run).count)


def tool_calls_page(run: Run, *, start: int, size: int) -> tuple[list[ToolCall], int]:
    """Tool calls at positions start .. start+size-1 (dense from 0 in the order the calls
    appeared, as steps), and how many the run has. A range of the (run, position) index, so a late
    page reads its own rows only (as costs_page)."""
    calls = list(ToolCall.objects.filter(run=run, position__gte=start, position__lt=start + size).order_by("position"))
    return calls, snapshots.at_head(run, "tool_calls", ToolCall.objects.filter(run=run).count)


def waits_for_resume_after_reconcile(run: Run) -> bool:
    """Whether nothing has continued this unfinished run since an operator reconciled a call of
    it: its last event is the reconcile. Only a resume goes on from there (docs/operations.md)."""
    if run.finished:
        return False
    last = Event.objects.filter(run=run, sequence=run.last_sequence).values_list("type", flat=True).first()
    return last == "harness.tool_call.reconciled"


def tool_calls_in_doubt(run: Run, also: Iterable[str], *, size: int) -> tuple[list[ToolCall], int]:
    """The first `size` calls in doubt (by the fold, or by the gateway's claims: `also`), in the
    order they appeared, and how many there are."""
    found = ToolCall.objects.filter(run=run).filter(Q(status="in_doubt") | Q(call_id__in=list(also)))
    return list(found.order_by("position")[:size]), found.count()


def costs_page(run: Run, *, size: int, after: int = 0, before: int | None = None) -> tuple[list[CostEntry], int]:
    """`size` of the run's cost entries in sequence order: the first ones after sequence `after`,
    or, `before` given, the last ones before it; and how many the run has. By key, on the unique
    (run, sequence) index: the last page of 20,000 entries reads its own rows, where an OFFSET read
    every entry before them. Cost entries are not dense in sequence (tool calls and steps hold the
    sequences between), so the key is the sequence, not a position (tool_calls_page)."""
    entries = CostEntry.objects.filter(run=run)
    if before is not None:
        rows = list(entries.filter(sequence__lt=before).order_by("-sequence")[:size])[::-1]
    else:
        rows = list(entries.filter(sequence__gt=after).order_by("sequence")[:size])
    return rows, snapshots.at_head(run, "cost_entries", entries.count)


def costs_by_model(run: Run) -> list[dict[str, Any]]:
    """Per (provider, model): calls, priced calls, cost (NULL when none priced) and tokens, summed
    in the database once per head of the run (snapshots.at_head: the sum reads every cost entry)."""
    rows = snapshots.at_head(run, "costs_by_model", lambda: _costs_by_model(run))
    return [dict(row) for row in rows]


def _costs_by_model(run: Run) -> list[dict[str, Any]]:
    return [
        dict(row)
        for row in CostEntry.objects.filter(run=run)
        .values("provider", "model_id")
        .annotate(
            calls=Count("pk"),
            priced=Count("cost_usd"),
            cost=Sum("cost_usd"),
            input=Sum("input_tokens"),
            output=Sum("output_tokens"),
            cached=Sum("cached_input_tokens"),
            reasoning=Sum("reasoning_tokens"),
        )
        .order_by("provider", "model_id")
    ]


def run_family(run: Run) -> list[Run]:
    """The run and every run below it, any depth, in one query on the root's projection (plus
    direct children recorded before their root was known), oldest first."""
    root = run.root_run_id or run.run_id
    family = list(
        runs(run.workspace)
        .filter(Q(root_run_id__in={root, run.run_id}) | Q(parent_run_id=run.run_id))
        .order_by("created_at", "pk")
    )
    for r in family:
        r.workspace = run.workspace
    return family
