"""The test run uses the parts the environment asks for, never a silent fallback."""

from __future__ import annotations

import os

import pytest
from channels.layers import get_channel_layer
from django.db import connection


@pytest.mark.django_db
def test_database_is_the_one_configured() -> None:
    expected = "postgresql" if os.environ.get("DATABASE_URL", "").startswith("postgres") else "sqlite"
    assert connection.vendor == expected
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
        assert cur.fetchone() == (1,)


def test_channel_layer_is_the_one_configured() -> None:
    expected = "RedisPubSubLayer" if os.environ.get("REDIS_URL") else "InMemoryChannelLayer"
    assert type(get_channel_layer()).__name__ == expected
