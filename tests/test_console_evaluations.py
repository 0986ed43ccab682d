"""The Evaluations pages: the runs list's selection into a dataset, a policy approved on the
page, an evaluation's report (verdict, aggregates, distribution, per-run rows with divergence
links), the polled fragments, and other tenants' 404."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils.html import escape

from console.pages import evaluations as page
from ledger.evaluation import datasets, evaluations
from ledger.models import AuditEntry, Evaluation, EvaluationPolicy, ReexecutionRequest, Workspace
from tests.conftest import named_user
from tests.evaluation_support import (
    Calls,
    a_provider_retired_before_its_runs,
    model_change,
    registered_providers,
    triage_runs,
)
from tests.runtime_support import every_run_verifies  # noqa: F401  (autouse: ledger verify passes on every run)

pytestmark = [pytest.mark.usefixtures("clock"), pytest.mark.django_db]
BASE = "/w/acme/support"


@pytest.fixture
def providers() -> Iterator[Calls]:
    yield from registered_providers()


@pytest.fixture
def people(admin: User, approver: User, operator: User, viewer: User, other_workspace: Workspace) -> dict[str, User]:
    olga = named_user("olga", "admin", tenant="globex")
    return {user.get_username(): user for user in (admin, approver, operator, viewer, olga)}


def as_(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_dataset_from_the_runs_list_a_policy_and_an_evaluation_report(workspace, people, providers) -> None:
    runs = triage_runs(workspace)
    carol, bob, dave, olga = (as_(people[n]) for n in ("carol", "bob", "dave", "olga"))
    listing = carol.get(f"{BASE}/").content.decode()
    assert 'id="dataset-submit"' in listing and f'formaction="{BASE}/datasets/add/"' in listing
    assert 'id="nav-evaluations"' in listing
    assert dave.post(f"{BASE}/datasets/add/", {"dataset": "golden", "run": runs}).status_code == 403
    assert olga.post(f"{BASE}/datasets/add/", {"dataset": "golden", "run": runs}).status_code == 404
    refused = carol.post(f"{BASE}/datasets/add/", {"dataset": "Bad Name", "run": runs})
    assert refused.status_code == 400 and "dataset name" in refused.content.decode()
    added = carol.post(f"{BASE}/datasets/add/", {"dataset": "golden", "run": runs, "reason": ""})
    assert added.status_code == 302 and added["Location"] == f"{BASE}/datasets/golden/"
    page = carol.get(f"{BASE}/datasets/golden/").content.decode()
    assert page.count('<tr data-run="') == 10 and 'id="dataset-digest"' in page
    assert 'id="dataset-held"' not in page
    # Ticking runs it already holds again: the page says so, and no version 2 is made.
    again = carol.post(f"{BASE}/datasets/add/", {"dataset": "golden", "run": runs[:3]})
    assert again.status_code == 302 and again["Location"] == f"{BASE}/datasets/golden/?held=3"
    page = carol.get(again["Location"]).content.decode()
    assert "Every run ticked (3) was already in this dataset" in page and "</small> v1</h1>" in page
    policy_form = {
        "dataset": "golden",
        "change_kinds": ["model"],
        "scorers": "exact, regex",
        "ceiling_per_evaluation": "1",
        "ceiling_per_day": "5",
        "ttl_hours": "24",
        "note": "CI",
    }
    assert 'id="policy-form"' not in carol.get(f"{BASE}/evaluations/").content.decode()
    assert carol.post(f"{BASE}/evaluations/policies/", policy_form).status_code == 403
    assert olga.post(f"{BASE}/evaluations/policies/", policy_form).status_code == 404
    assert bob.post(f"{BASE}/evaluations/policies/", {**policy_form, "ttl_hours": "x"}).status_code == 400
    assert bob.post(f"{BASE}/evaluations/policies/", policy_form).status_code == 302
    policy = EvaluationPolicy.objects.get()
    assert policy.approved_by_name == "bob"
    made = evaluations.start_evaluation(
        workspace=workspace,
        dataset="golden",
        change=model_change("regressing"),
        scorers=["exact"],
        fail_if="pass_rate < 0.95",
        reason="a new prompt route",
        by=people["carol"],
    )
    running = carol.get(f"{BASE}/evaluations/").content.decode()
    assert f'data-evaluation="{made.public_id}"' in running and 'hx-trigger="every 1s"' in running
    assert 'hx-trigger="every 1s"' in carol.get(f"{BASE}/evaluations/{made.public_id}/").content.decode()
    evaluations.execute_here(made)
    rows = carol.get(f"{BASE}/evaluations/rows/").content.decode()
    assert 'data-verdict="failed"' in rows and 'hx-trigger="every 3s"' in rows
    detail = carol.get(f"{BASE}/evaluations/{made.public_id}/").content.decode()
    assert 'data-verdict="failed"' in detail and 'id="score-distribution"' in detail
    assert detail.count('data-outcome="changed"') == 3 and detail.count('data-outcome="kept"') == 7
    assert detail.count(f"{BASE}/reexecutions/rx_") == 10 and 'id="live-tool-calls">0<' in detail
    # The scores are on the divergence page of each request and on the batch page.
    changed = next(r for r in Evaluation.objects.get(pk=made.pk).report["runs"] if r["outcome"] == "changed")
    divergence = carol.get(f"{BASE}/reexecutions/{changed['requestId']}/divergence/").content.decode()
    assert f'href="{BASE}/evaluations/{made.public_id}/"' in divergence
    assert 'data-scorer="exact" data-passed="false"' in divergence
    batch = carol.get(f"{BASE}/batches/{made.batch_id}/").content.decode()
    assert 'id="batch-evaluation"' in batch
    assert batch.count('data-scorer="exact" data-passed="true"') == 7 and batch.count('data-passed="false"') == 3
    live = carol.get(f"{BASE}/evaluations/{made.public_id}/live/").content.decode()
    assert 'data-verdict="failed"' in live and "hx-trigger" not in live
    # Another tenant: 404 on every page and action.
    for url in (
        f"{BASE}/evaluations/",
        f"{BASE}/evaluations/rows/",
        f"{BASE}/evaluations/{made.public_id}/",
        f"{BASE}/evaluations/{made.public_id}/live/",
        f"{BASE}/datasets/golden/",
    ):
        assert olga.get(url).status_code == 404, url
    assert olga.post(f"{BASE}/evaluations/policies/{policy.public_id}/revoke/").status_code == 404
    assert carol.get("/w/globex/main/evaluations/").status_code == 404
    assert carol.post(f"{BASE}/evaluations/policies/{policy.public_id}/revoke/").status_code == 403
    assert bob.post(f"{BASE}/evaluations/policies/{policy.public_id}/revoke/").status_code == 302
    assert "revoked" in carol.get(f"{BASE}/evaluations/").content.decode()
    assert AuditEntry.objects.filter(action="evaluation_policy.revoked", actor="bob").count() == 1


def test_a_dataset_page_edits_an_expected_output_and_removes_runs(workspace, people) -> None:
    """Each change on the page is the next frozen version, audited; operators and above only (a
    viewer 403, another tenant 404); a refused form keeps what was typed in it."""
    runs = triage_runs(workspace, count=3)
    datasets.add_runs(workspace=workspace, name="golden", run_ids=runs, by=people["carol"])
    carol, dave, olga = (as_(people[n]) for n in ("carol", "dave", "olga"))
    page = carol.get(f"{BASE}/datasets/golden/").content.decode()
    assert f'data-expected-form="{runs[0]}"' in page and 'id="dataset-remove-submit"' in page
    # A version that is no number is said, not answered with the latest; one the dataset lacks is 404.
    for bad in ("latest", "-1", "１"):
        refused_version = carol.get(f"{BASE}/datasets/golden/", {"version": bad})
        assert (
            refused_version.status_code == 400
            and "version must be a version number" in refused_version.content.decode()
        )
    assert carol.get(f"{BASE}/datasets/golden/", {"version": "7"}).status_code == 404
    assert carol.get(f"{BASE}/datasets/golden/", {"version": "1"}).status_code == 200
    viewer_page = dave.get(f"{BASE}/datasets/golden/").content.decode()
    assert "data-expected-form" not in viewer_page and 'id="dataset-remove' not in viewer_page
    url = f"{BASE}/datasets/golden/expected/"
    edit = {"run": runs[0], "expected": '{"reply": "Answer for: a kinder reply"}'}
    assert dave.post(url, edit).status_code == 403
    assert olga.post(url, edit).status_code == 404
    assert carol.post(f"{BASE}/datasets/nope/expected/", edit).status_code == 404
    # Bad JSON: refused (400), the version unchanged, the typed text kept in its open form.
    typed = '{"reply": "unfinished'
    refused = carol.post(url, {"run": runs[0], "expected": typed})
    body = refused.content.decode()
    assert refused.status_code == 400 and 'id="dataset-error"' in body and "is not JSON" in body
    assert escape(typed) in body and '<details class="edit-expected" open>' in body
    assert carol.post(url, {"run": "run_nope", "expected": "1"}).status_code == 400
    assert datasets.latest(datasets.get_dataset(workspace, "golden")).number == 1
    saved = carol.post(url, edit)
    assert saved.status_code == 302 and saved["Location"] == f"{BASE}/datasets/golden/"
    v2 = datasets.latest(datasets.get_dataset(workspace, "golden"))
    assert v2.number == 2 and v2.members[0]["expected"] == {"reply": "Answer for: a kinder reply"}
    assert v2.members[0]["expectedEditedBy"] == "carol"
    edited = carol.get(f"{BASE}/datasets/golden/").content.decode()
    assert "(set by carol)" in edited
    # The expected output reads as JSON, as it is edited, not as a Python dict.
    assert escape('{"reply": "Answer for: a kinder reply"}') in edited and escape("{'reply'") not in edited
    # Removing the ticked runs.
    remove = f"{BASE}/datasets/golden/remove/"
    assert dave.post(remove, {"run": runs[:1]}).status_code == 403
    assert olga.post(remove, {"run": runs[:1]}).status_code == 404
    assert carol.post(remove, {}).status_code == 400
    removed = carol.post(remove, {"run": runs[1:]})
    assert removed.status_code == 302
    v3 = datasets.latest(datasets.get_dataset(workspace, "golden"))
    assert v3.number == 3 and [m["runId"] for m in v3.members] == runs[:1]
    # The older versions stay as they were, shown read-only.
    old = carol.get(f"{BASE}/datasets/golden/?version=1").content.decode()
    assert old.count('<tr data-run="') == 3 and "data-expected-form" not in old
    changes = AuditEntry.objects.filter(action="dataset.changed", target="dataset:golden", actor="carol")
    assert changes.count() == 3


def test_the_approver_sees_the_change_a_waiting_evaluation_makes(workspace, people) -> None:
    """Outside every policy an evaluation waits on the Approvals page; the card shows what the
    approval binds to: the prompt override, or each run's own input, or the other workflow."""
    runs = triage_runs(workspace, count=2)
    datasets.add_runs(workspace=workspace, name="golden", run_ids=runs, by=people["carol"])

    def start(change: dict[str, object]) -> Evaluation:
        return evaluations.start_evaluation(
            workspace=workspace, dataset="golden", change=change, scorers=["exact"], fail_if="", reason="try it",
            by=people["carol"],
        )  # fmt: skip

    prompt = start({"kind": "prompt", "prompts": {"draft": {"system": "Be terse & kind."}}})
    inputs = start({"kind": "input", "inputs": {runs[1]: {"ticket": "Lost it", "orderId": "C-3"}}})
    other = start({"kind": "workflow", "workflow": "support.triage-premium"})
    assert {e.status for e in (prompt, inputs, other)} == {Evaluation.Status.PENDING_APPROVAL}
    page = as_(people["bob"]).get(f"{BASE}/approvals/").content.decode()
    assert page.count('class="prompt-overrides"') == 1 and "Be terse &amp; kind." in page
    assert 'data-prompt="draft.system"' in page
    assert page.count('class="mono run-input"') == 1 and "Lost it" in page
    assert 'data-workflow="support.triage-premium"' in page
    detail = as_(people["carol"]).get(f"{BASE}/evaluations/{prompt.public_id}/").content.decode()
    assert 'id="evaluation-change"' in detail and "draft: system" in detail


