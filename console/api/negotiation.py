"""Content negotiation for every /api/ view (REST_FRAMEWORK's DEFAULT_CONTENT_NEGOTIATION_CLASS):
a `?format=` no renderer has is 400 `invalid_parameter`, where DRF's own answers 404, which reads
as "no such object" for one that exists; and an `Accept` range with `q=0` refuses its media types
(RFC 9110 § 12.4.2), where DRF's own ignores the weight and answers JSON to `application/json;q=0`.

Its own module: DRF imports it while `rest_framework.views` is still loading, so nothing here may
import the views."""

from __future__ import annotations

from collections.abc import Iterable

from django.http.request import MediaType
from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request

from .pagination import InvalidParameter


def quality(accept: str, media_type: str) -> float | None:
    """The weight an Accept header gives `media_type` (its parameters aside), RFC 9110 § 12.5.1:
    the most specific range that matches it decides, so `*/*, text/csv;q=0` gives CSV 0 (Django's
    `accepts` drops the q=0 range and lets `*/*` admit it). None: no range matches; an empty
    header gives every type 1."""
    ranges = [MediaType(token) for token in accept.split(",") if token.strip()]
    if not ranges:
        return 1.0
    bare = media_type.split(";", 1)[0].strip()
    matching = [r for r in ranges if r.match(bare)]
    if not matching:
        return None
    return max(matching, key=lambda r: r.specificity).quality


def admits(accept: str, media_type: str) -> bool:
    """Whether an Accept header admits `media_type`: a range matches it with a weight above 0."""
    weight = quality(accept, media_type)
    return weight is not None and weight > 0


class Negotiation(DefaultContentNegotiation):
    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        # Only the representations the Accept header admits, and of those the ones it weighs most
        # (`application/json;q=0.1, application/x-ndjson` is NDJSON); DRF then picks among them as
        # it does (most specific range first). None admitted: 406, whatever DRF would have chosen.
        format = format_suffix or request.query_params.get(self.settings.URL_FORMAT_OVERRIDE)
        renderers = self.filter_renderers(renderers, format) if format else list(renderers)
        accept = request.META.get("HTTP_ACCEPT", "")
        weighed = [(quality(accept, renderer.media_type) or 0.0, renderer) for renderer in renderers]
        best = max((weight for weight, _ in weighed), default=0.0)
        if best <= 0:
            raise NotAcceptable(available_renderers=renderers)
        return super().select_renderer(request, [r for weight, r in weighed if weight == best], format_suffix)

    def filter_renderers(self, renderers: Iterable[BaseRenderer], format: str) -> list[BaseRenderer]:
        matching = [r for r in renderers if r.format == format]
        if not matching:
            raise InvalidParameter(
                f"format must be one of {', '.join(r.format for r in renderers)}", parameter="format"
            )
        return matching
