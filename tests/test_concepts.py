"""docs/concepts.md explains each word the console uses in a sentence or two with a link to where
it is shown; the README and every console page's footer lead to it; /concepts/ is that same file
rendered, the same for everyone (it holds no tenant's data); and each of its links opens a page of
the demo `make run` loads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from ledger.demo import load_demo
from ledger.models import ROLE_RANK, Role
from tests.conftest import named_user

ROOT = Path(__file__).resolve().parent.parent
CONCEPTS = ROOT / "docs" / "concepts.md"
# The words issue 39 asks for, as concepts.md spells its entries.
WORDS = (
    "Run",
    "Step",
    "Visit",
    "Session",
    "Turn",
    "Tool call",
    "In doubt",
    "Replay plan",
    "Simulate",
    "Evaluate",
    "Fork",
    "Rerun",
    "Resume",
    "Attention",
    "Evidence",
    "Share link",
    "Outer loop",
    "Divergence",
)
CONSOLE_LINK = re.compile(r"\]\((/[^)\s]*)\)")


def _entries() -> dict[str, str]:
    """`**Word.** text…` paragraphs of concepts.md by word."""
    paragraphs = re.split(r"\n\s*\n", CONCEPTS.read_text())
    return {match.group(1): " ".join(p.split()) for p in paragraphs if (match := re.match(r"\*\*([^*]+)\.\*\*", p))}


def _article(html: str) -> str:
    match = re.search(r'<article class="doc" id="concepts">.*?</article>', html, re.S)
    assert match, "no concepts article on the page"
    return match.group(0)


@pytest.mark.parametrize("word", WORDS)
def test_each_word_has_a_short_entry_with_a_link_into_the_console(word: str) -> None:
    entry = _entries().get(word)
    assert entry is not None, f"docs/concepts.md has no **{word}.** entry"
    sentences = re.findall(r"[.!?](?:\s|$)", re.sub(r"\([^)]*\)|`[^`]*`|…", "", entry))
    assert len(sentences) <= 5, f"{word}: a sentence or two, not {len(sentences)}"
    assert CONSOLE_LINK.search(entry), f"{word}: no link to where the console shows it"


def test_the_readme_and_the_design_link_the_concepts() -> None:
    assert "(docs/concepts.md)" in (ROOT / "README.md").read_text()
    assert "(concepts.md)" in (ROOT / "docs" / "design.md").read_text()


@pytest.mark.django_db
def test_every_console_page_has_the_concepts_link_in_its_footer(client: Client, admin: User) -> None:
    footer = '<footer class="site-footer"><a id="footer-concepts" href="/concepts/">Concepts</a>'
    assert footer in client.get("/accounts/login/").content.decode()
    client.force_login(admin)
    assert footer in client.get("/w/acme/support/").content.decode()


@pytest.mark.django_db
def test_the_concepts_page_is_the_document_with_every_link_for_who_may_open_them_all(client: Client) -> None:
    load_demo(history_runs=0, evaluations_too=False)
    anonymous = client.get("/concepts/")
    assert anonymous.status_code == 200
    article = _article(anonymous.content.decode())
    for word in WORDS:
        assert f"<strong>{word}.</strong>" in article
    # Console links stay links; links to other documents of the checkout become their names.
    assert '<a href="/w/acme/support/runs/run_demo_in_doubt/evidence/">' in article
    assert '<span class="doc-ref">docs/design.md</span>' in article and 'href="design.md"' not in article
    assert article.count("<a href=") == len(CONSOLE_LINK.findall(CONCEPTS.read_text()))
    client.force_login(User.objects.get(username="alice"))  # the demo's admin opens every one
    assert _article(client.get("/concepts/").content.decode()) == article
    assert client.post("/concepts/").status_code == 405


REEXECUTE = "/w/acme/support/runs/run_demo_triage/reexecute/"
AUDIT = "/t/acme/audit/"


@pytest.mark.django_db
def test_a_member_reads_a_page_their_role_cannot_open_as_text_with_the_role_it_needs(client: Client) -> None:
    """As the rest of the console offers actions only where they work: dave (viewer) was sent to
    the re-execution form and the audit log, and got 403 on both."""
    load_demo(history_runs=0, evaluations_too=False)
    gated = {
        REEXECUTE: ('<span class="gated">re-execution form</span> (operators and up)', "operator"),
        AUDIT: ('<span class="gated">audit log</span> (admins only)', "admin"),
    }
    for username, role in (("dave", "viewer"), ("carol", "operator"), ("bob", "approver"), ("alice", "admin")):
        client.force_login(User.objects.get(username=username))
        article = _article(client.get("/concepts/").content.decode())
        for path, (text, needed) in gated.items():
            may = ROLE_RANK[Role(role)] >= ROLE_RANK[Role(needed)]
            assert (f'<a href="{path}">' in article) is may, (username, path)
            assert (text in article) is not may, (username, path)
        assert '<a href="/w/acme/support/runs/run_demo_in_doubt/evidence/">' in article  # every member's
        for path in set(re.findall(r'<a href="(/[^"]*)"', article)):
            assert client.get(path.split("#")[0]).status_code == 200, (username, path)


@pytest.mark.django_db
def test_another_tenants_member_gets_the_demos_pages_as_text(client: Client) -> None:
    load_demo(history_runs=0, evaluations_too=False)
    client.force_login(User.objects.get(username="gina"))  # admin of globex
    article = _article(client.get("/concepts/").content.decode())
    assert 'href="/w/acme/' not in article and 'href="/t/acme/' not in article
    assert '<span class="gated">runs list</span> and' in article  # no note: not hers to see at all


@pytest.mark.django_db
def test_each_console_link_opens_a_page_of_the_demo_and_none_for_an_outsider(client: Client) -> None:
    load_demo(history_runs=0)
    links = sorted(set(CONSOLE_LINK.findall(CONCEPTS.read_text())))
    assert len(links) >= 15
    client.force_login(User.objects.get(username="alice"))
    opened = {link: client.get(link.split("#")[0]).status_code for link in links}
    assert opened == dict.fromkeys(links, 200)
    client.force_login(named_user("olga", "admin", tenant="globex"))
    assert {link: client.get(link.split("#")[0]).status_code for link in links} == dict.fromkeys(links, 404)
