"""Predicted versus measured delayed batching on a GPU: profile, model, predict B*(N), measure the runtime.

The paper's Figure 10 on real hardware, for R2R (p = 0.35) with the Qwen3-0.6B and
Qwen3-32B architectures (``data/models/*/config.json``, random weights, bf16),
both models in one process (one CUDA stream and worker thread each; separate
GPUs when there are two):

1. **profile** each model through the runtime's own executor
   (``tr_model.serving.runtime.torch_executor``, CUDA graphs per (b, T)): decode step
   ``L_i(b)`` for b = 1..max N, the extend cost (steps feeding 4 tokens per
   row), and the decode step while the other model runs decode steps back to
   back (the co-running latency);
2. **model**: the spec gets ``L_i(b)`` tables; the simulator adds the catch-up
   extend cost ``(L_ext4(b) - L(b)) / 3`` per extra fed token (the fed
   length padded to the captured graph lengths, as the executor pads it), the
   co-running slowdown ``f_i`` = median over b of co-running / alone, and the
   runtime's per-step overhead ``o`` (thread hand-off, routing, peer messages)
   from a short calibration run at N = 1: per committed token R2R takes one
   small-model step and p large-model steps, so
   ``o = (1 / T_1 - L_0 - p L_1) / (1 + p)`` with the run's own step times;
3. **predict** ``B*(N)`` for N = 1, 2, 4, 8, 16 with both models, "L(b)" (the
   chain's assumptions with batch-dependent latency) and "+costs" (extend and
   co-running), over all B with B0 <= 2;
4. **measure** the runtime (``tr_model.serving.runtime``, closed loop, N clients, greedy
   decoding, geometric router with P) at eager (1, 1), at both predicted B* and
   at the +costs B*'s neighbours in B1; tokens/s over a window after a warm-up,
   95% interval by batch means over the window's slices pooled over repeats.

Output: a table per N (predicted and measured tok/s, the predicted B*'s rank
among the measured vectors, predicted and measured gain over eager) on stdout,
and ``gpu_runtime_check.json`` / ``gpu_runtime_check.md`` in ``--out``
(default ``$OUT`` when set, else the current folder).  ``--budget-s`` bounds the
whole run: measurements that would overrun it are skipped and listed.

    python3 benchmarks/gpu_runtime_check.py                 # one H200: about 7 minutes
    python3 benchmarks/gpu_runtime_check.py --tiny          # CPU, tiny 2-layer models: the same pipeline
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

T_STUDENT = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23,
             12: 2.18, 15: 2.13, 20: 2.09, 25: 2.06, 30: 2.04}


def t_quantile(df: int) -> float:
    if df > 30:
        return 1.96
    return T_STUDENT.get(df) or T_STUDENT[max(d for d in T_STUDENT if d <= df)]


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny random 2-layer models on the CPU (a functional run)")
    ap.add_argument("--N", default=None, help="concurrency levels, comma separated (default 1,2,4,8,16; tiny 1,2,4)")
    ap.add_argument("--p", type=float, default=0.35, help="R2R escalation probability")
    ap.add_argument("--small-config", default=os.path.join(ROOT, "data", "models", "Qwen3-0.6B", "config.json"))
    ap.add_argument("--large-config", default=os.path.join(ROOT, "data", "models", "Qwen3-32B", "config.json"))
    ap.add_argument("--dtype", default=None, help="bf16 (GPU default) or fp32 (tiny default)")
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--output-tokens", type=int, default=480, help="tokens per request (then a new one starts)")
    ap.add_argument("--warmup-s", type=float, default=None, help="warm-up before each window (default 2; tiny 0.3)")
    ap.add_argument("--window-s", type=float, default=None, help="measured window per repeat (default 5; tiny 1)")
    ap.add_argument("--repeats", type=int, default=2, help="independent runs per configuration")
    ap.add_argument("--slices", type=int, default=6, help="batch-means slices per window")
    ap.add_argument("--profile-steps", type=int, default=None, help="timed steps per profiled size (default 12; tiny 4)")
    ap.add_argument("--sim-steps", type=int, default=150_000, help="simulated request-steps per predicted vector")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop measuring before this many seconds")
    ap.add_argument("--no-graphs", action="store_true", help="eager steps only (no CUDA graph capture)")
    ap.add_argument("--no-graph-padding", dest="graph_padding", action="store_false",
                    help="model catch-up lengths unpadded (default: padded to the captured lengths, as replayed)")
    ap.add_argument("--out", default=os.environ.get("OUT") or ".", help="folder for the JSON and markdown results")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    a.Ns = [int(x) for x in (a.N or ("1,2,4" if a.tiny else "1,2,4,8,16")).split(",")]
    if min(a.Ns) < 1:
        ap.error("--N values must be >= 1")
    a.warmup_s = a.warmup_s if a.warmup_s is not None else (0.3 if a.tiny else 2.0)
    a.window_s = a.window_s if a.window_s is not None else (1.0 if a.tiny else 5.0)
    a.profile_steps = a.profile_steps or (4 if a.tiny else 12)
    a.dtype = a.dtype or ("fp32" if a.tiny else "bf16")
    if a.dtype not in ("bf16", "fp32", "fp16"):
        ap.error("--dtype must be bf16, fp16 or fp32")
    return a


def warm_simulator_cache():
    """Compile the simulator kernel into numba's on-disk cache in a child process, while the GPU work runs."""
    code = ("import tr_model, simulator; simulator.simulate(tr_model.preset('r2r', [6.0, 27.9], p=0.35), 2, (1, 1), "
            "steps=2000, extend_ms_per_token=[0.0, 0.1], corun_slowdown=[[1, 1.1], [1.1, 1]])")
    try:
        return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    except OSError:
        return None


