"""The package's imports form no circle (imports inside functions included), neither between modules nor
between folders; the package imports its own modules at the top of each file, not inside functions, save the
listed exceptions (each with its reason); and production code does not import the test shapes
(`rf_eval.testing`)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
#: modules that may import `rf_eval.testing`: the test shapes themselves and the command that writes them
TESTING_USERS = {"rf_eval.testing", "rf_eval.cli.tiny_model"}

#: imports of the package's own modules that stay inside a function, each with its reason: "module" (all of
#: its in-function imports) or "module -> imported module". Anything else goes at the top of its file, where
#: the dependency graph can be read.
#: the command modules that read their options without loading torch, transformers or lm-eval
LIGHT_COMMANDS = ("convert_projector", "families", "fetch_data", "fills", "load", "methods", "serve", "study", "ttft")
LAZY_IMPORTS = {
    "rf_eval -> rf_eval.methods": "`import rf_eval` stays cheap: the lm-eval startup hook imports the "
    "package in every lm_eval process (`lm_eval --model hf` included); `rf_eval.RidgeFill` brings torch and "
    "the engine on first use",
    "rf_eval.model_adapters.startup": "the startup hook runs in every Python process of the environment (a .pth file): it "
    "imports nothing until lm-eval's CLI runs",
    "rf_eval.rarecache": "`import rf_eval.rarecache` stays cheap: the package's names resolve on first use, "
    "so the package does not build the method (torch, the engine) before one is asked for",
    "rf_eval.reports -> rf_eval.reports.render": "the package's names resolve on first use: Jinja is imported "
    "when a report is rendered",
    "rf_eval.cli.serve -> rf_eval.serving.app": "FastAPI is the optional `serve` extra: the command's options "
    "(`rf-eval serve --help`) work without it; the app is built when the server starts",
    **{f"rf_eval.cli.{command} -> {library}": "a command's module is imported to read its options (`rf-eval "
       "COMMAND --help`): the library that does the work (torch, transformers, the "
       "statistics) loads when the command runs"
       for command, library in (("fit", "rf_eval.ridgefill.fit_run"), ("fit_transfer", "rf_eval.rarecache.transfer_run"),
                                ("report", "rf_eval.reports.build"), ("demo", "rf_eval.study.demo_run"),
                                ("demo", "rf_eval.study.study_file"))},
    **{f"rf_eval.cli.{command}": "a command's module is imported to read its options (`rf-eval COMMAND --help`, "
       "a refused value): what does the work (torch, transformers, lm-eval) loads when the command runs"
       for command in LIGHT_COMMANDS},
    "rf_eval.tasks.common -> rf_eval.engine.plan": "the report reads tasks.common (rf_eval.stats.runs, "
    "cap_hits) and runs without torch; the default tail is the engine's, which imports torch",
    "rf_eval.study.preflight": "a study's arms are checked by the adapter's rules (`model_adapters.config.preflight`), "
    "which loads lm-eval only when the study has an rf-eval arm; a split is checked against the model's "
    "config, read through transformers only when an arm names one",
    "rf_eval.study.overlap -> rf_eval.ridge.calibration": "`rf-eval overlap` on text files runs without torch; "
    "only a calibration file is read through the ridge package, which imports it",
}

#: modules that import none of these libraries: the weight the reasons of LAZY_IMPORTS keep off them
LIGHT = {
    "rf_eval": ("torch", "transformers", "lm_eval"),
    "rf_eval.model_adapters.startup": ("torch", "transformers", "lm_eval"),
    "rf_eval.cli": ("torch", "transformers", "lm_eval"),
    "rf_eval.rarecache": ("torch",),
    "rf_eval.reports": ("jinja2",),
    "rf_eval.stats.runs": ("torch",),
    "rf_eval.tasks.common": ("torch",),
    "rf_eval.study.overlap": ("torch",),
    "rf_eval.cli.serve": ("fastapi", "uvicorn", "torch", "lm_eval"),
    **{f"rf_eval.cli.{command}": ("torch", "transformers", "lm_eval") for command in LIGHT_COMMANDS if command != "serve"},
    "rf_eval.cli.fit_transfer": ("torch", "transformers"),
    "rf_eval.cli.report": ("torch", "scipy"),
    "rf_eval.cli.demo": ("torch", "transformers"),
}


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


def _targets(node: ast.Import | ast.ImportFrom, package: str, modules: dict[str, Path]) -> list[str]:
    """The package modules one import statement names (a name imported from a module counts as that module;
    an import of a package's attribute as the package)."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*up, base] if base else up)
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    out = []
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target:
            out.append(target)
    return out


def _package(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules `name` imports anywhere in its file (a name imported from a module counts as that
    module; an import of a package's attribute as the package)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update(t for t in _targets(node, _package(name, path), modules) if t != name)
    return out


def imported_in_functions(name: str, path: Path, modules: dict[str, Path]) -> set[tuple[int, str]]:
    """(line, module) for each package module `name` imports inside a function (or a method)."""
    out = set()
    for func in ast.walk(ast.parse(path.read_text())):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    out.update((node.lineno, t) for t in _targets(node, _package(name, path), modules) if t != name)
    return out


def folder(name: str, path: Path) -> str:
    """The folder a module sits in, as a node of the folder graph: its (sub)package; each module directly in
    the package root is a node of its own (the root is no layer)."""
    package = _package(name, path)
    return name if package == "rf_eval" else package


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
    assert len(graph) > 100 and "rf_eval.engine" in graph["rf_eval.methods.requests"]  # the walk saw the package
    assert circles(graph) == []


#: at most this many modules loose in `rf_eval/` (#53 item 4): the package's face and shared basics
ROOT_MODULES = 10


def test_the_package_root_holds_its_face_and_shared_basics_only():
    """At most ten modules sit loose in `rf_eval/`, and none of them but `__init__` and `__main__` (the
    package's face: its lazy names, `python -m rf_eval`) imports one of its sub-packages, anywhere in the file:
    every other part lives in a sub-package named for what it is."""
    loose = sorted(p.stem for p in (ROOT / "rf_eval").glob("*.py"))
    assert len(loose) <= ROOT_MODULES, loose
    modules = package_modules()
    subpackages = {name for name, path in modules.items() if path.name == "__init__.py" and name.count(".") == 1}
    for stem in loose:
        if stem in ("__init__", "__main__"):
            continue
        name = f"rf_eval.{stem}"
        reached = {t for t in imported(name, modules[name], modules)
                   if any(t == p or t.startswith(p + ".") for p in subpackages)}
        assert not reached, f"{name} imports {sorted(reached)}"


def folder_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], list[tuple[str, str]]]]:
    """The import graph between folders (`folder`), and the module imports behind each of its edges."""
    modules = package_modules()
    graph: dict[str, set[str]] = {}
    edges: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for name, path in modules.items():
        here = folder(name, path)
        graph.setdefault(here, set())
        for target in imported(name, path, modules):
            there = folder(target, modules[target])
            if there != here:
                graph[here].add(there)
                edges.setdefault((here, there), []).append((name, target))
    return graph, edges


