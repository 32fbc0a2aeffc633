"""Every pair of places that ``duplicates`` still reports in package code, named, with why it stays and a check
that the two sides agree.

The pairs (a pair is two files, or two places in one file, sharing runs of six or more lines):

- ``optimizer/_kernels.py`` with itself: ``_stage_launch`` and ``_launch_keys`` (the per-model launch choices
  and the odometer over them; ``_launch_keys`` is the last stage of ``_stage_launch`` fused with packing, kept
  apart for speed), ``_mdp_build`` with ``_coarse_mdp_build`` (the same growable arrays) and with
  ``class_reach`` (the same breadth-first walk over the next completion time).  Compiled kernels, inlined on
  purpose: a call with this many array arguments costs more than its body.
- ``dtmc/_kernels.py`` with itself: ``gth_solve`` and ``gth_solve_scaled`` (the same GTH elimination and
  back-substitution over the alive sets, in doubles and in extended exponents).
- ``dtmc/_kernels.py`` with ``optimizer/_kernels.py``: the chain's ``_build`` and the decision processes'
  ``_routed`` / ``_mdp_build`` (the routed configuration after a completion; the work arrays).  Each module's
  numba cache sees only its own file, so the optimizer keeps its own compiled copy.
- ``simulator/engine.py`` with itself: the solo latency table in ``simulate`` and ``_corun_latency_table``
  (the same check and fill, of the two launch laws).
- ``optimizer/_kernels.py`` with ``optimizer/policy.py``: :class:`optimizer._kernels.CoarseProcess` and
  :class:`optimizer.policy.Process` list the same arrays of a built decision process, in the same order.
- ``optimizer/cache.py`` with ``tr_model/thresholds.py``: ``_is_num``, the finite-JSON-number rule; the reader
  is vendorable (stdlib only) and keeps its own copy.  Checked in ``tests/test_reader_copies.py``.
- ``tr_model/plan.py`` with ``tr_model/tuning/kvplan.py``: the planner's :class:`~tr_model.plan.ModelPlacement`
  and the KV plan's :class:`~tr_model.tuning.kvplan.PlacedModel` are the same record (a model, its GPUs, its
  tensor-parallel degree) over a name and over a footprint; the planner turns one into the other.  The other
  run of the pair (``PlanResult`` beside ``KVPlan``) is two unrelated records declared alike.
- ``optimizer/evaluate.py`` with ``shadow_prefill/cluster/sim.py`` (``Evaluation`` beside ``ClusterConfig``)
  and ``dtmc/lowering.py`` with ``optimizer/policy_classes.py`` (two-line properties of ``LoweredSystem`` beside
  ``PolicyClass``'s): not copies, declarations of the same shape.  The checks here hold them apart: should
  they ever share fields, they have become copies to merge.

The copies are compared as normalised source (indentation, comments and blank lines dropped; names the two
sides spell differently mapped onto each other), so an edit of one side alone fails here.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _function_lines(path: str, name: str) -> list[str]:
    """The normalised lines of function ``name`` (top-level or nested) of ``path``."""
    with open(os.path.join(ROOT, path)) as f:
        src = f.read()
    lines = src.split("\n")
    hits = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(hits) == 1, f"{path}: {len(hits)} functions named {name}"
    out = []
    for line in lines[hits[0].lineno - 1:hits[0].end_lineno]:
        text = re.sub(r"\s+#.*$", "", line).strip()
        if text and not text.startswith("#"):
            out.append(text)
    return out


def _block(path: str, func: str, first: str | tuple[str, int], count: int,
           rename: dict[str, str] | None = None) -> list[str]:
    """``count`` normalised lines of ``func`` from the first that starts with ``first`` (or ``(first, k)``: the
    k-th such line, -1 the last), names in ``rename`` replaced (whole words)."""
    first, which = first if isinstance(first, tuple) else (first, 0)
    lines = _function_lines(path, func)
    starts = [i for i, text in enumerate(lines) if text.startswith(first)]
    assert starts, f"{path}:{func}: no line starts with {first!r}"
    block = lines[starts[which]:starts[which] + count]
    assert len(block) == count, f"{path}:{func}: fewer than {count} lines from {first!r}"
    for old, new in (rename or {}).items():
        block = [re.sub(rf"(?<![\w-]){re.escape(old)}(?![\w-])", new, text) for text in block]
    return block


# (name, (file, function), (file, function), first line, lines, renames of the second side)
COPIES = [
    ("launch choices per model", ("optimizer/_kernels.py", "_stage_launch"),
     ("optimizer/_kernels.py", "_launch_keys"), "if cfg[c, 2 * M + j] != 0:", 14, {}),
    ("odometer over the launch choices", ("optimizer/_kernels.py", "_stage_launch"),
     ("optimizer/_kernels.py", "_launch_keys"), "j = 0", 9, {}),
    ("growable arrays of a decision process", ("optimizer/_kernels.py", "_mdp_build"),
     ("optimizer/_kernels.py", "_coarse_mdp_build"), "max_states, max_entries =", 10, {}),
    ("walk to the next completion", ("optimizer/_kernels.py", "_mdp_build"),
     ("optimizer/_kernels.py", "class_reach"), "while head < n:", 6, {}),
    ("GTH elimination: alive sets", ("dtmc/_kernels.py", "gth_solve"),
     ("dtmc/_kernels.py", "gth_solve_scaled"), "for k in range(n - 1):", 5, {}),
    ("GTH back-substitution: alive sets in reverse", ("dtmc/_kernels.py", "gth_solve"),
     ("dtmc/_kernels.py", "gth_solve_scaled"), ("na = I0", -1), 12, {"xm": "x"}),
    ("routed configuration after a completion", ("dtmc/_kernels.py", "_build"),
     ("optimizer/_kernels.py", "_routed"), "k2[i] = k[i]", 11, {}),
    ("work arrays of a build", ("dtmc/_kernels.py", "_build"),
     ("optimizer/_kernels.py", "_mdp_build"), "tkeys = np.full(tcap, EMPTY, dtype=np.int64)", 8, {}),
    ("latency table of a launch law", ("simulator/engine.py", "simulate"),
     ("simulator/engine.py", "_corun_latency_table"), "for i in range(M):", 7,
     {"co-running latency": "latency", "corun_latency_ms": "latency_ms", "co": "lat"}),
]


@pytest.mark.parametrize("name, a, b, first, count, rename", COPIES, ids=[c[0] for c in COPIES])
def test_kept_copies_agree(name, a, b, first, count, rename):
    left = _block(*a, first, count)
    right = _block(*b, first, count, rename)
    assert left == right, f"{name}: {a[0]}:{a[1]} and {b[0]}:{b[1]} differ; edit both copies alike"


def test_the_comparison_can_fail():
    a = _block("optimizer/_kernels.py", "_stage_launch", "if cfg[c, 2 * M + j] != 0:", 14)
    b = _block("optimizer/_kernels.py", "_launch_keys", "if cfg[c, 2 * M + j] != 0:", 14, {"nch": "nchoices"})
    assert a != b


def test_process_records_list_the_same_arrays():
    from optimizer._kernels import CoarseProcess
    from optimizer.policy import Process

    mine = [f.name for f in dataclasses.fields(Process)]
    shared = [name for name in CoarseProcess._fields if name in mine]
    assert shared == [name for name in mine if name in CoarseProcess._fields]
    assert {"n", "tau", "g", "out_ptr", "out_prob", "opt_ptr", "opt_idx"} <= set(shared)
    def spelled(t) -> str:  # an annotation as written, whether kept as a string or a forward reference
        return t if isinstance(t, str) else getattr(t, "__forward_arg__", None) or t.__name__

    types = {f.name: spelled(f.type) for f in dataclasses.fields(Process)}
    for name in shared:
        assert types[name] == spelled(CoarseProcess.__annotations__[name]), name


def test_is_num_copy_is_checked_where_the_reader_is():
    with open(os.path.join(ROOT, "tests", "test_reader_copies.py")) as f:
        text = f.read()
    assert "cache._is_num(x) == thresholds._is_num(x)" in text


def test_placement_records_agree():
    from tr_model.plan import ModelPlacement, candidates
    from tr_model.tuning.kvplan import PlacedModel, make_placement, read_model_footprint

    mine = [(f.name, f.type) for f in dataclasses.fields(ModelPlacement)]
    theirs = [(f.name, f.type) for f in dataclasses.fields(PlacedModel)]
    assert mine[0] == ("model", "str") and theirs[0] == ("footprint", "ModelFootprint")
    assert mine[1:] == theirs[1:]  # gpus, tensor_parallel: the same fields, in the same order
    small = read_model_footprint(os.path.join(ROOT, "data/models/Qwen3-0.6B/config.json"))
    large = read_model_footprint(os.path.join(ROOT, "data/models/Qwen3-32B/config.json"))
    fps = {"small": small, "large": large}
    for c in candidates(["small", "large"], [[1, 2], [1, 2]], 4):
        placed = make_placement([(fps[m.model], list(m.gpus), m.tensor_parallel) for m in c.placement], 141.0)
        assert [(p.footprint.name, p.gpus, p.tensor_parallel) for p in placed.models] == [
            (fps[m.model].name, m.gpus, m.tensor_parallel) for m in c.placement]


def test_look_alike_records_are_not_copies():
    from dtmc.lowering import LoweredSystem
    from optimizer.evaluate import Evaluation
    from optimizer.policy_classes import PolicyClass
    from shadow_prefill.cluster.sim import ClusterConfig

    def names(cls):
        fields = {f.name for f in dataclasses.fields(cls)}
        props = {k for k, v in vars(cls).items() if isinstance(v, property)}
        return fields | props

    assert not names(Evaluation) & names(ClusterConfig)
    assert not names(LoweredSystem) & names(PolicyClass) - {"name"}
