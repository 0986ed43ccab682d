"""A signed-out htmx request goes to the login page, not into the page that made it.

`login_required` answers a signed-out request with a 302 to the login page; htmx (and live.js's
fetch) follow it and swap the login page into the run page, while the top bar still names the
user. For every console view at once, a request htmx made gets that redirect as `HX-Redirect`
instead, which htmx follows in the whole window, with `next` the page the browser shows (not the
fragment's or the form's address, which is no page to come back to).
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django_htmx.middleware import HtmxDetails


class HtmxLoginRedirectMiddleware:
    """After django_htmx's HtmxMiddleware (it reads `request.htmx`)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        htmx = getattr(request, "htmx", None)
        if not htmx or response.status_code != 302:
            return response
        if urlsplit(response.get("Location", "")).path != settings.LOGIN_URL:
            return response
        return login_redirect(htmx)


def login_redirect(htmx: HtmxDetails) -> HttpResponse:
    """The login page for the whole window, coming back to the page the browser shows. 401, not
    htmx's usual 200: live.js's fetch of a fragment must not swap in an empty answer."""
    page = htmx.current_url_abs_path  # None when HX-Current-URL is another origin's
    login = settings.LOGIN_URL + (f"?{urlencode({'next': page})}" if page else "")
    refused = HttpResponse(status=401)
    refused["HX-Redirect"] = login
    return refused
