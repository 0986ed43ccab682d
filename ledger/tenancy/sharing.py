"""Share links (docs/api.md "Share links"): a read-only, login-free view of one run's evidence.

A link is a random token (256 bits, `secrets.token_urlsafe(32)`), shown once to its creator inside
its URL and stored only as its sha256, so the database never holds a usable link and the URL says
nothing about the run. Services create, revoke and open links, each audited in its own
transaction; `open_link` counts the open with one conditional UPDATE, so two readers racing for
a link's last open cannot both get it (PostgreSQL re-checks the WHERE clause of an UPDATE once
the row lock is granted; the check constraint on the table is the backstop).

What a shared view shows is redacted by `shared_envelope` / `shared_bundle`: secrets were
redacted before storage already (docs/design.md §3); a workspace may also hide model inputs (the
messages and prompts sent) and tool arguments from every shared view (`share_hides_inputs`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import F, Q, QuerySet

from .. import audit, clock
from ..errors import LedgerError, NotFound
from ..fold import fold
from ..fold.pricing import prices_of
from ..log.envelopes import log_of
from ..models import Run, ShareLink, Workspace
from ..reads import selectors
from ..replay.runlog import FoldedRun, SnapshotRun, snapshot

MAX_EXPIRY_HOURS = 720
MAX_OPENS = 10_000
TOKEN_BYTES = 32
# token_urlsafe(32) is 43 characters of the URL-safe base64 alphabet; anything else is no token.
TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{43}$")
PUBLIC_ID_PREFIX = "shl_"
HIDDEN = "[HIDDEN]"
ANONYMOUS = audit.Actor(name="anonymous")


class InvalidShareLink(LedgerError):
    code = "invalid_request"


class ShareLinkGone(LedgerError):
    """The link existed and no longer opens: why is `reason` (expired, revoked, used_up, run_deleted)."""

    code = "share_link_gone"
    status = 410

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message, reason=reason)
        self.reason = reason


def share_path(token: str) -> str:
    """The public path of a link (the URL reveals nothing but the token)."""
    return f"/s/{token}/"


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def status_of(link: ShareLink) -> str:
    """active, revoked, expired or used_up (in that order of precedence after active)."""
    if link.revoked_at is not None:
        return "revoked"
    if link.expires_at <= clock.now():
        return "expired"
    if link.max_opens is not None and link.open_count >= link.max_opens:
        return "used_up"
    return "active"


# --- services ---------------------------------------------------------------------------------


@transaction.atomic
def create_link(
    *,
    workspace: Workspace,
    run: Run,
    by: AbstractBaseUser,
    expires_in_hours: int,
    include_sub_runs: bool = False,
    max_opens: int | None = None,
) -> tuple[ShareLink, str]:
    """A new link to `run`; returns it and its token, which is never stored or shown again. Audited."""
    if not 1 <= expires_in_hours <= MAX_EXPIRY_HOURS:
        raise InvalidShareLink(f"expiresInHours must be between 1 and {MAX_EXPIRY_HOURS}", field="expiresInHours")
    if max_opens is not None and not 1 <= max_opens <= MAX_OPENS:
        raise InvalidShareLink(f"maxOpens must be between 1 and {MAX_OPENS}", field="maxOpens")
    if run.workspace_id != workspace.pk:
        raise NotFound("run not found", runId=run.run_id)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    now = clock.now()
    link = ShareLink.objects.create(
        public_id=PUBLIC_ID_PREFIX + secrets.token_hex(8),
        workspace=workspace,
        run_id=run.run_id,
        token_hash=_hash(token),
        include_sub_runs=include_sub_runs,
        expires_at=now + timedelta(hours=expires_in_hours),
        max_opens=max_opens,
        created_by=by.get_username(),
        created_by_user_id=by.pk,
        created_at=now,
    )
    audit.record(
        actor=by,
        tenant=workspace.tenant,
        workspace=workspace,
        action=audit.Action.SHARE_LINK_CREATED,
        target=f"share_link:{link.public_id}",
        details={
            "runId": run.run_id,
            "expiresAt": link.expires_at.isoformat(),
            "includeSubRuns": include_sub_runs,
            "maxOpens": max_opens,
        },
    )
    return link, token


@transaction.atomic
def revoke_link(link: ShareLink, *, by: AbstractBaseUser) -> ShareLink:
    """Revoke a link at once (idempotent: only the first revocation is audited)."""
    revoked = ShareLink.objects.filter(pk=link.pk, revoked_at__isnull=True).update(
        revoked_at=clock.now(), revoked_by=by.get_username()
    )
    if revoked:
        workspace = link.workspace
        audit.record(
            actor=by,
            tenant=workspace.tenant,
            workspace=workspace,
            action=audit.Action.SHARE_LINK_REVOKED,
            target=f"share_link:{link.public_id}",
            details={"runId": link.run_id},
        )
    link.refresh_from_db()
    return link


@dataclass(frozen=True)
class Opened:
    link: ShareLink
    root: Run  # the run the link was made for
    run: Run  # the run shown: the root, or one of its sub-runs when the link includes them


def find_link(token: str) -> ShareLink:
    """The link a token opens, whatever its state; NotFound for anything that is not one."""
    if not TOKEN_RE.match(token):
        raise NotFound("not found")
    digest = _hash(token)
    link = ShareLink.objects.select_related("workspace__tenant").filter(token_hash=digest).first()
    # The lookup is by a hash of the token, so its timing says nothing about stored tokens; the
    # comparison is constant-time anyway, as for API keys.
    if link is None or not hmac.compare_digest(link.token_hash, digest):
        raise NotFound("not found")
    return link


def _gone(link: ShareLink) -> ShareLinkGone:
    reason = status_of(link)
    messages = {
        "revoked": "This share link was revoked.",
        "expired": "This share link has expired.",
        "used_up": "This share link has been opened as many times as it allows.",
    }
    return ShareLinkGone(reason, messages.get(reason, "This share link no longer opens."))


def open_link(token: str, *, what: str, sub_run_id: str | None = None) -> Opened:
    """Open a link (a page or its evidence.json): count the open and audit it, or refuse.

    NotFound (404) for an unknown or tampered token, and for a run the link does not cover;
    ShareLinkGone (410) for a revoked, expired or used-up link, or a run deleted since.
    """
    link = find_link(token)
    workspace = link.workspace
    root = selectors.find_run(workspace, link.run_id)
    if root is None:
        raise ShareLinkGone("run_deleted", "The run this link shared has been deleted.")
    root.workspace = workspace
    shown = root
    if sub_run_id is not None and sub_run_id != root.run_id:
        found = descendant(root, sub_run_id) if link.include_sub_runs else None
        if found is None:
            raise NotFound("not found")
        shown = found
    with transaction.atomic():
        now = clock.now()
        counted = ShareLink.objects.filter(
            Q(max_opens__isnull=True) | Q(open_count__lt=F("max_opens")),
            pk=link.pk,
            revoked_at__isnull=True,
            expires_at__gt=now,
        ).update(open_count=F("open_count") + 1, last_opened_at=now)
        if not counted:
            link.refresh_from_db()
            raise _gone(link)
        audit.record(
            actor=ANONYMOUS,
            tenant=workspace.tenant,
            workspace=workspace,
            action=audit.Action.SHARE_LINK_OPENED,
            target=f"share_link:{link.public_id}",
            details={"runId": shown.run_id, "what": what},
        )
    # As this open left them (others opening at the same moment may have counted theirs too):
    # not read back, no caller shows them.
    link.open_count, link.last_opened_at = link.open_count + 1, now
    return Opened(link=link, root=root, run=shown)


def descendant(root: Run, run_id: str) -> Run | None:
    """`run_id` when it is a run below `root` (any depth), else None."""
    family = selectors.run_family(root)
    by_id = {r.run_id: r for r in family}
    found = by_id.get(run_id)
    seen: set[str] = set()
    node = found
    while node is not None and node.run_id not in seen:  # walk up: a sub-run's parents reach the root
        if node.parent_run_id == root.run_id:
            return found
        seen.add(node.run_id)
        node = by_id.get(node.parent_run_id)
    return None


@transaction.atomic
def set_share_policy(*, workspace: Workspace, hides_inputs: bool, by: AbstractBaseUser) -> bool:
    """An admin's choice for the workspace's shared views; audited when it changes. Returns
    whether it changed."""
    changed = (
        Workspace.objects.filter(pk=workspace.pk)
        .exclude(share_hides_inputs=hides_inputs)
        .update(share_hides_inputs=hides_inputs)
    )
    workspace.share_hides_inputs = hides_inputs
    if changed:
        audit.record(
            actor=by,
            tenant=workspace.tenant,
            workspace=workspace,
            action=audit.Action.SHARE_POLICY_CHANGED,
            target=f"workspace:{workspace.tenant.slug}/{workspace.slug}",
            details={"hidesInputs": hides_inputs},
        )
    return bool(changed)


# --- selectors --------------------------------------------------------------------------------


def links_of_run(workspace: Workspace, run_id: str) -> QuerySet[ShareLink]:
    return (
        ShareLink.objects.filter(workspace=workspace, run_id=run_id)
        .select_related("workspace__tenant")
        .order_by("-created_at", "-pk")
    )


def get_link(workspaces: list[Workspace], public_id: str) -> ShareLink:
    link = (
        ShareLink.objects.select_related("workspace__tenant")
        .filter(workspace__in=workspaces, public_id=public_id)
        .first()
    )
    if link is None:
        raise NotFound("share link not found", id=public_id)
    return link


def as_dict(link: ShareLink) -> dict[str, Any]:
    """A link as the API lists it: never its token (which is not stored)."""
    return {
        "id": link.public_id,
        "runId": link.run_id,
        "creator": link.created_by,
        "createdAt": clock.iso(link.created_at),
        "expiresAt": clock.iso(link.expires_at),
        "maxOpens": link.max_opens,
        "openCount": link.open_count,
        "lastOpenedAt": clock.iso(link.last_opened_at),
        "revokedAt": clock.iso(link.revoked_at),
        "includeSubRuns": link.include_sub_runs,
        "status": status_of(link),
    }


# --- what a shared view shows -----------------------------------------------------------------


def _hide_requested_args(calls: Any) -> Any:
    if not isinstance(calls, list):
        return calls
    return [
        {k: HIDDEN if k in ("args", "arguments", "input") else v for k, v in c.items()} if isinstance(c, dict) else c
        for c in calls
    ]


def shared_payload(event_type: str, payload: Any, *, hide_inputs: bool) -> Any:
    """A payload as shared views show it: with `hide_inputs`, what a model was sent (the request,
    a session's task) and every tool argument (a call's args, the calls a model asked for) are
    replaced by "[HIDDEN]"."""
    if not hide_inputs or not isinstance(payload, dict):
        return payload
    hidden = dict(payload)
    if event_type == "harness.model.called" and "request" in hidden:
        hidden["request"] = HIDDEN
    elif event_type == "harness.tool_call.started" and "args" in hidden:
        hidden["args"] = HIDDEN
    elif event_type == "harness.session.started" and "task" in hidden:
        hidden["task"] = HIDDEN
    elif event_type == "harness.model.responded" and isinstance(hidden.get("response"), dict):
        response = dict(hidden["response"])
        for key in ("toolCalls", "tool_calls"):
            if key in response:
                response[key] = _hide_requested_args(response[key])
        hidden["response"] = response
    return hidden


def shared_envelope(envelope: dict[str, Any], *, hide_inputs: bool, at_root: bool = True) -> dict[str, Any]:
    """An event as shared views show it: a run's start never names a run outside the link (the
    run it replays; its parent when it is the link's run, `at_root`: the run object says the same,
    `_anonymous_run`), and with `hide_inputs` neither its input nor the other inputs above."""
    payload = envelope["payload"]
    if envelope["type"] == "RunStarted" and isinstance(payload, dict):
        outside = ("replayOf", *(("parentRunId",) if at_root else ()))
        hidden = {k: HIDDEN for k in (*outside, *(("input",) if hide_inputs else ())) if k in payload}
        if hidden:
            envelope = {**envelope, "payload": {**payload, **hidden}}
    if not hide_inputs:
        return envelope
    return {**envelope, "payload": shared_payload(envelope["type"], envelope["payload"], hide_inputs=True)}


def shared_folded(run: Run, *, hide_inputs: bool) -> FoldedRun | SnapshotRun:
    """The run folded from its log as shared views show it (the conversation reads both): from its
    fold snapshots; with the workspace hiding inputs, the hidden log folded whole (the snapshots
    hold what the run was sent, which the hidden view must not fold in)."""
    if not hide_inputs:
        return snapshot(run)
    log = [shared_envelope(e, hide_inputs=True) for e in log_of(run)]
    return FoldedRun(log, fold(log, prices=prices_of(run), run_id=run.run_id))


def shared_run_path(token: str, root_run_id: str, run_id: str) -> str:
    """Where a link shows a run: its own run at the link's root, a sub-run below it."""
    base = share_path(token)
    return base if run_id == root_run_id else f"{base}runs/{run_id}/"


