"""The redaction policy (docs/security.md): built-in key and value rules, workspace extras, and
that redaction happens before storage and before hashing. Every rule has cases it must redact
and cases it must leave alone, appended through the one write path and read back from the
database (these run on SQLite and, in the PostgreSQL pass, on PostgreSQL)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ledger.canonical import event_id
from ledger.models import Event
from ledger.redaction import (
    BUILTIN_VALUE_RULES,
    REDACTED,
    InvalidRule,
    Redactor,
    check_pattern,
    check_rules,
    key_words,
    policy,
)
from ledger.tenancy.services import create_key
from tests.conftest import ev, started

VECTORS = Path(__file__).resolve().parent / "data" / "vectors.json"  # the shared vectors (test_canonical_vectors)


def _stored(run_id: str, sequence: int) -> str:
    return Event.objects.get(run__run_id=run_id, sequence=sequence).payload


def _note(append: Any, run_id: str, **payload: Any) -> dict[str, Any]:
    """Append a custom event with `payload` to a started run; the payload as the database holds it."""
    append(run_id, started())
    append(run_id, ev("custom.note", **payload))
    return json.loads(_stored(run_id, 2))


# --- key names --------------------------------------------------------------------------------

SECRET_KEYS = [
    # docs/design.md §3's whole names, in the spellings harnesses use
    "authorization",
    "Authorization",
    "Proxy-Authorization",
    "cookie",
    "Set-Cookie",
    "apiKey",
    "x-api-key",
    "password",
    "passwd",
    "secret",
    "client_secret",
    "token",
    "access_token",
    "refreshToken",
    "id_token",
    "private_key",
    "sessionId",
    # by word: vendor-prefixed and compound names the whole-name rule let through
    "openai_api_key",
    "OPENAI_API_KEY",
    "anthropicApiKey",
    "XApiKey",
    "aws_secret_access_key",
    "aws_access_key_id",
    "AWS_SESSION_TOKEN",
    "X-Amz-Security-Token",
    "GITHUB_TOKEN",
    "X-Auth-Token",
    "bearerToken",
    "csrftoken",
    "db.password",
    "DB_PASSWORD",
    "user_passwd",
    "passphrase",
    "webhookSecret",
    "secrets",
    "credentials",
    "gcp_credential",
    "api_keys",
    "private_key_pem",
    "signing_key",
    "session_key",
    "HTTPAuthorization",
    "oauth2Token",
    "cookies",
]

NOT_SECRET_KEYS = [
    # token counts are the ledger's evidence
    "max_tokens",
    "maxTokens",
    "max_completion_tokens",
    "input_tokens",
    "inputTokens",
    "output_tokens",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "tokens",
    "cachedInputTokens",
    "reasoningTokens",
    "token_count",
    "totalTokenCount",
    "promptTokenCount",
    "num_tokens",
    # tokens that are a count, a vocabulary entry, a cursor, or Runledger's own lease and fence
    "max_token",
    "eos_token",
    "pad_token",
    "next_page_token",
    "nextToken",
    "leaseToken",
    "fencingToken",
    "tokenizer",
    "token_type",
    "tokenId",
    # ordinary names near the rules
    "key",
    "idempotencyKey",
    "keys",
    "monkey",
    "cacheKey",
    "primary_key",
    "session",
    "sessionName",
    "author",
    "authored_by",
    "secretary",
    "passage",
    "cook",
    "toolName",
    "promptHash",
    "model",
]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_secret_key_names_are_redacted_at_any_depth(append, key: str) -> None:
    stored = _note(append, "run_k", top={key: "v4lue-of-the-secret"}, nested=[{"deeper": {key: {"a": 1}}}])
    assert stored["top"] == {key: REDACTED}
    assert stored["nested"] == [{"deeper": {key: REDACTED}}]
    assert "v4lue-of-the-secret" not in _stored("run_k", 2)


@pytest.mark.parametrize("key", NOT_SECRET_KEYS)
def test_ordinary_key_names_are_kept(append, key: str) -> None:
    stored = _note(append, "run_k", top={key: 1834}, text={key: "plain"})
    assert stored == {"top": {key: 1834}, "text": {key: "plain"}}


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("openai_api_key", ["openai", "api", "key"]),
        ("X-Amz-Security-Token", ["x", "amz", "security", "token"]),
        ("openaiAPIKey.v2", ["openai", "api", "key", "v2"]),
        ("HTTPAuthorization", ["http", "authorization"]),
        ("cachedInputTokens", ["cached", "input", "tokens"]),
        ("__", []),
    ],
)
def test_key_names_split_into_words(key: str, words: list[str]) -> None:
    assert key_words(key) == words


def test_usage_counters_survive_a_model_response(append) -> None:
    usage = {"inputTokens": 1834, "outputTokens": 212, "cachedInputTokens": 1024, "reasoningTokens": 7}
    append("run_u", started())
    env = append(
        "run_u",
        ev(
            "harness.model.responded",
            turn=1,
            callId="c1",
            model={"provider": "openai", "modelId": "gpt-4o-mini"},
            response={"text": "hi", "usage": usage},
            request={"max_tokens": 500, "headers": {"Authorization": "Bearer abcdef0123456789xyz"}},
        ),
    ).events[0]
    assert env["payload"]["response"]["usage"] == usage
    assert env["payload"]["request"] == {"max_tokens": 500, "headers": {"Authorization": REDACTED}}


# --- values -----------------------------------------------------------------------------------

JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n-----END RSA PRIVATE KEY-----"

# (rule, text sent, text stored)
REDACTED_VALUES = [
    (
        "bearer",
        "curl -H 'Authorization: Bearer abc123def456ghi789jkl' https://x",
        f"curl -H 'Authorization: Bearer {REDACTED}' https://x",
    ),
    ("bearer", "bearer 0a1b2c3d4e5f6a7b8c9d", f"bearer {REDACTED}"),
    ("bearer", "BEARER tok_live_ABCDEFGHIJKLMNOP", f"BEARER {REDACTED}"),
    ("openai_anthropic_key", "use sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c now", f"use {REDACTED} now"),
    ("openai_anthropic_key", "sk-ant-api03-AbCdEf0123456789_-xyzXYZ0123456789", REDACTED),
    ("openai_anthropic_key", "key=sk-0123456789abcdefghijABCDEFGHIJ", f"key={REDACTED}"),
    ("aws_access_key_id", "id AKIAIOSFODNN7EXAMPLE here", f"id {REDACTED} here"),
    ("aws_access_key_id", "ASIAY34FZKBOKMUTVV7A", REDACTED),
    ("jwt", f"token was {JWT}.", f"token was {REDACTED}."),
    (
        "github_token",
        "git clone https://ghp_" + "a1B2c3D4e5" * 4 + "@github.com/o/r",
        "git clone https://" + REDACTED + "@github.com/o/r",
    ),
    ("github_token", "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", REDACTED),
    ("slack_token", "SLACK=xoxb-1234567890-0987654321-AbCdEfGhIjKl", f"SLACK={REDACTED}"),
    ("slack_token", "xoxp-12345678901-abcdef", REDACTED),
    ("private_key_pem", f"key:\n{PEM}\nend", f"key:\n{REDACTED}\nend"),
    ("private_key_pem", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA (cut off", REDACTED),
    (
        "url_password",
        "DATABASE_URL=postgres://app:hunter2@db.internal:5432/app",
        f"DATABASE_URL=postgres://app:{REDACTED}@db.internal:5432/app",
    ),
    ("url_password", "fetch https://user:p%40ss@example.com/x", f"fetch https://user:{REDACTED}@example.com/x"),
    (
        "secret_assignment",
        "GET /cb?code=1&access_token=abc123&state=x",
        f"GET /cb?code=1&access_token={REDACTED}&state=x",
    ),
    ("secret_assignment", "export OPENAI_API_KEY=not-an-sk-key", f"export OPENAI_API_KEY={REDACTED}"),
    (
        "secret_assignment",
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        f"aws_secret_access_key = {REDACTED}",
    ),
    (
        "secret_assignment",
        'body {"user": "ann", "password": "hunter2"}',
        f'body {{"user": "ann", "password": "{REDACTED}"}}',
    ),
    ("secret_assignment", "login password=hunter2 ok", f"login password={REDACTED} ok"),
    # Normalised first: case, zero-width characters, %XX, keys glued into identifiers.
    ("openai_anthropic_key", "SK-PROJ-4F9A8B7C6D5E4F3A2B1C0D9E8F7A6B5C", REDACTED),
    ("openai_anthropic_key", "ref my_sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c", f"ref my_{REDACTED}"),
    ("openai_anthropic_key", "key sk-\u200bproj-4f9a8b7c6d5e4f3a2b1c0d9e8f", f"key {REDACTED}"),
    ("openai_anthropic_key", "q=sk%2Dproj%2D4f9a8b7c6d5e4f3a2b1c0d9e8f&x=1", f"q={REDACTED}&x=1"),
    # A bare % beside a %XX (prose before an encoded key): the text is still decoded.
    ("openai_anthropic_key", "a 4% fee; q=sk%2dproj%2D4f9a8b7c6d5e4f3a2b1c0d9e8f", f"a 4% fee; q={REDACTED}"),
    ("aws_access_key_id", "wfver_AKIAIOSFODNN7EXAMPLE", f"wfver_{REDACTED}"),
    ("aws_access_key_id", "id=AKIA\ufeffIOSFODNN7EXAMPLE", f"id={REDACTED}"),
]

KEPT_VALUES = [
    ("bearer", "the bearer of bad news"),
    ("bearer", "Bearer responsibilities matter"),  # 16+ letters, no digit or symbol: a word
    ("bearer", "token_type: bearer"),
    ("openai_anthropic_key", "sk-learn-compatible-estimator-api"),  # no digit: a slug
    ("openai_anthropic_key", "task-0123456789abcdefghijkl"),  # `sk-` inside a word
    ("openai_anthropic_key", "sk-12345"),  # too short
    ("aws_access_key_id", "AKIA is a prefix"),
    ("aws_access_key_id", "XAKIAIOSFODNN7EXAMPLE1"),  # inside a longer word
    ("aws_access_key_id", "Asia/Tokyo timezone"),
    ("jwt", "eyJhbGciOiJIUzI1NiJ9 alone"),  # one segment
    ("jwt", "hey Joe.eyJ..x"),
    ("github_token", "ghp_short"),
    ("github_token", "the gh_cli_helper module"),
    ("slack_token", "xoxb-short"),
    ("slack_token", "toxoxo-1234567890123"),
    ("private_key_pem", "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkq\n-----END PUBLIC KEY-----"),
    ("private_key_pem", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"),
    ("url_password", "postgres://postgres@127.0.0.1:5432/wt"),
    ("url_password", "https://example.com:8443/a@b"),
    ("secret_assignment", "max_tokens=100 and tokens: 5"),
    ("secret_assignment", "The password: must be eight characters"),
    ("secret_assignment", 'usage {"prompt_tokens": 12, "token_count": 3}'),
    ("secret_assignment", "a = b; key == value"),
    # Normalising changes nothing that holds no secret: %XX and zero-width characters stay.
    ("openai_anthropic_key", "q=hello%20world&sk%2Dshort"),
    ("openai_anthropic_key", "100% of the sk-proj% budget, 4%% off, %zz and %4"),  # no %XX to decode
    ("openai_anthropic_key", "zero\u200bwidth joiner task-\u200d0123456789abcdefghijkl"),
]


@pytest.mark.parametrize(("rule", "sent", "stored"), REDACTED_VALUES, ids=lambda v: v if len(v) < 25 else None)
def test_secret_shaped_values_are_redacted_inside_text(append, rule: str, sent: str, stored: str) -> None:
    payload = _note(append, "run_v", text=sent, nested={"list": [sent]})
    assert payload == {"text": stored, "nested": {"list": [stored]}}, rule


@pytest.mark.parametrize(("rule", "sent"), KEPT_VALUES, ids=lambda v: v if len(v) < 25 else None)
def test_ordinary_values_near_a_rule_are_kept(append, rule: str, sent: str) -> None:
    assert _note(append, "run_v", text=sent) == {"text": sent}, rule


def test_every_value_rule_has_cases_on_both_sides() -> None:
    names = {r.name for r in BUILTIN_VALUE_RULES}
    assert {case[0] for case in REDACTED_VALUES} == names
    assert {case[0] for case in KEPT_VALUES} == names


@pytest.mark.parametrize("rule", BUILTIN_VALUE_RULES, ids=lambda r: r.name)
def test_each_rule_redacts_its_documented_example(rule: Any) -> None:
    assert rule.sub(rule.example) != rule.example
    assert "[REDACTED]" in Redactor().scrub(rule.example)


def test_values_are_redacted_in_lists_and_not_in_key_names(append) -> None:
    key = "sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c"
    stored = _note(append, "run_v", items=["a", "AKIAIOSFODNN7EXAMPLE", 3, None, True], other={key: "x"})
    assert stored == {"items": ["a", REDACTED, 3, None, True], "other": {key: "x"}}


@pytest.mark.parametrize(
    ("sent", "stored"),
    [
        (["sk-proj-4f9a8b7c", "6d5e4f3a2b1c0d9e8f7a6b5c"], [REDACTED, REDACTED]),
        (["say ", "sk-proj-4f9a", "8b7c6d5e4f3a2b1c0d9e8f", " ok"], ["say ", REDACTED, REDACTED, " ok"]),
        (
            ["Authorization: Bearer abc123", "def456ghi789 ok", 7],
            ["Authorization: Bearer " + REDACTED, REDACTED + " ok", 7],
        ),
        (["AKIAIOSF", "ODNN7EXAMPLE"], [REDACTED, REDACTED]),
        # pieces that only look alike, and a number between the halves
        (["hello ", "world"], ["hello ", "world"]),
        (["task-", "0123456789abcdefghijkl"], ["task-", "0123456789abcdefghijkl"]),
        (["sk-proj-4f9a8b7c", 1, "6d5e4f3a2b1c0d9e8f7a6b5c"], ["sk-proj-4f9a8b7c", 1, "6d5e4f3a2b1c0d9e8f7a6b5c"]),
    ],
)
def test_a_secret_split_across_list_items_is_redacted_piece_by_piece(
    append, sent: list[Any], stored: list[Any]
) -> None:
    assert _note(append, "run_split", chunks=sent) == {"chunks": stored}


def test_workspace_patterns_also_see_secrets_split_across_items(workspace, append) -> None:
    workspace.redact_value_patterns = [r"cust-[0-9]{6}"]
    workspace.save()
    assert _note(append, "run_split", chunks=["id cust-12", "3456 done"]) == {
        "chunks": [f"id {REDACTED}", f"{REDACTED} done"]
    }


# --- workspace extras -------------------------------------------------------------------------


def test_workspace_keys_and_patterns_apply_with_the_builtins(workspace, append) -> None:
    workspace.redact_keys = ["customerEmail", "internal-note"]
    workspace.redact_value_patterns = [r"ord_[0-9]{5}", r"\b[\w.+-]+@example\.com\b"]
    workspace.save()
    stored = _note(
        append,
        "run_w",
        customer_email="a@b.c",
        INTERNAL_NOTE={"x": 1},
        text="order ord_88213 for ann@example.com, key sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c",
        emailCount=2,
    )
    assert stored == {
        "customer_email": REDACTED,
        "INTERNAL_NOTE": REDACTED,
        "emailCount": 2,
        "text": f"order {REDACTED} for {REDACTED}, key {REDACTED}",
    }


def test_a_stored_pattern_that_is_invalid_is_ignored_not_a_failure(workspace, append) -> None:
    workspace.redact_value_patterns = ["(unclosed", "(?=a)a+$", r"ord_\d+"]
    workspace.save()
    assert _note(append, "run_w", text="ord_1 aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!") == {
        "text": f"{REDACTED} aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!"
    }
    assert policy(workspace.redact_keys, workspace.redact_value_patterns).invalid_patterns == ["(unclosed", "(?=a)a+$"]


def test_one_compiled_policy_per_rule_set() -> None:
    assert policy(["a"], ["b+"]) is policy(("a",), ("b+",))
    assert policy(["a"], ["b+"]) is not policy(["a"], ["c+"])


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("(unclosed", "cannot be used: missing \\)"),
        ("(?=x)y", "lookarounds"),
        ("x(?<!y)", "lookarounds"),
        (r"(a)\1", "backreferences"),
        ("a++", "possessive"),
        (r"\w{1,1000}", "too complex"),
        ("a?", "matches the empty string"),
        (r"\b", "matches the empty string"),
        ("", "non-empty"),
        ("x" * 501, "at most 500"),
        (5, "non-empty string"),
    ],
)
def test_bad_value_patterns_are_refused_with_the_reason(pattern: Any, why: str) -> None:
    with pytest.raises(InvalidRule, match=why):
        check_pattern(pattern)


@pytest.mark.parametrize(
    "pattern",
    [
        r"ord_[0-9]{5}",
        r"[\w.+-]+@[\w-]+\.[\w.-]+",
        r"(ab){2}c",
        r"(?i)acme-\d+",
        r"(x|y)+z",
        # Catastrophic for a backtracking engine, linear on RE2 (test_linear_time.py feeds them 1 MB).
        r"\w*\w*\w*\w*!",
        "(a+)+$",
        r"(\w*\s?)*x",
        r"(?:\.[\w-]+)+",
    ],
)
def test_ordinary_value_patterns_are_accepted(pattern: str) -> None:
    assert check_pattern(pattern) == pattern


def test_rules_are_trimmed_deduplicated_and_capped() -> None:
    assert check_rules([" a ", "a", "b"], ["x+", "x+"]) == (["a", "b"], ["x+"])
    with pytest.raises(InvalidRule, match="at most 100"):
        check_rules(["k"] * 101, [])
    with pytest.raises(InvalidRule, match="not a key name"):
        check_rules(["__"], [])


# --- before storage, before hashing -------------------------------------------------------------


def test_event_id_is_computed_over_the_redacted_payload(append) -> None:
    append("run_h", started())
    env = append("run_h", ev("custom.login", user="ann", api_key="k-123", note="Bearer abcdef0123456789xyz")).events[0]
    redacted = {"user": "ann", "api_key": REDACTED, "note": f"Bearer {REDACTED}"}
    assert env["payload"] == redacted
    assert env["eventId"] == event_id(run_id="run_h", sequence=2, type="custom.login", payload=redacted)
    assert json.loads(_stored("run_h", 2)) == redacted


def test_a_retry_with_another_secret_value_is_the_same_event(append) -> None:
    append("run_h", started())
    first = append(
        "run_h", {**ev("custom.call", headers={"X-Api-Key": "one"}, log="token=aaa1"), "idempotencyKey": "k"}
    ).events[0]
    again = append(
        "run_h", {**ev("custom.call", headers={"X-Api-Key": "two"}, log="token=bbb2"), "idempotencyKey": "k"}
    ).events[0]
    assert again["replayed"] and again["eventId"] == first["eventId"]


def test_the_interop_vectors_append_to_the_same_event_ids(append) -> None:
    vectors = json.loads(VECTORS.read_text())
    order = [v for v in vectors["events"] if v["runId"] == "run_order"]
    got = append("run_order", *({"type": v["type"], "payload": v["payload"]} for v in order)).events
    assert [e["eventId"] for e in got] == [v["eventId"] for v in order]
    for vector in vectors["events"]:
        assert Redactor()(vector["payload"]) == vector["payload"]


def test_a_lone_surrogate_does_not_stop_redaction_around_it() -> None:
    key = "sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c"
    assert Redactor().scrub(f"\ud800{key} \udfff x") == f"\ud800{REDACTED} \udfff x"
    assert Redactor()([f"{key[:10]}\ud800", key[10:]]) == [f"{key[:10]}\ud800", key[10:]]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("type", "custom.sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c"),
        ("idempotencyKey", "step-1-AKIAIOSFODNN7EXAMPLE"),
        ("idempotencyKey", "retry:password=hunter2"),
    ],
)
def test_a_secret_in_the_type_or_idempotency_key_is_refused(append, field: str, value: str) -> None:
    from ledger.errors import InvalidEvent

    append("run_env", started())
    event = {**ev("custom.note", text="x"), field: value}
    for _ in range(2):  # and again: the type's verdict is remembered, not forgotten
        with pytest.raises(InvalidEvent) as refused:
            append("run_env", event)
        assert refused.value.details == {"index": 0, "field": field}
    assert Event.objects.filter(run__run_id="run_env").count() == 1
    assert append("run_env", {**ev("custom.note", text="x"), "idempotencyKey": "step-1-ordinary"}).events


def test_a_type_is_judged_by_its_redactor_every_time_it_comes() -> None:
    """The verdict on a type is remembered per rule set: a batch names a few types many times."""
    builtins, own = Redactor(), Redactor((), [r"custom\.ord_\d+"])
    for _ in range(2):  # the second answer is the remembered one
        assert builtins.changes_name("custom.AKIAIOSFODNN7EXAMPLE")
        assert not builtins.changes_name("custom.ord_12")
        assert own.changes_name("custom.ord_12")
        assert not own.changes_name("harness.model.responded")


@pytest.mark.django_db(transaction=True)
def test_a_secret_shaped_type_is_a_400_through_the_api(workspace) -> None:
    from tests.conftest import http_client

    key = create_key(workspace=workspace, scopes=["ingest"])[1]
    api = http_client(headers={"Authorization": f"Bearer {key}"})
    body = {"events": [{"type": "custom.AKIAIOSFODNN7EXAMPLE", "payload": {}}]}
    answer = api.post("/api/v1/runs/run_envapi/events", json=body)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_event"
    assert answer.json()["error"]["details"]["field"] == "type"


def test_patterns_naming_the_same_group_still_apply_each() -> None:
    redactor = Redactor((), [r"(?P<n>ord_\d+)", r"(?P<n>inv_\d+)"])
    assert redactor.scrub("ord_1 and inv_2") == f"{REDACTED} and {REDACTED}"
