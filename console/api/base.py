"""What every /api/v1/ view shares: the caller's run (checked id, access, 404 outside the caller's
workspace). Content negotiation is console/api/negotiation.py, DRF's default for every view."""

from __future__ import annotations

from typing import Any

from django.core.validators import MaxLengthValidator
from rest_framework import serializers
from rest_framework.exceptions import NotAcceptable
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.limits import MAX_TEXT
from ledger.log.prepare import validate_run_id
from ledger.models import Run
from ledger.tenancy.access import Access

from .auth import access_for
from .fastjson import JsonRenderer
from .negotiation import admits


class WrittenText(serializers.CharField):
    """A person's free text (a reason, a note, a comment). The schema shows the domain's limit;
    the service checks it (ledger.limits.written), so the API says what the console says."""

    def __init__(self, *, limit: int = MAX_TEXT, **kwargs: Any) -> None:
        super().__init__(max_length=limit, allow_blank=True, trim_whitespace=False, **kwargs)
        self.validators = [v for v in self.validators if not isinstance(v, MaxLengthValidator)]


class ApiView(APIView):
    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().dispatch(request, *args, **kwargs)
        # DRF and Django leave a request's objects referring to one another: the view to itself
        # (View.setup's `self.head = self.get`), DRF's request to itself and the view through its
        # parser context, the response to itself and the view through its renderer context. So
        # the parsed body and the response's data outlived every request until the cyclic
        # collector found them: a 500-event POST left ~3,600 objects to it, and its collections
        # were ~10 % of such a request's time in Daphne (bench/README.md § Floors, session 10).
        # With the links cut, the request's end frees them; the response is rendered first.
        self.__dict__.pop("head", None)
        self.request.parser_context = None  # type: ignore[assignment]
        self.response = None  # type: ignore[assignment]
        if isinstance(response, Response):
            response.add_post_render_callback(_forget_renderer_context)
        return response

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)
        # Errors are always the JSON envelope, whatever representation was asked for.
        if (
            isinstance(response, Response)
            and response.status_code >= 400
            and not isinstance(response.accepted_renderer, JSONRenderer)
        ):
            response.accepted_renderer = JsonRenderer()
            response.accepted_media_type = JsonRenderer.media_type
        return response


def _forget_renderer_context(response: Response) -> None:
    response.renderer_context = None  # type: ignore[attr-defined]  # set by APIView, read only while rendering


def require_accepted(request: Request, media_type: str, what: str) -> None:
    """406 `not_acceptable` when the Accept header admits no `media_type` (its parameters aside), for
    views that force DRF's negotiation because they write one representation themselves (a zip,
    NDJSON, CSV, an artifact's bytes): `application/json`, or `text/csv;q=0`, is refused; no Accept,
    `*/*`, `type/*` and a browser's usual Accept admit it. Errors are the JSON envelope either way."""
    bare = media_type.split(";", 1)[0].strip() or "application/octet-stream"
    if not admits(request.headers.get("Accept", ""), bare):
        raise NotAcceptable(f"{what} is {bare}, which the Accept header does not admit")


def run_for(request: Request, run_id: str, scope: str) -> tuple[Access, Run]:
    # The id is checked before any lookup: a malformed id is the client's mistake, not a missing run.
    validate_run_id(run_id)
    caller = access_for(request, scope, run_id=run_id)
    assert caller.run is not None
    return caller, caller.run
