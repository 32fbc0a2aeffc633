"""Where the states of the co-running chain come from (issue 22, speed target of the chain), side by side.

R2R at N = 32, eager B = (1, 1), constant L = (6.0, 27.9) ms on the 0.1 ms grid (60 and 279 quanta).
With the probe's factors on both models (x2.8 / x1.05: 168 and 293 quanta) the exact chain has about
4x the states of today's.  Sections:

``time``        today's chain and the co-running chain, build + solve (``tr_model.evaluate``, no cache),
                alternating runs, medians of wall and CPU seconds.
``attribute``   the state count with each part of the law switched on alone (the small model's co-running
                step, the large model's, both), and the gcd of the steps: the residual times of the
                running batches live on a lattice of gcd quanta, so a step that shares no factor with
                the others makes every residual value reachable.
``lump``        the coarsest ordinarily lumpable partition of each chain that keeps the holding time and
                the reward of every block constant (partition refinement): its block count against the
                state count says whether an exact aggregation could shrink the chain.
``grid``        the large model's co-running step moved by one quantum at a time (29.0-29.7 ms): states
                and tokens/s of the exact chain, to show what a "coarser common grid" would do.

    .venv/bin/python experiments/corun_chain_states.py time attribute lump grid [--repeat 5]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import numpy as np

import dtmc
import tr_model

P = np.array([[0.65, 0.35], [1.0, 0.0]])
C = np.array([[1.0, 0.0], [1.0, 0.0]])
N = 32
CONST = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
PROBE = CONST.with_corun([{"slowdown": 2.8}, {"slowdown": 1.05}])


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def _tables(solo, co=None):
    d = np.ones((2, N + 1), dtype=np.int64)
    d[0, 1:], d[1, 1:] = solo
    if co is None:
        return d, None
    dco = np.ones((2, N + 1), dtype=np.int64)
    dco[0, 1:], dco[1, 1:] = co
    return d, dco


def time_section(a) -> str:
    rows = {"today": ([], [], None), "co-running x2.8 / x1.05": ([], [], None)}
    load0 = _load()
    for _ in range(a.repeat):
        for label, spec in (("today", CONST), ("co-running x2.8 / x1.05", PROBE)):
            t, c = time.perf_counter(), time.process_time()
            e = tr_model.evaluate(spec, N, (1, 1), round_to_grid=True)
            w, cp, _ = rows[label]
            w.append(time.perf_counter() - t)
            cp.append(time.process_time() - c)
            rows[label] = (w, cp, e)
    md = [f"Chain at R2R N = {N}, B = (1, 1) (`corun_chain_states.py time`; build + solve through "
          f"`tr_model.evaluate`, no cache; medians of {a.repeat} alternating runs after one warm-up; load "
          f"average {load0:.1f} at the start, {_load():.1f} at the end, {os.cpu_count()} cores):", "",
          "| chain | states | transitions | solver | build s | solve s | wall s (median) | CPU s (median) | "
          "CPU ratio |", "|---|---|---|---|---|---|---|---|---|"]
    base = statistics.median(rows["today"][1])
    for label, (w, cp, e) in rows.items():
        md.append(f"| {label} | {e.states:,} | {e.transitions:,} | {e.solver} ({e.iterations}) | "
                  f"{e.build_seconds:.2f} | {e.solve_seconds:.2f} | {statistics.median(w):.2f} | "
                  f"{statistics.median(cp):.2f} | {statistics.median(cp) / base:.2f}x |")
    return "\n".join(md)


def attribute_section(a) -> str:
    cases = [("today", (60, 279), None),
             ("factor 1 on both (the co-running path, same durations)", (60, 279), (60, 279)),
             ("small model x2.8 only", (60, 279), (168, 279)),
             ("large model x1.05 only", (60, 279), (60, 293)),
             ("both (the probe)", (60, 279), (168, 293)),
             ("both, the large model's step 29.4 ms", (60, 279), (168, 294))]
    md = [f"States of the exact chain at R2R N = {N}, B = (1, 1), by which steps the law uses "
          "(`corun_chain_states.py attribute`; durations in 0.1 ms quanta):", "",
          "| law | solo steps | co-running steps | gcd of all steps | states | x today | transitions | "
          "states with one successor |", "|---|---|---|---|---|---|---|---|"]
    base = None
    for label, solo, co in cases:
        d, dco = _tables(solo, co)
        ch = dtmc.build_chain(P, C, d, N, (1, 1), dco=dco)
        base = base or ch.n_states
        g = math.gcd(*solo, *(co or ()))
        single = int((np.diff(ch.T.indptr) == 1).sum())
        md.append(f"| {label} | {solo[0]}, {solo[1]} | {'-' if co is None else f'{co[0]}, {co[1]}'} | {g} | "
                  f"{ch.n_states:,} | {ch.n_states / base:.2f}x | {ch.n_transitions:,} | "
                  f"{single:,} ({100 * single / ch.n_states:.0f} %) |")
    return "\n".join(md)


def coarsest_lumping(ch) -> tuple[int, int]:
    """Blocks of the coarsest partition that is ordinarily lumpable with constant holding time and reward
    per block (refinement from the partition by (tau, g) until stable); and the refinement rounds."""
    T = ch.T.tocsr()
    n = T.shape[0]
    rows = np.repeat(np.arange(n), np.diff(T.indptr))
    key0 = np.stack([ch.tau.astype(np.int64), np.round(ch.g * 1e9).astype(np.int64)], axis=1)
    block = np.unique(key0, axis=0, return_inverse=True)[1].ravel()
    nb = int(block.max()) + 1
    rounds = 0
    while True:
        rounds += 1
        bj = block[T.indices]
        order = np.lexsort((bj, rows))
        r2, b2, p2 = rows[order], bj[order], T.data[order]
        first = np.ones(len(r2), dtype=bool)
        first[1:] = (r2[1:] != r2[:-1]) | (b2[1:] != b2[:-1])
        at = np.flatnonzero(first)
        ps = np.add.reduceat(p2, at)
        # the signature of a state: its probability (to 1e-10) of entering each block, as an exact
        # sorted list compared row by row (no hashing: a collision could only merge, but none is taken)
        rr, bb, qq = r2[at], b2[at], np.round(ps * 1e10).astype(np.int64)
        sig = {}
        new = np.empty(n, dtype=np.int64)
        starts = np.searchsorted(rr, np.arange(n + 1))
        for s in range(n):
            k = (int(block[s]), bb[starts[s]:starts[s + 1]].tobytes(), qq[starts[s]:starts[s + 1]].tobytes())
            new[s] = sig.setdefault(k, len(sig))
        nn = len(sig)
        if nn == nb:
            return nb, rounds
        block, nb = new, nn


def lump_section(a) -> str:
    md = [f"Coarsest exact (ordinary) lumping of the chains at R2R N = {N}, B = (1, 1), holding time and reward "
          "constant on each block (`corun_chain_states.py lump`):", "",
          "| chain | states | blocks of the coarsest lumping | refinement rounds |", "|---|---|---|---|"]
    for label, solo, co in (("today", (60, 279), None), ("co-running x2.8 / x1.05", (60, 279), (168, 293))):
        d, dco = _tables(solo, co)
        ch = dtmc.build_chain(P, C, d, N, (1, 1), dco=dco)
        nb, rounds = coarsest_lumping(ch)
        md.append(f"| {label} | {ch.n_states:,} | {nb:,} | {rounds} |")
    return "\n".join(md)


def grid_section(a) -> str:
    md = [f"The large model's co-running step moved one 0.1 ms quantum at a time (small model 16.8 ms "
          f"co-running; R2R N = {N}, B = (1, 1); exact chain; `corun_chain_states.py grid`):", "",
          "| large model's co-running step | gcd with 168 | states | tok/s | vs 29.3 ms |",
          "|---|---|---|---|---|"]
    ref = None
    vals = []
    for q in range(290, 298):
        d, dco = _tables((60, 279), (168, q))
        sol = dtmc.solve_chain(P, C, d, N, (1, 1), dco=dco)
        thr = sol.throughput_per_quantum * 1000.0 / 0.1
        vals.append((q, sol.states, thr))
        if q == 293:
            ref = thr
    for q, n, thr in vals:
        md.append(f"| {q / 10:.1f} ms ({q} quanta) | {math.gcd(168, q)} | {n:,} | {thr:.2f} | "
                  f"{100 * (thr / ref - 1):+.2f} % |")
    return "\n".join(md)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="+", choices=("time", "attribute", "lump", "grid"))
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    print(f"machine: {os.cpu_count()} cores, load {_load():.1f}", flush=True)
    # warm-up: load the compiled kernels before anything is timed
    tr_model.evaluate(CONST, 8, (1, 1))
    tr_model.evaluate(PROBE, 8, (1, 1), round_to_grid=True)
    for w in a.what:
        out = {"time": time_section, "attribute": attribute_section, "lump": lump_section,
               "grid": grid_section}[w](a)
        print(out + "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
