"""The engine gives the same numbers it gave before its kernels were shared and narrowed.

``tests/fixtures/engine_identity.json`` was written from the code as it stood before that refactor
(``python tests/test_engine_identity.py --write``).  It holds, per system, sha256 digests of the chain's
arrays (state keys, CSR data/indices/indptr, holding times, rewards) and throughputs to 1e-12 relative;
the decision processes' arrays and bounds of a few boxes (fine and coarse clock, a box cut out of its
parent), optimal-policy values, class tables, mean-field values and a seeded simulation.  Any change to
the arithmetic of a kernel shows here first, so a refactor that is meant to change nothing proves it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "fixtures", "engine_identity.json")
REL = 1e-12


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:24]


def _specs():
    from tr_core.spec import make_spec, preset

    r2r = preset("r2r", [6.0, 27.9], p=0.35)
    me = preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2])
    lb = make_spec([0.6, 2.0], [[0.65, 0.35], [1.0, 0.0]], [[1, 0], [1, 0]], delta_ms=0.1,
                   latency_curves=[{"intercept_ms": 0.5, "per_request_ms": 0.1},
                                   {"intercept_ms": 1.8, "per_request_ms": 0.2}],
                   max_batch_size=[None, 3])
    me_caps = make_spec([0.3, 0.5, 0.7], [[0.5, 0.3, 0.2]] * 3, [[1, 1, 1]] * 3, delta_ms=0.1,
                        max_batch_size=[2, 3, 4])
    corun_tab = make_spec([3.0, 7.0], [[0.6, 0.4], [0.7, 0.3]], [[1.0, 0.5], [2.0, 0.0]], delta_ms=1.0,
                          corun_latency=[{"batch_size": [1, 3], "step_latency_ms": [4.0, 8.0]}, {"slowdown": 2.0}])
    # stiff: a rare escalation to a very slow peer (probabilities spread over many orders of magnitude)
    stiff = preset("r2r", [1.0, 60.0], p=0.002, delta_ms=1.0)
    return {"r2r": r2r, "r2r-corun": r2r.with_corun([2.8, 2.0]), "me": me, "me-corun": me.with_corun([2.0, 1.5, 2.0]),
            "lb-cap": lb, "lb-cap-corun": lb.with_corun([2.0, 1.5]), "me-caps": me_caps, "corun-tab": corun_tab,
            "stiff": stiff}


CHAINS = [
    ("r2r", 4, (1, 1)), ("r2r", 8, (1, 3)), ("r2r", 12, (2, 4)), ("r2r", 16, (1, 6)), ("r2r", 24, (3, 8)),
    ("r2r", 32, (1, 12)), ("r2r", 40, (4, 14)),
    ("r2r-corun", 6, (1, 2)), ("r2r-corun", 12, (2, 5)), ("r2r-corun", 20, (1, 8)),
    ("me", 4, (1, 1, 1)), ("me", 6, (1, 2, 3)), ("me", 9, (2, 2, 3)), ("me", 12, (1, 3, 5)),
    ("me-corun", 6, (1, 2, 2)), ("me-corun", 8, (2, 2, 3)),
    ("lb-cap", 5, (1, 1)), ("lb-cap", 8, (2, 3)), ("lb-cap", 12, (3, 2)),
    ("lb-cap-corun", 6, (1, 3)), ("lb-cap-corun", 10, (2, 2)),
    ("me-caps", 4, (1, 1, 1)), ("me-caps", 6, (2, 1, 2)), ("me-caps", 8, (1, 2, 3)),
    ("corun-tab", 5, (1, 2)), ("corun-tab", 9, (2, 3)), ("corun-tab", 14, (3, 5)),
    ("stiff", 6, (1, 2)), ("stiff", 12, (2, 5)), ("stiff", 20, (1, 8)),
]

BOXES = [
    ("r2r", 10, (1, 1), (4, 6), 1), ("r2r", 16, (1, 2), (3, 9), 1), ("r2r", 16, (1, 2), (3, 9), 2),
    ("r2r-corun", 8, (1, 1), (3, 5), 1), ("r2r-corun", 12, (1, 1), (4, 7), 3),
    ("me", 6, (1, 1, 1), (2, 3, 4), 1), ("me-caps", 5, (1, 1, 1), (2, 2, 3), 1),
    ("corun-tab", 8, (1, 1), (3, 4), 1), ("corun-tab", 8, (1, 1), (3, 4), 3),
]

POLICIES = [("r2r", 5), ("r2r-corun", 4), ("me", 3), ("lb-cap-corun", 4), ("corun-tab", 4)]

CLASS_CASES = [
    ("r2r", 8, "busy", (1, 1, 3, 2)), ("r2r", 8, "residual", (1, 1, 1, 3, 2, 4)), ("r2r", 8, "window", (2, 3, 4, 0)),
    ("r2r", 8, "ratio", (1, 2, 3, 1)), ("r2r-corun", 8, "residual", (1, 2, 1, 3, 2, 4)),
    ("corun-tab", 7, "ratio", (1, 1, 2, 3)), ("me", 5, "busy", (1, 2, 1, 1, 2, 3)),
    ("me-caps", 5, "window", (1, 1, 2, 2, 1, 1)),
]

MEAN_FIELD = [("r2r", 24, (1, 8)), ("r2r-corun", 16, (2, 5)), ("me", 12, (1, 3, 5)), ("lb-cap-corun", 10, (2, 2))]


def _quanta(spec, N):
    d, _ = spec.quanta_table(N)
    dco = spec.corun_quanta_table(N)[0] if spec.has_corun else None
    return d, dco


def _chain_row(spec, N, B):
    import dtmc

    d, dco = _quanta(spec, N)
    ch = dtmc.build_chain(spec.P, spec.C, d, N, B, caps=spec.caps(N), dco=dco)
    sol = dtmc.solve_chain(spec.P, spec.C, d, N, B, caps=spec.caps(N), dco=dco)
    return {"digest": _digest(ch.keys, ch.T.data, ch.T.indices, ch.T.indptr, ch.tau, ch.g),
            "states": ch.n_states, "transitions": ch.n_transitions, "throughput": sol.throughput_per_quantum}


def _box_rows(spec, N, lo, hi, coarse):
    from optimizer.bounds import box_bound

    r = box_bound(spec, N, lo, hi, coarse=coarse, keep=coarse > 1)
    row = {f: getattr(r, f) for f in r.__dataclass_fields__ if f != "process"}
    row = {k: (list(v) if isinstance(v, tuple) else v) for k, v in row.items() if k != "seconds"}
    if coarse > 1 and r.process is not None:
        # a sub-box cut out of the kept parent: the same process (and bound) as enumerating it
        sub_hi = tuple(max(l, h - 1) for l, h in zip(lo, hi))
        sub = box_bound(spec, N, lo, sub_hi, coarse=coarse, parent=r.process)
        row["sub"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in
                      ((f, getattr(sub, f)) for f in sub.__dataclass_fields__) if k not in ("seconds", "process")}
    return row


def _policy_row(spec, N):
    from optimizer.policy import build_process, optimal_policy

    p = build_process(spec, N)
    r = optimal_policy(spec, N, proc=p)
    return {"digest": _digest(p.keys, p.tau, p.g, p.out_ptr, p.out_prob, p.opt_ptr, p.opt_idx, p.ukey, p.init_opts),
            "n": p.n, "throughput": r.throughput_tok_s, "upper": r.upper_bound_tok_s}


def _class_row(spec, N, cls, params):
    from optimizer.policy import build_process, class_chain_table, class_table, evaluate_table

    rt = class_chain_table(spec, N, cls, params)
    sol = evaluate_table(spec, N, rt.table)
    full = class_table(build_process(spec, N), cls, params)
    return {"digest": _digest(rt.table.states, rt.table.launch), "full": _digest(full.states, full.launch),
            "chain_states": rt.chain_states, "throughput": sol.throughput_per_quantum}


def _mean_field_row(spec, N, B):
    from optimizer.mean_field import mean_field_throughput

    m = mean_field_throughput(spec, N, B)
    return {"throughput": m.throughput_tok_s, "drift": m.drift}


def _simulate_row(spec, N, B):
    from simulator.engine import simulate

    r = simulate(spec, N, B, steps=20_000, seed=3)
    return {"throughput": r.throughput_tok_s, "ci95": r.throughput_ci95_tok_s,
            "completed": r.completed_requests, "launches": list(r.launches)}


SIMS = [("r2r", 12, (1, 4)), ("r2r-corun", 10, (2, 3)), ("me-caps", 6, (1, 2, 2))]


def _key(*parts) -> str:
    return "|".join(str(p) for p in parts)


def compute() -> dict:
    S = _specs()
    out = {"chains": {}, "boxes": {}, "policies": {}, "classes": {}, "mean_field": {}, "simulate": {}}
    for name, N, B in CHAINS:
        out["chains"][_key(name, N, B)] = _chain_row(S[name], N, B)
    for name, N, lo, hi, c in BOXES:
        out["boxes"][_key(name, N, lo, hi, c)] = _box_rows(S[name], N, lo, hi, c)
    for name, N in POLICIES:
        out["policies"][_key(name, N)] = _policy_row(S[name], N)
    for name, N, cls, par in CLASS_CASES:
        out["classes"][_key(name, N, cls, par)] = _class_row(S[name], N, cls, par)
    for name, N, B in MEAN_FIELD:
        out["mean_field"][_key(name, N, B)] = _mean_field_row(S[name], N, B)
    for name, N, B in SIMS:
        out["simulate"][_key(name, N, B)] = _simulate_row(S[name], N, B)
    return out


@pytest.fixture(scope="module")
def expected():
    with open(FIXTURE, encoding="utf-8") as f:
        return json.load(f)


def _same(got, want, where):
    if isinstance(want, dict):
        assert set(got) == set(want), where
        for k in want:
            _same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            _same(a, b, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(got, str):
        if not np.isfinite(want):
            assert got == want, where
        else:
            assert abs(got - want) <= REL * max(abs(want), 1e-300), (where, got, want)
    else:
        assert got == want, (where, got, want)


def _norm(x):
    return json.loads(json.dumps(x))


@pytest.mark.parametrize("case", CHAINS, ids=[_key(*c) for c in CHAINS])
def test_chain_identity(expected, case):
    name, N, B = case
    _same(_norm(_chain_row(_specs()[name], N, B)), expected["chains"][_key(*case)], _key(*case))


@pytest.mark.parametrize("case", BOXES, ids=[_key(*c) for c in BOXES])
def test_box_identity(expected, case):
    name, N, lo, hi, c = case
    _same(_norm(_box_rows(_specs()[name], N, lo, hi, c)), expected["boxes"][_key(*case)], _key(*case))


@pytest.mark.parametrize("case", POLICIES, ids=[_key(*c) for c in POLICIES])
def test_policy_identity(expected, case):
    name, N = case
    _same(_norm(_policy_row(_specs()[name], N)), expected["policies"][_key(*case)], _key(*case))


@pytest.mark.parametrize("case", CLASS_CASES, ids=[_key(*c) for c in CLASS_CASES])
def test_class_identity(expected, case):
    name, N, cls, par = case
    _same(_norm(_class_row(_specs()[name], N, cls, par)), expected["classes"][_key(*case)], _key(*case))


def test_mean_field_and_simulator_identity(expected):
    S = _specs()
    for name, N, B in MEAN_FIELD:
        _same(_norm(_mean_field_row(S[name], N, B)), expected["mean_field"][_key(name, N, B)], name)
    for name, N, B in SIMS:
        _same(_norm(_simulate_row(S[name], N, B)), expected["simulate"][_key(name, N, B)], name)


if __name__ == "__main__":
    if "--write" in sys.argv:
        sys.path.insert(0, os.path.dirname(HERE))
        data = compute()
        with open(FIXTURE, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {FIXTURE}: {sum(len(v) for v in data.values())} cases")