def test_older_evaluations_are_a_page_away_and_a_broken_link_says_so(workspace, people, monkeypatch) -> None:
    """The list shows the newest EVALUATIONS_PAGE (2 here, of 3): *Older evaluations* opens the
    rest, whose polled fragment stays on that page; a cursor of another workspace or none at all is
    a 400 with no rows and a link to the newest; another tenant gets 404 with the link."""
    monkeypatch.setattr(page, "EVALUATIONS_PAGE", 2)
    runs = triage_runs(workspace, count=1)
    datasets.add_runs(workspace=workspace, name="golden", run_ids=runs, by=people["carol"])
    made = [
        evaluations.start_evaluation(
            workspace=workspace,
            dataset="golden",
            change=model_change("scripted", f"m{n}"),
            scorers=["exact"],
            fail_if="",
            reason="try it",
            by=people["carol"],
        )  # fmt: skip
        for n in range(3)
    ]
    carol = as_(people["carol"])
    first = carol.get(f"{BASE}/evaluations/").content.decode()
    assert re.findall(r'data-evaluation="([^"]+)"', first) == [made[2].public_id, made[1].public_id]
    older = re.search(r'href="([^"]+)" id="evaluations-older"', first)
    assert older is not None and 'id="evaluations-newest"' not in first
    older_url = older.group(1).replace("&amp;", "&")
    second = carol.get(older_url).content.decode()
    assert re.findall(r'data-evaluation="([^"]+)"', second) == [made[0].public_id]
    assert 'id="evaluations-newest"' in second and 'id="evaluations-older"' not in second
    cursor = older_url.split("cursor=", 1)[1]
    assert f'hx-get="{BASE}/evaluations/rows/?cursor={cursor}"' in second  # the poll keeps the page
    rows = carol.get(f"{BASE}/evaluations/rows/?cursor={cursor}").content.decode()
    assert re.findall(r'data-evaluation="([^"]+)"', rows) == [made[0].public_id]

    for bad in (
        "nonsense",
        page.page_cursor(
            made[1].created_at, made[1].pk, kind=page.CURSOR_KIND, scope=Workspace.objects.get(tenant__slug="globex")
        ),
    ):
        response = carol.get(f"{BASE}/evaluations/", {"cursor": bad})
        html = response.content.decode()
        assert response.status_code == 400 and 'id="broken-page"' in html and 'id="evaluations-newest"' in html
        assert "data-evaluation=" not in html and "hx-trigger" not in html
    assert as_(people["olga"]).get(older_url).status_code == 404