def build_models(a, maxN):
    import torch
    from tr_model.serving.runtime.torch_executor import SlotModel, load_shape, random_weights, tiny_shape
    cuda = torch.cuda.is_available() and not a.tiny
    if a.tiny:
        shapes = [tiny_shape(hidden=32, layers=2, vocab_size=256), tiny_shape(hidden=64, layers=2, vocab_size=256)]
    else:
        shapes = [load_shape(a.small_config), load_shape(a.large_config)]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    ngpu = torch.cuda.device_count() if cuda else 0
    devices = ["cpu", "cpu"] if not cuda else (["cuda:0", "cuda:1"] if ngpu >= 2 else ["cuda:0", "cuda:0"])
    max_len = a.prompt_tokens + a.output_tokens + 1
    buckets = (1, 2, 4, 8, 16, 32) if not a.tiny else (1, 2, 4, 8)
    models, info = [], []
    for k, (shape, dev) in enumerate(zip(shapes, devices)):
        t0 = time.perf_counter()
        w = random_weights(shape, device=dev, dtype=dtype, seed=a.seed + k)
        m = SlotModel(shape, w, n_slots=maxN, max_len=max_len, t_buckets=buckets, device=dev, dtype=dtype,
                      cuda_graphs=False, name=["small", "large"][k])
        del w
        graph_error = None
        if cuda and not a.no_graphs:
            try:
                m.capture_graphs(range(1, maxN + 1))
            except Exception as e:  # keep going eagerly: a run without graphs still answers most questions
                m.graphs.clear()
                torch.cuda.synchronize()
                graph_error = f"{type(e).__name__}: {e}"[:500]
                print(f"warning: CUDA graph capture failed for model {k} ({graph_error}); eager steps",
                      file=sys.stderr)
        models.append(m)
        info.append({"device": dev, "weight_bytes": shape.weight_bytes(2 if dtype != torch.float32 else 4),
                     "layers": shape.num_layers, "hidden": shape.hidden_size, "graphs": len(m.graphs),
                     "capture_s": round(m.capture_s, 2), "build_s": round(time.perf_counter() - t0, 2),
                     "cache_positions": m.S, "graph_error": graph_error})
    dev_name = torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu"
    return models, info, dev_name, cuda


