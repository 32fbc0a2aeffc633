"""The rooms of tr_model import only downward (tr_model/__init__.py): the thresholds reader imports nothing of
the project, tuning never imports the API, the command lines or serving, serving never imports tuning, the API or
the command lines, and every room says its role and its imports in its docstring."""

from __future__ import annotations

import ast
import importlib
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FACE = ("tr_model.api", "tr_model.cli", "tr_model.autotune_cli", "tr_model.plan_cli")
ALIASES = ("tr_model.autotune", "tr_model.kvplan", "tr_model.launch_policy", "tr_model.serve")


def _modules(folder: str) -> dict[str, str]:
    out = {}
    base = os.path.join(ROOT, *folder.split("."))
    for d, dirs, files in os.walk(base):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = os.path.join(d, f)
    return out


def _imports(path: str) -> set[str]:
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _hits(imports: set[str], forbidden) -> list[str]:
    return sorted(i for i in imports for f in forbidden if i == f or i.startswith(f + "."))


@pytest.mark.parametrize("room, forbidden", [
    ("tr_model.tuning", FACE + ("tr_model.serving", "tr_model.serving.runtime", "tr_model.plan", "tr_model.plots")),
    ("tr_model.serving", FACE + ("tr_model.tuning",)),
    ("tr_model.serving.runtime", FACE + ("tr_model.tuning", "tr_model.serving.server")),
])
def test_rooms_import_downward_only(room, forbidden):
    for mod, path in _modules(room).items():
        bad = _hits(_imports(path), forbidden + ALIASES)
        assert not bad, f"{mod} imports {bad}"


def test_the_reader_imports_nothing_of_the_project():
    imports = _imports(os.path.join(ROOT, "tr_model", "thresholds.py"))
    project = ("tr_core", "tr_model", "dtmc", "optimizer", "simulator", "profiler", "shadow_prefill", "numpy")
    assert not _hits(imports, project)


@pytest.mark.parametrize("room", ["tr_model", "tr_model.tuning", "tr_model.serving"])
def test_every_room_says_its_role_and_its_imports(room):
    doc = importlib.import_module(room).__doc__ or ""
    assert "import" in doc and len(doc.split()) > 30


@pytest.mark.parametrize("old", ALIASES)
def test_an_old_path_is_the_same_module(old):
    new = {"tr_model.serve": "tr_model.serving.server"}.get(old, old.replace("tr_model.", "tr_model.tuning."))
    assert importlib.import_module(old) is importlib.import_module(new)
