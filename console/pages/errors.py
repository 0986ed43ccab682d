"""The console's error pages: 400, 403, 404, 405, 410 and 500 in the console's layout, each with a
way back (Django's handler400/403/404/500, set in console/urls.py, CSRF_FAILURE_VIEW,
`MethodNotAllowedMiddleware` for a method an address does not take, and `error_page` for the
views' own refusals).

A 404 never says more than "not found" (another tenant's object reads as one that does not
exist, docs/design.md §2). Under /api/ console/api/errors.py turns these into the API's error
envelope. The 500 page reads nothing from the database: it is what shows when
the database is what failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseServerError
from django.template import loader
from django.template.response import TemplateResponse
from django.utils.http import url_has_allowed_host_and_scheme
from django_htmx.middleware import HtmxDetails

from ledger.models import Workspace
from ledger.reads import selectors

from ..htmx_login import login_redirect

TEMPLATE = "errors/error.html"

TITLES = {
    400: "Bad request",
    403: "Not allowed",
    404: "Not found",
    405: "Method not allowed",
    410: "Gone",
    500: "Something went wrong",
}
MESSAGES = {
    400: "The address or the form holds something this page cannot use.",
    403: "Your role in this tenant does not allow this page. An admin of the tenant can change your role.",
    404: "There is nothing at this address, or it is not yours to see.",
    410: "What was here has been removed.",
    500: "The server failed to answer. The error has been logged; try again in a moment.",
}


def _where(request: HttpRequest) -> tuple[Any, Workspace | None]:
    """The member's workspaces (for the switcher) and, when the address is one of them, that one
    (its navigation offers the way back)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return [], None
    workspaces = selectors.workspaces_for(user)
    kwargs = request.resolver_match.kwargs if request.resolver_match else {}
    here = None
    if "tenant" in kwargs and "workspace" in kwargs:
        here = workspaces.filter(tenant__slug=kwargs["tenant"], slug=kwargs["workspace"]).first()
    elif "tenant" in kwargs:
        here = workspaces.filter(tenant__slug=kwargs["tenant"]).first()
    return workspaces, here


def error_page(
    request: HttpRequest,
    status: int,
    message: str = "",
    *,
    title: str = "",
    back_url: str = "",
    back_label: str = "",
    context: dict[str, Any] | None = None,
) -> HttpResponse:
    """An error in the console's layout: what went wrong, and where to go from here."""
    workspaces, here = _where(request)
    page: dict[str, Any] = {
        "status": status,
        "title": title or TITLES.get(status, "Error"),
        "message": message or MESSAGES.get(status, ""),
        "back_url": back_url,
        "back_label": back_label or "Back",
        "workspaces": workspaces,
        "workspace": here,
        **(context or {}),
    }
    if here is not None and not back_url:
        page["back_url"] = f"/w/{here.tenant.slug}/{here.slug}/"
        page["back_label"] = f"Runs of {here}"
    return TemplateResponse(request, TEMPLATE, page, status=status).render()


def _message(exception: Exception | None, status: int) -> str:
    """The exception's own words where they are meant for the reader (PermissionDenied("the
    audit log is for the tenant's admins")); the generic sentence otherwise. A 404 keeps the
    generic one: its reason may name what is not to be revealed."""
    text = str(exception) if exception is not None and exception.args else ""
    if status == 404 or not text or text in ("not found", "Forbidden"):
        return MESSAGES[status]
    return text[:300].rstrip(".") + "."


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return error_page(request, 400, _message(exception, 400))


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return error_page(request, 403, _message(exception, 403))


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return error_page(request, 404)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: a form sent with a token that is no longer the session's (logged out and
    in again in another tab, or the session expired) is the styled 403, not Django's bare page
    (whose inline style the CSP blocks), and leads back to the form: the Referer when it is this
    site's page, else the workspace's runs or home. The API's views are exempt: DRF checks the
    session's CSRF itself and answers its JSON error.

    A form htmx sent gets the message in place instead (`_form_expired`): htmx drops a 403 page,
    and the click seemed to do nothing."""
    htmx = getattr(request, "htmx", None)
    if htmx:
        return _form_expired(request, htmx)
    return error_page(
        request,
        403,
        "This form expired: you logged in again, or your session ended, since the page was loaded. "
        "Reload the page and submit the form again.",
        title="The form expired",
        back_url=_same_site_page(request),
        back_label="Back to the form",
    )


def _same_site_page(request: HttpRequest) -> str:
    """The console page the request came from (htmx's current URL, else a Referer of this site),
    or ""."""
    htmx = getattr(request, "htmx", None)
    if htmx and htmx.current_url_abs_path:
        return str(htmx.current_url_abs_path)
    referer = request.META.get("HTTP_REFERER", "")
    same_site = url_has_allowed_host_and_scheme(referer, {request.get_host()}, require_https=request.is_secure())
    return referer if referer and same_site else ""


def method_not_allowed(request: HttpRequest, allow: str) -> HttpResponse:
    """405 in the console's layout, its `Allow` kept: an action's address opened as a page (a
    form's URL pasted in the address bar, a bookmark of it) says so and leads back to the page the
    form is on; any other method names the ones the address takes."""
    allowed = [m.strip() for m in allow.split(",") if m.strip()]
    method = (request.method or "")[:20]
    if method in ("GET", "HEAD"):
        message = (
            "This address is where a console form is sent, not a page to open. "
            "Go back to the page the form is on and send it from there."
        )
    else:
        message = f"This address does not take a {method} request; it takes {', '.join(allowed) or 'none'}."
    back = _same_site_page(request)
    response = error_page(request, 405, message, back_url=back, back_label="Back to the page" if back else "")
    response["Allow"] = allow
    return response


class MethodNotAllowedMiddleware:
    """Django's answer to a method a view does not take (`require_POST`, `require_safe`, a class
    view's `http_method_not_allowed`) is an empty 405: outside /api/ (whose error body
    console/api/errors.py writes), that answer becomes `method_not_allowed`'s page. A 405 that has
    a body of its own (the share pages') is left as it is. After HtmxMiddleware and the
    authentication middleware: the page reads `request.htmx` and the member's workspaces."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code != 405 or request.path.startswith("/api/"):
            return response
        if getattr(response, "streaming", False) or response.content:
            return response
        return method_not_allowed(request, response.get("Allow", ""))


def _form_expired(request: HttpRequest, htmx: HtmxDetails) -> HttpResponse:
    """The expired form's message, put just before the element that sent it (HX-Retarget `this`,
    HX-Reswap `beforebegin`; static/js/refusals.js swaps a refusal that names its place): the form
    and what was typed in it stay as they were, to copy before reloading. Signed out meanwhile,
    the whole window goes to the login page, as for any htmx request (console/htmx_login.py)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return login_redirect(htmx)
    context = {"page": htmx.current_url_abs_path or "", "username": user.get_username()}
    response = TemplateResponse(request, "errors/form_expired.html", context, status=403).render()
    response["HX-Retarget"] = "this"
    response["HX-Reswap"] = "beforebegin"
    return response


def server_error(request: HttpRequest) -> HttpResponse:
    """The layout without the database: no user, no workspaces (the failure may be the database)."""
    try:
        html = loader.get_template(TEMPLATE).render(
            {"status": 500, "title": TITLES[500], "message": MESSAGES[500], "back_url": "/", "back_label": "Home"}
        )
    except Exception:  # noqa: BLE001 - the last answer: whatever failed, a page still goes out
        html = "<!doctype html><title>Server error</title><h1>Something went wrong</h1><p><a href='/'>Home</a></p>"
    return HttpResponseServerError(html)