def shared_bundle(
    bundle: dict[str, Any], *, token: str, root_run_id: str, hide_inputs: bool, include_sub_runs: bool
) -> dict[str, Any]:
    """The evidence bundle as a link serves it: the same shape, its links pointing under the
    link, sub-runs listed only when the link includes them, and the workspace's hiding applied.
    `bundle` is not changed: what differs is built anew, the rest shared with it (a deep copy of
    a 100,000-event run's bundle took half the request, issue 33)."""
    shared = dict(bundle)

    def links(of: str) -> dict[str, str]:
        page = shared_run_path(token, root_run_id, of)
        return {"console": page, "evidence": f"{page}evidence.json", "events": f"{page}#timeline"}

    shown = shared["run"]["runId"]
    shared["run"] = _anonymous_run(shared["run"], root_run_id=root_run_id, below_root=shown != root_run_id)
    shared["run"]["links"] = links(shown)
    if include_sub_runs:
        shared["subRuns"] = [
            {**_anonymous_run(sub, root_run_id=root_run_id, below_root=True), "links": links(sub["runId"])}
            for sub in shared["subRuns"]
        ]
    else:
        shared["subRuns"] = []
        shared["run"]["treeUsage"] = None  # the sub-runs' spending is theirs, and they are not shared
    shared["approvals"] = [_anonymous_approval(a) for a in shared["approvals"] if a["status"] not in UNDECIDED]
    shared["feedback"] = [_anonymous_feedback(f) for f in shared["feedback"]]
    if hide_inputs:
        shared["toolCalls"] = [{**call, "args": HIDDEN} for call in shared["toolCalls"]]
        for run in (shared["run"], *shared["subRuns"]):
            run["input"] = HIDDEN
        for approval in shared["approvals"]:
            if "input" in approval:
                approval["input"] = HIDDEN
    return shared