def profile(models, a, maxN):
    from tr_model.serving.runtime.torch_executor import profile_step_latency
    bs = list(range(1, maxN + 1))
    ctx = max(1, min(a.prompt_tokens + a.output_tokens // 2, models[0].max_len - 8))
    kw = dict(context=ctx, steps=a.profile_steps, warmup=2, seed=a.seed)
    prof = {"context_tokens": ctx, "decode": [], "extend4": [], "corun": [], "corun_other_batch": []}
    ext_bs = sorted({b for b in (1, 2, 4, 8, 16) if b <= maxN} | {maxN})
    for i, m in enumerate(models):
        other = models[1 - i]
        prof["decode"].append(profile_step_latency(m, bs, new_tokens=1, **kw))
        prof["extend4"].append(profile_step_latency(m, ext_bs, new_tokens=4, **kw))
        ob = max(1, min(4, maxN))
        prof["corun"].append(profile_step_latency(m, ext_bs, new_tokens=1, other=other, other_batch=ob, **kw))
        prof["corun_other_batch"].append(ob)
    return prof


def calibrate_overhead(ex, spec, a):
    """Per-step overhead of the runtime beyond the executor's step time (ms), from a closed loop at N = 1."""
    from tr_model.serving.runtime import measure_closed_loop
    ex.reset()
    r = measure_closed_loop(spec, 1, (1, 1), ex, duration_s=max(1.0, a.window_s / 2), warmup_s=a.warmup_s / 2,
                            max_output_tokens=a.output_tokens, prompt_len=a.prompt_tokens, seed=a.seed + 7)
    logs = [[s["ms"] for s in ex.step_log if s["model"] == i and s["tokens"] <= 8] for i in range(2)]
    L = [sum(v) / len(v) if v else math.nan for v in logs]
    o = (1000.0 / r.throughput_tok_s - L[0] - a.p * L[1]) / (1 + a.p)
    return max(0.0, o), {"throughput_tok_s": r.throughput_tok_s, "mean_step_ms": L, "overhead_ms": o}


def model_inputs(prof, p, overhead_ms=0.0):
    """Spec with L_i(b) tables, the same plus the runtime overhead, extend slope functions, co-running factors."""
    import numpy as np
    import tr_model
    from tr_core.spec import make_spec
    curves, slopes, factors = [], [], []
    for i in range(2):
        dec = prof["decode"][i]
        bs = sorted(dec)
        # a step latency that falls with b is noise: keep the curve monotone (running maximum)
        ls, run = [], 0.0
        for b in bs:
            run = max(run, dec[b])
            ls.append(run)
        curves.append({"batch_size": bs, "step_latency_ms": ls})
        eb = sorted(prof["extend4"][i])
        sl = [max(0.0, (prof["extend4"][i][b] - float(np.interp(b, bs, ls))) / 3.0) for b in eb]
        slopes.append((eb, sl))
        ratios = [prof["corun"][i][b] / float(np.interp(b, bs, ls)) for b in sorted(prof["corun"][i])]
        factors.append(max(1.0, float(np.median(ratios))))
    P = [[1 - p, p], [1.0, 0.0]]
    spec = make_spec([curves[0]["step_latency_ms"][0], curves[1]["step_latency_ms"][0]], P, [[1, 0], [1, 0]],
                     latency_curves=curves, name="r2r-measured")
    ext = [(lambda b, e=e: float(np.interp(b, e[0], e[1]))) for e in slopes]
    corun = [[1.0, factors[0]], [factors[1], 1.0]]
    with_o = [{"batch_size": c["batch_size"], "step_latency_ms": [x + overhead_ms for x in c["step_latency_ms"]]}
              for c in curves]
    spec_o = make_spec([c["step_latency_ms"][0] for c in with_o], P, [[1, 0], [1, 0]], latency_curves=with_o,
                       name="r2r-measured+overhead")
    return spec, spec_o, ext, corun, {"latency_curves": curves, "overhead_ms": overhead_ms,
                                      "extend_ms_per_token": [list(map(list, zip(*s))) for s in slopes],
                                      "corun_slowdown": corun}


def predict(spec, spec_o, ext, corun, N, a, buckets=()):
    from simulator import simulate
    cands = [(b0, b1) for b0 in (1, 2) for b1 in range(1, N + 1) if (b0 - 1) + (b1 - 1) < N]
    out = {}
    for B in cands:
        lb = simulate(spec, N, B, steps=a.sim_steps, seed=a.seed + 1)
        full = simulate(spec_o, N, B, steps=a.sim_steps, seed=a.seed + 1, extend_ms_per_token=ext,
                        prompt_tokens=a.prompt_tokens, request_tokens=a.output_tokens, corun_slowdown=corun,
                        extend_buckets=buckets if a.graph_padding else None)
        out[B] = {"lb": lb.throughput_tok_s, "lb_ci": lb.throughput_ci95_tok_s, "costs": full.throughput_tok_s,
                  "costs_ci": full.throughput_ci95_tok_s}
    return out


def measure(ex, spec, N, B, a):
    from tr_model.serving.runtime import measure_closed_loop
    slices, runs = [], []
    graph_steps = steps = 0
    for rep in range(a.repeats):
        ex.reset()
        r = measure_closed_loop(spec, N, B, ex, duration_s=a.window_s, warmup_s=a.warmup_s,
                                max_output_tokens=a.output_tokens, prompt_len=a.prompt_tokens,
                                seed=a.seed + 100 * rep + N, slices=a.slices)
        slices += list(r.slice_throughput_tok_s)
        runs.append(r)
        steps += len(ex.step_log)
        graph_steps += sum(1 for s in ex.step_log if s["graph"])
    k = len(slices)
    mean = sum(slices) / k
    ci = (t_quantile(k - 1) * math.sqrt(sum((x - mean) ** 2 for x in slices) / (k - 1) / k)) if k > 1 else math.nan
    return {"tok_s": mean, "ci95": ci, "mean_batch": [sum(r.mean_batch_size[i] for r in runs) / len(runs) for i in range(2)],
            "min_batch": [min(r.min_batch_size[i] for r in runs) for i in range(2)],
            "graph_fraction": graph_steps / steps if steps else math.nan}


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        return run(a)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        import traceback
        try:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, "gpu_runtime_check_error.txt"), "w", encoding="utf-8") as f:
                traceback.print_exc(file=f)
        except OSError:
            pass
        print(f"error: {type(e).__name__}: {e} (traceback in {a.out}/gpu_runtime_check_error.txt)",
              file=sys.stderr)
        return 1


