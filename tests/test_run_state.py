"""A run's folded state: `ledger state RUN [--at N]` and `GET /api/v1/runs/{runId}/state`, the fold
the console's state-at-N view shows (ledger.replay.runlog.state_json); an imported run's too."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from ledger import log
from ledger.fold import fold
from ledger.log.envelopes import log_of
from ledger.models import Run, Workspace
from ledger.tenancy.services import create_key
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db
SAMPLE = Path(__file__).resolve().parent / "data" / "little" / "sample"


def ledger(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("ledger", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def api_for(workspace: Workspace) -> Client:
    _, key = create_key(workspace=workspace, scopes=["read"])
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}", raise_request_exception=False)


@pytest.fixture
def run_id(workspace: Workspace) -> str:
    log.append(
        workspace=workspace,
        run_id="run_st",
        events=[
            started(input={"rate": 5e-7}),
            ev("StepScheduled", stepPath="a"),
            ev("StepAttemptStarted", stepPath="a", attempt=1),
            ev("StepCompleted", stepPath="a", attempt=1, output={"ok": True}),
            {"type": "RunCompleted", "payload": {"output": 1}},
        ],
    )
    return "run_st"


def test_the_cli_and_the_api_give_the_same_folded_state(workspace: Workspace, run_id: str) -> None:
    code, out, _ = ledger("state", run_id)
    assert code == 0
    printed = json.loads(out)
    run = Run.objects.get(run_id=run_id)
    expected = fold(log_of(run), run_id=run_id).to_json()
    assert printed == {"runId": run_id, "at": 5, "lastSequence": 5, "state": json.loads(json.dumps(expected))}
    assert printed["state"]["status"] == "completed" and '"rate":5e-7' in out
    response = api_for(workspace).get(f"/api/v1/runs/{run_id}/state")
    assert response.status_code == 200 and response.json() == printed


def test_state_after_event_n(workspace: Workspace, run_id: str) -> None:
    code, out, _ = ledger("state", run_id, "--at", "3")
    at3 = json.loads(out)
    assert code == 0 and at3["at"] == 3 and at3["state"]["status"] == "running"
    assert [s["status"] for s in at3["state"]["steps"]] == ["running"]
    api = api_for(workspace)
    assert api.get(f"/api/v1/runs/{run_id}/state?at=3").json() == at3
    for bad in ("0", "6", "x"):
        response = api.get(f"/api/v1/runs/{run_id}/state?at={bad}")
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_parameter"
    assert ledger("state", run_id, "--at", "6")[0] == 2


def test_an_outsider_and_an_unknown_run_get_404(workspace: Workspace, other_workspace: Workspace, run_id: str) -> None:
    outsider = api_for(other_workspace)
    theirs = outsider.get(f"/api/v1/runs/{run_id}/state")
    never = outsider.get("/api/v1/runs/run_never/state")
    assert theirs.status_code == never.status_code == 404
    assert theirs.json()["error"]["code"] == "not_found"
    assert api_for(workspace).get("/api/v1/runs/bad%20id/state").status_code == 400
    assert ledger("state", "run_never")[0] == 1


def test_an_imported_runs_state_is_readable(workspace: Workspace) -> None:
    assert ledger("import-little", str(SAMPLE), "--workspace", "acme/support")[0] == 0
    code, out, _ = ledger("state", "run_cycle_2")
    state = json.loads(out)["state"]
    assert code == 0 and state["status"] == "completed" and state["outerLoopId"] == "ol_sample"


# --- an imported outer loop's page ---------------------------------------------------------------


def test_an_imported_outer_loop_opens_on_the_loop_page(workspace: Workspace, viewer: Any, client: Any) -> None:
    assert ledger("import-little", str(SAMPLE), "--workspace", "acme/support")[0] == 0
    client.force_login(viewer)
    page = client.get("/w/acme/support/loops/ol_sample/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-status="completed"' in html and 'id="loop-imported"' in html
    assert 'data-cycle="1" data-verdict="continue"' in html and 'data-cycle="2" data-verdict="done"' in html
    assert 'href="/w/acme/support/runs/run_cycle_1/"' in html and 'href="/w/acme/support/runs/run_cycle_2/"' in html
    assert "short summary" in html  # the final output
    assert client.get("/w/acme/support/loops/ol_nope/").status_code == 404


def test_an_outsider_gets_404_for_an_imported_loop(workspace: Workspace, outsider: Any, client: Any) -> None:
    assert ledger("import-little", str(SAMPLE), "--workspace", "acme/support")[0] == 0
    client.force_login(outsider)
    assert client.get("/w/acme/support/loops/ol_sample/").status_code == 404
    assert client.get("/w/globex/main/loops/ol_sample/").status_code == 404
