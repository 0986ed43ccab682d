"""Feedback on a run: a member's or a harness's rating, listed in the evidence bundle."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from ..models import ApiKey, Feedback, Run


@transaction.atomic
def record_feedback(*, run: Run, rating: int, category: str = "", comment: str = "",
                    author: Any = None, api_key: ApiKey | None = None) -> Feedback:
    """Store one rating (1..5; the database refuses anything else) by a member or an API key."""
    return Feedback.objects.create(run=run, rating=rating, category=category, comment=comment,
                                   author=author, api_key=api_key)