def write_outputs(doc, out):
    from tr_core.fileio import atomic_write
    os.makedirs(out, exist_ok=True)
    md = render(doc)
    atomic_write(os.path.join(out, "gpu_runtime_check.json"), lambda f: json.dump(doc, f, indent=1))
    atomic_write(os.path.join(out, "gpu_runtime_check.md"), lambda f: f.write(md + "\n"))
    return md


def run(a) -> int:
    t_start = time.perf_counter()
    try:
        import torch
    except ImportError:
        print("error: torch is not installed", file=sys.stderr)
        return 2
    if not a.tiny and not torch.cuda.is_available():
        print("error: no CUDA device; run with --tiny for the CPU pipeline", file=sys.stderr)
        return 2
    warm = warm_simulator_cache()
    if a.tiny:
        torch.set_num_threads(1)  # two model threads on a small CPU: one intra-op thread each
    maxN = max(a.Ns)
    models, minfo, dev_name, cuda = build_models(a, maxN)
    if warm is not None and not cuda:
        warm.wait()               # on a CPU the compile would slow the profiled steps down
    t_build = time.perf_counter() - t_start
    prof = profile(models, a, maxN)
    t_prof = time.perf_counter() - t_start - t_build
    if warm is not None:
        warm.wait()
    import tr_model
    from tr_model.serving.runtime.torch_executor import TorchExecutor
    ex = TorchExecutor(models)
    overhead, calib = calibrate_overhead(ex, tr_model.preset("r2r", [1.0, 1.0], p=a.p), a)
    spec, spec_o, ext, corun, model_doc = model_inputs(prof, a.p, overhead)
    model_doc["calibration"] = calib
    results, skipped = [], []

    def document(total):
        return {"schema_version": 1, "kind": "gpu_runtime_check", "tiny": a.tiny, "device": dev_name, "cuda": cuda,
                "dtype": a.dtype, "p": a.p, "models": minfo,
                "profile": {k: ([{str(b): v for b, v in d.items()} for d in val]
                                if isinstance(val, list) and val and isinstance(val[0], dict) else val)
                            for k, val in prof.items()},
                "model": model_doc, "results": results, "skipped": skipped,
                "seconds": {"build": round(t_build, 1), "profile": round(t_prof, 1), "total": round(total, 1)},
                "arguments": {k: v for k, v in vars(a).items() if k != "Ns"}, "torch_version": torch.__version__}

    for N in a.Ns:
        t0 = time.perf_counter()
        pred = predict(spec, spec_o, ext, corun, N, a, models[1].t_buckets if models[1].graphs else ())
        b_lb = max(pred, key=lambda B: (pred[B]["lb"], [-x for x in B]))
        b_costs = max(pred, key=lambda B: (pred[B]["costs"], [-x for x in B]))
        vecs = [(1, 1), b_costs, b_lb]
        for d in (-1, 1):
            nb = (b_costs[0], b_costs[1] + d)
            if nb[1] >= 1 and (nb[0] - 1) + (nb[1] - 1) < N:
                vecs.append(nb)
        vecs = list(dict.fromkeys(vecs))
        t_pred = time.perf_counter() - t0
        meas = {}
        per_config = a.repeats * (a.window_s + a.warmup_s) * 1.15 + 1.0
        for B in vecs:
            if time.perf_counter() - t_start + per_config > a.budget_s:
                skipped.append({"N": N, "B": list(B)})
                continue
            meas[B] = measure(ex, spec, N, B, a)
        ranked = sorted(meas, key=lambda B: -meas[B]["tok_s"])
        row = {"N": N, "predicted_B_lb": list(b_lb), "predicted_B_costs": list(b_costs), "predict_s": round(t_pred, 1),
               "vectors": [{"B": list(B), "predicted_lb_tok_s": pred[B]["lb"], "predicted_costs_tok_s": pred[B]["costs"],
                            "predicted_ci95": max(pred[B]["lb_ci"], pred[B]["costs_ci"]),
                            **({"measured_tok_s": meas[B]["tok_s"], "measured_ci95": meas[B]["ci95"],
                                "mean_batch": meas[B]["mean_batch"], "min_batch": meas[B]["min_batch"],
                                "graph_fraction": meas[B]["graph_fraction"]} if B in meas else {})}
                           for B in vecs]}
        if meas:
            row["measured_best_B"] = list(ranked[0])
            for key, B in (("rank_costs", b_costs), ("rank_lb", b_lb)):
                row[key] = (ranked.index(B) + 1) if B in meas else None
            if (1, 1) in meas and b_costs in meas:
                row["measured_gain"] = meas[b_costs]["tok_s"] / meas[(1, 1)]["tok_s"]
                row["predicted_gain_costs"] = pred[b_costs]["costs"] / pred[(1, 1)]["costs"]
                row["predicted_gain_lb"] = pred[b_lb]["lb"] / pred[(1, 1)]["lb"]
                row["best_shortfall"] = 1 - meas[b_costs]["tok_s"] / meas[ranked[0]]["tok_s"]
        results.append(row)
        print(f"N = {N}: predicted B* {b_costs} (+costs), {b_lb} (L(b)); measured "
              + ", ".join(f"{B}: {meas[B]['tok_s']:.1f}" for B in ranked), flush=True)
        write_outputs(document(time.perf_counter() - t_start), a.out)   # partial results survive a later failure
    ex.close()
    md = write_outputs(document(time.perf_counter() - t_start), a.out)
    print(md)
    return 0


