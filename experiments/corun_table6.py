"""The paper's Table 6 from the exact chain with co-running (issue 22, item 6), and B*(N) under co-running.

Paper, Table 6 (R2R, Qwen3-0.6B / Qwen3-32B, p = 0.35): eager (B = (1, 1)) against delayed batching at
the B the paper deployed (the chain's B* for L = (6.0, 27.9) ms: (1, 3) at N = 4, (1, 5) at N = 8):
N = 4: 161.26 / 210.61 (x1.306); N = 8: 296.86 / 372.48 (x1.255).

Sections (each printed as a markdown table; what is fitted and what is predicted is said in each):

``fit``     constant L = (6.0, 27.9) ms, the small model's co-running factor F0 (large model x1) fitted to
            the N = 4 gain on the 0.1 ms grid (exact chain, bisection over Lco_0 = 6.0 F0 in 0.1 ms steps);
            N = 8 and N = 16 are then predictions.  Next to it, the simulator's rate-sharing law
            (``simulate(..., corun_slowdown=...)``) at the same factor: the two readings of co-running.
``scan``    the N = 4 and N = 8 gains as the small model's co-running step moves one 0.1 ms quantum at a
            time (large model x1): the two move in opposite directions, and the exact law resonates at
            some steps (phase locking of deterministic durations).
``h200``    L_i(b) of the H200 CUDA-graph decode profiles with the co-running probe's factors by batch
            size (small model x2.8 at b = 1 to x3.6 at b = 16, linear in b; large model x1.02 / x1.05 /
            x1.08), nothing fitted; exact chain on the coarsest grid within 1 %.
``bstar``   B*(N) for N = 1..64 with and without co-running (``search="auto"``, exact), constant L, the
            fitted F0.
``speed``   a co-running chain at R2R N = 32 next to today's chain (alternating runs, medians), and the
            pruned search N = 1..64 with and without co-running, side by side in one run (``sweeps``:
            the search part alone; ``--before`` adds the co-running search with the slot rule used
            before, every step of both tables within 4 % / 1.5 %).

    .venv/bin/python experiments/corun_table6.py fit h200 bstar speed sweeps [--profiles DIR] [--before]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

import tr_model
from optimizer.search import optimize_sweep, optimize_thresholds
from tr_core.grid import coarsest_delta, spec_latencies
from tr_core.spec import make_spec

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PROFILES = os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "data", "h200-profiles")
PAPER = {1: (73.02, 73.02), 4: (161.26, 210.61), 8: (296.86, 372.48)}
PAPER_B = {1: (1, 1), 4: (1, 3), 8: (1, 5), 16: (2, 10)}   # the chain's B* with L = (6.0, 27.9) ms (16: not in the paper)
P_R2R = [[0.65, 0.35], [1.0, 0.0]]
C_R2R = [[1, 0], [1, 0]]
CONST = tr_model.preset("r2r", [6.0, 27.9], p=0.35)




def gain_row(spec, N, rtg=False, own=True):
    """eager, delayed at the paper's B, their gain, and (own=True) the spec's own B* and its gain."""
    e = tr_model.evaluate(spec, N, (1, 1), round_to_grid=rtg).throughput_tok_s
    d = tr_model.evaluate(spec, N, PAPER_B[N], round_to_grid=rtg).throughput_tok_s
    out = {"eager": e, "delayed": d, "gain": d / e}
    if own:
        o = optimize_thresholds(spec, N, search="auto", round_to_grid=rtg)
        out.update(own_B=o.best_B, own=o.throughput_tok_s, own_gain=o.throughput_tok_s / e)
    return out


def fit(a) -> str:
    t0 = time.perf_counter()
    target = PAPER[4][1] / PAPER[4][0]
    target8 = PAPER[8][1] / PAPER[8][0]

    def g4(q, f1):
        return gain_row(CONST.with_corun([{"slowdown": q / 60.0}, {"slowdown": f1}]), 4, rtg=True, own=False)["gain"]

    def fit_q(f1):
        lo, hi = 60, 240             # Lco_0 = 6.0 ... 24.0 ms in quanta of 0.1 ms
        assert g4(lo, f1) < target < g4(hi, f1)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if g4(mid, f1) < target:
                lo = mid
            else:
                hi = mid
        return min((lo, hi), key=lambda x: abs(g4(x, f1) - target))

    variants = []
    for f1 in (1.0, 1.02, 1.05, 1.08):
        q = fit_q(f1)
        spec = CONST.with_corun([{"slowdown": q / 60.0}, {"slowdown": f1}])
        variants.append((f1, q, spec, {N: gain_row(spec, N, rtg=True) for N in (4, 8, 16)}))
        print(f"large x{f1}: fitted small x{q / 60:.4f}", flush=True)
    solo = {N: gain_row(CONST, N) for N in (1, 4, 8, 16)}
    from simulator import simulate
    md = [f"**Constant L = (6.0, 27.9) ms, the small model's co-running factor fitted at N = 4** "
          f"(`corun_table6.py fit`, {time.perf_counter() - t0:.0f} s; exact chain, 0.1 ms grid). *Fitted*: F0, "
          f"one number per row, to the paper's N = 4 gain x{target:.3f} (at the B the paper deployed). *Fixed, not "
          "fitted*: the large model's factor F1, x1.00 (it is not slowed) or the probe's measured x1.02 / x1.05 / "
          "x1.08. *Predicted*: everything at N = 8 and 16, and every B*.", "",
          "| large F1 (fixed) | small F0 (fitted) | N = 4 gain | N = 8 gain (predicted) | vs paper x1.255 | "
          "N = 16 gain (predicted) | own B* N = 4 / 8 / 16 | own gain N = 8 / 16 |",
          "|---|---|---|---|---|---|---|---|"]
    for f1, q, spec, g in variants:
        md.append(f"| x{f1:.2f} | x{q / 60:.4f} (Lco_0 = {q / 10:.1f} ms) | x{g[4]['gain']:.3f} | x{g[8]['gain']:.3f} | "
                  f"{100 * (g[8]['gain'] - target8):+.1f} points | x{g[16]['gain']:.3f} | "
                  f"{g[4]['own_B']} / {g[8]['own_B']} / {g[16]['own_B']} | x{g[8]['own_gain']:.3f} / "
                  f"x{g[16]['own_gain']:.3f} |")
    md.append(f"| no co-running | - | x{solo[4]['gain']:.3f} | x{solo[8]['gain']:.3f} | "
              f"{100 * (solo[8]['gain'] - target8):+.1f} points | x{solo[16]['gain']:.3f} | {solo[4]['own_B']} / "
              f"{solo[8]['own_B']} / {solo[16]['own_B']} | x{solo[8]['own_gain']:.3f} / x{solo[16]['own_gain']:.3f} |")
    md += ["", "Rates (tok/s) next to the paper's, and the two readings of co-running at the same factors: the chain's "
               "launch law and the simulator's rate-sharing law (`corun_law=\"rate-sharing\"`: a model runs F times "
               f"slower *while* the other runs, re-timed at every start and end; {a.steps:,} request-steps, seed 1, "
               "95 % half-widths):", "",
           "| F0 / F1 | N | paper eager / delayed | chain (launch law) eager / delayed / gain | "
           "rate-sharing (simulator) eager / delayed / gain |", "|---|---|---|---|---|"]
    for f1, q, spec, g in (variants[0], variants[2]):
        F0 = q / 60.0
        for N in (4, 8, 16):
            kw = dict(steps=a.steps, seed=1, corun_slowdown=[[1.0, F0], [f1, 1.0]], corun_law="rate-sharing")
            e = simulate(CONST, N, (1, 1), **kw)
            d = simulate(CONST, N, PAPER_B[N], **kw)
            p = PAPER.get(N)
            ptxt = f"{p[0]:.2f} / {p[1]:.2f}" if p else "-"
            md.append(f"| x{F0:.4f} / x{f1:.2f} | {N} | {ptxt} | {g[N]['eager']:.2f} / {g[N]['delayed']:.2f} / "
                      f"x{g[N]['gain']:.3f} | {e.throughput_tok_s:.2f} +- {e.throughput_ci95_tok_s:.2f} / "
                      f"{d.throughput_tok_s:.2f} +- {d.throughput_ci95_tok_s:.2f} / "
                      f"x{d.throughput_tok_s / e.throughput_tok_s:.3f} |")
    print("\n".join(md), flush=True)
    return "\n".join(md)


def scan(a) -> str:
    """The N = 4 and N = 8 gains (paper's B) as the small model's co-running step moves one 0.1 ms quantum at
    a time (large model x1.00): the gains change by steps where the number of whole co-running small-model
    steps inside one large-model step changes, and no F0 gives both of the paper's gains."""
    t0 = time.perf_counter()
    target4, target8 = PAPER[4][1] / PAPER[4][0], PAPER[8][1] / PAPER[8][0]
    rows = []
    for q in range(a.scan_lo, a.scan_hi + 1):
        spec = CONST.with_corun([{"slowdown": q / 60.0}, {"slowdown": 1.0}])
        rows.append((q, gain_row(spec, 4, rtg=True, own=False)["gain"], gain_row(spec, 8, rtg=True, own=False)["gain"]))
    # irregular: a gain more than 1 point away from the mean of its two neighbours
    odd = set()
    for i in range(1, len(rows) - 1):
        for c in (1, 2):
            if abs(rows[i][c] - 0.5 * (rows[i - 1][c] + rows[i + 1][c])) > 0.01:
                odd.add(rows[i][0])
    md = [f"**The N = 4 and N = 8 gains as the small model's co-running step moves** (`corun_table6.py scan`, "
          f"{time.perf_counter() - t0:.0f} s; large model x1.00, constant L = (6.0, 27.9) ms, exact chain on the "
          f"0.1 ms grid, paper's B; Lco_0 = {a.scan_lo / 10:.1f}-{a.scan_hi / 10:.1f} ms one quantum at a time; "
          "every 5th step and every irregular one shown; *irregular*: a gain more than 1 point away from the mean "
          "of its two neighbours).", "",
          "| Lco_0 ms | F0 | whole co-running small steps in one large step | N = 4 gain | N = 8 gain | "
          "N = 8 vs paper | irregular |", "|---|---|---|---|---|---|---|"]
    for q, g4, g8 in rows:
        if q % 5 == 0 or q in odd or q == 129:
            md.append(f"| {q / 10:.1f} | x{q / 60:.3f} | {279 // q} | x{g4:.3f} | x{g8:.3f} | "
                      f"{100 * (g8 - target8):+.1f} points | {'yes' if q in odd else ''} |")
    # regimes: how many whole co-running small-model steps fit in one large-model step (279 quanta)
    md += ["", "By regime (the number of whole co-running small-model steps inside one large-model step, "
               "floor(27.9 / Lco_0)):", "",
           "| steps inside | Lco_0 ms | N = 4 gain | N = 8 gain | paper's N = 4 x%.3f reachable | N = 8 there |"
           % target4, "|---|---|---|---|---|---|"]
    for k in sorted({279 // q for q, _, _ in rows}, reverse=True):
        part = [r for r in rows if 279 // r[0] == k]
        g4s, g8s = [r[1] for r in part], [r[2] for r in part]
        there = "-"
        if min(g4s) <= target4 <= max(g4s):
            near = min(part, key=lambda r: abs(r[1] - target4))
            there = f"x{near[2]:.3f} at {near[0] / 10:.1f} ms ({100 * (near[2] - target8):+.1f} points)"
        md.append(f"| {k} | {part[0][0] / 10:.1f}-{part[-1][0] / 10:.1f} | x{min(g4s):.3f}-x{max(g4s):.3f} | "
                  f"x{min(g8s):.3f}-x{max(g8s):.3f} | {'no' if there == '-' else 'yes'} | {there} |")
    print("\n".join(md), flush=True)
    return "\n".join(md)


def h200(a) -> str:
    t0 = time.perf_counter()

    def curve(name):
        with open(os.path.join(a.profiles, name), encoding="utf-8") as f:
            doc = json.load(f)
        return {int(b["batch_size"]): float(b["median_ms"]) for b in doc["batches"]}

    dec0 = curve("qwen3-0.6b_decode_graph.json")
    dec1 = curve("qwen3-32b_decode_graph.json")
    bs0, bs1 = sorted(dec0), sorted(dec1)

    def f_small(b):   # probe: x2.8 at b = 1 to x3.6 at b = 16, linear in b, flat outside
        return float(np.interp(b, [1, 16], [2.8, 3.6]))

    md = [f"**H200 graph-decode curves L_i(b) with the probe's co-running factors** (`corun_table6.py h200`; "
          "nothing fitted: small model x2.8 at b = 1 to x3.6 at b = 16 as a table over the profile's batch sizes, "
          "large model x1.02 / x1.05 / x1.08 (the probe's range); exact chain on the coarsest grid that holds every "
          "latency within 1 %).", "",
          "| large x | delta ms | N | eager | at paper's B | gain (paper's B) | own B* | own gain | paper gain |",
          "|---|---|---|---|---|---|---|---|---|"]
    for f1 in (None, 1.02, 1.05, 1.08):
        base = make_spec([dec0[1], dec1[1]], P_R2R, C_R2R, name="r2r-h200", latency_curves=[
            {"batch_size": bs0, "step_latency_ms": [dec0[b] for b in bs0]},
            {"batch_size": bs1, "step_latency_ms": [dec1[b] for b in bs1]}])
        spec = base if f1 is None else base.with_corun([
            {"batch_size": bs0, "step_latency_ms": [dec0[b] * f_small(b) for b in bs0]}, {"slowdown": f1}])
        delta = coarsest_delta(spec_latencies(spec, 8), 0.01)
        spec = spec.with_delta(delta)
        for N in (1, 4, 8):
            r = gain_row(spec, N, rtg=True)
            p = PAPER[N]
            md.append(f"| {'none (solo)' if f1 is None else f1} | {delta:.4g} | {N} | {r['eager']:.2f} | "
                      f"{r['delayed']:.2f} | x{r['gain']:.3f} | {r['own_B']} | x{r['own_gain']:.3f} | "
                      f"x{p[1] / p[0]:.3f} |")
        print(md[-1], flush=True)
    md.insert(1, f"({time.perf_counter() - t0:.0f} s.)")
    print("\n".join(md), flush=True)
    return "\n".join(md)


def bstar(a) -> str:
    t0 = time.perf_counter()
    F0 = a.f0
    co = CONST.with_corun([{"slowdown": F0}, None])
    Ns = list(range(1, a.nmax + 1))
    t1 = time.perf_counter()
    solo = optimize_sweep(CONST, Ns, search="auto", workers=a.workers)
    ts = time.perf_counter() - t1
    t1 = time.perf_counter()
    cor = optimize_sweep(co, Ns, search="auto", workers=a.workers, round_to_grid=True)
    tc = time.perf_counter() - t1
    return bstar_table(F0, Ns, solo, cor, f"`search=\"auto\"` (exact: exhaustive to N = 20, pruned above), "
                       f"workers {a.workers}; without {ts:.0f} s, with {tc:.0f} s")


def bstar_table(F0, Ns, solo, cor, how) -> str:
    md = [f"**B*(N) with and without co-running** (constant L = (6.0, 27.9) ms, small model x{F0:.4f} (fitted at "
          f"N = 4 above); {how}).", "",
          "| N | B* without | tok/s | gain | B* with co-running | tok/s | gain | certificate |", "|---|---|---|---|---|---|---|---|"]
    for N, s, c in zip(Ns, solo, cor):
        if N <= 8 or N % 4 == 0:
            md.append(f"| {N} | {s.best_B} | {s.throughput_tok_s:.2f} | x{s.gain_vs_eager:.3f} | {c.best_B} | "
                      f"{c.throughput_tok_s:.2f} | x{c.gain_vs_eager:.3f} | {c.certificate} |")
    ratio0 = [c.best_B[0] / max(1, s.best_B[0]) for s, c in zip(solo, cor) if s.N >= 16]
    ratio1 = [c.best_B[1] / max(1, s.best_B[1]) for s, c in zip(solo, cor) if s.N >= 16]
    gains = [c.gain_vs_eager for c in cor if c.N >= 16]
    if ratio0:
        md += ["", f"N = 16..{Ns[-1]}: B*_0 with co-running / without {min(ratio0):.2f}-{max(ratio0):.2f}, "
                   f"B*_1 {min(ratio1):.2f}-{max(ratio1):.2f}; gain over eager with co-running "
                   f"x{min(gains):.3f}-x{max(gains):.3f}."]
    print("\n".join(md), flush=True)
    return "\n".join(md)


def _load():
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


def speed(a) -> str:
    import dtmc

    F0 = a.f0
    md = [f"**Speed, side by side in one run** (`corun_table6.py speed`; {os.cpu_count()} shared cores, load "
          f"average {_load()[0]:.1f} at the start: other helpers were running).", ""]
    # 1. the chain at R2R N = 32: today's chain vs the co-running chain (alternating, medians)
    rows = []
    for label, spec in (("x%.4f small" % F0, CONST.with_corun([{"slowdown": F0}, None])),
                        ("probe x2.8 / x1.05", CONST.with_corun([{"slowdown": 2.8}, {"slowdown": 1.05}]))):
        for B in ((1, 1), (3, 20)):
            ts, tc, ns, nc = [], [], 0, 0
            for _ in range(a.repeat):
                t = time.perf_counter()
                es = tr_model.evaluate(CONST, 32, B)
                ts.append(time.perf_counter() - t)
                t = time.perf_counter()
                ec = tr_model.evaluate(spec, 32, B, round_to_grid=True)
                tc.append(time.perf_counter() - t)
                ns, nc = es.states, ec.states
            rows.append((label, B, ns, nc, statistics.median(ts), statistics.median(tc)))
            print(rows[-1], flush=True)
    md += ["Chain at R2R N = 32 (build + solve, `tr_model.evaluate`, no cache), medians of "
           f"{a.repeat} alternating runs; target: co-running <= 1.5x today's:", "",
           "| co-running | B | states today | states co-running | today s | co-running s | ratio | per state |",
           "|---|---|---|---|---|---|---|---|"]
    for label, B, ns, nc, s, c in rows:
        md.append(f"| {label} | {B} | {ns:,} | {nc:,} | {s:.2f} | {c:.2f} | {c / s:.2f}x | "
                  f"{(c / nc) / (s / ns):.2f}x |")
    # 2. pruned search N = 1..nmax, with and without co-running, interleaved N by N (so that a change of
    # the machine's load falls on both), each variant started near its own B*(N - 1) as optimize_sweep does
    md += ["", pruned_sweeps(a, F0)]
    print("\n".join(md), flush=True)
    return "\n".join(md)


def pruned_sweeps(a, F0) -> str:
    """The pruned search N = 1..nmax without co-running, with it (today's slot choice), and with it under
    the union slot rule used before (``--before``), interleaved N by N; wall and CPU seconds."""
    from optimizer.branch import auto_coarse
    from optimizer.search import optimize_thresholds

    def union_levels(spec, N):
        from optimizer.bounds import Bounder
        b = Bounder(spec, N, round_to_grid=True)
        steps = np.concatenate([b.d, b.dco])
        return tuple(sorted({auto_coarse(steps, 0.04), auto_coarse(steps, 0.015)} - {1}, reverse=True))

    co = CONST.with_corun([{"slowdown": F0}, None])
    variants = [("today (no co-running)", CONST, False), (f"co-running x{F0:.4f}", co, False)]
    if a.before:
        variants.append((f"co-running x{F0:.4f}, slots as before (union rule)", co, True))
    Ns = list(range(1, a.nmax + 1))
    res = {v[0]: [] for v in variants}
    wall = {v[0]: 0.0 for v in variants}
    cpu = {v[0]: 0.0 for v in variants}
    prev = {v[0]: None for v in variants}
    for label, spec, old in variants:     # load the compiled kernels before anything is timed
        optimize_thresholds(spec, 24, search="pruned", round_to_grid=True,
                            **({"coarse": union_levels(spec, 24)} if old else {}))
    loads = [_load()[0]]
    for N in Ns:
        for label, spec, old in variants:
            kw = {"coarse": union_levels(spec, N)} if old else {}
            t, c = time.perf_counter(), time.process_time()
            o = optimize_thresholds(spec, N, search="pruned", start=prev[label], round_to_grid=True, **kw)
            wall[label] += time.perf_counter() - t
            cpu[label] += time.process_time() - c
            prev[label] = o.best_B
            res[label].append(o)
        if N % 8 == 0:
            loads.append(_load()[0])
            print(f"N = {N}: " + ", ".join(f"{k}: {wall[k]:.0f} s wall / {cpu[k]:.0f} s CPU" for k in wall),
                  flush=True)
    base = variants[0][0]
    md = [f"Pruned search N = 1..{a.nmax} (`optimize_thresholds(search=\"pruned\")` N by N, each started at its "
          f"own B*(N - 1), the variants interleaved N by N; load average {min(loads):.1f}-{max(loads):.1f}); "
          "target: co-running <= 2x today's:", "",
          "| sweep | wall s | CPU s | wall ratio | CPU ratio | chains evaluated | vectors pruned | B* as today's co-running |",
          "|---|---|---|---|---|---|---|---|"]
    ref = [o.best_B for o in res[variants[1][0]]]
    for label, _, _ in variants:
        same = "-" if label == base else ("yes" if [o.best_B for o in res[label]] == ref else "NO")
        md.append(f"| {label} | {wall[label]:.1f} | {cpu[label]:.1f} | {wall[label] / wall[base]:.2f}x | "
                  f"{cpu[label] / cpu[base]:.2f}x | {sum(o.evaluated for o in res[label]):,} | "
                  f"{sum(o.pruned for o in res[label]):,} | {same} |")
    certs = sorted({o.certificate for rows in res.values() for o in rows})
    md += ["", f"Certificates: {', '.join(certs)}.", "",
           bstar_table(F0, Ns, res[base], res[variants[1][0]], "from these pruned sweeps (exact, certificate "
                       "`pruned-exact`; B* equals `search=\"auto\"`'s)")]
    print("\n".join(md), flush=True)
    return "\n".join(md)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="+", choices=("fit", "scan", "h200", "bstar", "speed", "sweeps"))
    ap.add_argument("--profiles", default=DEFAULT_PROFILES)
    ap.add_argument("--steps", type=int, default=300_000, help="simulated request-steps (rate-sharing comparison)")
    ap.add_argument("--f0", type=float, default=None, help="small-model factor for bstar/speed (default: fit it)")
    ap.add_argument("--nmax", type=int, default=64)
    ap.add_argument("--scan-lo", type=int, default=90, help="scan: smallest Lco_0 in 0.1 ms quanta")
    ap.add_argument("--scan-hi", type=int, default=180, help="scan: largest Lco_0 in 0.1 ms quanta")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before", action="store_true",
                    help="speed/sweeps: also the co-running sweep with the slots chosen as before (union rule)")
    a = ap.parse_args(argv)
    print(f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, load {_load()}", flush=True)
    out = []
    for w in a.what:
        if w == "fit":
            out.append(fit(a))
        elif w == "scan":
            out.append(scan(a))
        elif w == "h200":
            out.append(h200(a))
        else:
            if a.f0 is None:
                print("error: --f0 is needed for bstar/speed (run fit first)", file=sys.stderr)
                return 2
            out.append({"bstar": bstar, "speed": speed, "sweeps": lambda a: pruned_sweeps(a, a.f0)}[w](a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
