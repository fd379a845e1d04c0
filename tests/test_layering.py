"""Layers point down only (docs/design.md, "Layers").

Bottom to top: ``ipcjax`` (the library), ``scenes``, ``fitting``, ``baselines``, ``jobs``
(the command line). A module may import its own layer and any layer below it, never one
above; no two layers are peers, so every pair has one allowed direction. Nothing in the
layers imports ``tests`` or ``benchmarks``. Every import counts: at the top of a module,
inside a function (the lazy imports of the jobs), relative, or by
``importlib.import_module`` with a literal name.
"""
from __future__ import annotations

import ast
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = ("ipcjax", "scenes", "fitting", "baselines", "jobs")  # bottom first
OUTSIDE = ("tests", "benchmarks")  # not layers: no layer imports them


def _dotted(node: ast.expr) -> str:
    """``a.b.c`` for an attribute chain of names, else ""."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def imported_modules(tree: ast.AST, package: str):
    """(line, module) for every import in ``tree``, a module of ``package`` (dotted);
    relative imports resolved against it."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[:len(parts) - (node.level - 1)]
                yield node.lineno, ".".join(base + ([node.module] if node.module else []))
            else:
                yield node.lineno, node.module
        elif (isinstance(node, ast.Call) and _dotted(node.func) in ("importlib.import_module", "import_module",
                                                                     "__import__")
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, node.args[0].value


def violations(source: str, path: str) -> list[str]:
    """Each import in ``source`` (the file at ``path``, relative to the repository root,
    e.g. ``scenes/bag.py``) that reaches up out of its layer or out of the layers:
    ``path:line: module (why)``."""
    parts = pathlib.PurePosixPath(path).with_suffix("").parts
    layer = parts[0]
    package = ".".join(parts[:-1])  # of a module and of an __init__ alike
    rank = LAYERS.index(layer)
    found = []
    for line, module in sorted(imported_modules(ast.parse(source, path), package)):
        top = module.split(".")[0]
        if top in OUTSIDE:
            found.append(f"{path}:{line}: {module} ({top}/ is outside the layers)")
        elif top in LAYERS and LAYERS.index(top) > rank:
            found.append(f"{path}:{line}: {module} ({layer}/ is below {top}/)")
    return found


def test_the_checker_flags_imports_up_and_out_and_passes_imports_down():
    source = ("import numpy\n"
              "from ipcjax import runfolder\n"
              "import scenes.bag\n"
              "\n"
              "def job():\n"
              "    from fitting.rollout_fit import fit_cantilever\n"
              "    import jobs.cli\n"
              "    from tests.helpers import tree_allclose\n"
              "    importlib.import_module('baselines.verlet')\n"
              "    from . import bag_run\n"
              "    from ..jobs import compare\n")
    assert violations(source, "scenes/x.py") == [
        "scenes/x.py:6: fitting.rollout_fit (scenes/ is below fitting/)",
        "scenes/x.py:7: jobs.cli (scenes/ is below jobs/)",
        "scenes/x.py:8: tests.helpers (tests/ is outside the layers)",
        "scenes/x.py:9: baselines.verlet (scenes/ is below baselines/)",
        "scenes/x.py:11: jobs (scenes/ is below jobs/)",
    ]
    # the same imports from the top layer: only the one out of the layers
    assert violations(source, "jobs/x.py") == ["jobs/x.py:8: tests.helpers (tests/ is outside the layers)"]
    # the library imports nothing above it, not even lazily
    assert violations("def main():\n    from scenes.bag_run import run_bag\n", "ipcjax/cli.py") == [
        "ipcjax/cli.py:2: scenes.bag_run (ipcjax/ is below scenes/)"]
    # a package's __init__ resolves `from . import` against itself
    assert violations("from . import cli\n", "jobs/__init__.py") == []


def test_the_layers_are_the_installed_packages():
    """A package added to pyproject.toml must take its place in LAYERS."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        include = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {p.removesuffix("*") for p in include} == set(LAYERS)


def test_no_module_imports_from_a_layer_above_its_own():
    found, files = [], {layer: 0 for layer in LAYERS}
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            files[layer] += 1
            rel = path.relative_to(ROOT).as_posix()
            found += violations(path.read_text(), rel)
    assert all(files.values()), f"a layer without modules: {files}"
    assert not found, ("imports against the layers " + " → ".join(LAYERS) + " (each may import only its own "
                       "and those below it):\n" + "\n".join(found))