def test_folders_are_the_packages_and_the_root_modules():
    modules = package_modules()
    assert folder("rf_eval.fills.ridge", modules["rf_eval.fills.ridge"]) == "rf_eval.fills"
    assert folder("rf_eval.fills", modules["rf_eval.fills"]) == "rf_eval.fills"
    assert folder("rf_eval.ridgefill.corrections.base", modules["rf_eval.ridgefill.corrections.base"]) == \
        "rf_eval.ridgefill.corrections"
    assert folder("rf_eval.errors", modules["rf_eval.errors"]) == "rf_eval.errors"  # the root is no layer
    assert folder("rf_eval.tasks.common", modules["rf_eval.tasks.common"]) == "rf_eval.tasks"


def test_no_import_circle_between_folders():
    graph, edges = folder_graph()
    assert "rf_eval.engine" in graph["rf_eval.fills"]  # the walk saw the package
    found = circles(graph)
    listing = [f"{a} -> {b}: {', '.join(f'{m} imports {t}' for m, t in pairs[:3])}"
               for circle in found for (a, b), pairs in sorted(edges.items()) if a in circle and b in circle]
    assert found == [], "folders import each other in a circle:\n" + "\n".join(listing)


def test_the_in_function_walk_finds_imports_in_functions_and_methods_only(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from rf_eval import errors\n\n\nclass C:\n    def f(self):\n"
                      "        if True:\n            from rf_eval.engine.plan import Plan\n\n\n"
                      "def g():\n    import rf_eval.fills\n")
    found = imported_in_functions("x.m", module, package_modules())
    assert found == {(7, "rf_eval.engine.plan"), (11, "rf_eval.fills")}


def test_the_package_imports_its_own_modules_at_the_top_of_each_file():
    modules = package_modules()
    found = {name: imported_in_functions(name, path, modules) for name, path in modules.items()}
    listed = set()
    unexplained = []
    for name, hits in sorted(found.items()):
        for line, target in sorted(hits):
            key = next((k for k in (f"{name} -> {target}", name) if k in LAZY_IMPORTS), None)
            if key is not None:
                listed.add(key)
            else:
                unexplained.append(f"{modules[name].relative_to(ROOT)}:{line} imports {target} inside a function")
    assert not unexplained, ("import these at the top of the file, or list them in LAZY_IMPORTS with the reason:\n"
                             + "\n".join(unexplained))
    stale = sorted(set(LAZY_IMPORTS) - listed)
    assert not stale, f"listed, but no longer imported inside a function (remove them): {stale}"


def test_the_light_modules_import_no_heavy_library(tmp_path):
    code = ("import importlib, json, sys; importlib.import_module(sys.argv[1]); "
            "print(json.dumps(sorted(m for m in sys.modules if '.' not in m)))")
    runs = {name: subprocess.Popen([sys.executable, "-c", code, name], stdout=subprocess.PIPE, text=True,
                                   cwd=tmp_path)  # the installed package, as the tests import it
            for name in LIGHT}
    heavy = {}
    for name, run in runs.items():
        out, _ = run.communicate(timeout=120)
        assert run.returncode == 0, name
        loaded = set(json.loads(out))
        assert "rf_eval" in loaded  # the walk imported the package
        heavy[name] = sorted(set(LIGHT[name]) & loaded)
    assert heavy == {name: [] for name in LIGHT}


def test_production_code_does_not_import_the_test_shapes():
    users = {name for name, deps in import_graph().items() if "rf_eval.testing" in deps}
    assert users <= TESTING_USERS, users - TESTING_USERS
