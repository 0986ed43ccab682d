"""The layers stay true: ledger/ is the domain, in layers (docs/architecture.md), console/api,
console/pages and console/live are its transports. Checked by the import contracts in
pyproject.toml (`lint-imports`, in `make lint` and CI), by a walk of every import for cycles
(imports inside functions included), and by a scan for ORM managers in console/ (the import graph
cannot see an attribute). Each check is shown failing on a deliberate violation, so one that
stopped looking would be noticed."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.backend_independent

REPO_ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
# Manager attributes: `.objects` and the two managers Django gives every model besides it.
MANAGERS = frozenset({"objects", "_default_manager", "_base_manager"})
CONTRACTS = [
    c["name"] for c in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
]


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
        shutil.copytree(REPO_ROOT / package, destination / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", destination / "pyproject.toml")
    return destination


def test_an_import_across_a_layer_breaks_its_contract(tmp_path: Path) -> None:
    tree = _copy_of_the_tree(tmp_path)
    # module written, its one import, the import lint-imports reports (an external package by its
    # top-level name), and the contract that import breaks
    violations = [
        (
            "ledger/_violation_console.py",
            "from console.api import urls",
            "console.api.urls",
            "ledger (the domain) imports no transport: not console, DRF, htmx or Channels",
        ),
        (
            "ledger/_violation_drf.py",
            "from rest_framework.response import Response",
            "rest_framework",
            "ledger (the domain) imports no transport: not console, DRF, htmx or Channels",
        ),
        (
            "ledger/_violation_http.py",
            "from django.http import HttpResponse",
            "django.http",
            "ledger (the domain) uses nothing of Django's HTTP layer",
        ),
        (
            "console/api/_violation_pages.py",
            "from console.pages import runs",
            "console.pages.runs",
            "The transports console.api, console.pages, console.live never import each other",
        ),
        (
            "ledger/runtime/_violation_demo.py",
            "import ledger.demo",
            "ledger.demo",
            "ledger.runtime never imports the demo",
        ),
        (
            "ledger/log/_violation_feature.py",
            "from ledger.reexecution import services",
            "ledger.reexecution.services",
            "The layers of docs/architecture.md: nothing imports upward",
        ),
        (
            "ledger/fold/_violation_log.py",
            "from ledger.log import prepare",
            "ledger.log.prepare",
            "The layers of docs/architecture.md: nothing imports upward",
        ),
    ]
    for module, line, _, _ in violations:
        (tree / module).write_text(f"from __future__ import annotations\n\n{line}\n")

    result = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(tree / "pyproject.toml")],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},  # the copy, not the installed checkout
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 1, result.stdout + result.stderr
    broken = result.stdout.split("Broken contracts", 1)[1]
    for module, _, imported, contract in violations:
        importer = module.removesuffix(".py").replace("/", ".")
        assert f"{importer} -> {imported}" in _section(broken, contract), contract


def _section(report: str, contract: str) -> str:
    """The part of lint-imports' list of broken contracts under `contract`'s heading."""
    start = report.index(contract + "\n")
    headings = [report.index(name + "\n", start + 1) for name in CONTRACTS if name + "\n" in report[start + 1 :]]
    return report[start : min(headings, default=len(report))]


def test_the_console_makes_no_orm_query() -> None:
    """Views, consumers and their helpers read through ledger selectors and services only."""
    assert orm_uses(REPO_ROOT) == []


def import_cycles(root: Path, packages: tuple[str, ...] = ("ledger", "console")) -> list[list[str]]:
    """The import cycles among the modules of `packages` under `root`: every `import` and `from …
    import` statement counts, at module level or inside a function, a class or an `if`. Each cycle
    is the sorted list of its modules (a strongly connected component of more than one)."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
                ]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
    return _strongly_connected(edges)


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one node, iteratively (the graph has ~300 nodes)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_no_import_cycle_in_ledger_or_console() -> None:
    assert import_cycles(REPO_ROOT) == []


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    tree = _copy_of_the_tree(tmp_path)
    # The log calling a feature back from inside a function: the edge an import graph of module
    # level imports alone would miss.
    (tree / "ledger" / "log" / "_cycle.py").write_text(
        "from __future__ import annotations\n\n\ndef settle():\n"
        "    from ..reexecution import _cycle_back\n\n    return _cycle_back\n"
    )
    (tree / "ledger" / "reexecution" / "_cycle_back.py").write_text(
        "from __future__ import annotations\n\nfrom ledger.log import _cycle\n"
    )

    assert import_cycles(tree) == [["ledger.log._cycle", "ledger.reexecution._cycle_back"]]
