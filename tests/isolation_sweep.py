"""The isolation sweep (tests/test_isolation_sweep.py): every HTTP route the URL configuration
holds and every WebSocket route, requested through a live Daphne by everyone who must be refused —
anonymous callers, another tenant's admin (session and key), the tenant's members and keys below
the route's requirement, a revoked key — and a list of what answered otherwise.

Each route must be declared in ROUTES with who may use it; a route that is not declared is itself
a violation, so a new route fails CI until someone says who may call it, and then it is swept.
The requests are the refused principals' only: nobody allowed ever calls anything, so the sweep
writes nothing (the test checks the log is unchanged).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import websocket
from django.urls import URLPattern, URLResolver, get_resolver

from ledger.models import ROLE_RANK, Role

# Who may use a route, per HTTP method: (API key scope, console session role). None: that kind of
# caller is refused outright (403). Methods not named are answered 405 to everyone.
Need = tuple[str | None, str | None]
READ: Need = ("read", Role.VIEWER)


@dataclass(frozen=True)
class Route:
    kind: str  # api | page | share | public
    methods: dict[str, Need] = field(default_factory=dict)
    # Lists the caller's own objects (no object of another tenant in its path): another tenant's
    # member gets 200 for their own, and nothing of ours may appear in it.
    collection: bool = False
    # Names its object per workspace (a dataset by its name): a session names the workspace too.
    names_workspace: bool = False


def api(methods: dict[str, Need], **kw: Any) -> Route:
    return Route("api", methods, **kw)


def page(methods: dict[str, Need], **kw: Any) -> Route:
    return Route("page", methods, **kw)


OPERATOR, APPROVER, ADMIN = Role.OPERATOR, Role.APPROVER, Role.ADMIN
W = "w/<slug:tenant>/<slug:workspace>/"
RUN = W + "runs/<str:run_id>/"
V1 = "api/v1/"

ROUTES: dict[str, Route] = {
    "api/schema/": Route("public"),
    "api/docs/": Route("public"),
    "accounts/login/": Route("public"),
    "accounts/logout/": Route("public"),
    # The signed-in user's own password, no tenant's object in them (tests/test_password_change.py).
    "accounts/password/": Route("public"),
    "accounts/password/done/": Route("public"),
    # docs/concepts.md as a page: the same words for everyone, no tenant's data (tests/test_concepts.py).
    "concepts/": Route("public"),
    # --- the API: a key of the workspace with the scope, or a member's session with the role
    V1 + "runs": api({"GET": READ}, collection=True),
    V1 + "runs/<str:run_id>": api({"GET": READ}),
    V1 + "runs/<str:run_id>/children": api({"GET": READ}),
    V1 + "runs/<str:run_id>/stream": api({"GET": READ}),
    V1 + "runs/<str:run_id>/events": api({"GET": READ, "POST": ("ingest", OPERATOR)}),
    V1 + "runs/<str:run_id>/evidence": api({"GET": READ}),
    V1 + "runs/<str:run_id>/replay-plan": api({"GET": READ}),
    V1 + "runs/<str:run_id>/state": api({"GET": READ}),
    V1 + "runs/<str:run_id>/otlp": api({"GET": READ}),
    V1 + "otlp/v1/traces": api({"POST": ("ingest", OPERATOR)}, collection=True),
    V1 + "runs/<str:run_id>/feedback": api({"POST": ("ingest", Role.VIEWER)}),
    V1 + "artifacts/<str:artifact_id>": api({"GET": READ}),
    V1 + "artifacts/<str:artifact_id>/content": api({"GET": READ}),
    V1 + "usage": api({"GET": READ}, collection=True),
    V1 + "runs/<str:run_id>/tool-calls": api({"GET": READ, "POST": ("ingest", OPERATOR)}),
    V1 + "runs/<str:run_id>/tool-calls/<str:call_id>/outbound": api({"POST": ("ingest", OPERATOR)}),
    V1 + "runs/<str:run_id>/tool-calls/<str:call_id>/complete": api({"POST": ("ingest", OPERATOR)}),
    V1 + "runs/<str:run_id>/tool-calls/<str:call_id>/reconcile": api({"POST": (None, OPERATOR)}),
    V1 + "runs/<str:run_id>/reexecutions": api({"GET": READ, "POST": ("execute", OPERATOR)}),
    V1 + "reexecutions": api({"GET": READ}, collection=True),
    V1 + "reexecutions/claim": api({"POST": ("execute", None)}, collection=True),
    V1 + "reexecutions/batches": api({"POST": ("execute", OPERATOR)}, collection=True),
    V1 + "reexecutions/batches/<str:batch_id>": api({"GET": READ}),
    V1 + "reexecutions/<str:reexecution_id>": api({"GET": READ}),
    V1 + "reexecutions/<str:reexecution_id>/approve": api({"POST": (None, APPROVER)}),
    V1 + "reexecutions/<str:reexecution_id>/deny": api({"POST": (None, APPROVER)}),
    V1 + "reexecutions/<str:reexecution_id>/lease": api({"POST": ("execute", None)}),
    V1 + "reexecutions/<str:reexecution_id>/divergence": api({"GET": READ}),
    V1 + "audit": api({"GET": (None, ADMIN)}, collection=True),
    V1 + "runs/<str:run_id>/cancel": api({"POST": ("execute", OPERATOR)}),
    V1 + "runs/<str:run_id>/tool-calls/<str:call_id>/approve": api({"POST": (None, APPROVER)}),
    V1 + "runs/<str:run_id>/tool-calls/<str:call_id>/deny": api({"POST": (None, APPROVER)}),
    V1 + "runs/<str:run_id>/share-links": api({"GET": (None, OPERATOR), "POST": (None, OPERATOR)}),
    V1 + "share-links/<str:link_id>": api({"DELETE": (None, OPERATOR)}),
    V1 + "export/runs": api({"GET": READ}, collection=True),
    V1 + "export/events": api({"GET": READ}, collection=True),
    V1 + "export/costs": api({"GET": READ}, collection=True),
    V1 + "export/audit": api({"GET": (None, ADMIN)}, collection=True),
    V1 + "runs/<str:run_id>/evidence.zip": api({"GET": READ}),
    V1 + "outer-loops/<str:outer_loop_id>": api({"GET": READ}),
    # Datasets and evaluations (docs/evaluations.md): policies are approved by a person, not a key.
    V1 + "datasets": api({"GET": READ}, collection=True),
    V1 + "datasets/<str:name>": api({"GET": READ}, names_workspace=True),
    V1 + "datasets/<str:name>/runs": api({"POST": ("execute", OPERATOR)}, names_workspace=True),
    V1 + "datasets/<str:name>/runs/remove": api({"POST": ("execute", OPERATOR)}, names_workspace=True),
    V1 + "datasets/<str:name>/expected": api({"POST": ("execute", OPERATOR)}, names_workspace=True),
    V1 + "evaluation-policies": api({"GET": READ, "POST": (None, APPROVER)}, collection=True),
    V1 + "evaluation-policies/<str:policy_id>/revoke": api({"POST": (None, APPROVER)}, names_workspace=True),
    V1 + "evaluations": api({"GET": READ, "POST": ("execute", OPERATOR)}, collection=True),
    V1 + "evaluations/<str:evaluation_id>": api({"GET": READ}),
    V1 + "evaluations/<str:evaluation_id>/junit": api({"GET": READ}),
    # --- the console: a member's session with the role (pages never take keys)
    "": page({"GET": (None, Role.VIEWER)}, collection=True),
    W: page({"GET": (None, Role.VIEWER)}),
    RUN + "reexecute/": page({"GET": (None, OPERATOR), "POST": (None, OPERATOR)}),
    RUN + "reexecute/plan/": page({"GET": (None, OPERATOR)}),
    W + "reexecutions/<str:reexecution_id>/divergence/": page({"GET": (None, Role.VIEWER)}),
    RUN + "share-links/": page({"GET": (None, OPERATOR), "POST": (None, OPERATOR)}),
    RUN + "share-links/<str:link_id>/revoke/": page({"POST": (None, OPERATOR)}),
    RUN + "share-policy/": page({"POST": (None, ADMIN)}),
    RUN: page({"GET": (None, Role.VIEWER)}),
    RUN + "timeline/rows/": page({"GET": (None, Role.VIEWER)}),
    RUN + "timeline/caption/": page({"GET": (None, Role.VIEWER)}),
    RUN + "header/": page({"GET": (None, Role.VIEWER)}),
    RUN + "waterfall/rows/": page({"GET": (None, Role.VIEWER)}),
    RUN + "waterfall/detail/": page({"GET": (None, Role.VIEWER)}),
    RUN + "feedback/": page({"POST": (None, Role.VIEWER)}),
    RUN + "tool-calls/<str:call_id>/reconcile/": page({"POST": (None, OPERATOR)}),
    RUN + "cancel/": page({"POST": (None, OPERATOR)}),
    RUN + "<slug:tab>/": page({"GET": (None, Role.VIEWER)}),
    W + "approvals/": page({"GET": (None, Role.VIEWER)}),
    W + "approvals/tool-calls/": page({"POST": (None, APPROVER)}),
    W + "approvals/<str:reexecution_id>/approve/": page({"POST": (None, APPROVER)}),
    W + "approvals/<str:reexecution_id>/deny/": page({"POST": (None, APPROVER)}),
    W + "batches/": page({"POST": (None, OPERATOR)}),
    W + "batches/<str:batch_id>/": page({"GET": (None, Role.VIEWER)}),
    "t/<slug:tenant>/audit/": page({"GET": (None, ADMIN)}),
    W + "usage/": page({"GET": (None, Role.VIEWER)}),
    W + "evaluations/": page({"GET": (None, Role.VIEWER)}),
    W + "evaluations/rows/": page({"GET": (None, Role.VIEWER)}),
    W + "evaluations/policies/": page({"POST": (None, APPROVER)}),
    W + "evaluations/policies/<str:policy_id>/revoke/": page({"POST": (None, APPROVER)}),
    W + "evaluations/<str:evaluation_id>/": page({"GET": (None, Role.VIEWER)}),
    W + "evaluations/<str:evaluation_id>/live/": page({"GET": (None, Role.VIEWER)}),
    W + "datasets/add/": page({"POST": (None, OPERATOR)}),
    W + "datasets/<str:name>/": page({"GET": (None, Role.VIEWER)}),
    W + "datasets/<str:name>/expected/": page({"POST": (None, OPERATOR)}),
    W + "datasets/<str:name>/remove/": page({"POST": (None, OPERATOR)}),
    W + "loops/": page({"GET": (None, Role.VIEWER)}),
    W + "loops/<str:outer_loop_id>/": page({"GET": (None, Role.VIEWER)}),
    W + "settings/": page({"GET": (None, ADMIN)}),
    W + "settings/retention/": page({"POST": (None, ADMIN)}),
    W + "settings/keys/": page({"POST": (None, ADMIN)}),
    W + "settings/keys/<str:prefix>/revoke/": page({"POST": (None, ADMIN)}),
    W + "settings/members/": page({"GET": (None, ADMIN)}),
    W + "settings/members/add/": page({"POST": (None, ADMIN)}),
    W + "settings/members/role/": page({"POST": (None, ADMIN)}),
    W + "settings/members/remove/": page({"POST": (None, ADMIN)}),
    W + "settings/members/password/": page({"POST": (None, ADMIN)}),
    W + "settings/prices/": page({"GET": (None, ADMIN)}),
    W + "settings/prices/set/": page({"POST": (None, ADMIN)}),
    W + "settings/prices/remove/": page({"POST": (None, ADMIN)}),
    W + "settings/prices/reprice/": page({"POST": (None, ADMIN)}),
    # Every member reads the workspace's redaction rules; only admins change them.
    W + "settings/redaction/": page({"GET": (None, Role.VIEWER), "POST": (None, ADMIN)}),
    # --- share links: the token is the credential (tokens are checked by tests/test_share_links.py
    # too); here, an unknown and a revoked token, and a run the link does not include.
    "s/<str:token>/": Route("share", {"GET": (None, None)}),
    "s/<str:token>/evidence.json": Route("share", {"GET": (None, None)}),
    "s/<str:token>/runs/<str:run_id>/": Route("share", {"GET": (None, None)}),
    "s/<str:token>/runs/<str:run_id>/evidence.json": Route("share", {"GET": (None, None)}),
    "s/<str:token>/<path:rest>": Route("share", {"GET": (None, None)}),
}

# WebSocket routes: every member of the workspace may watch; anyone else is refused at the handshake.
WEBSOCKETS = {
    "ws/runs/<str:run_id>/",
    "ws/workspaces/<slug:tenant>/<slug:workspace>/runs/",
    "ws/workspaces/<slug:tenant>/<slug:workspace>/reexecutions/",
}

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def http_routes(urlconf: str | None = None) -> list[str]:
    def walk(patterns: list[Any], prefix: str) -> Iterator[str]:
        for p in patterns:
            if isinstance(p, URLResolver):
                yield from walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                yield prefix + str(p.pattern)

    return list(dict.fromkeys(walk(get_resolver(urlconf).url_patterns, "")))


def websocket_routes() -> list[str]:
    from console.routing import routes

    return [str(r.pattern) for r in routes]


def fill(route: str, values: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in values:
            raise KeyError(f"the sweep has no object for <{match.group(1)}:{name}> in {route!r}: add one to its values")
        return values[name]

    return "/" + re.sub(r"<(?:(\w+):)?(\w+)>", lambda m: one(m), route)


@dataclass
class Caller:
    name: str
    client: httpx.Client
    kind: str  # anonymous | outsider | member | key | revoked
    role: str | None = None  # a member's
    scope: str | None = None  # a single-scope key's ("all" for the outsider's key)

    @property
    def is_key(self) -> bool:
        return self.scope is not None or self.kind == "revoked"


@dataclass
class Sweep:
    base_url: str
    values: dict[str, str]  # an object of the swept tenant for every URL parameter
    unknown: dict[str, str]  # the same parameters naming nothing at all
    share_values: list[dict[str, str]]  # token/run combinations every share route must refuse
    callers: list[Caller]
    ours: list[str]  # identifiers of the swept tenant's objects: none may show in another's answer
    session_cookies: dict[str, str]  # websocket: caller name -> session id
    violations: list[str] = field(default_factory=list)
    requests: int = 0

    def flag(self, text: str) -> None:
        self.violations.append(text)

    def request(self, caller: Caller, method: str, url: str) -> httpx.Response:
        self.requests += 1
        kwargs: dict[str, Any] = {}
        if method in ("POST", "PUT", "PATCH"):
            kwargs = {"json": {}} if url.startswith("/api/") else {"data": {}}
        return caller.client.request(method, url, follow_redirects=False, **kwargs)

    def expected(self, route: Route, method: str, caller: Caller) -> set[int] | None:
        """The codes `caller` may get for `method` on `route`; None when it is allowed (not swept).
        Another tenant's answers are checked further in `check` (they must not tell our objects from
        objects that do not exist)."""
        if route.kind == "page" and caller.is_key:
            # Pages take no keys (an Authorization header is ignored): that caller is anonymous there.
            return {302, 405} if caller.kind == "outsider" else None
        need = route.methods.get(method)
        if need is None:
            # Not a method of the route: refused as such, or for want of credentials first.
            return {405, 401} if route.kind == "api" else {405, 302, 404}
        scope, role = need
        if caller.kind == "anonymous":
            return {401} if route.kind == "api" else {302}
        if caller.kind == "revoked":
            return {401}
        if caller.kind == "outsider":
            # A key where only sessions are taken, or a session where only keys are: another
            # tenant's object is still 404 (it is looked up first); a route without an object of
            # its own refuses that caller, the same for everyone (403).
            refused = (caller.is_key and scope is None) or (not caller.is_key and role is None)
            if refused:
                return {403, 404} if route.collection else {404}
            return {404, 400, 409, 200, 201, 204, 302}
        if caller.kind == "key":
            return None if scope == caller.scope else {403}
        assert caller.kind == "member" and caller.role is not None
        if role is not None and ROLE_RANK[Role(caller.role)] >= ROLE_RANK[Role(role)]:
            return None
        return {403}

    def url(self, route_text: str, route: Route, caller: Caller, values: dict[str, str]) -> str:
        url = fill(route_text, values)
        if route.kind == "api" and (route.collection or route.names_workspace):
            # Every caller names the workspace: another tenant's member or key names ours.
            url += f"?workspace={values['tenant']}/{values['workspace']}"
        return url

    def check(self, route_text: str, route: Route) -> None:
        if route.kind == "public":
            return
        if route.kind == "share":
            self.check_share(route_text)
            return
        for method in METHODS:
            for caller in self.callers:
                want = self.expected(route, method, caller)
                if want is None:
                    continue
                url = self.url(route_text, route, caller, self.values)
                response = self.request(caller, method, url)
                status = response.status_code
                where = f"{method} {url} as {caller.name}"
                if status not in want:
                    self.flag(f"{where}: {status}, expected {sorted(want)}: {response.text[:200]!r}")
                    continue
                location = response.headers.get("location", "")
                if status == 302 and caller.kind != "outsider" and "/accounts/login/" not in location:
                    self.flag(f"{where}: redirected to {location}, not to log in")
                if caller.kind == "outsider":
                    self.check_outsider(route_text, route, caller, method, url, response)

    def check_outsider(
        self, route_text: str, route: Route, caller: Caller, method: str, url: str, response: httpx.Response
    ) -> None:
        """Another tenant learns nothing: no identifier of ours in the answer, and an answer other
        than 404 is exactly the answer for objects that do not exist (run ids are per workspace: an
        append to one unused in their own workspace is `run_not_started`, like any other)."""
        where = f"{method} {url} as {caller.name}"
        location = response.headers.get("location", "")
        # What the caller sent may come back (a 404 names the id it did not find); nothing else of ours.
        leaked = [o for o in self.ours if o in response.text + location and o not in url]
        if location.startswith("/accounts/login/"):
            location = ""
        if leaked or f"/{self.values['tenant']}/" in location:
            self.flag(f"{where}: answered with our {leaked[:3] or location}")
        if response.status_code in (404, 403, 405) or (route.collection and route.kind == "page"):
            return
        twin = self.request(caller, method, self.url(route_text, route, caller, self.unknown))
        if (twin.status_code, _code(twin)) != (response.status_code, _code(response)):
            self.flag(
                f"{where}: {response.status_code} {_code(response)}, but {twin.status_code} {_code(twin)} for "
                "objects that do not exist: the answer tells ours apart"
            )

    def check_share(self, route_text: str) -> None:
        for values in self.share_values:
            if values.get("needs") and f":{values['needs']}>" not in route_text:
                continue  # a valid token's own pages are the link's to show
            try:
                url = fill(route_text, values)
            except KeyError:
                continue
            for method in METHODS:
                response = self.request(self.callers[0], method, url)
                # A revoked (or expired, or used up) link says so: 410, and nothing of the run.
                want = ({410, 404} if values.get("gone") else {404}) if method == "GET" else {404, 405, 403}
                if response.status_code not in want:
                    self.flag(
                        f"{method} {url} (share, {values['why']}): {response.status_code}, expected {sorted(want)}"
                    )

    def check_websocket(self, route_text: str) -> None:
        url = self.base_url.replace("http://", "ws://") + fill(route_text, self.values)
        for name in ("anonymous", "outsider"):
            cookie = self.session_cookies.get(name)
            self.requests += 1
            try:
                sock = websocket.create_connection(
                    url, cookie=f"sessionid={cookie}" if cookie else None, origin=self.base_url, timeout=30
                )
            except websocket.WebSocketBadStatusException as refused:
                if refused.status_code != 403:
                    self.flag(f"WS {url} as {name}: handshake {refused.status_code}, expected 403")
                continue
            sock.close()
            self.flag(f"WS {url} as {name}: accepted")

    def run(self, http: list[str], sockets: list[str], table: dict[str, Route] = ROUTES) -> list[str]:
        for route_text in http:
            route = table.get(route_text)
            if route is None:
                self.flag(
                    f"route {route_text!r} is not declared in the isolation sweep (tests/isolation_sweep.py "
                    "ROUTES): say who may use it"
                )
                continue
            self.check(route_text, route)
        for route_text in sockets:
            if route_text not in WEBSOCKETS:
                self.flag(f"websocket route {route_text!r} is not declared in the isolation sweep (WEBSOCKETS)")
                continue
            self.check_websocket(route_text)
        return self.violations


def _code(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    return error.get("code") if isinstance(error, dict) else None


def csrf_client(base_url: str, session_id: str | None = None, key: str | None = None) -> httpx.Client:
    """A caller as a browser or a harness presents itself: a session cookie with the CSRF pair (so
    a refusal is the route's check, never the CSRF middleware's), or a Bearer key."""
    token = secrets.token_hex(16)
    cookies = {"csrftoken": token}
    if session_id:
        cookies["sessionid"] = session_id
    headers = {"X-CSRFToken": token, "Referer": base_url + "/"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.Client(base_url=base_url, cookies=cookies, headers=headers, timeout=60)
