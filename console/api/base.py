"""What every /api/v1/ view shares: content negotiation whose errors are always JSON, and the
caller's run (checked id, access, 404 outside the caller's workspace)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.access import Access
from ledger.append import validate_run_id
from ledger.models import Run

from .auth import access_for
from .fastjson import JsonRenderer
from .pagination import InvalidParameter


class Negotiation(DefaultContentNegotiation):
    def filter_renderers(self, renderers: Iterable[BaseRenderer], format: str) -> list[BaseRenderer]:
        matching = [r for r in renderers if r.format == format]
        if not matching:
            raise InvalidParameter(f"format must be one of {', '.join(r.format for r in renderers)}",
                                   parameter="format")
        return matching


class ApiView(APIView):
    content_negotiation_class = Negotiation

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)
        # Errors are always the JSON envelope, whatever representation was asked for.
        if isinstance(response, Response) and response.status_code >= 400 \
                and not isinstance(response.accepted_renderer, JSONRenderer):
            response.accepted_renderer = JsonRenderer()
            response.accepted_media_type = JsonRenderer.media_type
        return response


def run_for(request: Request, run_id: str, scope: str) -> tuple[Access, Run]:
    # The id is checked before any lookup: a malformed id is the client's mistake, not a missing run.
    validate_run_id(run_id)
    caller = access_for(request, scope, run_id=run_id)
    assert caller.run is not None
    return caller, caller.run
