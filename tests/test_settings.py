"""The test run uses the parts the environment asks for, never a silent fallback."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

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


def _setup_and_print(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings", "DEBUG": "1", **env},
    )


def test_this_process_runs_the_collector_at_the_configured_threshold() -> None:
    from django.conf import settings

    assert settings.RUNLEDGER_GC_THRESHOLD == int(os.environ.get("RUNLEDGER_GC_THRESHOLD", "50000"))
    assert gc.get_threshold()[0] == settings.RUNLEDGER_GC_THRESHOLD


def test_collector_threshold_comes_from_the_environment_and_a_bad_one_is_refused() -> None:
    done = _setup_and_print("import gc; print(gc.get_threshold())", RUNLEDGER_GC_THRESHOLD="1234")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"(1234, {gc.get_threshold()[1]}, {gc.get_threshold()[2]})"
    refused = _setup_and_print("pass", RUNLEDGER_GC_THRESHOLD="lots")
    assert refused.returncode != 0
    assert "RUNLEDGER_GC_THRESHOLD must be a whole number" in refused.stderr


def test_the_tests_read_no_static_manifest_that_make_serve_collected() -> None:
    """`make serve` collects into var/staticfiles; a test run on the same checkout reads no manifest
    from there (its pages would name hashed files the tests of `make run` do not expect)."""
    from django.conf import settings
    from django.templatetags.static import static

    assert Path(settings.STATIC_ROOT) != Path(settings.BASE_DIR) / "var" / "staticfiles"
    assert not (Path(settings.STATIC_ROOT) / "staticfiles.json").exists()
    assert static("js/live.js") == "/static/js/live.js"
