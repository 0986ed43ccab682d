"""What the filtered, cursor-paged lists (the runs list, the audit log) share: From/To dates and a
keyset cursor (the position after the last row shown, sealed: console/cursors.py) sealed with the
filters and order it was made under (`page_query`), so that it opens under those alone: replayed
under others, a page link would show a page of another list as if it were this one's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db.models import Model
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from ledger import limits

from .. import cursors

BROKEN = "This page link is broken: start again from the first page."
# A filtered list's cursor that does not open: broken, or made under other filters or another order.
NOT_THESE_FILTERS = (
    "This page link is broken, or was made for other filters or another order: "
    "start again from the first page of the list as filtered now."
)


def page_query(params: Mapping[str, str], names: Iterable[str]) -> str:
    """The filters and order a list is asked with, of the parameters `names`, in one canonical form
    (empty ones left out, as the lists' own links leave them): what its cursors are sealed with, as
    the API's are (console/api/pagination.list_query)."""
    return urlencode(sorted((name, value) for name in names if (value := params.get(name))))


def list_query(params: Mapping[str, str], names: Sequence[str], **changes: str) -> str:
    """A list's URL query, of the parameters `names`, with these changes: `names` in their order,
    then the page (`cursor`), the empty ones left out, so the same view is always the same link."""
    given = {k: v for k, v in params.items() if k in names}
    given.update(changes)
    pairs = [(k, given[k]) for k in (*names, "cursor") if given.get(k)]
    return "?" + urlencode(pairs) if pairs else ""


def clean_address(request: HttpRequest, names: Sequence[str]) -> HttpResponse | None:
    """The filter form sends every field, the empty ones too (`?from=&to=`): the URL to keep or
    pass on is the one with what was chosen alone, in the list's one order (`list_query`). A
    redirect there when a page (not an htmx swap) was asked with an empty parameter; else None."""
    if getattr(request, "htmx", False) or "" not in request.GET.values():
        return None
    return redirect(request.path + list_query(request.GET, names))


def page_cursor(at: datetime, pk: int, *, kind: str, scope: Model, query: str = "") -> str:
    """The `?cursor=` of the page after the row (at, pk) of the list `kind` of `scope` asked with
    `query` (page_query)."""
    return cursors.seal({"t": at.isoformat(), "id": pk}, kind=kind, scope=scope, query=query)


def day_field(label: str) -> forms.DateField:
    """A day YYYY-MM-DD within ledger.limits' calendar range (ranges add and subtract days, and
    the calendar's own edges would overflow)."""
    return forms.DateField(
        required=False,
        input_formats=["%Y-%m-%d"],
        label=label,
        widget=forms.DateInput(attrs={"type": "date"}),
        validators=[MinValueValidator(limits.FIRST_DAY), MaxValueValidator(limits.LAST_DAY)],
    )


class DateRangePageForm(forms.Form):
    """A filter form with inclusive From/To days and the cursor of the page to show, one that
    `page_cursor` made for the list `cursor_kind` of `cursor_scope` asked with `cursor_query`: a
    cursor of other filters or another order is refused as a broken one is (`broken`), a 400 that
    keeps the filters asked and links their first page."""

    broken = BROKEN

    cursor = forms.CharField(required=False, max_length=cursors.MAX_LENGTH, widget=forms.HiddenInput)

    def __init__(
        self, *args: Any, cursor_kind: str, cursor_scope: Model, cursor_query: str = "", **kwargs: Any
    ) -> None:
        self.cursor_kind, self.cursor_scope, self.cursor_query = cursor_kind, cursor_scope, cursor_query
        super().__init__(*args, **kwargs)
        # "from" is a keyword: these two are added here rather than declared on the class.
        for name, label in (("from", "From"), ("to", "To")):
            self.fields[name] = day_field(label)

    def opened_cursor(self, raw: str) -> Any:
        """The position a cursor of this list holds; cursors.NotOurs (a ValueError) for any other."""
        return cursors.unseal(raw, kind=self.cursor_kind, scope=self.cursor_scope, query=self.cursor_query)

    def clean_cursor(self) -> tuple[datetime, int] | None:
        raw = self.cleaned_data["cursor"]
        if not raw:
            return None
        try:
            # Range-checked as well: what a sealed cursor holds is ours, but a key can leak.
            return limits.keyset_position(self.opened_cursor(raw))
        except (ValueError, TypeError, OverflowError):
            raise ValidationError(self.broken) from None

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("from") and data.get("to") and data["from"] > data["to"]:
            self.add_error("from", "From must not be after To.")
        return data
