"""Content negotiation for every /api/ view (REST_FRAMEWORK's DEFAULT_CONTENT_NEGOTIATION_CLASS):
a `?format=` no renderer has is 400 `invalid_parameter`, where DRF's own answers 404, which reads
as "no such object" for one that exists.

Its own module: DRF imports it while `rest_framework.views` is still loading, so nothing here may
import the views."""

from __future__ import annotations

from collections.abc import Iterable

from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer

from .pagination import InvalidParameter


class Negotiation(DefaultContentNegotiation):
    def filter_renderers(self, renderers: Iterable[BaseRenderer], format: str) -> list[BaseRenderer]:
        matching = [r for r in renderers if r.format == format]
        if not matching:
            raise InvalidParameter(
                f"format must be one of {', '.join(r.format for r in renderers)}", parameter="format"
            )
        return matching
