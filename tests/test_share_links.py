"""Share links (docs/api.md "Share links"): an operator makes a link to a run; anyone holding it reads
the run's evidence without a login — read-only, unindexed, never a referrer — until it expires,
is revoked or has been opened `maxOpens` times. A tampered token is a 404, a dead link a 410
saying why; every open is counted and audited; the token is stored only as its sha256.
"""

from __future__ import annotations

import hashlib
import re
import threading
from html.parser import HTMLParser
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from ledger.log import append, artifacts
from ledger.models import AuditEntry, ShareLink, Workspace
from ledger.tenancy import sharing
from ledger.tenancy.services import bootstrap, create_key
from tests.conftest import IN_PROCESS, FakeClock, ev, log_in, named_user, started

pytestmark = pytest.mark.django_db

RUN = "run_shared"
SUB = "run_shared_sub"
SUBSUB = "run_shared_subsub"
SECRET_PROMPT = "PROMPT-ONLY-THE-TEAM-SEES"
SECRET_ARG = "ARG-ONLY-THE-TEAM-SEES"
MINI = {"provider": "openai", "modelId": "gpt-4o-mini"}
TOKEN_IN_URL = re.compile(r"/s/([A-Za-z0-9_-]{43})/$")


def _chat(workspace: Workspace, run_id: str, **extra: Any) -> None:
    report = artifacts.store_bytes(workspace, b'{"report": true}')
    append(
        workspace=workspace,
        run_id=run_id,
        events=[
            started(**extra),
            ev("StepScheduled", stepPath="draft"),
            ev("StepAttemptStarted", stepPath="draft", attempt=1),
            ev(
                "harness.session.started",
                stepPath="draft",
                role="worker",
                task={"kind": "execute_step"},
                manifest={},
                manifestHash="sha256:" + "0" * 64,
            ),
            ev(
                "harness.model.called",
                stepPath="draft",
                turn=1,
                callId="m1",
                promptHash="h1",
                request={"messages": [{"role": "user", "content": SECRET_PROMPT}]},
            ),
            ev(
                "harness.model.responded",
                stepPath="draft",
                turn=1,
                callId="m1",
                model=MINI,
                response={
                    "usage": {"inputTokens": 100, "outputTokens": 10},
                    "toolCalls": [{"id": "c1", "name": "lookup", "args": {"q": SECRET_ARG}}],
                },
            ),
            ev(
                "harness.tool_call.started",
                stepPath="draft",
                callId="c1",
                caller="model",
                turn=1,
                toolName="lookup",
                args={"q": SECRET_ARG},
            ),
            ev("harness.tool_call.succeeded", stepPath="draft", callId="c1", result={"file": report.ref}, durationMs=3),
            ev("StepCompleted", stepPath="draft", attempt=1, output={"answer": "fine"}),
            ev("RunCompleted", output={"ok": True}),
        ],
    )


@pytest.fixture
def shared_run(workspace: Workspace) -> str:
    _chat(workspace, RUN)
    append(workspace=workspace, run_id=SUB, events=[started(parentRunId=RUN)])
    append(workspace=workspace, run_id=SUBSUB, events=[started(parentRunId=SUB)])
    append(workspace=workspace, run_id="run_unrelated", events=[started()])
    return RUN


def _api(client: Client, user: User) -> Client:
    client.force_login(user)
    return client


def _create(client: Client, run_id: str = RUN, **body: Any) -> Any:
    return client.post(
        f"/api/v1/runs/{run_id}/share-links", {"expiresInHours": 24, **body}, content_type="application/json"
    )


def _token(url: str) -> str:
    found = TOKEN_IN_URL.search(url)
    assert found, url
    return found.group(1)


@pytest.fixture
def link(client: Client, operator: User, shared_run: str) -> str:
    """A fresh link's token, created by carol the operator; the client is logged out after."""
    made = _create(_api(client, operator), includeSubRuns=True)
    assert made.status_code == 201, made.content
    client.logout()
    return _token(made.json()["url"])


def _opened(workspace: Workspace) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(tenant=workspace.tenant, action="share_link.opened").order_by("pk"))


# --- the API -------------------------------------------------------------------------------------


