"""The runtime's per-call shortcuts give what the plain ways give: the gateway row's values as
Django would store them, the prompt hash as digest() of the whole request."""

from __future__ import annotations

import warnings
from datetime import datetime
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import connection

from ledger import clock
from ledger.canonical import digest
from ledger.models import ToolGatewayClaim
from ledger.replay import gateway
from ledger.runtime.session import PromptHasher


@pytest.mark.django_db
def test_gateway_row_values_are_what_django_would_store() -> None:
    values: list[Any] = [
        None,
        "",
        "x",
        ToolGatewayClaim.Status.CLAIMED,
        clock.now(),
        datetime(2026, 1, 1),
        1,
        2.5,
        {"a": [1, "é"]},
        [1],
        True,
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a naive datetime, on purpose
        for name, field in gateway._CLAIM_FIELDS.items():
            if name in ("id", "run"):
                continue
            for value in values:
                assert _prepared(lambda: gateway._columns({name: value})[1][0]) == _prepared(
                    lambda: field.get_db_prep_save(value, connection)
                ), (name, value)


def _prepared(convert: Any) -> tuple[Any, ...]:
    try:
        value = convert()
    except (TypeError, ValueError, ValidationError) as exc:  # e.g. "" for a datetime: refused by both
        return ("raises", type(exc))
    return (type(value), repr(value))


def test_prompt_hash_is_the_digest_of_the_request_every_turn() -> None:
    specs = [{"name": "lookup", "parameters": {"type": "object"}}]
    hashed = PromptHasher("gpt-4o-mini", specs)
    messages: list[dict[str, Any]] = []
    for turn in range(12):
        assert hashed(messages) == digest({"model": "gpt-4o-mini", "messages": messages, "tools": specs})
        messages = [*messages, {"role": "user", "content": f"é\u2028{turn}"}]
    other = messages[:3]  # not the conversation seen so far: hashed from the start
    assert hashed(other) == digest({"model": "gpt-4o-mini", "messages": other, "tools": specs})
    assert hashed(messages) == digest({"model": "gpt-4o-mini", "messages": messages, "tools": specs})
