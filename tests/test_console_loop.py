"""The outer-loop page: its cycles with status, cost and supervise verdicts, linked both ways with
the cycle runs' pages; members of the workspace only (another tenant's loop is a 404)."""

from __future__ import annotations

import html as html_lib
import re
from typing import Any

import pytest
from django.test import Client

from console.format import money
from ledger.log import append
from ledger.models import Workspace
from ledger.runtime.outer_loop import cycle_run_id, read_loop, record_run_id, start_outer_loop
from tests.loop_workflows import reset_loop_registrations
from tests.runtime_support import every_run_verifies  # noqa: F401  (autouse)

PAGE = "/w/acme/support/loops/ol_page/"


@pytest.fixture
def loop(workspace: Workspace) -> Any:
    reset_loop_registrations()
    return start_outer_loop(
        workspace=workspace,
        workflow="rt_refine",
        input={"topic": "tides"},
        goal="a tight <paragraph>",
        max_cycles=4,
        supervise="rt_until_third",
        outer_loop_id="ol_page",
    )


def _text(html: str) -> str:
    return html_lib.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)))


def test_the_loop_page_lists_its_cycles_with_status_cost_and_verdicts(client: Client, viewer: Any, loop: Any) -> None:
    client.force_login(viewer)  # any member may read it
    response = client.get(PAGE)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-status="completed"' in html and "a tight &lt;paragraph&gt;" in html
    rows = re.findall(r'<tr class="cycle" data-cycle="(\d)" data-verdict="(\w*)">', html)
    assert rows == [("1", "continue"), ("2", "continue"), ("3", "done")]
    for n in (1, 2, 3):
        assert f'href="/w/acme/support/runs/{cycle_run_id("ol_page", n)}/"' in html
    text = _text(html)
    assert "continue: sharper than draft 1 draft 1" in text and "continue: sharper than draft 2 draft 2" in text
    assert "3 of at most 4" in text
    state = read_loop(loop.record.workspace, "ol_page")
    per_cycle = money(state.cycles[0].usage.cost_usd)
    assert text.count(per_cycle) >= 3 and money(state.usage.cost_usd) in text
    assert 'Final output: {"cycles":3,"text":"draft 3"}' in text
    assert f'href="/w/acme/support/runs/{record_run_id("ol_page")}/"' in html


def test_each_cycle_run_and_the_record_link_back_to_the_loop(client: Client, member: Any, loop: Any) -> None:
    client.force_login(member)
    cycle = client.get(f"/w/acme/support/runs/{cycle_run_id('ol_page', 2)}/").content.decode()
    assert f'id="outer-loop-link" href="{PAGE}"' in cycle and "cycle 2" in _text(cycle)
    record = client.get(f"/w/acme/support/runs/{record_run_id('ol_page')}/").content.decode()
    assert f'id="outer-loop-link" href="{PAGE}"' in record and "this run is its record" in _text(record)
    plain = client.get(f"/w/acme/support/runs/{cycle_run_id('ol_page', 2)}/timeline/", HTTP_HX_REQUEST="true")
    assert plain.status_code == 200


def test_another_tenant_and_unknown_or_malformed_loops_are_404(
    client: Client, outsider: Any, member: Any, loop: Any
) -> None:
    client.force_login(outsider)
    assert client.get(PAGE).status_code == 404
    assert client.get("/w/globex/main/loops/ol_page/").status_code == 404
    assert client.get(f"/w/acme/support/runs/{cycle_run_id('ol_page', 1)}/").status_code == 404
    client.force_login(member)
    assert client.get("/w/acme/support/loops/ol_nope/").status_code == 404
    assert client.get("/w/acme/support/loops/not%20a%20loop/").status_code == 404
    client.logout()
    assert client.get(PAGE).status_code == 302  # to the log-in page


def test_a_pending_cycle_shows_its_reserved_run_and_a_corrupt_record_is_a_readable_409(
    client: Client, member: Any, workspace: Workspace
) -> None:
    client.force_login(member)
    append(
        workspace=workspace,
        run_id="run_ol_waiting",
        events=[
            {
                "type": "RunStarted",
                "payload": {
                    "workflowVersionId": "outer_loop:x",
                    "outerLoopId": "ol_waiting",
                    "input": {},
                    "outerLoop": {
                        "goal": {"workflow": "rt_refine", "workflowDefinitionHash": "sha256:00"},
                        "maxCycles": 2,
                    },
                },
            }
        ],
    )
    html = client.get("/w/acme/support/loops/ol_waiting/").content.decode()
    assert 'data-cycle="1"' in html and "run_ol_waiting_c1" in html and "reserved for this cycle" in html
    assert 'href="/w/acme/support/runs/run_ol_waiting_c1/"' not in html  # not started: nothing to link to
    append(
        workspace=workspace,
        run_id="run_ol_bad",
        events=[
            {
                "type": "RunStarted",
                "payload": {
                    "workflowVersionId": "outer_loop:x",
                    "outerLoopId": "ol_bad",
                    "input": {},
                    "outerLoop": {
                        "goal": {"workflow": "rt_refine", "workflowDefinitionHash": "sha256:00"},
                        "maxCycles": 2,
                    },
                },
            },
            {"type": "RunCompleted", "payload": {"output": 1}},
        ],
    )
    response = client.get("/w/acme/support/loops/ol_bad/")
    assert response.status_code == 409
    assert "has result.kind=&#x27;done&#x27; but cycles is empty." in response.content.decode()


# --- the list of loops ---------------------------------------------------------------------------

LIST = "/w/acme/support/loops/"


def test_the_loops_list_links_each_loop_and_the_nav_leads_to_it(client: Client, viewer: Any, loop: Any) -> None:
    client.force_login(viewer)
    response = client.get(LIST)
    assert response.status_code == 200
    html = response.content.decode()
    assert re.findall(r'data-loop-id="([^"]+)"', html) == ["ol_page"]
    assert f'<a href="{PAGE}">ol_page</a>' in html
    assert 'id="nav-loops" href="/w/acme/support/loops/" aria-current="page"' in html
    assert 'id="nav-api" href="/api/docs/"' in html
    # Cycle runs are not loops.
    assert "cycle" not in "".join(re.findall(r'data-loop-id="([^"]+)"', html))


def test_the_loops_filter_form_leaves_a_url_of_what_was_chosen(client: Client, viewer: Any, loop: Any) -> None:
    """The From/To form sends both fields, empty ones too: the list redirects to the URL holding
    only what was chosen, as the runs list does (one to bookmark or send on)."""
    client.force_login(viewer)
    both_empty = client.get(LIST + "?from=&to=")
    assert both_empty.status_code == 302 and both_empty["Location"] == LIST
    assert re.findall(r'data-loop-id="([^"]+)"', client.get(both_empty["Location"]).content.decode()) == ["ol_page"]
    one_day = client.get(LIST + "?to=&from=2026-03-01")
    assert one_day.status_code == 302 and one_day["Location"] == LIST + "?from=2026-03-01"
    assert client.get(LIST + "?from=&to=", headers={"HX-Request": "true"}).status_code == 200  # htmx: as sent
    assert client.get(LIST + "?from=2026-03-01").status_code == 200  # what was chosen alone: no redirect


def test_the_loops_list_is_a_404_for_another_tenant_and_a_400_for_a_broken_link(
    client: Client, outsider: Any, member: Any, loop: Any
) -> None:
    client.force_login(outsider)
    assert client.get(LIST).status_code == 404
    client.force_login(member)
    broken = client.get(LIST + "?cursor=zzz")
    assert broken.status_code == 400 and 'role="alert"' in broken.content.decode()