def test_create_answers_id_url_and_expiry_and_stores_only_the_hash(
    client: Client, operator: User, workspace: Workspace, shared_run: str
) -> None:
    made = _create(_api(client, operator), maxOpens=5)
    assert made.status_code == 201
    body = made.json()
    assert set(body) == {"id", "url", "expiresAt"} and body["id"].startswith("shl_")
    token = _token(body["url"])
    around = body["url"].replace(token, "")  # the random token may hold "acme" by chance
    assert RUN not in around and "acme" not in around
    stored = ShareLink.objects.get(public_id=body["id"])
    assert stored.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert token not in str(ShareLink.objects.filter(pk=stored.pk).values().get())
    listed = client.get(f"/api/v1/runs/{RUN}/share-links").json()
    assert [item["id"] for item in listed["shareLinks"]] == [body["id"]] and listed["next"] is None
    item = listed["shareLinks"][0]
    assert token not in str(listed)
    assert item["creator"] == "carol" and item["maxOpens"] == 5 and item["openCount"] == 0
    assert item["includeSubRuns"] is False and item["revokedAt"] is None and item["lastOpenedAt"] is None
    created = AuditEntry.objects.get(action="share_link.created")
    assert (created.actor, created.target, created.details["runId"]) == ("carol", f"share_link:{body['id']}", RUN)


def test_two_links_have_unrelated_tokens_of_256_bits(client: Client, operator: User, shared_run: str) -> None:
    one, two = (_token(_create(_api(client, operator)).json()["url"]) for _ in range(2))
    assert one != two and len(one) == 43  # 32 random bytes, URL-safe base64


