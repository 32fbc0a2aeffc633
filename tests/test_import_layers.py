"""The import graph points down: foundation (tr_core) <- features <- face (tr_model), no circles.

Read from the project's own source with ``ast`` (function-level imports included), so a lazy import
that runs back up is caught as well as a top-level one.

Layers, lowest first::

    tr_core                      foundation: imports no other package of the project
    dtmc                         a leaf feature: imports nothing of the project, not even tr_core
    optimizer < simulator < profiler < shadow_prefill
                                 features: tr_core and lower features only
    tr_model                     the face: may import anything below it; nothing imports it
"""

from __future__ import annotations

import ast
import os
from collections import defaultdict

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FEATURES = ["dtmc", "optimizer", "simulator", "profiler", "shadow_prefill"]
PACKAGES = ["tr_core"] + FEATURES + ["tr_model"]
RANK = {p: i for i, p in enumerate(PACKAGES)}


def _modules() -> dict[str, str]:
    """module name -> file path, for every module of the project's packages."""
    out = {}
    for pkg in PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(ROOT, pkg)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, f), ROOT)[:-3].replace(os.sep, ".")
                    out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(folder, f)
    return out


MODULES = _modules()


def _imports(mod: str, path: str) -> set[str]:
    """Project modules named by the import statements of one file (anywhere in it)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    is_pkg = path.endswith("__init__.py")
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = mod.split(".")
                if not is_pkg:
                    parts = parts[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module
            # `from pkg import sub` names the submodule when there is one, else pkg itself
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in MODULES and t != mod:
                found.add(t)
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _package(mod: str) -> str:
    return mod.split(".")[0]


def test_the_packages_are_found():
    assert {_package(m) for m in MODULES} == set(PACKAGES)
    assert "tr_core.cli" in MODULES and "dtmc" in MODULES


def test_every_import_points_down():
    upward = []
    for m, targets in GRAPH.items():
        pm = _package(m)
        for t in targets:
            pt = _package(t)
            if pt == pm:
                continue
            if pm == "dtmc":
                upward.append(f"{m} -> {t} (dtmc imports nothing of the project)")
            elif pt == "tr_model":
                upward.append(f"{m} -> {t} (nothing below the face imports tr_model)")
            elif RANK[pt] > RANK[pm]:
                upward.append(f"{m} -> {t} ({pt} is above {pm})")
    assert not upward, "imports running back up:\n" + "\n".join(sorted(upward))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_planted_circle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(g) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_package_level_circle():
    pg: dict[str, set[str]] = defaultdict(set)
    for m, targets in GRAPH.items():
        pg[_package(m)].update(_package(t) for t in targets if _package(t) != _package(m))
    for p in PACKAGES:
        pg.setdefault(p, set())
    assert _cycles(dict(pg)) == []


def test_no_module_level_circle():
    circles = _cycles(GRAPH)
    assert not circles, "import circles between modules:\n" + "\n".join(" <-> ".join(c) for c in circles)


@pytest.mark.parametrize("pkg", ["tr_core", "dtmc"])
def test_foundation_and_leaf_import_no_feature(pkg):
    for m, targets in GRAPH.items():
        if _package(m) == pkg:
            assert all(_package(t) == pkg for t in targets), (m, targets)
