"""The test settings with tests/leaky_urls.py as the URL configuration (the isolation sweep's own test)."""

from __future__ import annotations

from tests.settings import *  # noqa: F403

ROOT_URLCONF = "tests.leaky_urls"
