"""docs/api.md, the contract in prose, and the OpenAPI schema at /api/schema/, the contract in
machine form, say the same thing: the same operations, each with the same success statuses and the
same error codes per status; every field, parameter and enumerated value of the schema is named in
docs/api.md; and every error code the code can answer (each LedgerError subclass, the API's own
codes for DRF's and Django's failures) is in its table of error codes, and nothing else is. So a
new endpoint, field or error code that is not documented fails here."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

import console
import ledger
from console.api import errors as api_errors
from ledger.errors import LedgerError

pytestmark = pytest.mark.backend_independent

ROOT = Path(__file__).resolve().parent.parent
API_MD = ROOT / "docs" / "api.md"
METHODS = ("get", "post", "put", "patch", "delete")
OPERATION = re.compile(r"^### `(GET|POST|PUT|PATCH|DELETE) (/api/\S+)`\s*$", re.M)
API_PATH = re.compile(r"/api/v1/[A-Za-z0-9_{}./-]*[A-Za-z0-9_}]")
STATUS_CODES = re.compile(r"\b([1-5]\d\d) ((?:`[a-z_]+`(?:, )?)+)")
CODE_ROW = re.compile(r"^\| `([a-z_]+)` \| (\d{3}) \| ([^|]+) \|", re.M)

Operation = tuple[str, str]  # ("POST", "/api/v1/runs/{}/events")


def _path(path: str) -> str:
    """A path as both sides spell it: parameters unnamed ({run_id} and {runId} alike), no query."""
    return re.sub(r"\{[^}]*\}", "{}", path.split("?", 1)[0])


@cache
def schema() -> dict[str, Any]:
    response = Client().get("/api/schema/?format=json")
    assert response.status_code == 200
    loaded: dict[str, Any] = response.json()
    return loaded


def _schema_operations() -> dict[Operation, dict[str, Any]]:
    return {
        (method.upper(), _path(path)): operation
        for path, item in schema()["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    }


def _declared_codes(response: dict[str, Any]) -> list[str]:
    """The error codes a response's description declares (console/api/schema.py error_responses)."""
    description = response.get("description", "")
    return re.findall(r"`([a-z_]+)`", description.split("Error codes:", 1)[1]) if "Error codes:" in description else []


def _schema_errors(operation: dict[str, Any]) -> dict[str, set[str]]:
    return {
        status: set(codes)
        for status, response in operation["responses"].items()
        if (codes := _declared_codes(response))
    }


def _schema_successes(operation: dict[str, Any]) -> set[str]:
    return {status for status in operation["responses"] if status[0] in "23"}


@cache
def doc() -> str:
    return API_MD.read_text()


def _doc_operations() -> dict[Operation, str]:
    """Each `### \\`METHOD /path\\`` heading and its text; headings stacked without text of their own
    share the text of the one below them."""
    text = doc()
    found = list(OPERATION.finditer(text))
    sections: dict[Operation, str] = {}
    pending: list[Operation] = []
    for index, match in enumerate(found):
        start = match.end()
        end = found[index + 1].start() if index + 1 < len(found) else len(text)
        body = re.split(r"^#{1,3} ", text[start:end], maxsplit=1, flags=re.M)[0]
        operation = (match.group(1), _path(match.group(2)))
        assert operation not in sections and operation not in pending, f"{operation} documented twice"
        pending.append(operation)
        if body.strip():
            sections.update(dict.fromkeys(pending, body))
            pending = []
    assert not pending, f"no text under {pending}"
    return sections


def _paragraph(body: str, label: str, operation: Operation) -> str:
    paragraphs = [p for p in re.split(r"\n\s*\n", body) if p.startswith(f"{label}:")]
    assert len(paragraphs) == 1, f"{operation}: one '{label}:' paragraph expected, found {len(paragraphs)}"
    return " ".join(paragraphs[0].split())


def _doc_errors(body: str, operation: Operation) -> dict[str, set[str]]:
    line = _paragraph(body, "Errors", operation)
    return {status: set(re.findall(r"`([a-z_]+)`", codes)) for status, codes in STATUS_CODES.findall(line)}


def _doc_successes(body: str, operation: Operation) -> set[str]:
    line = _paragraph(body, "Answers", operation)
    return set(re.findall(r"(?<![\w.])([23]\d\d)(?!\w|\.\d)", line))


# --- what the code can answer --------------------------------------------------------------------


def _import_everything() -> None:
    for package in (ledger, console):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if ".migrations" not in module.name:
                importlib.import_module(module.name)


def _subclasses(cls: type) -> list[type]:
    found, stack = [], [cls]
    while stack:
        found.append(current := stack.pop())
        stack.extend(current.__subclasses__())
    return found


