"""Regression evaluations in a real browser: alice builds a dataset from the runs list, bob
approves an evaluation policy on the Evaluations page, and an evaluation started from the command
line (`manage.py ledger evaluate … --here`, another process) appears on alice's open page without
a reload, running and then with its verdict; its report page shows the regressed run and links its
divergence. Screenshots of the Evaluations page and the report, light and dark, land in
var/screenshots/."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from ledger.evaluation import datasets, evaluations, policies
from ledger.models import Dataset, Evaluation, EvaluationPolicy, Workspace
from ledger.runtime.executor import start_run
from tests.browser.conftest import Daphne, log_in, screenshot_dir
from tests.evaluation_support import a_provider_retired_before_its_runs
from tests.servers import REPO_ROOT, database_url

pytestmark = pytest.mark.django_db(transaction=True)

SCHEMES = ("light", "dark")
TICKETS = [
    ("Where is my parcel?", "A-1"),
    ("My order is late.", "B-2"),
    ("Parcel lost.", "C-3"),
    ("Wrong door.", "D-4"),
]


def _shoot(page: Page, name: str) -> None:
    for scheme in SCHEMES:
        page.emulate_media(color_scheme=scheme)  # type: ignore[arg-type]
        page.screenshot(path=str(screenshot_dir() / f"{name}-{scheme}.png"), full_page=True)
    page.emulate_media(color_scheme="light")


def test_a_dataset_from_the_runs_list_a_policy_and_a_gate_run_from_the_command_line(
    open_context: object,
    server: Daphne,
    workspace: Workspace,
    tmp_path: Path,
    admin: User,
    approver: User,
    operator: User,
) -> None:
    run_ids = []
    for number, (ticket, order) in enumerate(TICKETS):
        run_id = f"run_golden_{number}"
        start_run(
            workspace=workspace, workflow="support.triage", run_id=run_id, input={"ticket": ticket, "orderId": order}
        )
        run_ids.append(run_id)

    # alice: tick the runs in the runs list and add them to a new dataset.
    alice = open_context().new_page()  # type: ignore[operator]
    log_in(alice, server, admin, "/w/acme/support/")
    for run_id in run_ids:
        alice.check(f'input.pick[value="{run_id}"]')
    alice.click("#dataset-add summary")
    alice.fill("#dataset-add input[name=dataset]", "golden")
    alice.click("#dataset-submit")
    expect(alice.locator("#dataset-runs tbody tr")).to_have_count(4)
    assert list(Dataset.objects.values_list("name", flat=True)) == ["golden"]

    # bob: approve an evaluation policy for it on the Evaluations page.
    bob = open_context().new_page()  # type: ignore[operator]
    log_in(bob, server, approver, "/w/acme/support/evaluations/")
    bob.click("#policy-form summary")
    bob.fill("#policy-form input[name=scorers]", "exact, regex")
    bob.fill("#policy-form input[name=note]", "CI may evaluate model swaps on golden")
    bob.click("#policy-submit")
    policy = bob.locator("#policies tbody tr")
    expect(policy).to_have_count(1)
    expect(policy).to_contain_text("active")
    assert EvaluationPolicy.objects.get().approved_by_name == "bob"

    # alice keeps the Evaluations page open; the gate runs from the command line, in another process.
    alice.goto(f"{server.url}/w/acme/support/evaluations/")
    expect(alice.locator("#no-evaluations")).to_be_visible()
    alice.evaluate("window.stillTheSamePage = true")
    environment = dict(os.environ)
    environment["DATABASE_URL"] = database_url()
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), environment.get("PYTHONPATH")]))
    environment.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    # The same workflow with a model that answers a second later per call: the evaluation runs visibly.
    environment["RUNLEDGER_WORKFLOW_MODULES"] = "tests.browser.slow_workflows"
    junit = tmp_path / "evaluation.xml"
    gate = subprocess.Popen(
        [
            sys.executable, "manage.py", "ledger", "evaluate", "golden", "--workspace", "acme/support",
            "--as", "carol", "--change", "model:default=demo-weaker/gpt-4o-mini", "--scorer", "exact",
            "--fail-if", "pass_rate < 0.95", "--here", "--junit", str(junit),
        ],
        cwd=REPO_ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        row = alice.locator("#evaluations tbody tr")
        expect(row).to_have_count(1, timeout=60_000)
        expect(row.locator(".status")).to_have_text("running", timeout=60_000)
        expect(row.locator("[data-verdict]")).to_have_attribute("data-verdict", "failed", timeout=90_000)
        out, err = gate.communicate(timeout=90)
    finally:
        if gate.poll() is None:
            gate.kill()
            gate.wait(timeout=10)
    assert gate.returncode == 1, (out, err)
    assert alice.evaluate("window.stillTheSamePage === true")
    assert junit.read_text().count("<failure") == 2  # the lost parcel's run, and the gate
    expect(row).to_contain_text("75 %")
    _shoot(alice, "evaluations")

    made = Evaluation.objects.get()
    assert made.policy is not None and made.requested_by == "carol"
    row.locator("a").first.click()
    expect(alice.locator("#evaluation-verdict [data-verdict]")).to_have_attribute("data-verdict", "failed")
    changed = alice.locator('#evaluation-runs tr[data-outcome="changed"]')
    expect(changed).to_have_count(1)
    expect(changed).to_have_attribute("data-run", "run_golden_2")
    expect(alice.locator("#live-tool-calls")).to_have_text("0")
    _shoot(alice, "evaluation-report")
    changed.locator("a", has_text="divergence").click()
    expect(alice.locator("#first-divergence")).to_have_attribute("data-step", "draft")
    for name in ("evaluations", "evaluation-report"):
        for scheme in SCHEMES:
            assert (screenshot_dir() / f"{name}-{scheme}.png").stat().st_size > 10_000


def test_an_open_evaluation_page_reaches_incomplete_when_its_runs_could_not_run(
    page: Page, production: Daphne, workspace: Workspace, approver: User, operator: User
) -> None:
    """The page of a running evaluation polls its report; when its runs could not run (a provider
    retired after the evaluation was asked for) the report's rows have no tokens nor duration, and the
    poll answered 500: the page stayed on "running" for good. It now shows the verdict."""
    run_ids = []
    for number, (ticket, order) in enumerate(TICKETS[:2]):
        run_ids.append(f"run_unrunnable_{number}")
        start_run(
            workspace=workspace,
            workflow="support.triage",
            run_id=run_ids[-1],
            input={"ticket": ticket, "orderId": order},
        )
    datasets.add_runs(workspace=workspace, name="golden", run_ids=run_ids, by=operator)
    policies.approve_policy(
        workspace=workspace, dataset="golden", change_kinds=["model"], scorers=["exact"],
        ceiling_per_evaluation_usd="1", ceiling_per_day_usd="5", ttl_hours=24, by=approver,
    )  # fmt: skip
    with a_provider_retired_before_its_runs() as change:
        made = evaluations.start_evaluation(
            workspace=workspace, dataset="golden", scorers=["exact"], fail_if="pass_rate < 0.95", reason="try it",
            change=change, by=operator,
        )  # fmt: skip
    log_in(page, production, operator, f"/w/acme/support/evaluations/{made.public_id}/")
    expect(page.locator("#evaluation-verdict .status")).to_have_text("running")
    evaluations.execute_here(made)
    expect(page.locator("#evaluation-verdict [data-verdict]")).to_have_attribute("data-verdict", "incomplete")
    expect(page.locator("#evaluation-verdict [data-verdict]")).to_have_text("incomplete")
    expect(page.locator('#evaluation-runs tr[data-outcome="not_run"]')).to_have_count(2)
    expect(page.locator("#evaluation-report [data-live]")).to_have_attribute("data-live", "false")


def test_at_390_px_an_evaluations_verdict_and_a_policys_revoke_are_in_view(
    page: Page, production: Daphne, workspace: Workspace, approver: User, operator: User
) -> None:
    """At 390 px the evaluations and the policies were tables scrolling in their own boxes: the
    status, the verdict and the policy's Revoke sat past the right edge, to be found by scrolling
    each table sideways. They are cards now, like the runs list, each value labelled."""
    start_run(
        workspace=workspace, workflow="support.triage", run_id="run_narrow", input={"ticket": "Late.", "orderId": "B-2"}
    )
    datasets.add_runs(workspace=workspace, name="golden", run_ids=["run_narrow"], by=operator)
    policies.approve_policy(
        workspace=workspace, dataset="golden", change_kinds=["model"], scorers=["exact"],
        ceiling_per_evaluation_usd="1", ceiling_per_day_usd="5", ttl_hours=24, by=approver,
    )  # fmt: skip
    with a_provider_retired_before_its_runs() as change:
        made = evaluations.start_evaluation(
            workspace=workspace, dataset="golden", scorers=["exact"], fail_if="", reason="try it",
            change=change, by=operator,
        )  # fmt: skip
    evaluations.execute_here(made)
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, production, approver, "/w/acme/support/evaluations/")
    for target in (
        page.locator("#evaluations [data-verdict]"),
        page.locator("#evaluations .status"),
        page.locator("#policies form button", has_text="Revoke"),
    ):
        expect(target).to_have_count(1)
        target.scroll_into_view_if_needed()
        box = target.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, box
    expect(page.locator('#evaluations td[data-label="Verdict"]')).to_contain_text("incomplete")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
