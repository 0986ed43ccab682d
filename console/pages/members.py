"""The tenant's members, for its admins, from a workspace's Settings (docs/design.md §2): each
member with their role and when they were added; add a member, change a role, remove a member,
reset a member's password. The same services as the command line's (`ledger add-member`, `ledger
create-user` for a role, `ledger remove-member`, `ledger reset-password`;
ledger/tenancy/services.py), so the same rules and the same audit entries (`member.added`,
`member.changed`, `member.removed`, `member.password_reset`, with the admin's name): the tenant's
last admin can be neither removed nor given another role (`last_admin`); an admin whose account is
disabled does not count.

A reset gives the member a new one-time password, shown once as a new user's is, ends their
sessions and forgets their failed logins. Not the admin's own account (they change their own),
not a deployment operator's, and not a member of another tenant the admin does not administer
(`reset_not_allowed`: docs/security.md § Roles); the list offers it only where it works. A
disabled account is neither reset nor added (`account_disabled`).

Adding takes a username, a role and whether the user is new or exists already. An existing user
keeps their own password; a new one is made with a one-time password, shown once on the answer to
the form (as an API key's secret: never stored but as Django's hash, never shown again, the page
not cached), for the admin to hand over. Refused, the form comes back as typed with the reason by
the field: 400 for a name or role that is not one, 409 for a member already (`already_member`) or
a new user by a taken name (`username_taken`), 404 for an existing user nobody is called.

Another tenant's workspace is a 404, as is another tenant's member named in a form; a member
below admin gets 403. The role and removal forms post with htmx and answer with the members
section (a refusal: 422 with the section and the reason); without JavaScript they post and
redirect, or answer 409/400 with the page. The add form posts plainly and answers with the page
(the password is on that answer only). An admin who takes their own admin role away (another admin
remains) goes to the workspace's runs: this page is no longer theirs.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_POST, require_safe

from ledger.errors import LedgerError, NotFound
from ledger.models import Role, Workspace
from ledger.tenancy import services as tenancy

from .guard import has_role, switcher, wants_fragment, workspace_admin

WS = "w/<slug:tenant>/<slug:workspace>/"
USERNAME_MAX = 150  # Django's username field


def _section(
    ws: Workspace, user: Any, *, error: str = "", done: str = "", reset: dict[str, Any] | None = None
) -> dict[str, Any]:
    rows = tenancy.members(ws.tenant)
    # Admins who can sign in: a disabled account's admin does not count (`_keep_an_admin`).
    enabled_admins = sum(1 for m in rows if m.role == Role.ADMIN and m.active)
    beyond = tenancy.beyond_reset(ws.tenant, user)
    return {
        "workspace": ws,
        "members": [
            {
                "m": m,
                "you": m.username == user.get_username(),
                # Offered only where it can work: the last admin's role and membership stay.
                "last_admin": m.role == Role.ADMIN and enabled_admins - m.active == 0,
                # A reset is offered only where it can work too (the service refuses the rest).
                "resettable": m.active and m.username not in beyond,
            }
            for m in rows
        ],
        # Admins whose account is disabled: the last one who can sign in is then said so.
        "admins_disabled": sum(1 for m in rows if m.role == Role.ADMIN and not m.active),
        "roles": list(Role.values),
        "role_url": reverse("workspace-member-role", args=[ws.tenant.slug, ws.slug]),
        "remove_url": reverse("workspace-member-remove", args=[ws.tenant.slug, ws.slug]),
        "reset_url": reverse("workspace-member-password", args=[ws.tenant.slug, ws.slug]),
        "error": error,
        "done": done,
        "reset": reset,
    }


@login_required
@require_safe
def members_page(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    ws, admin = workspace_admin(request, tenant, workspace)
    done = "Saved: the change is in the audit log." if request.GET.get("saved") == "1" else ""
    return _page(request, ws, admin, done=done)


ACCOUNTS = ("new", "existing")


def _add_form(
    ws: Workspace,
    *,
    username: str = "",
    role: str = Role.VIEWER,
    account: str = "new",
    errors: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "url": reverse("workspace-member-add", args=[ws.tenant.slug, ws.slug]),
        "username": username,
        "role": role,
        "account": account,
        "errors": errors or {},
        "username_max": USERNAME_MAX,
    }


def _page(
    request: HttpRequest,
    ws: Workspace,
    user: Any,
    status: int = 200,
    *,
    add_form: dict[str, Any] | None = None,
    added: dict[str, Any] | None = None,
    reset: dict[str, Any] | None = None,
    **state: str,
) -> HttpResponse:
    workspaces = list(switcher(request))
    context = {
        **_section(ws, user, reset=reset, **state),
        "workspaces": workspaces,
        "tenant_workspaces": [w.slug for w in workspaces if w.tenant_id == ws.tenant_id],
        "add_form": add_form or _add_form(ws),
        "added": added,
    }
    response = render(request, "console/members.html", context, status=status)
    if added is not None and added["password"]:
        response["Cache-Control"] = "no-store"  # the password is on this page, once
    return response


def _answer(
    request: HttpRequest, ws: Workspace, user: Any, *, done: str = "", error: str = "", status: int = 200
) -> HttpResponse:
    """The members section (htmx) or the page, after a change or a refusal; the runs when the
    admin is no longer one (home when no longer a member at all)."""
    if not error and not has_role(user, ws, Role.ADMIN):
        away = reverse("workspace-runs", args=[ws.tenant.slug, ws.slug]) if has_role(user, ws, Role.VIEWER) else "/"
        if wants_fragment(request):
            response = HttpResponse(status=200)
            response["HX-Redirect"] = away
            return response
        return redirect(away)
    if wants_fragment(request):
        # A refusal is 422, not 409/400: django-htmx's debug script (DEBUG on) replaces the whole
        # document with a 400 answer to htmx; static/js/settings.js swaps the 422 in place.
        return render(
            request,
            "console/settings/members_section.html",
            _section(ws, user, done=done, error=error),
            status=422 if error else 200,
        )
    if error:
        return _page(request, ws, user, status=status, error=error)
    return redirect(reverse("workspace-members", args=[ws.tenant.slug, ws.slug]) + "?saved=1")


@login_required
@require_POST
def change_role(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    ws, admin = workspace_admin(request, tenant, workspace)
    username, role = request.POST.get("username", "")[:200], request.POST.get("role", "")[:20]
    try:
        changed = tenancy.change_role(username=username, tenant=ws.tenant.slug, role=role, by=admin)
    except NotFound:  # another tenant's member, or nobody: alike
        raise Http404("not found") from None
    except LedgerError as exc:
        return _answer(request, ws, admin, error=exc.message, status=exc.status)
    done = f"{username} is {role} now." if changed else f"{username} was {role} already: nothing changed."
    return _answer(request, ws, admin, done=done)


@login_required
@require_POST
def remove_member(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    ws, admin = workspace_admin(request, tenant, workspace)
    username = request.POST.get("username", "")[:200]
    try:
        tenancy.remove_member(username=username, tenant=ws.tenant.slug, by=admin)
    except NotFound:
        raise Http404("not found") from None
    except LedgerError as exc:
        return _answer(request, ws, admin, error=exc.message, status=exc.status)
    return _answer(request, ws, admin, done=f"{username} is no longer a member of {ws.tenant.slug}.")


@login_required
@require_POST
def add_member(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    """A new member: the page again, with a new user's password shown once (not a redirect: the
    password is never stored to be shown on a later page); refused, the form as typed with the
    reason by the field."""
    ws, admin = workspace_admin(request, tenant, workspace)
    username = request.POST.get("username", "")[: USERNAME_MAX + 1].strip()
    role = request.POST.get("role", "")[:20]
    account = request.POST.get("account", "")[:20]
    errors = {}
    if len(username) > USERNAME_MAX:
        errors["username"] = f"A username has at most {USERNAME_MAX} characters."
    elif not username:
        errors["username"] = "Name the user to add."
    if role not in Role.values:
        errors["role"] = f"Choose one of {', '.join(Role.values)}."
    if account not in ACCOUNTS:
        errors["account"] = "Choose whether the user is new or has an account already."
    form = {"username": username, "role": role, "account": account}
    if errors:
        return _page(request, ws, admin, status=400, add_form=_add_form(ws, **form, errors=errors))
    try:
        added = tenancy.add_member(
            username=username, tenant=ws.tenant.slug, role=role, new_user=account == "new", by=admin
        )
    except LedgerError as exc:  # the tenant is the admin's own: any refusal is about what was typed
        field = str(exc.details.get("field", "username"))
        message = exc.message if exc.message.endswith(".") else exc.message + "."
        return _page(request, ws, admin, status=exc.status, add_form=_add_form(ws, **form, errors={field: message}))
    name = added.membership.user.get_username()
    return _page(request, ws, admin, status=201, added={"username": name, "role": role, "password": added.password})


@login_required
@require_POST
def reset_password(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    """A member's new one-time password, shown once on the answer (the members section with htmx,
    else the page; `no-store` either way, never a redirect: the password is stored nowhere to be
    shown later). Refused (their own account, an operator's, a member of a tenant the admin does
    not administer, a disabled account): the reason over the list, nothing changed."""
    ws, admin = workspace_admin(request, tenant, workspace)
    username = request.POST.get("username", "")[:200]
    try:
        reset = tenancy.reset_password(username=username, tenant=ws.tenant.slug, by=admin)
    except NotFound:  # another tenant's member, or nobody: alike
        raise Http404("not found") from None
    except LedgerError as exc:
        return _answer(request, ws, admin, error=exc.message, status=exc.status)
    shown = {"username": reset.username, "password": reset.password, "sessions_ended": reset.sessions_ended}
    if wants_fragment(request):
        response = render(request, "console/settings/members_section.html", _section(ws, admin, reset=shown))
    else:
        response = _page(request, ws, admin, reset=shown)
    response["Cache-Control"] = "no-store"  # the password is on this answer, once
    return response


urlpatterns = [
    path(WS + "settings/members/", members_page, name="workspace-members"),
    path(WS + "settings/members/add/", add_member, name="workspace-member-add"),
    path(WS + "settings/members/role/", change_role, name="workspace-member-role"),
    path(WS + "settings/members/remove/", remove_member, name="workspace-member-remove"),
    path(WS + "settings/members/password/", reset_password, name="workspace-member-password"),
]
