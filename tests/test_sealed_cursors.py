"""Cursors are sealed (console/cursors.py): a `next` of the API, or a console page's `?cursor=`,
shows no row id (which would count every tenant's rows) and opens only for the list, workspace,
run or tenant it was made for; anything else is 400 `invalid_cursor` (a 400 page in the console),
never a 500 and never another tenant's rows. Pages stay keyset pages: the same rows, in the same
order, with none skipped or repeated while rows arrive (docs/security.md § What ids and cursors
reveal)."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client

from console import cursors
from console.pages import runs as runs_page
from ledger import audit, log
from ledger.models import Run, Tenant, Workspace
from ledger.tenancy.services import bootstrap, create_key
from tests.conftest import named_user, started

V1 = "/api/v1"


def _opened(cursor: str) -> bytes:
    """A cursor's bytes as a client can see them."""
    return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))


def _shows_nothing(cursor: str, pk: int | None = None) -> None:
    """The cursor is no JSON, holds none of a position's names, nor `pk`, the id of the row it
    stands after, as a position writes it (`"id":4242}`, or followed by another member). Only that
    row's id, in those forms: a cursor's bytes are ciphertext, which holds any short byte string by
    chance (":3" is in one 112-byte cursor of 600), so looking for ":<id>" of each of a page's 60
    rows failed about one run in 70."""
    raw = _opened(cursor)
    with pytest.raises(ValueError):
        json.loads(raw)
    held = [f":{pk}}}".encode(), f":{pk},".encode()] if pk is not None else []
    for text in (b'"id"', b'"t"', b'"after"', b'"before"', *held):
        assert text not in raw, text


def _key_client(workspace: Workspace, scopes: str = "ingest,read,execute") -> Client:
    _, key = create_key(workspace=workspace, scopes=scopes.split(","))
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}", raise_request_exception=False)


def _runs(workspace: Workspace, *run_ids: str) -> None:
    for run_id in run_ids:
        log.append(workspace=workspace, run_id=run_id, events=[started()])


def _pk(workspace: Workspace, run_id: str) -> int:
    return Run.objects.get(workspace=workspace, run_id=run_id).pk


def _invalid_cursor(response: Any) -> None:
    assert response.status_code == 400, response.content[:300]
    assert response.json()["error"]["code"] == "invalid_cursor"


# --- what a cursor shows ------------------------------------------------------------------------


LONGEST = [  # the longest position of each shape a list gives out, with the id it holds left out
    lambda pk: {"t": "2026-11-30T22:12:00.123456+00:00", "id": pk},
    lambda pk: {"k": "-duration", "v": 2**63 - 1, "id": pk},
    lambda pk: {"k": "-cost", "v": "9" * 40, "id": pk},
    lambda pk: {"k": "-started", "v": "2026-11-30T22:12:00.123456+00:00", "id": pk},
    lambda pk: {"before": pk},
    lambda pk: {"after": pk},
]


@pytest.mark.backend_independent
def test_a_cursor_is_the_same_length_whatever_row_id_it_holds() -> None:
    """The length of a cursor would tell how many digits its row id has: every position that holds
    one fits the same padded block."""
    scope = Workspace(pk=7)
    lengths = {
        len(cursors.seal(shape(pk), kind="runs", scope=scope)) for shape in LONGEST for pk in (0, 1, 10**9, 2**63 - 1)
    }
    assert len(lengths) == 1
    sealed = cursors.seal({"t": "2026-11-30T22:12:00+00:00", "id": 4242}, kind="runs", scope=scope)
    _shows_nothing(sealed, 4242)
    assert cursors.unseal(sealed, kind="runs", scope=scope) == {"t": "2026-11-30T22:12:00+00:00", "id": 4242}


