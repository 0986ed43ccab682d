"""The layers stay true: ledger/ is the domain, console/api, console/pages and console/live are its
transports. Checked by the import contracts in pyproject.toml (`lint-imports`, in `make lint` and
CI) and by a scan for ORM managers in console/ (the import graph cannot see an attribute). Each
check is shown failing on a deliberate violation, so one that stopped looking would be noticed."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
# Manager attributes: `.objects` and the two managers Django gives every model besides it.
MANAGERS = frozenset({"objects", "_default_manager", "_base_manager"})
CONTRACTS = [c["name"] for c in
             tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]]


def orm_uses(root: Path) -> list[str]:
    """`path:line` of every model-manager access in console/ under `root` (migrations aside)."""
    found = []
    for path in sorted((root / "console").rglob("*.py")):
        relative = path.relative_to(root)
        if "migrations" in relative.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute) and node.attr in MANAGERS:
                found.append((str(relative), node.lineno))
    return [f"{name}:{line}" for name, line in sorted(found)]


def test_an_orm_query_in_the_console_is_named_by_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "console" / "pages").mkdir(parents=True)
    (tmp_path / "console" / "pages" / "leak.py").write_text(
        '"""Run.objects in a docstring is not a query."""\n'
        "from ledger.models import Run\n\n\n"
        "def newest():\n"
        "    return Run.objects.order_by('-pk').first()\n"
    )
    (tmp_path / "console" / "migrations").mkdir()
    (tmp_path / "console" / "migrations" / "0001_initial.py").write_text("rows = Run._default_manager.all()\n")

    assert orm_uses(tmp_path) == ["console/pages/leak.py:6"]


def _copy_of_the_tree(destination: Path) -> Path:
    for package in ("ledger", "console"):
        shutil.copytree(REPO_ROOT / package, destination / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", destination / "pyproject.toml")
    return destination


def test_an_import_across_a_layer_breaks_its_contract(tmp_path: Path) -> None:
    tree = _copy_of_the_tree(tmp_path)
    # module written, its one import, the import lint-imports reports (an external package by its
    # top-level name), and the contract that import breaks
    violations = [
        ("ledger/_violation_console.py", "from console.api import urls", "console.api.urls",
         "ledger (the domain) imports no transport: not console, DRF, htmx or Channels"),
        ("ledger/_violation_drf.py", "from rest_framework.response import Response", "rest_framework",
         "ledger (the domain) imports no transport: not console, DRF, htmx or Channels"),
        ("ledger/_violation_http.py", "from django.http import HttpResponse", "django.http",
         "ledger (the domain) uses nothing of Django's HTTP layer"),
        ("console/api/_violation_pages.py", "from console.pages import runs", "console.pages.runs",
         "The transports console.api, console.pages, console.live never import each other"),
        ("ledger/runtime/_violation_demo.py", "import ledger.demo", "ledger.demo",
         "ledger.runtime never imports the demo"),
    ]
    for module, line, _, _ in violations:
        (tree / module).write_text(f"from __future__ import annotations\n\n{line}\n")

    result = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(tree / "pyproject.toml")],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},  # the copy, not the installed checkout
        capture_output=True, text=True, timeout=120,
    )

    assert result.returncode == 1, result.stdout + result.stderr
    broken = result.stdout.split("Broken contracts", 1)[1]
    for module, _, imported, contract in violations:
        importer = module.removesuffix(".py").replace("/", ".")
        assert f"{importer} -> {imported}" in _section(broken, contract), contract


def _section(report: str, contract: str) -> str:
    """The part of lint-imports' list of broken contracts under `contract`'s heading."""
    start = report.index(contract + "\n")
    headings = [report.index(name + "\n", start + 1) for name in CONTRACTS if name + "\n" in report[start + 1:]]
    return report[start:min(headings, default=len(report))]


def test_the_console_makes_no_orm_query() -> None:
    """Views, consumers and their helpers read through ledger selectors and services only."""
    assert orm_uses(REPO_ROOT) == []
