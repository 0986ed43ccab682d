"""The repository stands on its own: nothing in it (README, docs/, code and its comments, templates)
refers to a path outside it — the design files beside the repository it once leaned on, or any relative link that
climbs out of the repository root — every relative link in its Markdown reaches a file (and
heading) that exists, every repository path a file names exists, and every console path a document
links to is a page of the console."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest
from django.urls import Resolver404, resolve

pytestmark = pytest.mark.backend_independent

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_DIRS = {
    ".git",
    ".venv",
    "var",
    "node_modules",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    ".mypy_cache",
    ".import_linter_cache",
    ".ruff_cache",
    "runledger.egg-info",
}
SKIPPED = {ROOT / "tests" / "browser" / "vendor"}  # third-party files, as shipped
TEXT_SUFFIXES = {
    ".py",
    ".md",
    ".html",
    ".css",
    ".js",
    ".toml",
    ".txt",
    ".json",
    ".yml",
    ".yaml",
    ".cfg",
    ".ini",
    ".sh",
    ".svg",
    "",
}
# The files outside the repository that it used to name: the design, the contract, the style
# guide, the vectors and the reference documents of the directory beside the checkout.
OUTSIDE = re.compile(
    r"\.\./+shared\b"
    r"|(?<![\w./-])shared/(?:API|DESIGN|STYLE)\.md|(?<![\w./-])shared/(?:vectors|reference|hooks)\b"
    r"|(?<![\w/.-])(?:API|DESIGN|STYLE)\.md\b"  # their names alone: docs/api.md and docs/design.md now
    r"|/work/(?:shared|main|helpers|wt-)"
)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|^\s*\[[^\]]+\]:\s*(\S+)", re.M)
# A file of the repository named by its path: documents anywhere; code, data and pictures in the
# documents (code names template paths relative to templates/, and files its tests create).
DOC_PATH = re.compile(r"(?<![\w./$-])((?:docs|bench|client|tests)/[\w./-]*\w\.md)\b")
REPO_PATH = re.compile(
    r"(?<![\w./$-])((?:docs|bench|bin|client|console|ledger|reliability|static|tests)/[\w./-]*[a-z0-9_]\.(?:md|py|json|toml|png|svg|js|css))\b"
)


def _files() -> Iterator[Path]:
    stack = [ROOT]
    while stack:
        for path in sorted(stack.pop().iterdir()):
            if path.is_dir():
                if path.name not in SKIPPED_DIRS and path not in SKIPPED:
                    stack.append(path)
            elif path.suffix in TEXT_SUFFIXES and path.name not in {".installed", ".git"}:
                yield path


@cache
def texts() -> dict[Path, str]:
    found = {}
    for path in _files():
        try:
            found[path] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return found


def _markdown() -> dict[Path, str]:
    return {path: text for path, text in texts().items() if path.suffix == ".md"}


def _without_code(text: str) -> str:
    """Markdown outside fenced blocks and code spans: a `[x](y)` inside code is not a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    heading = re.sub(r"[`*_]", "", heading.strip()).lower()
    kept = "".join(ch for ch in heading if ch in " -" or unicodedata.category(ch)[0] in "LN")
    return kept.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#{1,6} (.+)$", re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M), re.M)
    return {_slug(heading) for heading in headings}


def _links() -> Iterator[tuple[Path, str]]:
    for path, text in _markdown().items():
        for match in LINK.finditer(_without_code(text)):
            yield path, match.group(1) or match.group(2)


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_no_file_refers_to_a_path_outside_the_repository() -> None:
    this_file = Path(__file__).resolve()
    found = [
        f"{_where(path)}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)}"
        for path, text in texts().items()
        if path != this_file
        for match in OUTSIDE.finditer(text)
    ]
    assert found == []


def test_relative_markdown_links_stay_inside_and_reach_what_they_name() -> None:
    broken = []
    for source, target in _links():
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
            continue  # another site, or a console path (the next test)
        file_part, _, anchor = target.partition("#")
        destination = (source.parent / unquote(file_part)).resolve() if file_part else source
        if not destination.is_relative_to(ROOT):
            broken.append(f"{_where(source)}: {target} leaves the repository")
        elif not destination.exists():
            broken.append(f"{_where(source)}: {target} does not exist")
        elif anchor and destination.suffix == ".md" and anchor not in _anchors(destination):
            broken.append(f"{_where(source)}: {target} names no heading of {_where(destination)}")
    assert broken == []


def test_console_paths_linked_from_documents_are_console_pages() -> None:
    unknown = []
    for source, target in _links():
        if target.startswith("/") and not target.startswith("//"):
            try:
                resolve(target.split("#", 1)[0].split("?", 1)[0])
            except Resolver404:
                unknown.append(f"{_where(source)}: {target}")
    assert unknown == []


def test_every_repository_path_a_file_names_exists() -> None:
    named = [(path, name) for path, text in texts().items() for name in DOC_PATH.findall(text)]
    named += [(path, name) for path, text in _markdown().items() for name in REPO_PATH.findall(text)]
    this_file = Path(__file__).resolve()
    missing = sorted(
        {f"{_where(path)}: {name}" for path, name in named if path != this_file and not (ROOT / name).exists()}
    )
    assert missing == []


def test_the_readme_shows_every_picture_of_docs_img_and_each_is_small() -> None:
    """The pictures `make screenshots` takes (tests/browser/test_readme_screenshots.py) are all shown,
    and none weighs down a clone."""
    from tests.browser.test_readme_screenshots import MAX_BYTES, NAMES

    pictures = sorted((ROOT / "docs" / "img").glob("*.png"))
    shown = set(re.findall(r"!\[[^\]]*\]\(docs/img/([^)]+\.png)\)", (ROOT / "README.md").read_text()))
    assert sorted(path.name for path in pictures) == sorted(f"{name}.png" for name in NAMES) == sorted(shown)
    assert all(path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size <= MAX_BYTES for path in pictures)


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """The patterns themselves, on text written to fail them."""
    beside = "../" + "shared"  # spelled in two parts: this file refers to nothing outside the repository
    assert OUTSIDE.search(f"see {beside}/API.md") and OUTSIDE.search("(DESIGN.md §3)")
    assert OUTSIDE.search("shared/vectors/vectors.json") and not OUTSIDE.search("docs/design.md §3")
    assert LINK.search(f"[the contract](../{beside}/API.md)").group(1) == f"../{beside}/API.md"  # type: ignore[union-attr]
    assert _slug("Error codes") == "error-codes" and _slug("## `GET /api/v1/runs`".lstrip("# ")) == "get-apiv1runs"
    assert DOC_PATH.findall("(docs/nowhere.md § Settings)") == ["docs/nowhere.md"]
    assert REPO_PATH.findall("see `tests/test_nowhere.py`") == ["tests/test_nowhere.py"]