@pytest.mark.backend_independent
def test_the_check_of_a_cursor_finds_a_position_or_a_row_id_left_readable() -> None:
    """What _shows_nothing looks for is what a cursor in the clear would show: a position's JSON,
    or its row id among other text."""
    for leaked in (b'{"t":"2026-11-30T22:12:00+00:00","id":4242}', b"runs after id:4242}", b"v1:4242,2026-11-30"):
        with pytest.raises((AssertionError, pytest.fail.Exception)):
            _shows_nothing(base64.urlsafe_b64encode(leaked).decode().rstrip("="), 4242)


@pytest.mark.django_db
def test_another_tenants_runs_between_ours_change_nothing_in_our_pages(
    workspace: Workspace, other_workspace: Workspace
) -> None:
    ours = _key_client(workspace)
    _runs(workspace, "run_a1")
    _runs(other_workspace, *(f"run_b{n:02d}" for n in range(30)))
    _runs(workspace, "run_a2", "run_a3")

    first = ours.get(f"{V1}/runs", {"limit": 1}).json()
    assert [r["runId"] for r in first["runs"]] == ["run_a3"]
    _shows_nothing(first["next"], _pk(workspace, "run_a3"))
    # Rows arrive while the client pages, ours and theirs: the next pages go on where it left off.
    _runs(workspace, "run_a4")
    _runs(other_workspace, *(f"run_c{n:02d}" for n in range(10)))
    second = ours.get(f"{V1}/runs", {"limit": 1, "cursor": first["next"]}).json()
    assert [r["runId"] for r in second["runs"]] == ["run_a2"]
    _shows_nothing(second["next"], _pk(workspace, "run_a2"))
    assert len(second["next"]) == len(first["next"])
    last = ours.get(f"{V1}/runs", {"limit": 1, "cursor": second["next"]}).json()
    assert [r["runId"] for r in last["runs"]] == ["run_a1"] and last["next"] is None
    # The same list sorted another way, through the same rows.
    by_cost = ours.get(f"{V1}/runs", {"limit": 2, "sort": "-cost"}).json()
    rest = ours.get(f"{V1}/runs", {"limit": 2, "sort": "-cost", "cursor": by_cost["next"]}).json()
    assert sorted(r["runId"] for r in by_cost["runs"] + rest["runs"]) == ["run_a1", "run_a2", "run_a3", "run_a4"]
    _shows_nothing(by_cost["next"], _pk(workspace, by_cost["runs"][-1]["runId"]))


# --- who a cursor opens for ----------------------------------------------------------------------


@pytest.mark.django_db
def test_a_cursor_of_another_workspace_or_tenant_is_a_400(workspace: Workspace, other_workspace: Workspace) -> None:
    neighbour = bootstrap(tenant="acme", workspace="billing")
    ours = _key_client(workspace)
    _runs(workspace, "run_a1", "run_a2", "run_a3")
    for space in (neighbour, other_workspace):
        _runs(space, "run_x1", "run_x2", "run_x3")
        theirs = _key_client(space).get(f"{V1}/runs", {"limit": 1}).json()["next"]
        _invalid_cursor(ours.get(f"{V1}/runs", {"limit": 1, "cursor": theirs}))
    # A run's tool calls: a cursor of one run's list does not open another's.
    for run_id in ("run_a1", "run_a2"):
        for call in ("c1", "c2"):
            claim = {"callId": call, "toolName": "t", "args": {}, "effect": "read", "owner": "w"}
            assert (
                ours.post(f"{V1}/runs/{run_id}/tool-calls", claim, content_type="application/json").status_code == 201
            )
    of_one = ours.get(f"{V1}/runs/run_a1/tool-calls", {"limit": 1}).json()["next"]
    assert ours.get(f"{V1}/runs/run_a1/tool-calls", {"cursor": of_one}).json()["toolCalls"][0]["callId"] == "c2"
    _invalid_cursor(ours.get(f"{V1}/runs/run_a2/tool-calls", {"cursor": of_one}))
    # Another list's cursor is not this one's either.
    _invalid_cursor(ours.get(f"{V1}/reexecutions", {"cursor": of_one}))


