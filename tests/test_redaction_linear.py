"""Redaction cannot stall the process (docs/security.md "Linear time"): every value pattern, built
in or a workspace's, is compiled by RE2, whose work per byte of text is bounded by the size of its
program; the stdlib `re` never sees a tenant's pattern; a pattern RE2 cannot run that way is
refused on save. Each rule and each accepted catastrophic-for-backtracking pattern gets 1 MB of
adversarial text through the one write path. No timing: the bound is the engine's, by
construction, and the test checks that it is the engine in use and that the bound holds."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import re2

from ledger.log.artifacts import get_by_ref, read_bytes
from ledger.models import Event
from ledger.redaction import (
    BUILTIN_VALUE_RULES,
    MAX_PROGRAM_SIZE,
    MAX_TOTAL_PROGRAM_SIZE,
    REDACTED,
    InvalidRule,
    check_pattern,
    check_rules,
    policy,
)
from tests.conftest import ev, started

REPORTED = r"\w*\w*\w*\w*!"  # the security review's pattern: 4.2 s for 152 characters under `re`
MB = 1_000_000

# Each built-in rule's worst shape for a backtracking engine: a prefix that starts a match over and
# over, never completed (or completed only at the very end).
ADVERSARIAL = {
    "bearer": "bearer " * (MB // 7),
    "openai_anthropic_key": "sk-" * (MB // 3),
    "aws_access_key_id": "AKIA" * (MB // 4),
    "jwt": "eyJaaaaa." * (MB // 9),
    "github_token": "ghp_" * (MB // 4),
    "slack_token": "xoxb-" * (MB // 5),
    "private_key_pem": "-----BEGIN RSA PRIVATE KEY-----" * (MB // 31),
    "url_password": "a://b:" * (MB // 6),
    "secret_assignment": "token" * (MB // 5),
}
# Accepted workspace patterns that backtrack catastrophically under `re`, and their worst text.
USER_PATTERNS = {
    REPORTED: "a" * MB + " !",
    "(a+)+$": "a" * MB + "!",
    r"(\w*\s?)*x": "ab " * (MB // 3),
    r"(?:\.[\w-]+)+@": ".a" * (MB // 2),
}


def test_the_reported_pattern_compiles_on_re2_and_re_never_sees_it(monkeypatch) -> None:
    seen: list[Any] = []
    real = re._compile  # type: ignore[attr-defined]

    def spy(pattern: Any, flags: Any) -> Any:
        seen.append(pattern)
        return real(pattern, flags)

    monkeypatch.setattr(re, "_compile", spy)
    assert check_rules([], [REPORTED]) == ([], [REPORTED])
    redactor = policy(["customer"], [REPORTED, "(a+)+$"])
    assert [type(p).__module__ for p in redactor.patterns] == ["re2", "re2"]
    assert redactor.scrub("a" * 150 + "!") == REDACTED
    assert redactor.scrub("a" * 150 + " !") == "a" * 150 + " " + REDACTED
    assert REPORTED not in seen and "(a+)+$" not in seen


@pytest.mark.parametrize(
    ("pattern", "why"),
    [("(?=a)a", "lookarounds"), (r"(\w)\1", "backreferences"), ("a*+", "possessive"), (r"\w{1,1000}", "too complex")],
)
def test_what_re2_cannot_run_in_linear_time_is_refused_with_the_reason(pattern: str, why: str) -> None:
    with pytest.raises(InvalidRule, match=why):
        check_pattern(pattern)


def test_the_patterns_of_a_workspace_are_bounded_together() -> None:
    big = r"\pL+\d{4}"  # about 1,200 instructions (the Unicode letter class)
    assert re2.compile(big).programsize <= MAX_PROGRAM_SIZE
    many = [big + f"x{i}" for i in range(MAX_TOTAL_PROGRAM_SIZE // re2.compile(big).programsize + 1)]
    with pytest.raises(InvalidRule, match="together"):
        check_rules([], many)


def test_every_builtin_rule_runs_on_re2_with_a_small_program() -> None:
    for rule in BUILTIN_VALUE_RULES:
        assert type(rule.regex).__module__ == "re2", rule.name
        assert rule.regex.programsize <= 200, rule.name
    assert set(ADVERSARIAL) == {rule.name for rule in BUILTIN_VALUE_RULES}


def _stored(workspace: Any, run_id: str) -> dict[str, Any]:
    """The payload as stored, its fields moved to artifacts (a megabyte is past the inline limit) read back."""
    payload = json.loads(Event.objects.get(run__run_id=run_id, sequence=2).payload)
    return {
        name.removesuffix("Ref"): json.loads(read_bytes(get_by_ref(workspace, value)))
        if name.endswith("Ref")
        else value
        for name, value in payload.items()
    }


@pytest.mark.parametrize("rule", sorted(ADVERSARIAL))
def test_a_megabyte_of_adversarial_text_per_builtin_rule(workspace, append, rule: str) -> None:
    text = ADVERSARIAL[rule]
    append("run_adv", started())
    append("run_adv", ev("custom.note", text=text))
    stored = _stored(workspace, "run_adv")["text"]
    # Bounded work: the engine in use does at most a constant times its program per byte, and the
    # answer is what the rule says (most of these never complete a match).
    assert len(stored) <= len(text)
    if rule == "private_key_pem":  # a block cut off runs to the end of the text
        assert stored == REDACTED
    if rule == "secret_assignment":
        assert stored == text  # `token` never followed by `=`


def test_a_megabyte_of_adversarial_text_per_accepted_workspace_pattern(workspace, append) -> None:
    workspace.redact_value_patterns = list(USER_PATTERNS)
    workspace.save()
    redactor = policy(workspace.redact_keys, workspace.redact_value_patterns)
    assert redactor.invalid_patterns == []
    assert sum(p.programsize for p in redactor.patterns) <= MAX_TOTAL_PROGRAM_SIZE
    append("run_adv", started())
    append("run_adv", ev("custom.note", **{f"t{i}": text for i, text in enumerate(USER_PATTERNS.values())}))
    stored = _stored(workspace, "run_adv")
    assert stored["t0"] == "a" * MB + " " + REDACTED  # `\w*\w*\w*\w*!` matches only ` !`'s `!`
    assert stored["t1"] == REDACTED  # `a…a!` is one match of the first pattern
    assert stored["t3"] == ".a" * (MB // 2 - 1) + "." + REDACTED  # no `@`; `(a+)+$` takes the last a
