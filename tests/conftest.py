from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from ledger.append import AppendResult, append_events
from ledger.models import Workspace
from ledger.tenancy import bootstrap, create_user


@pytest.fixture(autouse=True)
def _artifacts_in_tmp(settings: Any, tmp_path: Path) -> None:
    settings.ARTIFACTS_ROOT = tmp_path / "artifacts"


@pytest.fixture(autouse=True)
def _let_flush_empty_the_log(request: pytest.FixtureRequest) -> Any:
    """Transactional tests end with a flush, which deletes events; the log's triggers allow that
    only for runs marked for pruning, as retention does. The audit log allows no DELETE at all."""
    marker = request.node.get_closest_marker("django_db")
    transactional = (marker and marker.kwargs.get("transaction")) or any(
        name in request.fixturenames for name in ("transactional_db", "live_server"))
    if not transactional:
        yield
        return
    request.getfixturevalue("transactional_db")  # set up first, so torn down after this
    yield
    from django.db import connection

    from ledger import dbguards

    with connection.cursor() as cur:
        cur.execute("UPDATE ledger_run SET pruning = %s", [True])
    # The audit log refuses every DELETE; the flush may empty it with its guard lifted for the moment.
    with connection.schema_editor() as editor:
        dbguards.drop_audit(None, editor)
        editor.execute("DELETE FROM ledger_auditentry")
        dbguards.install_audit(None, editor)


@pytest.fixture
def workspace(db: None) -> Workspace:
    return bootstrap(tenant="acme", workspace="support")


@pytest.fixture
def other_workspace(db: None) -> Workspace:
    return bootstrap(tenant="globex", workspace="main")


@pytest.fixture
def member(workspace: Workspace) -> User:
    return create_user(username="alice", tenant="acme", role="admin", password="pw-alice-123").user


@pytest.fixture
def outsider(other_workspace: Workspace) -> User:
    return create_user(username="olga", tenant="globex", role="admin", password="pw-olga-123").user


def started(workflow: str = "wfver_test", **extra: Any) -> dict[str, Any]:
    return {"type": "RunStarted", "payload": {"workflowVersionId": workflow, **extra}}


def ev(type_: str, **payload: Any) -> dict[str, Any]:
    return {"type": type_, "payload": payload}


@pytest.fixture
def append(workspace: Workspace) -> Callable[..., AppendResult]:
    def _append(run_id: str, *events: dict[str, Any], **kwargs: Any) -> AppendResult:
        return append_events(workspace=workspace, run_id=run_id, events=list(events), **kwargs)

    return _append