@pytest.mark.django_db
def test_a_runs_list_cursor_and_a_run_s_children_cursor_open_only_for_their_own_list(workspace: Workspace) -> None:
    """The runs list and a run's children page the same rows of one workspace, but a cursor opens
    only for the list (and the run) that gave it out (docs/api.md, Conventions)."""
    ours = _key_client(workspace)
    for parent in ("run_p1", "run_p2"):
        _runs(workspace, parent)
        for n in range(3):
            log.append(workspace=workspace, run_id=f"{parent}_c{n}", events=[started(parentRunId=parent)])
    of_list = ours.get(f"{V1}/runs", {"limit": 1}).json()["next"]
    of_p1 = ours.get(f"{V1}/runs/run_p1/children", {"limit": 1}).json()["next"]
    assert of_list and of_p1
    # Each opens where it was made...
    assert ours.get(f"{V1}/runs", {"limit": 1, "cursor": of_list}).status_code == 200
    assert [r["runId"] for r in ours.get(f"{V1}/runs/run_p1/children", {"cursor": of_p1}).json()["runs"]] == [
        "run_p1_c1",
        "run_p1_c0",
    ]
    # ...and nowhere else: not the list for a run's children, nor one run's children for another's.
    _invalid_cursor(ours.get(f"{V1}/runs/run_p1/children", {"cursor": of_list}))
    _invalid_cursor(ours.get(f"{V1}/runs", {"cursor": of_p1}))
    _invalid_cursor(ours.get(f"{V1}/runs/run_p2/children", {"cursor": of_p1}))


@pytest.mark.django_db
def test_a_cursor_opens_only_under_the_filters_and_order_that_made_it(workspace: Workspace) -> None:
    """A `next` of `status=completed` once opened under `status=failed` too, and its page began
    at a completed run's position in the failed runs: now it is 400 `invalid_cursor`, as another
    list's is (docs/api.md, Conventions)."""
    ours = _key_client(workspace)
    for n in range(3):
        log.append(workspace=workspace, run_id=f"run_ok{n}", events=[started(), {"type": "RunCompleted"}])
        failed = {"type": "RunFailed", "payload": {"error": {"message": "no"}}}
        log.append(workspace=workspace, run_id=f"run_bad{n}", events=[started(), failed])
    made = {"status": "completed", "limit": 1}
    cursor = ours.get(f"{V1}/runs", made).json()["next"]
    assert [r["runId"] for r in ours.get(f"{V1}/runs", {**made, "cursor": cursor}).json()["runs"]] == ["run_ok1"]
    # The limit may change from page to page; what is listed, and in which order, may not.
    assert ours.get(f"{V1}/runs", {"status": "completed", "limit": 5, "cursor": cursor}).status_code == 200
    for other in (
        {"status": "failed"},
        {},
        {"status": "completed", "q": "ok"},
        {"status": "completed", "workflow": "wfver_test"},
        {"status": "completed", "order": "asc"},
        {"status": "completed", "sort": "-started"},
    ):
        _invalid_cursor(ours.get(f"{V1}/runs", {**other, "limit": 1, "cursor": cursor}))
    unfiltered = ours.get(f"{V1}/runs", {"limit": 1}).json()["next"]
    _invalid_cursor(ours.get(f"{V1}/runs", {"status": "failed", "cursor": unfiltered}))
    # The other filtered lists: tool calls and re-executions by status, usage by range and grouping.
    _runs(workspace, "run_open")
    for call in ("c1", "c2"):
        claim = {"callId": call, "toolName": "t", "args": {}, "effect": "read", "owner": "w"}
        assert ours.post(f"{V1}/runs/run_open/tool-calls", claim, content_type="application/json").status_code == 201
    claimed = ours.get(f"{V1}/runs/run_open/tool-calls", {"status": "claimed", "limit": 1}).json()["next"]
    assert ours.get(f"{V1}/runs/run_open/tool-calls", {"status": "claimed", "cursor": claimed}).status_code == 200
    _invalid_cursor(ours.get(f"{V1}/runs/run_open/tool-calls", {"status": "succeeded", "cursor": claimed}))
    _invalid_cursor(ours.get(f"{V1}/runs/run_open/tool-calls", {"cursor": claimed}))
    for n in range(2):
        ours.post(
            f"{V1}/runs/run_ok{n}/reexecutions", {"mode": "simulate", "reason": "r"}, content_type="application/json"
        )
    requests = ours.get(f"{V1}/reexecutions", {"status": "approved", "limit": 1}).json()["next"]
    assert requests is not None
    _invalid_cursor(ours.get(f"{V1}/reexecutions", {"status": "denied", "cursor": requests}))
    calls = [
        {
            "type": "harness.model.responded",
            "payload": {
                "turn": n,
                "callId": f"m{n}",
                "model": {"provider": "openai", "modelId": model},
                "response": {"text": "x", "usage": {"inputTokens": 10, "outputTokens": 1}},
            },
        }
        for n, model in enumerate(["gpt-4o", "gpt-4o-mini"], start=1)
    ]
    log.append(workspace=workspace, run_id="run_calls", events=[started(), *calls])
    usage = {"groupBy": "model", "limit": 1}
    models = ours.get(f"{V1}/usage", usage).json()["next"]
    assert models is not None
    assert ours.get(f"{V1}/usage", {**usage, "cursor": models}).status_code == 200
    _invalid_cursor(ours.get(f"{V1}/usage", {**usage, "groupBy": "workflow", "cursor": models}))
    _invalid_cursor(ours.get(f"{V1}/usage", {**usage, "from": "2000-01-01", "cursor": models}))