def test_the_report_of_an_evaluation_whose_runs_did_not_run_is_shown(workspace, people) -> None:
    """A run that never started (its model's provider was retired after the evaluation was asked
    for) is `not_run` in the report, with no tokens nor duration: the page and its polled fragment
    still render, with a dash in those cells, so an open page reaches the verdict `incomplete`
    instead of staying on `running` behind a failing poll."""
    runs = triage_runs(workspace, count=2)
    datasets.add_runs(workspace=workspace, name="golden", run_ids=runs, by=people["carol"])
    with a_provider_retired_before_its_runs() as change:
        made = evaluations.start_evaluation(
            workspace=workspace, dataset="golden", change=change, scorers=["exact"],
            fail_if="", reason="a provider this deployment retires", by=people["carol"],
        )  # fmt: skip
    waiting = as_(people["carol"]).get(f"{BASE}/evaluations/{made.public_id}/").content.decode()
    assert "waits for an approver" in waiting and "approved by a person" not in waiting
    bob = as_(people["bob"])
    request = ReexecutionRequest.objects.filter(batch_id=made.batch_id).first()
    assert request is not None
    assert bob.post(f"{BASE}/approvals/{request.public_id}/approve/", {"note": "go"}).status_code == 302
    finished = evaluations.execute_here(Evaluation.objects.get(pk=made.pk))
    assert finished.verdict == Evaluation.Verdict.INCOMPLETE
    assert {r["outcome"] for r in finished.report["runs"]} == {"not_run"}
    # No original was scored: "before" is unknown, not 0 % (the originals pass their scorers).
    assert finished.report["aggregates"]["passRateBefore"] is None
    carol = as_(people["carol"])
    for url in (f"{BASE}/evaluations/{made.public_id}/", f"{BASE}/evaluations/{made.public_id}/live/"):
        response = carol.get(url)
        html = response.content.decode()
        assert response.status_code == 200, url
        assert html.count('data-outcome="not_run"') == 2 and 'data-verdict="incomplete"' in html
        assert '<dd id="mean-score">—</dd>' in html  # no score to average: a dash, not a bare "Δ"
        assert "(before —)" in html
        assert "hx-trigger" not in html


