"""/concepts/: docs/concepts.md, the words the console uses, as a page of the console (linked from
every page's footer). Rendered from the Markdown file itself, so the page and the document never
say different things; its links to console pages work as they are, its links to other documents
of the repository become their names (they are files of the checkout, not pages)."""

from __future__ import annotations

import re
from functools import cache

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_safe
from markdown_it import MarkdownIt

from ledger.reads import selectors

CONCEPTS = settings.BASE_DIR / "docs" / "concepts.md"
_PAGE_LINK = re.compile(r"^/(?!/)")


@cache
def _rendered() -> SafeString:
    # No raw HTML from the file (it is shown as text), so nothing in it can break the page's CSP.
    markdown = MarkdownIt("commonmark", {"html": False})
    tokens = markdown.parse(CONCEPTS.read_text(encoding="utf-8"))
    for block in tokens:
        links = []
        for token in block.children or []:
            if token.type == "link_open":
                links.append(_PAGE_LINK.match(str(token.attrGet("href") or "")) is not None)
                if not links[-1]:
                    token.tag, token.attrs = "span", {"class": "doc-ref"}
            elif token.type == "link_close" and not links.pop():
                token.tag = "span"
    return mark_safe(markdown.renderer.render(tokens, markdown.options, {}))  # noqa: S308 (html off above)


@require_safe
def concepts_page(request: HttpRequest) -> HttpResponse:
    """Open to anyone, signed in or not: it holds no tenant's data, only the words (and, for a
    member, the workspace switcher every page has)."""
    workspaces = selectors.workspaces_for(request.user) if request.user.is_authenticated else []
    return render(request, "console/concepts.html", {"body": _rendered(), "workspaces": workspaces})


urlpatterns = [path("concepts/", concepts_page, name="concepts")]