def _literal_error_bodies() -> set[str]:
    """Codes written where an error body is built by hand: error_body("code", …)."""
    codes = set()
    for package in ("console", "ledger"):
        for source in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "id", getattr(node.func, "attr", "")) == "error_body"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                ):
                    codes.add(node.args[0].value)
    return codes


@cache
def answerable_codes() -> frozenset[str]:
    """Every error code anything in ledger/ or console/ can put in an error body."""
    _import_everything()
    classes = _subclasses(LedgerError)
    codes = {cls.code for cls in classes}
    # fastjson.BadBody takes the code of the view that parsed the body (its invalid_body_code).
    for module in pkgutil.walk_packages(console.__path__, "console."):
        for value in vars(importlib.import_module(module.name)).values():
            if isinstance(value, type) and isinstance(getattr(value, "invalid_body_code", None), str):
                codes.add(value.invalid_body_code)
    codes.update(code for _, code, _ in api_errors._DRF_CODES)
    codes.update(code for code, _ in api_errors._PAGES.values())
    codes.update({api_errors.NOT_FOUND[0], api_errors.INTERNAL[0]})
    codes.update(_literal_error_bodies())
    return frozenset(codes)


def _code_table() -> dict[str, tuple[str, str]]:
    section = doc().split("\n## Error codes\n", 1)[1].split("\n## ", 1)[0]
    rows = CODE_ROW.findall(section)
    table = {code: (status, where.strip()) for code, status, where in rows}
    assert len(table) == len(rows), "a code listed twice"
    assert [code for code, _, _ in rows] == sorted(table), "keep the table in alphabetical order"
    return table


# --- the tests -----------------------------------------------------------------------------------


def test_every_operation_of_the_schema_is_documented_and_nothing_else() -> None:
    in_schema, in_doc = set(_schema_operations()), set(_doc_operations())
    assert sorted(in_schema - in_doc) == [], "in the schema, not in docs/api.md"
    assert sorted(in_doc - in_schema) == [], "in docs/api.md, not in the schema"


def test_every_api_path_docs_api_md_mentions_exists() -> None:
    """Templates and the examples' concrete paths alike (`/api/v1/runs/run_doc/events`)."""
    templates = [re.compile(re.escape(_path(path)).replace(r"\{\}", "[^/]+") + "$") for path in schema()["paths"]]
    mentioned = {_path(path) for path in API_PATH.findall(doc())}
    assert sorted(path for path in mentioned if not any(t.match(path) for t in templates)) == []


@pytest.mark.parametrize("operation", sorted(_doc_operations()), ids=" ".join)
def test_each_operation_answers_and_errors_as_the_schema_declares(operation: Operation) -> None:
    declared = _schema_operations().get(operation)
    assert declared is not None, f"{operation} is not in the schema"
    body = _doc_operations()[operation]
    assert _doc_successes(body, operation) == _schema_successes(declared)
    assert _doc_errors(body, operation) == _schema_errors(declared)


def test_every_field_parameter_and_enumerated_value_of_the_schema_is_named() -> None:
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            names.update(node.get("properties", {}))
            names.update(str(value) for value in node.get("enum", []) if value)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema()["components"])
    for operation in _schema_operations().values():
        # Path parameters are named in the paths themselves (camelCase there: {runId}, not {run_id}).
        names.update(parameter["name"] for parameter in operation.get("parameters", []) if parameter["in"] != "path")
        walk(operation.get("parameters", []))
    text = doc()
    missing = sorted(name for name in names if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text))
    assert missing == []


def test_every_error_code_the_code_can_answer_is_in_the_table_and_only_those() -> None:
    documented = set(_code_table())
    declared = {
        code
        for operation in _schema_operations().values()
        for codes in _schema_errors(operation).values()
        for code in codes
    }
    answerable = answerable_codes() | declared
    assert sorted(answerable - documented) == [], "answered, not in docs/api.md § Error codes"
    assert sorted(documented - answerable) == [], "in docs/api.md § Error codes, answered by nothing"


def test_each_code_the_schema_declares_is_marked_as_an_api_answer_with_its_status() -> None:
    table = _code_table()
    for operation in _schema_operations().values():
        for status, codes in _schema_errors(operation).items():
            for code in codes:
                assert "API" in table[code][1], f"{code} is answered by the API: its row should say so"
                assert table[code][0] == status, f"{code}: the table says {table[code][0]}, the schema {status}"


def test_each_error_class_status_matches_the_table() -> None:
    answerable_codes()
    table = _code_table()
    for cls in _subclasses(LedgerError):
        if cls.code in table and cls.__dict__.get("code"):
            assert table[cls.code][0] == str(cls.status), f"{cls.__qualname__}: {cls.code} is {cls.status}"