@pytest.mark.parametrize(
    "body, field",
    [
        ({"expiresInHours": 0}, "expiresInHours"),
        ({"expiresInHours": 721}, "expiresInHours"),
        ({"expiresInHours": "soon"}, "expiresInHours"),
        ({"expiresInHours": 1.5}, "expiresInHours"),
        ({"expiresInHours": None}, "expiresInHours"),
        ({"maxOpens": 0}, "maxOpens"),
        ({"maxOpens": 10_001}, "maxOpens"),
        ({"includeSubRuns": "perhaps"}, "includeSubRuns"),
    ],
)
def test_invalid_fields_are_a_400_naming_them(
    client: Client, operator: User, shared_run: str, body: dict[str, Any], field: str
) -> None:
    answer = _create(_api(client, operator), **body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "invalid_request" and field in error["details"]["fields"]
    assert not ShareLink.objects.exists()


def test_missing_expiry_bad_json_and_bad_run_id_are_400s(client: Client, operator: User, shared_run: str) -> None:
    _api(client, operator)
    missing = client.post(f"/api/v1/runs/{RUN}/share-links", {}, content_type="application/json")
    assert missing.status_code == 400 and "expiresInHours" in missing.json()["error"]["details"]["fields"]
    broken = client.post(f"/api/v1/runs/{RUN}/share-links", "{", content_type="application/json")
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_json"
    bad_id = _create(client, run_id="not-a-run-id")
    assert bad_id.status_code == 400 and bad_id.json()["error"]["code"] == "invalid_run_id"
    bad_cursor = client.get(f"/api/v1/runs/{RUN}/share-links?cursor=zzz")
    assert bad_cursor.status_code == 400 and bad_cursor.json()["error"]["code"] == "invalid_cursor"


def test_the_list_pages_with_a_cursor(client: Client, operator: User, shared_run: str) -> None:
    ids = [_create(_api(client, operator)).json()["id"] for _ in range(3)]
    first = client.get(f"/api/v1/runs/{RUN}/share-links?limit=2").json()
    assert [i["id"] for i in first["shareLinks"]] == ids[::-1][:2] and first["next"]
    rest = client.get(f"/api/v1/runs/{RUN}/share-links?limit=2&cursor={first['next']}").json()
    assert [i["id"] for i in rest["shareLinks"]] == ids[:1] and rest["next"] is None


def test_an_outsider_gets_404_on_create_list_and_revoke(
    client: Client, operator: User, outsider: User, shared_run: str
) -> None:
    link_id = _create(_api(client, operator)).json()["id"]
    _api(client, outsider)
    assert _create(client).status_code == 404
    assert client.get(f"/api/v1/runs/{RUN}/share-links").status_code == 404
    revoked = client.delete(f"/api/v1/share-links/{link_id}")
    assert revoked.status_code == 404 and revoked.json()["error"]["code"] == "not_found"
    assert ShareLink.objects.get(public_id=link_id).revoked_at is None


def test_a_viewer_and_an_api_key_are_refused_with_403(
    client: Client, operator: User, viewer: User, workspace: Workspace, shared_run: str
) -> None:
    link_id = _create(_api(client, operator)).json()["id"]
    _api(client, viewer)
    assert _create(client).status_code == 403
    assert client.get(f"/api/v1/runs/{RUN}/share-links").status_code == 403
    assert client.delete(f"/api/v1/share-links/{link_id}").json()["error"]["code"] == "forbidden"
    client.logout()
    _, key = create_key(workspace=workspace, scopes=["read", "ingest", "execute"])
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    assert (
        client.post(
            f"/api/v1/runs/{RUN}/share-links", {"expiresInHours": 1}, content_type="application/json", **auth
        ).status_code
        == 403
    )
    assert client.get(f"/api/v1/runs/{RUN}/share-links", **auth).status_code == 403
    assert client.delete(f"/api/v1/share-links/{link_id}", **auth).status_code == 403
    assert (
        client.post(
            f"/api/v1/runs/{RUN}/share-links", {"expiresInHours": 1}, content_type="application/json"
        ).status_code
        == 401
    )
    assert ShareLink.objects.get(public_id=link_id).revoked_at is None


def test_the_schema_documents_the_share_link_operations(client: Client) -> None:
    schema = client.get("/api/schema/?format=json").json()
    paths = schema["paths"]
    assert {"post", "get"} <= set(paths["/api/v1/runs/{runId}/share-links"])
    assert "delete" in paths["/api/v1/share-links/{linkId}"]
    created = paths["/api/v1/runs/{runId}/share-links"]["post"]["responses"]["201"]
    assert "url" in str(schema["components"]["schemas"]) and created


# --- opening a link ------------------------------------------------------------------------------


def test_the_page_and_the_json_open_without_login(client: Client, link: str, workspace: Workspace) -> None:
    page = client.get(f"/s/{link}/")
    assert page.status_code == 200
    text = page.content.decode()
    assert RUN in text and "draft" in text and "lookup" in text and SECRET_PROMPT in text
    bundle = client.get(f"/s/{link}/evidence.json")
    assert bundle.status_code == 200 and bundle["Content-Type"] == "application/json"
    body = bundle.json()
    assert body["run"]["runId"] == RUN and [s["stepPath"] for s in body["steps"]] == ["draft"]
    assert body["run"]["links"]["evidence"] == f"/s/{link}/evidence.json"
    assert [s["runId"] for s in body["subRuns"]] == [SUB]
    assert body["subRuns"][0]["links"]["console"] == f"/s/{link}/runs/{SUB}/"
    opened = _opened(workspace)
    assert [(e.actor, e.details["what"]) for e in opened] == [("anonymous", "page"), ("anonymous", "evidence.json")]
    stored = ShareLink.objects.get()
    assert stored.open_count == 2 and stored.last_opened_at is not None


def test_the_shared_bundle_is_the_apis_bundle(client: Client, link: str, admin: User) -> None:
    shared = client.get(f"/s/{link}/evidence.json").json()
    client.force_login(admin)
    own = client.get(f"/api/v1/runs/{RUN}/evidence").json()
    for key in ("steps", "toolCalls", "costs", "artifacts", "usage", "integrity", "replayReady", "feedback"):
        assert shared[key] == own[key], key
    own["run"].pop("links"), shared["run"].pop("links")
    assert shared["run"] == own["run"]


def test_the_shared_bundle_json_is_what_djangos_encoder_writes() -> None:
    """The share link's evidence.json is written by orjson: the same values as Django's encoder
    (datetimes and decimals through it), and what orjson refuses by Django's JsonResponse."""
    import json
    from datetime import UTC, datetime
    from decimal import Decimal

    from django.core.serializers.json import DjangoJSONEncoder

    from console.pages.share import _json

    body = {"at": datetime(2026, 12, 4, 8, 0, 0, 123456, tzinfo=UTC), "usd": Decimal("0.000125"), "n": [1, 2.5, None]}
    assert json.loads(_json(body).content) == json.loads(json.dumps(body, cls=DjangoJSONEncoder))
    assert json.loads(_json(body).content)["at"] == "2026-12-04T08:00:00.123Z"
    huge = {"n": 2**70}  # beyond orjson's 64 bits: Django's JsonResponse writes it
    assert json.loads(_json(huge).content) == huge


def test_a_link_with_its_limit_of_evidence_requests_in_flight_is_refused(
    client: Client, operator: User, link: str, settings: Any
) -> None:
    """Counters, not timing: two evidence.json requests of the link are held in flight by hand,
    the third is refused (sub-run paths of the same link too) without using up an open; another
    link is not; a changed token is still a 404; once one finishes, the link is answered again."""
    from console.pages.share import EVIDENCE_SLOTS

    settings.LEDGER_SHARE_EVIDENCE_MAX_IN_FLIGHT_PER_LINK = 2
    other = _token(_create(_api(Client(), operator)).json()["url"])
    assert client.get(f"/s/{link}/evidence.json").status_code == 200  # its slot is given back
    held = [EVIDENCE_SLOTS.take(f"share:{link}", 2) for _ in range(2)]
    assert all(held)
    opens = ShareLink.objects.get(token_hash=hashlib.sha256(link.encode()).hexdigest()).open_count
    for url in (f"/s/{link}/evidence.json", f"/s/{link}/runs/{SUB}/evidence.json"):
        refused = client.get(url)
        assert refused.status_code == 429 and refused["Retry-After"] == "1", url
        assert refused["Cache-Control"] == "no-store"
        error = refused.json()["error"]
        assert error["code"] == "rate_limited" and error["details"] == {"retryAfter": 1, "limit": 2}
    assert ShareLink.objects.get(token_hash=hashlib.sha256(link.encode()).hexdigest()).open_count == opens
    assert client.get(f"/s/{other}/evidence.json").status_code == 200  # another link
    tampered = link[:-1] + ("A" if link[-1] != "A" else "B")
    assert client.get(f"/s/{tampered}/evidence.json").status_code == 404  # an outsider: still 404
    held[0].release()
    assert client.get(f"/s/{link}/evidence.json").status_code == 200
    held[1].release()
    assert EVIDENCE_SLOTS.open_for(f"share:{link}") == 0


def test_every_response_is_noindex_no_referrer_no_store(client: Client, link: str) -> None:
    tampered = link[:-1] + ("A" if link[-1] != "A" else "B")
    for url in (
        f"/s/{link}/",
        f"/s/{link}/evidence.json",
        f"/s/{tampered}/",
        f"/s/{link}/runs/run_unrelated/",
        f"/s/{link}/no/such/page",
        f"/s/{link}/runs/{SUB}/evidence.jsonx",
    ):
        answer = client.get(url)
        assert answer["X-Robots-Tag"].startswith("noindex"), url
        assert answer["Referrer-Policy"] == "no-referrer", url
        assert answer["Cache-Control"] == "no-store", url
    assert client.get(f"/s/{link}/no/such/page").status_code == 404
    page = client.get(f"/s/{link}/").content.decode()
    assert '<meta name="robots" content="noindex, nofollow">' in page
    assert '<meta name="referrer" content="no-referrer">' in page


@pytest.mark.parametrize("position", [0, 10, 42])
def test_one_changed_character_is_a_404(client: Client, link: str, workspace: Workspace, position: int) -> None:
    swapped = "B" if link[position] == "A" else "A"
    tampered = link[:position] + swapped + link[position + 1 :]
    for url in (f"/s/{tampered}/", f"/s/{tampered}/evidence.json"):
        answer = client.get(url)
        assert answer.status_code == 404, url
    assert client.get(f"/s/{link[:-1]}/").status_code == 404  # one character short
    assert client.get(f"/s/{link}x/").status_code == 404
    assert client.get("/s/not-a-token/").status_code == 404
    assert _opened(workspace) == [] and ShareLink.objects.get().open_count == 0


def test_an_expired_link_is_a_410_that_says_so(client: Client, clock: FakeClock, link: str) -> None:
    assert client.get(f"/s/{link}/").status_code == 200
    clock.advance(hours=24, seconds=1)
    gone = client.get(f"/s/{link}/")
    assert gone.status_code == 410
    assert "expired" in gone.content.decode() and "text/html" in gone["Content-Type"]
    gone = client.get(f"/s/{link}/evidence.json")
    assert gone.status_code == 410 and gone.json()["error"]["details"] == {"reason": "expired"}
    assert ShareLink.objects.get().open_count == 1


def test_the_json_refuses_with_the_error_envelope_and_the_page_with_html(
    client: Client, operator: User, link: str, workspace: Workspace
) -> None:
    """evidence.json is read by programs: its 404 and 410 are the error envelope its 429 is
    (docs/api.md), while the page a person opens keeps its HTML refusal."""
    tampered = link[:-1] + ("A" if link[-1] != "A" else "B")
    for url in (f"/s/{tampered}/evidence.json", f"/s/{link}/runs/run_unrelated/evidence.json"):
        unknown = client.get(url)
        assert unknown.status_code == 404 and unknown["Content-Type"] == "application/json", url
        assert unknown.json() == {
            "error": {"code": "not_found", "message": "There is no share link at this address.", "details": {}}
        }
        assert unknown["Cache-Control"] == "no-store"
    assert "text/html" in client.get(f"/s/{tampered}/")["Content-Type"]
    sharing.revoke_link(ShareLink.objects.get(), by=operator)
    for url in (f"/s/{link}/evidence.json", f"/s/{link}/runs/{SUB}/evidence.json"):
        gone = client.get(url)
        assert gone.status_code == 410 and gone["Content-Type"] == "application/json", url
        assert gone.json() == {
            "error": {
                "code": "share_link_gone",
                "message": "This share link was revoked.",
                "details": {"reason": "revoked"},
            }
        }
        assert gone["X-Robots-Tag"].startswith("noindex") and gone["Cache-Control"] == "no-store"
    page = client.get(f"/s/{link}/")
    assert page.status_code == 410 and "text/html" in page["Content-Type"]
    assert _opened(workspace) == []


def test_the_json_refuses_another_method_with_the_envelope_and_opens_nothing(link: str, workspace: Workspace) -> None:
    """A POST was Django's CSRF page (403 HTML); evidence.json answers GET, and says so as JSON,
    whether or not the caller holds a session and a CSRF token."""
    strict = Client(enforce_csrf_checks=True)
    for url in (f"/s/{link}/evidence.json", f"/s/{link}/runs/{SUB}/evidence.json"):
        for method in ("post", "put", "delete", "patch"):
            refused = getattr(strict, method)(url)
            assert (refused.status_code, refused["Content-Type"]) == (405, "application/json"), (method, url)
            assert refused.json()["error"]["code"] == "method_not_allowed"
            assert refused["Allow"] == "GET, HEAD" and refused["Cache-Control"] == "no-store"
    assert _opened(workspace) == []
    assert strict.get(f"/s/{link}/evidence.json").status_code == 200


def test_a_revoked_link_is_a_410_at_once(client: Client, operator: User, link: str, workspace: Workspace) -> None:
    link_id = ShareLink.objects.get().public_id
    _api(client, operator)
    revoked = client.delete(f"/api/v1/share-links/{link_id}")
    assert revoked.status_code == 200 and revoked.json()["revokedAt"] and revoked.json()["status"] == "revoked"
    assert client.delete(f"/api/v1/share-links/{link_id}").status_code == 200  # idempotent
    client.logout()
    gone = client.get(f"/s/{link}/")
    assert gone.status_code == 410 and "revoked" in gone.content.decode()
    assert client.get(f"/s/{link}/evidence.json").status_code == 410
    entries = AuditEntry.objects.filter(action="share_link.revoked")
    assert [(e.actor, e.target) for e in entries] == [("carol", f"share_link:{link_id}")]


def test_max_opens_allows_exactly_that_many(
    client: Client, operator: User, shared_run: str, workspace: Workspace
) -> None:
    token = _token(_create(_api(client, operator), maxOpens=3).json()["url"])
    client.logout()
    answers = [
        client.get(url).status_code
        for url in (
            f"/s/{token}/",
            f"/s/{token}/evidence.json",
            f"/s/{token}/",
            f"/s/{token}/",
            f"/s/{token}/evidence.json",
        )
    ]
    assert answers == [200, 200, 200, 410, 410]
    gone = client.get(f"/s/{token}/").content.decode()
    assert "opened as many times as it allows" in gone
    assert ShareLink.objects.get().open_count == 3 and len(_opened(workspace)) == 3
    _api(client, operator)
    listed = client.get(f"/api/v1/runs/{RUN}/share-links").json()["shareLinks"][0]
    assert (listed["openCount"], listed["status"]) == (3, "used_up")


@pytest.mark.django_db(transaction=True)
def test_racing_readers_get_exactly_max_opens() -> None:
    workspace = bootstrap(tenant="acme", workspace="support")
    append(workspace=workspace, run_id=RUN, events=[started()])
    carol = named_user("carol", "operator")
    from ledger.reads import selectors

    run = selectors.get_run(workspace, RUN)
    _, token = sharing.create_link(workspace=workspace, run=run, by=carol, expires_in_hours=1, max_opens=5)
    readers = 12
    outcomes: list[str] = []
    barrier = threading.Barrier(readers)

    def read() -> None:
        try:
            barrier.wait()
            sharing.open_link(token, what="page")
            outcomes.append("opened")
        except sharing.ShareLinkGone as gone:
            outcomes.append(gone.reason)
        finally:
            connection.close()

    threads = [threading.Thread(target=read) for _ in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(outcomes) == ["opened"] * 5 + ["used_up"] * 7
    assert ShareLink.objects.get().open_count == 5
    assert AuditEntry.objects.filter(action="share_link.opened").count() == 5


def test_a_deleted_run_makes_the_link_gone(client: Client, link: str, workspace: Workspace) -> None:
    ShareLink.objects.filter(token_hash=hashlib.sha256(link.encode()).hexdigest()).update(run_id="run_pruned")
    gone = client.get(f"/s/{link}/")
    assert gone.status_code == 410 and "deleted" in gone.content.decode()


# --- what the page offers: reading only, links only under the link -------------------------------


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("href", "src", "action", "formaction") or name.startswith(("hx-", "data-hx", "on")):
                self.urls.append((tag, name, value or ""))


def _check_page(html: str, token: str) -> _Links:
    parsed = _Links()
    parsed.feed(html)
    assert parsed.urls, "a page with no links at all proves nothing"
    for tag, name, value in parsed.urls:
        assert name in ("href", "src"), (tag, name, value)  # no action, no hx-*, no on* handler
        assert value.startswith((f"/s/{token}/", "/static/", "#")), (tag, name, value)
    assert not {"form", "input", "button", "textarea", "select"} & set(parsed.tags)
    assert "/w/" not in html and "/api/" not in html and "/accounts/" not in html
    # Nothing inline, for the Content-Security-Policy: styles and scripts come from /static/ only.
    assert " style=" not in html and "<style" not in html
    assert all("src" in attrs for attrs in re.findall(r"<script([^>]*)>", html))
    return parsed


def test_the_page_has_no_action_and_no_link_out_of_the_share(client: Client, link: str) -> None:
    page = client.get(f"/s/{link}/").content.decode()
    parsed = _check_page(page, link)
    hrefs = [v for _, n, v in parsed.urls if n == "href"]
    assert f"/s/{link}/runs/{SUB}/" in hrefs and f"/s/{link}/runs/{SUBSUB}/" in hrefs
    assert f"/s/{link}/evidence.json" in hrefs
    sub = client.get(f"/s/{link}/runs/{SUBSUB}/")
    assert sub.status_code == 200
    parsed_sub = _check_page(sub.content.decode(), link)
    assert f"/s/{link}/runs/{SUB}/" in [v for _, n, v in parsed_sub.urls]  # its parent, under the link


def test_the_timeline_pages_under_the_link(client: Client, link: str, workspace: Workspace) -> None:
    append(workspace=workspace, run_id=SUB, events=[ev("custom.tick", n=n) for n in range(250)])
    page = client.get(f"/s/{link}/runs/{SUB}/").content.decode()
    assert f'href="/s/{link}/runs/{SUB}/?after=200#timeline"' in page
    second = client.get(f"/s/{link}/runs/{SUB}/?after=200")
    assert second.status_code == 200 and "events 201–251 of 251" in second.content.decode()
    _check_page(second.content.decode(), link)
    bad = client.get(f"/s/{link}/?after=-1")
    assert bad.status_code == 400 and bad["Cache-Control"] == "no-store"
    tampered = link[:-1] + ("A" if link[-1] != "A" else "B")
    assert client.get(f"/s/{tampered}/?after=x").status_code == 404


def test_sub_runs_only_below_the_run_and_only_when_included(client: Client, operator: User, link: str) -> None:
    assert client.get(f"/s/{link}/runs/{SUB}/evidence.json").json()["run"]["runId"] == SUB
    assert client.get(f"/s/{link}/runs/run_unrelated/").status_code == 404
    assert client.get(f"/s/{link}/runs/run_unrelated/evidence.json").status_code == 404
    below = _token(_create(_api(client, operator), run_id=SUB, includeSubRuns=True).json()["url"])
    without = _token(_create(client).json()["url"])
    client.logout()
    assert client.get(f"/s/{below}/runs/{RUN}/").status_code == 404  # its parent is not below it
    named = re.compile(rf"{RUN}(?![A-Za-z0-9_.:-])")  # the parent's id whole, not a prefix of its children's
    assert not named.search(client.get(f"/s/{below}/").content.decode())  # nor named: its start's payload either
    assert SUB in client.get(f"/s/{below}/runs/{SUBSUB}/").content.decode()  # a parent inside the link is
    assert client.get(f"/s/{without}/runs/{SUB}/").status_code == 404
    page = client.get(f"/s/{without}/").content.decode()
    assert SUB not in page and 'id="subruns"' not in page
    left_out = client.get(f"/s/{without}/evidence.json").json()
    assert left_out["subRuns"] == [] and left_out["run"]["treeUsage"] is None  # what they spent is theirs
    included = client.get(f"/s/{below}/evidence.json").json()
    assert included["run"]["treeUsage"] is not None and included["subRuns"][0]["treeUsage"] is not None


# --- the workspace's policy: hide model inputs and tool arguments -------------------------------


def test_the_policy_hides_inputs_and_arguments_on_the_page_and_in_the_json(
    client: Client, admin: User, operator: User, link: str, workspace: Workspace
) -> None:
    assert SECRET_ARG in client.get(f"/s/{link}/evidence.json").content.decode()
    _api(client, operator)
    refused = client.post(f"/w/acme/support/runs/{RUN}/share-policy/", {"hides_inputs": "on"})
    assert refused.status_code == 403
    _api(client, admin)
    saved = client.post(f"/w/acme/support/runs/{RUN}/share-policy/", {"hides_inputs": "on"})
    assert saved.status_code == 302
    client.logout()
    page = client.get(f"/s/{link}/").content.decode()
    assert SECRET_PROMPT not in page and SECRET_ARG not in page
    assert "[HIDDEN]" in page and 'id="inputs-hidden"' in page
    assert "lookup" in page and "draft" in page  # what was done still shows; what was sent does not
    bundle = client.get(f"/s/{link}/evidence.json")
    assert SECRET_PROMPT not in bundle.content.decode() and SECRET_ARG not in bundle.content.decode()
    assert [c["args"] for c in bundle.json()["toolCalls"]] == ["[HIDDEN]"]
    changed = AuditEntry.objects.get(action="share_policy.changed")
    assert (changed.actor, changed.details) == ("alice", {"hidesInputs": True})
    _api(client, admin)
    client.post(f"/w/acme/support/runs/{RUN}/share-policy/", {"hides_inputs": "on"})  # no change: no entry
    assert AuditEntry.objects.filter(action="share_policy.changed").count() == 1
    assert client.get(f"/w/acme/support/runs/{RUN}/conversation/").content.decode().count(SECRET_PROMPT) >= 1


# --- the share panel of the run page -------------------------------------------------------------


def test_the_panel_creates_shows_the_url_once_lists_and_revokes(
    client: Client, operator: User, shared_run: str
) -> None:
    _api(client, operator)
    run_page = client.get(f"/w/acme/support/runs/{RUN}/").content.decode()
    assert 'id="share-panel"' in run_page and 'id="share-create"' in run_page and 'id="share-policy"' not in run_page
    htmx = {"HTTP_HX_REQUEST": "true"}
    made = client.post(
        f"/w/acme/support/runs/{RUN}/share-links/",
        {"expires_in_hours": "2", "max_opens": "4", "include_sub_runs": "on"},
        **htmx,
    )
    assert made.status_code == 201
    html = made.content.decode()
    url = re.search(r'id="share-new-url" readonly value="([^"]+)"', html)
    assert url and TOKEN_IN_URL.search(url.group(1))
    stored = ShareLink.objects.get()
    assert (stored.max_opens, stored.include_sub_runs, stored.created_by) == (4, True, "carol")
    again = client.get(f"/w/acme/support/runs/{RUN}/").content.decode()
    assert stored.public_id in again and _token(url.group(1)) not in again  # shown once
    bad = client.post(f"/w/acme/support/runs/{RUN}/share-links/", {"expires_in_hours": "721"}, **htmx)
    assert bad.status_code == 400 and 'id="share-error"' in bad.content.decode()
    # Its numbers as the console writes counts: the limit of opens thousands-separated.
    assert "Max opens (optional, 1–10,000)" in run_page
    too_many = client.post(
        f"/w/acme/support/runs/{RUN}/share-links/", {"expires_in_hours": "2", "max_opens": "10001"}, **htmx
    )
    assert (
        too_many.status_code == 400
        and "Max opens must be a whole number from 1 to 10,000." in too_many.content.decode()
    )
    revoked = client.post(f"/w/acme/support/runs/{RUN}/share-links/{stored.public_id}/revoke/", **htmx)
    assert revoked.status_code == 200 and "revoked" in revoked.content.decode()
    stored.refresh_from_db()
    assert stored.revoked_at is not None and stored.revoked_by == "carol"
    client.logout()
    assert client.get(url.group(1).split("testserver", 1)[-1]).status_code == 410


def test_a_viewer_sees_no_panel_and_cannot_post_to_it(
    client: Client, operator: User, viewer: User, shared_run: str
) -> None:
    link_id = _create(_api(client, operator)).json()["id"]
    _api(client, viewer)
    page = client.get(f"/w/acme/support/runs/{RUN}/").content.decode()
    assert 'id="share-panel"' not in page and link_id not in page
    assert client.post(f"/w/acme/support/runs/{RUN}/share-links/", {"expires_in_hours": "2"}).status_code == 403
    assert client.post(f"/w/acme/support/runs/{RUN}/share-links/{link_id}/revoke/").status_code == 403
    assert not AuditEntry.objects.filter(action="share_link.revoked").exists()


@pytest.mark.django_db(transaction=True)  # the login form's requests run as a server's would
def test_a_viewer_is_offered_no_share_links_and_their_address_says_why(
    client: Client, operator: User, viewer: User, outsider: User, shared_run: str
) -> None:
    """As each role would, through the login form with a real HTTP client: viewers may not list a
    run's links (the API's 403, docs/security.md § Roles), so the run page offers them no panel and
    no way to it, and the panel's address, pasted, is the 403 page saying why, not an empty page.
    An operator opens the same address as a page of its own, the links listed."""
    link_id = _create(_api(client, operator)).json()["id"]
    panel = f"/w/acme/support/runs/{RUN}/share-links/"
    as_viewer = log_in(IN_PROCESS, viewer)
    page = as_viewer.get(f"/w/acme/support/runs/{RUN}/")
    assert page.status_code == 200
    assert 'id="share-panel"' not in page.text and "share-links/" not in page.text and link_id not in page.text
    refused = as_viewer.get(panel)
    assert refused.status_code == 403 and 'id="error-title">Not allowed<' in refused.text
    assert "Share links are for operators, approvers and admins" in refused.text and link_id not in refused.text
    assert as_viewer.get(f"/api/v1/runs/{RUN}/share-links").status_code == 403

    as_operator = log_in(IN_PROCESS, operator)
    listed = as_operator.get(panel)
    assert listed.status_code == 200 and 'id="share-panel"' in listed.text and f'data-link="{link_id}"' in listed.text
    assert f'href="/w/acme/support/runs/{RUN}/"' in listed.text  # the way back to the run
    assert log_in(IN_PROCESS, outsider).get(panel).status_code == 404
    assert ShareLink.objects.count() == 1  # reading the panel makes nothing


def test_an_outsider_gets_404_from_the_panel(client: Client, operator: User, outsider: User, shared_run: str) -> None:
    link_id = _create(_api(client, operator)).json()["id"]
    _api(client, outsider)
    assert client.post(f"/w/acme/support/runs/{RUN}/share-links/", {"expires_in_hours": "2"}).status_code == 404
    assert client.post(f"/w/acme/support/runs/{RUN}/share-links/{link_id}/revoke/").status_code == 404
    assert client.post(f"/w/acme/support/runs/{RUN}/share-policy/", {"hides_inputs": "on"}).status_code == 404
    other = bootstrap(tenant="globex", workspace="main")
    append(workspace=other, run_id="run_theirs", events=[started()])
    # A link of acme's named under globex's run (which olga may see) is still not hers.
    assert client.post(f"/w/globex/main/runs/run_theirs/share-links/{link_id}/revoke/").status_code == 404
    assert ShareLink.objects.get().revoked_at is None


def test_the_schema_shapes_are_what_the_api_returns(client: Client, operator: User, shared_run: str) -> None:
    from console.api import share_links
    from tests.test_api_shapes import _matches

    made = _create(_api(client, operator), maxOpens=2)
    _matches(share_links.CreatedSerializer(), made.json(), "created")
    _matches(share_links.ShareLinkListSerializer(), client.get(f"/api/v1/runs/{RUN}/share-links").json(), "list")
    revoked = client.delete(f"/api/v1/share-links/{made.json()['id']}").json()
    _matches(share_links.ShareLinkSerializer(), revoked, "revoked")
