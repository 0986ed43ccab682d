"""A run's tree of sub-runs with usage, cost and time rolled up per subtree (docs/design.md §4: an
aggregate's cost is NULL only when every call in it is unpriced; a true 0 means no model calls)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Q

from ..fold.pricing import UsageTotals
from ..models import Run, RunStatus, Workspace
from . import selectors


@dataclass
class SubRunTree:
    run: Run
    children: list[SubRunTree] = field(default_factory=list)
    usage: UsageTotals = field(default_factory=UsageTotals)  # of the whole subtree
    first_start: datetime | None = None
    last_finish: datetime | None = None
    open: bool = False  # a run still going anywhere in the subtree
    failed: bool = False  # a failed run anywhere in the subtree
    size: int = 1

    @property
    def started_at(self) -> datetime | None:
        return self.first_start

    @property
    def finished_at(self) -> datetime | None:
        """The subtree's last finish, once nothing in it is still going."""
        return None if self.open else self.last_finish


def own_usage(run: Run) -> UsageTotals:
    return UsageTotals(
        input_tokens=run.input_tokens,
        output_tokens=run.output_tokens,
        cached_input_tokens=run.cached_input_tokens,
        reasoning_tokens=run.reasoning_tokens,
        cost_usd=run.cost_usd,
        priced_calls=run.priced_calls,
        unpriced_calls=run.unpriced_calls,
    )


def subrun_tree(run: Run, *, family: Sequence[Run] | None = None) -> SubRunTree:
    """The run and every run below it, any depth (one query), each node rolled up. `family`: what
    `selectors.run_family(run)` would read, when the caller knows it (`[run]`: none below it)."""
    children: dict[str, list[Run]] = {}
    for r in selectors.run_family(run) if family is None else family:
        if r.parent_run_id and r.pk != run.pk:
            children.setdefault(r.parent_run_id, []).append(r)
    seen: set[int] = set()

    def build(r: Run) -> SubRunTree:
        seen.add(r.pk)
        node = SubRunTree(r, [build(c) for c in children.get(r.run_id, []) if c.pk not in seen])
        node.usage = own_usage(r)
        for child in node.children:
            node.usage = node.usage.merge(child.usage)
        starts = [s for s in [r.started_at, *(c.first_start for c in node.children)] if s is not None]
        ends = [e for e in [r.finished_at, *(c.last_finish for c in node.children)] if e is not None]
        node.first_start = min(starts) if starts else None
        node.last_finish = max(ends) if ends else None
        node.open = not r.finished or any(c.open for c in node.children)
        node.failed = r.status == RunStatus.FAILED or any(c.failed for c in node.children)
        node.size = 1 + sum(c.size for c in node.children)
        return node

    return build(run)


_USAGE = (
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "reasoning_tokens",
    "cost_usd",
    "priced_calls",
    "unpriced_calls",
)


def tree_usages(workspace: Workspace, runs: Sequence[Run], children: Mapping[str, int]) -> dict[str, UsageTotals]:
    """Each run's usage summed over it and every run below it, any depth (the API's `treeUsage`;
    the same sum as `subrun_tree(run).usage`, which the run page shows). A run without sub-runs
    (`children`: direct sub-runs per run id, selectors.children_counts) has its own; the families of
    the others are read in one query, the usage columns only."""
    trees = {r.run_id: own_usage(r) for r in runs}
    parents = [r for r in runs if children.get(r.run_id)]
    if not parents:
        return trees
    ids = {r.run_id for r in parents}
    roots = {r.root_run_id or r.run_id for r in parents} | ids
    rows = (
        selectors.runs(workspace)
        .filter(Q(root_run_id__in=roots) | Q(parent_run_id__in=ids))
        .exclude(parent_run_id="")
        .values_list("pk", "run_id", "parent_run_id", *_USAGE)
    )
    below: dict[str, list[tuple[int, str, UsageTotals]]] = {}
    for pk, run_id, parent_run_id, *columns in rows:
        below.setdefault(parent_run_id, []).append((pk, run_id, UsageTotals(**dict(zip(_USAGE, columns)))))
    for run in parents:
        seen = {run.pk}
        total = own_usage(run)
        stack = [run.run_id]
        while stack:
            for pk, run_id, usage in below.get(stack.pop(), ()):
                if pk not in seen:
                    seen.add(pk)
                    total = total.merge(usage)
                    stack.append(run_id)
        trees[run.run_id] = total
    return trees
