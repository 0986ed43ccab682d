"""Feedback on a run: a member's or a harness's rating, listed in the evidence bundle."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from ..limits import written
from ..models import ApiKey, Feedback, Run
from ..redaction import redact_text

# A comment on a run is longer than a reason or a note may be.
MAX_COMMENT = 10_000


@transaction.atomic
def record_feedback(
    *, run: Run, rating: int, category: str = "", comment: str = "", author: Any = None, api_key: ApiKey | None = None
) -> Feedback:
    """Store one rating (1..5; the database refuses anything else) by a member or an API key."""
    workspace = run.workspace
    comment = written(comment, field="comment", label="comment", required=False, limit=MAX_COMMENT, workspace=workspace)
    category = redact_text(category, workspace) if isinstance(category, str) else category
    return Feedback.objects.create(
        run=run, rating=rating, category=category, comment=comment, author=author, api_key=api_key
    )