# A re-execution not yet decided is the tenant's business, not the reader's.
UNDECIDED = frozenset({"pending_approval", "expired"})
# What a shared re-execution keeps: what was done and when, by whom only as a role. Not its id,
# reason, note, digests, the people, the new run's id or its executor.
_APPROVAL_FIELDS = ("mode", "fromStep", "modelOverrides", "status", "decidedAt", "createdAt", "relation", "input")


def _anonymous_run(run: dict[str, Any], *, root_run_id: str, below_root: bool) -> dict[str, Any]:
    """A run object naming no run outside the link: its parent only below the link's run (the
    parent is then inside), its root only when that is the link's run, never the run it replays."""
    return {
        **run,
        "parentRunId": run["parentRunId"] if below_root else None,
        "rootRunId": run["rootRunId"] if run["rootRunId"] == root_run_id else None,
        "replayOf": None,
        "attention": _anonymous_attention(run.get("attention")),
    }


def _anonymous_attention(attention: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the run waits for and since when; not its detail, which names requests and people
    (a retry's time excepted)."""
    if attention is None:
        return None
    detail = attention.get("detail") or {}
    kept = {"retryAt": detail["retryAt"]} if "retryAt" in detail else {}
    return {"kind": attention["kind"], "since": attention["since"], "detail": kept}


def _anonymous_approval(approval: dict[str, Any]) -> dict[str, Any]:
    out = {k: approval[k] for k in _APPROVAL_FIELDS if k in approval}
    by = approval.get("requestedBy") or ""
    out["requestedBy"] = "an API key" if by.startswith("key:") else "a member"
    out["approver"] = "an approver" if approval.get("approver") else None
    return out


def _anonymous_feedback(row: dict[str, Any]) -> dict[str, Any]:
    """A rating without its comment or its author's name: only whether a member or a key gave it."""
    author = row.get("author")
    return {
        "runId": row["runId"],
        "rating": row["rating"],
        "category": row["category"],
        "author": {"type": author["type"]} if isinstance(author, dict) else None,
        "createdAt": row["createdAt"],
    }
