"""/concepts/: docs/concepts.md, the words the console uses, as a page of the console (linked from
every page's footer). Rendered from the Markdown file itself, so the page and the document never
say different things; its links to other documents of the repository become their names (they are
files of the checkout, not pages). Its links to console pages are offered as the rest of the
console offers actions, only where they work: a signed-in member reads a page their role cannot
open as plain text with the role it needs ("re-execution form (operators and up)"), and another
tenant's page as plain text; a visitor not signed in gets every link (they lead to the login)."""

from __future__ import annotations

import copy
import re
from functools import cache

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_safe
from markdown_it import MarkdownIt
from markdown_it.token import Token

from .guard import ROLE_NOTES, Reach, switcher

CONCEPTS = settings.BASE_DIR / "docs" / "concepts.md"
_PAGE_LINK = re.compile(r"^/(?!/)")


# No raw HTML from the file (it is shown as text), so nothing in it can break the page's CSP.
_MARKDOWN = MarkdownIt("commonmark", {"html": False})


@cache
def _tokens() -> list[Token]:
    return _MARKDOWN.parse(CONCEPTS.read_text(encoding="utf-8"))


def _rendered(reach: Reach | None) -> SafeString:
    """The document for a member's `reach` (None: a visitor not signed in)."""
    tokens = copy.deepcopy(_tokens())
    for block in tokens:
        if not block.children:
            continue
        children, refusals = [], []
        for token in block.children:
            children.append(token)
            if token.type == "link_open":
                href = str(token.attrGet("href") or "")
                refusal = "" if not _PAGE_LINK.match(href) else (None if reach is None else reach.refusal(href))
                refusals.append(refusal)
                if refusal is not None:
                    token.tag, token.attrs = "span", {"class": "doc-ref" if not _PAGE_LINK.match(href) else "gated"}
            elif token.type == "link_close":
                refusal = refusals.pop()
                if refusal is not None:
                    token.tag = "span"
                if refusal:
                    children.append(Token("text", "", 0, content=f" ({ROLE_NOTES[refusal]})"))
        block.children = children
    return mark_safe(_MARKDOWN.renderer.render(tokens, _MARKDOWN.options, {}))  # noqa: S308 (html off above)


@require_safe
def concepts_page(request: HttpRequest) -> HttpResponse:
    """Open to anyone, signed in or not: it holds no tenant's data, only the words (and, for a
    member, the workspace switcher every page has)."""
    if not request.user.is_authenticated:
        return render(request, "console/concepts.html", {"body": _rendered(None), "workspaces": []})
    context = {"body": _rendered(Reach.of(request.user)), "workspaces": switcher(request)}
    return render(request, "console/concepts.html", context)


urlpatterns = [path("concepts/", concepts_page, name="concepts")]
