"""What the filtered, cursor-paged lists (the runs list, the audit log) share: From/To dates and a
keyset cursor (the position after the last row shown, opaque to the browser)."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator

from ledger import limits


def page_cursor(at: datetime, pk: int) -> str:
    position = json.dumps({"t": at.isoformat(), "id": pk}, separators=(",", ":"))
    return base64.urlsafe_b64encode(position.encode()).decode().rstrip("=")


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
    """A filter form with inclusive From/To days and the cursor of the page to show."""

    cursor = forms.CharField(required=False, max_length=200, widget=forms.HiddenInput)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # "from" is a keyword: these two are added here rather than declared on the class.
        for name, label in (("from", "From"), ("to", "To")):
            self.fields[name] = day_field(label)

    def clean_cursor(self) -> tuple[datetime, int] | None:
        raw = self.cleaned_data["cursor"]
        if not raw:
            return None
        try:
            # Depth-limited and range-checked: the link is the browser's to forge (ledger.limits).
            return limits.keyset_position(limits.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))))
        except (ValueError, TypeError, OverflowError, binascii.Error):
            raise ValidationError("This page link is broken: start again from the first page.") from None

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("from") and data.get("to") and data["from"] > data["to"]:
            self.add_error("from", "From must not be after To.")
        return data