def test_verdicts_read_as_words_not_api_values(workspace, people) -> None:
    """`budget_exhausted` is the API's value; the list and the page say "budget exhausted"."""
    runs = triage_runs(workspace, count=1)
    datasets.add_runs(workspace=workspace, name="golden", run_ids=runs, by=people["carol"])
    made = evaluations.start_evaluation(
        workspace=workspace, dataset="golden", change=model_change("scripted"), scorers=["exact"],
        fail_if="", reason="try it", by=people["carol"],
    )  # fmt: skip
    Evaluation.objects.filter(pk=made.pk).update(
        status=Evaluation.Status.FINISHED, verdict=Evaluation.Verdict.BUDGET_EXHAUSTED, budget_exhausted=True
    )
    carol = as_(people["carol"])
    for url in (f"{BASE}/evaluations/", f"{BASE}/evaluations/{made.public_id}/"):
        html = carol.get(url).content.decode()
        shown = re.sub(r"<[^>]*>", " ", html)
        assert 'data-verdict="budget_exhausted"' in html and "budget exhausted" in shown, url
        assert "budget_exhausted" not in shown, url


def test_a_policy_whose_terms_were_altered_is_not_called_expired(workspace, people) -> None:
    """A policy whose stored terms no longer hash to its digest covers nothing; the list said
    "expired" of it though it had not expired. It says its terms were altered."""
    from ledger.evaluation import policies

    runs = triage_runs(workspace, count=1)
    datasets.add_runs(workspace=workspace, name="golden", run_ids=runs, by=people["carol"])
    terms = {
        "workspace": workspace, "dataset": "golden", "change_kinds": ["model"], "scorers": ["exact"],
        "ceiling_per_evaluation_usd": "1", "ceiling_per_day_usd": "5", "ttl_hours": 24, "by": people["bob"],
    }  # fmt: skip
    altered, kept = policies.approve_policy(**terms), policies.approve_policy(**terms)
    EvaluationPolicy.objects.filter(pk=altered.pk).update(ceiling_per_day_usd=500)
    html = as_(people["bob"]).get(f"{BASE}/evaluations/").content.decode()
    row = re.search(rf'<tr data-policy="{altered.public_id}">.*?</tr>', html, re.DOTALL)
    assert row is not None and "terms altered" in row.group(0) and "expired" not in row.group(0)
    row = re.search(rf'<tr data-policy="{kept.public_id}">.*?</tr>', html, re.DOTALL)
    assert row is not None and "active" in row.group(0)
