"""The package's imports form no circle (imports inside functions included), and production code does not
import the test shapes (`rf_eval.testing`)."""

from __future__ import annotations

import ast
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
#: modules that may import `rf_eval.testing`: the test shapes themselves and the command that writes them
TESTING_USERS = {"rf_eval.testing", "rf_eval.cli.tiny_model"}


def package_modules() -> dict[str, Path]:
    """Every module of the installed package (pyproject's package-dir), by its dotted name."""
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    modules: dict[str, Path] = {}
    for package, folder in folders.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules.setdefault(".".join([package, *parts]), path)
    return modules


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules `name` imports anywhere in its file (a name imported from a module counts as that
    module; an import of a package's attribute as the package)."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
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
    return found


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {name: imported(name, path, modules) for name, path in modules.items()}


def test_the_walk_finds_a_circle_when_there_is_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_walk_reads_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from rf_eval.engine.plan import Plan\n    import rf_eval.fills\n")
    modules = package_modules()
    assert imported("x.m", module, modules) == {"rf_eval.engine.plan", "rf_eval.fills"}


def test_no_import_circle_in_the_package():
    graph = import_graph()
    assert len(graph) > 100 and "rf_eval.engine" in graph["rf_eval.method"]  # the walk saw the package
    assert circles(graph) == []


def test_production_code_does_not_import_the_test_shapes():
    users = {name for name, deps in import_graph().items() if "rf_eval.testing" in deps}
    assert users <= TESTING_USERS, users - TESTING_USERS
