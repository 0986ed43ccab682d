"""The conversation tab of a call that asked for several choices (OpenAI's `n`): every choice its
answer recorded in `response.messages` is shown, labelled "choice i/n", not only the first (the
call's `response.text`); a call that asked for one shows its one response as before. The tab is
the workspace's own: another tenant's member gets 404."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from ledger.models import Workspace
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db


def _answer(text: str) -> dict[str, Any]:
    return {"role": "assistant", "parts": [{"type": "text", "content": text}], "finish_reason": "stop"}


def _call(turn: int, parameters: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A model call as the OTLP receiver records one: the request's parameters, and the answer's
    text the first message's while `messages` keeps them all."""
    request = {
        "operation": "chat",
        "model": "gpt-4o",
        "parameters": parameters,
        "messages": [{"role": "user", "parts": [{"type": "text", "content": "Name a colour."}]}],
    }
    first = messages[0]["parts"][0]["content"]
    return [
        ev("harness.model.called", turn=turn, callId=f"c{turn}", promptHash=f"sha256:{turn}", request=request),
        ev(
            "harness.model.responded",
            turn=turn,
            callId=f"c{turn}",
            model={"provider": "openai", "modelId": "gpt-4o"},
            response={"text": first, "messages": messages, "usage": {"inputTokens": 10, "outputTokens": 4}},
        ),
    ]


def _conversation(client: Client, workspace: Workspace, run_id: str) -> Any:
    return client.get(reverse("run-tab", args=[workspace.tenant.slug, workspace.slug, run_id, "conversation"]))


def test_every_choice_of_a_call_that_asked_for_several_is_shown(
    append: Any, browser: Client, workspace: Workspace
) -> None:
    append(
        "run_choices",
        started(),
        *_call(1, {"choice.count": 2}, [_answer("Teal, <surely>."), _answer("Ochre.")]),  # GenAI's
        *_call(2, {"n": 3}, [_answer("Red."), _answer("Blue."), _answer("Green.")]),  # OpenInference's
        *_call(3, {"temperature": 0.2}, [_answer("Plain.")]),
        ev("RunCompleted"),
    )
    page = _conversation(browser, workspace, "run_choices")
    assert page.status_code == 200
    html = page.content.decode()
    for label, text in (
        ("choice 1/2", "Teal, &lt;surely&gt;."),
        ("choice 2/2", "Ochre."),
        ("choice 1/3", "Red."),
        ("choice 2/3", "Blue."),
        ("choice 3/3", "Green."),
    ):
        assert f'<span class="role">response · {label}</span>' in html
        after = html.split(f"response · {label}</span>", 1)[1]
        assert after.index(text) < after.index("</div>")  # the choice's own text, in its own block
    assert "Plain." in html and html.count("choice 1/") == 2  # one answer: no choice label


def test_a_call_with_one_choice_but_two_messages_reads_as_before(
    append: Any, browser: Client, workspace: Workspace
) -> None:
    """Only a call that asked for several choices has them: two answer messages of a call that
    asked for one are one response, its recorded text."""
    append("run_one", started(), *_call(1, {}, [_answer("Part one."), _answer("Part two.")]), ev("RunCompleted"))
    html = _conversation(browser, workspace, "run_one").content.decode()
    assert "choice 1/" not in html and "Part one." in html


def test_an_outsider_gets_404_for_the_conversation(
    append: Any, client: Client, workspace: Workspace, outsider: User
) -> None:
    append("run_choices", started(), *_call(1, {"n": 2}, [_answer("A."), _answer("B.")]))
    client.force_login(outsider)
    assert _conversation(client, workspace, "run_choices").status_code == 404