def render(doc) -> str:
    def f(x, d=2):
        return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{d}f}"

    lines = [f"GPU runtime check on {doc['device']} ({doc['dtype']}, p = {doc['p']}, "
             f"{'tiny models' if doc['tiny'] else 'Qwen3-0.6B / Qwen3-32B configs'}, random weights); "
             f"build {doc['seconds']['build']} s, profile {doc['seconds']['profile']} s, total {doc['seconds']['total']} s.",
             "", "Profile (ms): " + "; ".join(
                 f"model {i}: L(1) {f(float(d.get('1', math.nan)))}, L(max) {f(float(list(d.values())[-1]))}, "
                 f"co-running x{doc['model']['corun_slowdown'][i][1 - i]:.2f}"
                 for i, d in enumerate(doc["profile"]["decode"]))
             + f"; runtime overhead per step {f(doc['model']['overhead_ms'])} ms (calibration at N = 1).", "",
             "| N | B | predicted tok/s: L(b) | predicted: +costs | measured tok/s (95% CI) | mean batch | graph steps |",
             "|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        for v in r["vectors"]:
            mark = (" *" if v["B"] == r["predicted_B_costs"] else "") + (" †" if v["B"] == r["predicted_B_lb"] else "")
            lines.append(f"| {r['N']} | {tuple(v['B'])}{mark} | {f(v['predicted_lb_tok_s'])} | "
                         f"{f(v['predicted_costs_tok_s'])} | {f(v.get('measured_tok_s'))} ± {f(v.get('measured_ci95'))} | "
                         f"{', '.join(f(x, 1) for x in v.get('mean_batch', []))} | {f(v.get('graph_fraction'))} |")
    lines += ["", "(* = B* predicted with the serving costs and the runtime overhead, † = B* predicted by L(b) alone)", "",
              "| N | predicted B* (+costs / L(b)) | measured best | rank of B* (+costs / L(b)) | predicted gain +costs / "
              "L(b) | measured gain | B* short of the best |", "|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        lines.append(f"| {r['N']} | {tuple(r['predicted_B_costs'])} / {tuple(r['predicted_B_lb'])} | "
                     f"{tuple(r['measured_best_B']) if r.get('measured_best_B') else '-'} | "
                     f"{r.get('rank_costs') or '-'} / {r.get('rank_lb') or '-'} of {sum('measured_tok_s' in v for v in r['vectors'])} | "
                     f"x{f(r.get('predicted_gain_costs'), 3)} / x{f(r.get('predicted_gain_lb'), 3)} | "
                     f"x{f(r.get('measured_gain'), 3)} | {f(100 * r['best_shortfall'] if 'best_shortfall' in r else None, 1)}% |")
    if doc["skipped"]:
        lines += ["", "Skipped (time budget): " + ", ".join(f"N = {s['N']} B = {tuple(s['B'])}" for s in doc["skipped"])]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
