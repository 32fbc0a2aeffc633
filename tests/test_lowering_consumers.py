"""``optimizer.evaluate`` and the simulator take their kernel inputs from the one lowering step (``dtmc.lowering``).

The evaluation hands the chain the arrays of :func:`dtmc.lowering.lower_system`; the simulator takes the grid-free
part, :func:`dtmc.lowering.lower_routing` (``P``, ``C``, ``cbar``, caps), and keeps its step latencies in ms (it
simulates continuous time; the lowering's durations are whole quanta).  Each consumer's arguments are caught at
the kernel's door and compared, bit for bit, with what the lowering gives.
"""

from __future__ import annotations

import numpy as np
import pytest

import dtmc
from dtmc.lowering import Routing, lower_routing, lower_system
from tr_core.errors import SpecError
from tr_core.spec import make_spec, preset


def _specs():
    r2r = preset("r2r", (6.0, 27.9), p=0.35)
    capped = make_spec([0.6, 2.0], [[0.65, 0.35], [1.0, 0.0]], [[1, 0], [1, 0]], delta_ms=0.1,
                       latency_curves=[{"intercept_ms": 0.5, "per_request_ms": 0.1},
                                       {"intercept_ms": 1.8, "per_request_ms": 0.2}],
                       max_batch_size=[None, 3])
    off_grid = make_spec([0.63, 2.17], [[0.6, 0.4], [0.9, 0.1]], [[1, 2], [1, 0]], delta_ms=0.1)
    return {"r2r": r2r, "r2r-corun": r2r.with_corun([2.8, 2.0]), "capped": capped,
            "capped-corun": capped.with_corun([2.0, 1.5]), "off-grid": off_grid,
            "off-grid-corun": off_grid.with_corun([1.37, 2.0])}


SPECS = _specs()


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name", sorted(SPECS))
def test_routing_is_the_lowered_systems(name):
    spec = SPECS[name]
    for N in (1, 2, 7):
        low = lower_system(spec, N, round_to_grid=True)
        r = lower_routing(spec.P, spec.C, N, spec.caps(N))
        assert isinstance(r, Routing)
        for f in Routing._fields:
            assert _same(getattr(r, f), getattr(low, f)), (name, N, f)


def test_routing_checks_like_lower_arrays():
    P, C = np.array([[0.5, 0.5], [1.0, 0.0]]), np.ones((2, 2))
    assert list(lower_routing(P, C, 4, [9, 2]).caps) == [4, 2]          # clipped to N
    assert list(lower_routing(P, C, 4).caps) == [4, 4]                  # default N
    d = np.ones((2, 5), dtype=np.int64)
    for bad in ({"N": 0, "caps": None}, {"N": 4, "caps": [0, 2]}):
        with pytest.raises(dtmc.DTMCError) as a:
            lower_routing(P, C, bad["N"], bad["caps"])
        with pytest.raises(dtmc.DTMCError) as b:
            dtmc.lower_arrays(P, C, d if bad["N"] == 4 else d[:, :1], bad["N"], bad["caps"])
        assert str(a.value) == str(b.value)


class _Caught(Exception):
    pass


@pytest.mark.parametrize("name", ["r2r", "r2r-corun", "capped-corun", "off-grid-corun"])
def test_evaluate_hands_the_chain_the_lowered_arrays(monkeypatch, name):
    from optimizer.evaluate import evaluate_thresholds

    spec, N, B = SPECS[name], 6, (1, 2)
    rnd = name.startswith("off-grid")
    seen = {}
    real = dtmc.solve_chain

    def spy(P, C, d, N_, B_, caps=None, **kw):
        seen.update(P=P, C=C, d=d, N=N_, caps=caps, dco=kw.get("dco"))
        return real(P, C, d, N_, B_, caps=caps, **kw)

    monkeypatch.setattr(dtmc, "solve_chain", spy)
    ev = evaluate_thresholds(spec, N, B, round_to_grid=rnd)
    low = lower_system(spec, N, round_to_grid=rnd)
    assert seen["N"] == low.N
    for f in ("P", "C", "d", "caps"):
        assert _same(seen[f], getattr(low, f)), f
    assert (seen["dco"] is None) == (low.dco is None) and (low.dco is None or _same(seen["dco"], low.dco))
    assert ev.roundings == low.roundings
    assert bool(ev.roundings) == rnd


def test_evaluate_refuses_off_grid_as_the_lowering_does():
    from optimizer.evaluate import evaluate_thresholds

    spec = SPECS["off-grid"]
    with pytest.raises(SpecError) as a:
        evaluate_thresholds(spec, 6, (1, 2))
    with pytest.raises(SpecError) as b:
        lower_system(spec, 6)
    assert str(a.value) == str(b.value)


@pytest.mark.parametrize("name", ["r2r", "capped-corun", "off-grid", "off-grid-corun"])
def test_simulator_takes_the_routing_of_the_lowering_and_latencies_in_ms(monkeypatch, name):
    import simulator.engine as E

    spec, N = SPECS[name], 7
    caught = {}

    def door(system, *args):
        caught["sys"] = system
        raise _Caught

    monkeypatch.setattr(E, "simulate_kernel", door)
    with pytest.raises(_Caught):
        E.simulate(spec, N, (1, 2), steps=1_000)
    s = caught["sys"]
    r = lower_routing(spec.P, spec.C, N, spec.caps(N))
    assert _same(s.cmat, r.C) and _same(s.exp_tok, r.cbar) and _same(s.caps, r.caps)
    cum = np.cumsum(r.P, axis=1)    # the sampling rows: P's cumulative sums, the last reachable one above 1
    for i in range(spec.M):
        last = int(np.flatnonzero(r.P[i] > 0)[-1])
        assert _same(s.pcum[i, :last], cum[i, :last]) and (s.pcum[i, last:] == 2.0).all()
    # the latencies are the spec's, in ms, not the lowering's quanta (off the grid they differ)
    lat = np.array([[spec.latency_ms(i, max(b, 1)) for b in range(N + 1)] for i in range(spec.M)])
    assert _same(s.lat, lat)
    if spec.has_corun:
        co = np.array([[spec.corun_latency_ms(i, max(b, 1)) for b in range(N + 1)] for i in range(spec.M)])
        assert _same(s.lat_co, co)
    if name.startswith("off-grid"):
        low = lower_system(spec, N, round_to_grid=True)
        assert not np.array_equal(low.d * spec.delta_ms, s.lat)
