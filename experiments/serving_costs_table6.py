"""Which serving cost explains the paper's delayed-batching gains (Table 6)?  The model, extended step by step.

Paper, Table 6 (R2R, Qwen3-0.6B / Qwen3-32B, p = 0.35; A100s, the small model on
GPU 0, the large one on GPUs 0 and 1 with TP 2, sharing GPU 0 through MPS):
eager (B = (1, 1)) versus delayed batching at the chain's B*, tokens/s:
N = 1: 73.02 / 73.02; N = 4: 161.26 / 210.61 (x1.31); N = 8: 296.86 / 372.48 (x1.25).

Model variants, each adding one cost to the previous one:

1. the paper's chain, constant L = (6.0, 27.9) ms (exact, ``tr_model.evaluate``);
2. L_i(b) of the H200 CUDA-graph decode profiles (simulator; the chain gives the
   same numbers where its grid allows, this keeps the script fast);
3. + the catch-up extend: the large model's step feeds the k + 1 tokens the
   request committed since it last ran there, at the extra cost per token of
   the H200 extend-4 profile, ``(L_ext4(b) - L(b)) / 3``;
4. + co-running slowdown: the small model runs ``f0`` times slower while the
   large one runs (and the large one ``f1`` times while the small one runs).
   No profile measures f yet (the GPU check does), so f0 is *fitted* to the
   N = 4 gain with f1 = 1, and the N = 8 gain is then a prediction; a second fit
   uses both gains for (f0, f1).

Gains are compared rather than absolute rates: the profiles come from one H200
with this project's executor, the paper from A100s with SGLang.

    .venv/bin/python experiments/serving_costs_table6.py [--steps 300000] [--no-results]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

import tr_model
from simulator import simulate
from tr_core.spec import make_spec

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PROFILES = os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "data", "h200-profiles")
PAPER = {1: (73.02, 73.02), 4: (161.26, 210.61), 8: (296.86, 372.48)}
PAPER_B = {1: (1, 1), 4: (1, 3), 8: (1, 5)}   # the chain's B* with L = (6.0, 27.9), deployed in the paper
P_R2R = [[0.65, 0.35], [1.0, 0.0]]
C_R2R = [[1, 0], [1, 0]]


def read_curve(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    return {int(b["batch_size"]): float(b["median_ms"]) for b in doc["batches"]}


def load_profiles(folder):
    dec0 = read_curve(os.path.join(folder, "qwen3-0.6b_decode_graph.json"))
    dec1 = read_curve(os.path.join(folder, "qwen3-32b_decode_graph.json"))
    ext1 = read_curve(os.path.join(folder, "qwen3-32b_extend4_graph.json"))
    bs = sorted(set(dec1) & set(ext1))
    slope = {b: (ext1[b] - dec1[b]) / 3.0 for b in bs}
    return dec0, dec1, slope


def curve_spec(dec0, dec1):
    def c(d):
        return {"batch_size": sorted(d), "step_latency_ms": [d[b] for b in sorted(d)]}
    return make_spec([dec0[1], dec1[1]], P_R2R, C_R2R, latency_curves=[c(dec0), c(dec1)], name="r2r-h200-graph")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", default=DEFAULT_PROFILES, help="folder of the H200 profiles")
    ap.add_argument("--steps", type=int, default=300_000, help="simulated request-steps per configuration")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-results", action="store_true", help="do not touch experiments/LOG.md")
    a = ap.parse_args(argv)
    if not os.path.isdir(a.profiles):
        print(f"error: no profile folder {a.profiles} (the shared H200 profiles)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    dec0, dec1, slope = load_profiles(a.profiles)
    spec_b = curve_spec(dec0, dec1)
    sb = sorted(slope)
    ext1 = (lambda b: float(np.interp(b, sb, [slope[x] for x in sb])))

    def sim(N, B, ext=False, f0=1.0, f1=1.0, spec=spec_b):
        kw = {}
        if ext:
            kw["extend_ms_per_token"] = [0.0, ext1]
        if f0 != 1.0 or f1 != 1.0:
            kw["corun_slowdown"] = [[1.0, f0], [f1, 1.0]]
        r = simulate(spec, N, B, steps=a.steps, seed=a.seed, **kw)
        return r.throughput_tok_s, r.throughput_ci95_tok_s

    def row(name, fn):
        out = {}
        for N in (1, 4, 8):
            e, ee = fn(N, (1, 1))
            d, de = fn(N, PAPER_B[N])
            best = max(((b1,) + fn(N, (1, b1)) for b1 in range(1, N + 1)), key=lambda x: x[1])
            out[N] = {"eager": e, "eager_ci": ee, "delayed": d, "delayed_ci": de, "gain": d / e,
                      "own_B1": best[0], "own_gain": best[1] / e}
        return name, out

    const = tr_model.preset("r2r", [6.0, 27.9], p=0.35)

    def chain(N, B):
        return tr_model.evaluate(const, N, B).throughput_tok_s, 0.0

    rows = [row("chain, constant L = (6.0, 27.9) ms", chain),
            row("L_i(b), H200 graph decode", lambda N, B: sim(N, B)),
            row("L_i(b) + catch-up extend", lambda N, B: sim(N, B, ext=True))]

    # fit f0 (f1 = 1) to the N = 4 gain by bisection on a monotone response
    target4 = PAPER[4][1] / PAPER[4][0]

    def gain(N, f0, f1, ext=True, spec=spec_b):
        return sim(N, PAPER_B[N], ext, f0, f1, spec)[0] / sim(N, (1, 1), ext, f0, f1, spec)[0]

    def fit_f0(ext=True, spec=spec_b):
        lo, hi = 1.0, 4.0
        for _ in range(14):
            mid = 0.5 * (lo + hi)
            if gain(4, mid, 1.0, ext, spec) < target4:
                lo = mid
            else:
                hi = mid
        return 0.5 * (lo + hi)

    f0 = fit_f0()
    rows.append(row(f"+ co-running, small model x{f0:.2f} (fitted to the N = 4 gain), large x1.00",
                    lambda N, B: sim(N, B, True, f0, 1.0)))
    # both factors fitted to both gains (coarse grid, then the best cell refined)
    target8 = PAPER[8][1] / PAPER[8][0]
    best = None
    for g0 in np.arange(1.0, 3.51, 0.25):
        for g1 in np.arange(1.0, 1.51, 0.1):
            err = (gain(4, g0, g1) - target4) ** 2 + (gain(8, g0, g1) - target8) ** 2
            if best is None or err < best[0]:
                best = (err, float(g0), float(g1))
    _, g0, g1 = best
    rows.append(row(f"+ co-running, small x{g0:.2f}, large x{g1:.2f} (both fitted to both gains)",
                    lambda N, B: sim(N, B, True, g0, g1)))
    # the same co-running cost on the paper's own constant L (no profile needed)
    fc = fit_f0(ext=False, spec=const)
    rows.append(row(f"constant L + co-running, small x{fc:.2f} (fitted to the N = 4 gain)",
                    lambda N, B: sim(N, B, False, fc, 1.0, const)))
    seconds = time.perf_counter() - t0

    def fmt(x):
        return f"{x:.2f}"

    md = ["| model | N=1 tok/s | N=4 eager | N=4 delayed (1,3) | N=4 gain | N=8 eager | N=8 delayed (1,5) | "
          "N=8 gain | own B1* at N=4 / 8 |", "|---|---|---|---|---|---|---|---|---|"]
    md.append(f"| **paper, measured (Table 6)** | {PAPER[1][0]} | {PAPER[4][0]} | {PAPER[4][1]} | "
              f"x{target4:.3f} | {PAPER[8][0]} | {PAPER[8][1]} | x{target8:.3f} | (3 / 5) |")
    for name, o in rows:
        md.append(f"| {name} | {fmt(o[1]['eager'])} | {fmt(o[4]['eager'])} | {fmt(o[4]['delayed'])} | "
                  f"x{o[4]['gain']:.3f} | {fmt(o[8]['eager'])} | {fmt(o[8]['delayed'])} | x{o[8]['gain']:.3f} | "
                  f"{o[4]['own_B1']} / {o[8]['own_B1']} |")
    base = rows[0][1]
    attrib = []
    for k in range(1, len(rows)):
        ref = {1: 0, 2: 1, 3: 2, 4: 2, 5: 0}[k]   # the row this one adds a cost to
        name, o = rows[k]
        prev = rows[ref][1]
        attrib.append(f"- {name}: gain at N = 4 {100 * (o[4]['gain'] - prev[4]['gain']):+.1f} pp, at N = 8 "
                      f"{100 * (o[8]['gain'] - prev[8]['gain']):+.1f} pp (vs \"{rows[ref][0]}\").")
    one = rows[3][1]
    attrib.append(f"- Out of sample: with the small-model slowdown fitted at N = 4 only, the predicted N = 8 gain is "
                  f"x{one[8]['gain']:.3f} against the measured x{target8:.3f} "
                  f"({100 * (one[8]['gain'] - target8):+.1f} pp; the constant-L chain: "
                  f"{100 * (base[8]['gain'] - target8):+.1f} pp).")
    n1 = rows[1][1][1]["eager"]
    ci = max(o[N][key] for _, o in rows[1:] for N in (1, 4, 8) for key in ("eager_ci", "delayed_ci"))
    body = "\n".join([
        "",
        "Which serving cost explains the paper's delayed-batching gains (Table 6, R2R p = 0.35)? Each row adds "
        "one cost to the row above (simulator, common random numbers; the first row is the exact chain). "
        "Profiles: `../shared/data/h200-profiles` (CUDA-graph decode of both models, extend-4 of the 32B model).",
        "",
        f"Command: `.venv/bin/python experiments/serving_costs_table6.py --steps {a.steps} --seed {a.seed}`; "
        f"{os.cpu_count()} shared cores, Python {platform.python_version()}, {seconds:.0f} s. Largest 95% "
        f"half-width of a simulated rate: {ci:.2f} tok/s.",
        "",
        *md,
        "",
        *attrib,
        "",
        "Reading: batch-size-dependent L_i(b) and the catch-up extend both make larger batches dearer, so they "
        "*lower* the predicted gain of delayed batching; neither explains Table 6. With L_i(b) from the H200 "
        "graph profiles the N = 1 rate (no batching, no overlap) is "
        f"{n1:.2f} tok/s against the paper's 73.02 ({100 * (n1 / 73.02 - 1):+.1f}%; the constant-L chain: 63.43), so "
        "the paper's constant L = (6.0, 27.9) ms is a loaded-system average rather than L(1). What raises the gain "
        "is the co-running slowdown: in eager mode the large model runs almost all the time, so the small model's "
        "steps nearly always share the GPU with it; delayed batching leaves the large model idle while a batch "
        "fills, and the small model then runs alone. A small-model slowdown fitted to the N = 4 gain (large "
        "model unaffected) predicts the N = 8 gain to the figure given above; on the paper's own constant L the same "
        "mechanism needs a factor of about 2 and then also brings the absolute rates within a few percent of Table "
        "6. The slowdown factor itself is "
        "a fit, not a measurement: `benchmarks/gpu_runtime_check.py` measures each model's step latency while the "
        "other runs (pending a GPU run).",
    ])
    print(body)
    if not a.no_results:
        from runtime_vs_model import replace_section
        replace_section(os.path.join(os.path.dirname(HERE), "experiments", "LOG.md"), "## runtime: serving costs vs the paper's Table 6", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