@pytest.mark.django_db
def test_another_tenants_audit_cursor_is_a_400(
    workspace: Workspace, other_workspace: Workspace, admin: User, client: Client
) -> None:
    gina = named_user("gina", "admin", tenant="globex")
    for tenant in (workspace.tenant, other_workspace.tenant):
        _audited(tenant, 3)
    client.force_login(gina)
    theirs = client.get(f"{V1}/audit", {"limit": 1}).json()["next"]
    client.force_login(admin)
    _invalid_cursor(client.get(f"{V1}/audit", {"limit": 1, "cursor": theirs}))
    mine = client.get(f"{V1}/audit", {"limit": 1}).json()["next"]
    assert client.get(f"{V1}/audit", {"limit": 1, "cursor": mine}).status_code == 200


def _audited(tenant: Tenant, count: int) -> None:
    with transaction.atomic():
        for n in range(count):
            audit.record(actor="system", tenant=tenant, action="run.pruned", target=f"run_gone_{n}")


def _flip(cursor: str) -> str:
    middle = len(cursor) // 2
    return cursor[:middle] + ("A" if cursor[middle] != "A" else "B") + cursor[middle + 1 :]


MUTATIONS = {
    "one character changed": _flip,
    "the last character cut": lambda c: c[:-1],
    "cut in half": lambda c: c[: len(c) // 2],
    "cut to a quarter": lambda c: c[: len(c) // 4],
    "a character added": lambda c: c + "A",
    "a block added": lambda c: c + c[:128],
    "not base64": lambda c: "!" * len(c),
    "not ASCII": lambda c: "é" * 10,
    "very long": lambda c: c * 40,
}


@pytest.mark.django_db
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_changed_or_cut_cursor_is_a_400_in_the_api_and_the_console(
    workspace: Workspace, admin: User, client: Client, mutation: str
) -> None:
    _runs(workspace, "run_a1", "run_a2", "run_a3")
    ours = _key_client(workspace)
    changed = MUTATIONS[mutation](ours.get(f"{V1}/runs", {"limit": 1}).json()["next"])
    _invalid_cursor(ours.get(f"{V1}/runs", {"limit": 1, "cursor": changed}))
    client.force_login(admin)
    client.raise_request_exception = False
    assert client.get("/w/acme/support/", {"cursor": changed}).status_code == 400
    assert client.get("/t/acme/audit/", {"cursor": changed}).status_code == 400


@pytest.mark.django_db
def test_a_made_up_cursor_holding_a_real_row_is_a_400(workspace: Workspace, admin: User, client: Client) -> None:
    """The cursors before sealing, base64 JSON, are refused whatever they hold: a client that could
    write one could ask where its own rows are among everyone's."""
    _runs(workspace, "run_a1", "run_a2")
    run = Run.objects.get(workspace=workspace, run_id="run_a2")
    made = base64.urlsafe_b64encode(json.dumps({"t": run.created_at.isoformat(), "id": run.pk}).encode()).decode()
    _invalid_cursor(_key_client(workspace).get(f"{V1}/runs", {"cursor": made.rstrip("=")}))
    client.force_login(admin)
    assert client.get("/w/acme/support/", {"cursor": made}).status_code == 400


@pytest.mark.django_db
def test_a_cursor_still_opens_while_its_key_is_a_fallback(workspace: Workspace, settings: Any) -> None:
    _runs(workspace, "run_a1", "run_a2", "run_a3")
    ours = _key_client(workspace)
    settings.SECRET_KEY = "the-key-before-" + "x" * 40
    made_before = ours.get(f"{V1}/runs", {"limit": 1}).json()["next"]
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "the-key-after-" + "y" * 40, [settings.SECRET_KEY]
    page = ours.get(f"{V1}/runs", {"limit": 1, "cursor": made_before}).json()
    assert [r["runId"] for r in page["runs"]] == ["run_a2"]
    made_after = ours.get(f"{V1}/runs", {"limit": 1, "cursor": page["next"]}).json()  # sealed with the new key
    assert [r["runId"] for r in made_after["runs"]] == ["run_a1"]
    settings.SECRET_KEY_FALLBACKS = []
    _invalid_cursor(ours.get(f"{V1}/runs", {"limit": 1, "cursor": made_before}))


# --- the console's pages -------------------------------------------------------------------------


def _follow(client: Client, url: str, rows: str) -> tuple[list[str], list[str]]:
    """Every page's rows (by the `rows` pattern) and the cursors of the links between them."""
    seen: list[str] = []
    links: list[str] = []
    next_url: str | None = url
    while next_url:
        response = client.get(next_url)
        assert response.status_code == 200, response.content[:300]
        html = response.content.decode()
        seen += re.findall(rows, html)
        found = re.search(r'<a id="next-page" href="([^"]+)"', html)
        next_url = None
        if found:
            link = found.group(1).replace("&amp;", "&")
            links.append(re.search(r"cursor=([^&]+)", link).group(1))
            next_url = link if link.startswith("/") else url.partition("?")[0] + link
    return seen, links


@pytest.mark.django_db
def test_the_console_pages_link_their_next_page_and_show_no_row_id(
    workspace: Workspace, other_workspace: Workspace, admin: User, client: Client
) -> None:
    client.force_login(admin)
    ours = [f"run_{n:03d}" for n in range(60)]
    for n, run_id in enumerate(ours):
        _runs(workspace, run_id)
        if n % 10 == 0:
            _runs(other_workspace, f"run_theirs_{n:03d}")
    seen, links = _follow(client, "/w/acme/support/", r'<tr class="run" data-run-id="([^"]+)"')
    assert seen == ours[::-1] and len(links) == 1
    _shows_nothing(links[0], _pk(workspace, seen[runs_page.PAGE_SIZE - 1]))  # the first page's last row

    _audited(workspace.tenant, 60)
    _audited(other_workspace.tenant, 5)
    seen, links = _follow(client, "/t/acme/audit/", r'<tr class="audit-entry"')
    assert len(seen) == 61 and len(links) == 1  # and alice's member.added
    _shows_nothing(links[0])

    for n in range(55):
        log.append(workspace=workspace, run_id=f"run_ol_{n:03d}", events=[started(f"outer_loop:refine@{n}")])
    seen, links = _follow(client, "/w/acme/support/loops/", r'data-loop-id="([^"]+)"')
    assert seen == [f"ol_{n:03d}" for n in reversed(range(55))] and len(links) == 1
    _shows_nothing(links[0])
