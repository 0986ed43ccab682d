"""Backup and restore as docs/operations.md § Backup and restore says to do it: the database
(pg_dump's custom format on PostgreSQL, SQLite's online backup on the embedded default), then the
artifact store; restored into a fresh database and a fresh directory, `ledger verify` is clean and
every event id is the same. Without the artifact store the same restore fails verify: the files are
part of the backup."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from ledger.demo import load_demo
from ledger.models import Event
from tests.servers import REPO_ROOT, database_url

pytestmark = pytest.mark.django_db(transaction=True)


def _ids_here() -> list[tuple[str, int, str]]:
    return list(
        Event.objects.order_by("run__workspace_id", "run__run_id", "sequence").values_list(
            "run__run_id", "sequence", "event_id"
        )
    )


IDS_SQL = (
    "SELECT r.run_id, e.sequence, e.event_id FROM ledger_event e JOIN ledger_run r ON r.id = e.run_id "
    "ORDER BY r.workspace_id, r.run_id, e.sequence"
)


def _ledger(command: list[str], url: str, artifacts: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "RUNLEDGER_ARTIFACTS_ROOT": str(artifacts),
        "DEBUG": "1",
        "DJANGO_SETTINGS_MODULE": "console.settings",
        "PYTHONPATH": str(REPO_ROOT),
    }
    env.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, "manage.py", "ledger", *command],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _backup_postgres(tmp_path: Path) -> tuple[str, Any]:
    s = connection.settings_dict
    where = ["-h", s["HOST"] or "127.0.0.1", "-p", str(s["PORT"] or 5432), "-U", s["USER"] or "postgres"]
    dump = tmp_path / "ledger.dump"
    subprocess.run(["pg_dump", *where, "--format=custom", "--no-owner", "--file", str(dump), s["NAME"]], check=True)
    restored = f"{s['NAME']}_restored_{uuid.uuid4().hex[:8]}"
    subprocess.run(["createdb", *where, restored], check=True)
    subprocess.run(["pg_restore", *where, "--no-owner", "--exit-on-error", "--dbname", restored, str(dump)], check=True)
    url = database_url().rsplit("/", 1)[0] + "/" + restored

    def drop() -> None:
        subprocess.run(["dropdb", *where, "--if-exists", restored], check=True)

    def ids() -> list[tuple[str, int, str]]:
        with psycopg.connect(url.replace("postgres://", "postgresql://")) as conn:
            return [tuple(row) for row in conn.execute(IDS_SQL).fetchall()]  # type: ignore[misc]

    return url, (drop, ids)


def _backup_sqlite(tmp_path: Path) -> tuple[str, Any]:
    source = Path(connection.settings_dict["NAME"]).resolve()
    target = tmp_path / "restored.sqlite3"
    with sqlite3.connect(source) as live, sqlite3.connect(target) as copy:
        live.backup(copy)  # the online backup API: a consistent copy while the server writes

    def ids() -> list[tuple[str, int, str]]:
        with sqlite3.connect(target) as conn:
            return [tuple(row) for row in conn.execute(IDS_SQL).fetchall()]  # type: ignore[misc]

    return f"sqlite:///{target}", (lambda: None, ids)


def test_a_restored_backup_verifies_with_the_same_event_ids(tmp_path: Path) -> None:
    load_demo(history_runs=12, evaluations_too=False)
    original = _ids_here()
    assert len(original) > 500
    backup = _backup_postgres if connection.vendor == "postgresql" else _backup_sqlite
    url, (drop, restored_ids) = backup(tmp_path)
    # The artifact store after the database: every artifact an event of the dump names was
    # written before that event committed, so a later copy holds them all.
    artifacts = tmp_path / "artifacts-restored"
    shutil.copytree(settings.ARTIFACTS_ROOT, artifacts)
    try:
        assert restored_ids() == original
        done = _ledger(["verify"], url, artifacts)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "FAIL" not in done.stdout and done.stdout.strip().endswith(": ok"), done.stdout
        runs = len({run for run, _, _ in original})
        assert f"verified {runs} run(s)" in done.stdout
        # The same database without its artifact store does not verify.
        bare = _ledger(["verify"], url, tmp_path / "no-artifacts")
        assert bare.returncode == 1 and "artifact" in bare.stdout, bare.stdout
    finally:
        drop()
