"""Co-running step latency on one GPU: each model's decode step alone and while the other model decodes.

The GPU check's co-running step where ``tr-profile latency --corun`` is
missing (an older tree); it uses the runtime's own executor and its probe,
``tr_model.serving.runtime.torch_executor.profile_step_latency(..., other=...)``:
both models (random weights, bf16, the Qwen3-0.6B and Qwen3-32B configs)
live on one device, each with its own CUDA stream and graphs; model i's
decode step of b rows is timed (wall clock of the runtime's step: input copy,
graph replay, synchronisation, copy back) alone, and while the other model
runs decode steps of ``o`` rows back to back in a second thread.

Each (model, b, o) is measured ``--repeats`` times (``--warmup-steps`` +
``--steps`` steps each, the median of the timed steps); the table reports the
median of the repeats and their range (min-max) as the spread, for the step
alone, the step co-running, and the slowdown (co-running / alone).

    python3 benchmarks/gpu_corun_probe.py --out-dir OUT            # one GPU
    python3 benchmarks/gpu_corun_probe.py --tiny --out-dir OUT     # CPU, tiny models (threads; direction only)

Writes ``corun_probe.json`` and ``corun_probe.md`` into ``--out-dir``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NAMES = ("small", "large")


def parse_args(argv):
    from tr_core.cli import Parser  # the project's error convention: one error: line, exit 2
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny random 2-layer models on the CPU (a functional run)")
    ap.add_argument("--small-config", default=os.path.join(ROOT, "data", "models", "Qwen3-0.6B", "config.json"))
    ap.add_argument("--large-config", default=os.path.join(ROOT, "data", "models", "Qwen3-32B", "config.json"))
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 2, 4, 8, 16],
                    help="batch sizes of the timed model (requests per step)")
    ap.add_argument("--other-batch-sizes", nargs="+", type=int, default=[1, 16],
                    help="batch sizes of the other model's back-to-back decode steps")
    ap.add_argument("--models", choices=("small", "large", "both"), default="both", help="which model is timed")
    ap.add_argument("--context", type=int, default=512, help="KV positions per request (tokens)")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per repeat")
    ap.add_argument("--warmup-steps", type=int, default=2, help="untimed steps per repeat")
    ap.add_argument("--repeats", type=int, default=3, help="independent medians per (model, b, other b)")
    ap.add_argument("--dtype", default=None, help="bf16 (GPU default) or fp32 (tiny default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", required=True, help="folder for corun_probe.json and corun_probe.md")
    a = ap.parse_args(argv)
    for flag, vals in (("--batch-sizes", a.batch_sizes), ("--other-batch-sizes", a.other_batch_sizes)):
        if not vals or min(vals) < 1:
            ap.error(f"{flag} values must be >= 1")
    if a.context < 1 or a.steps < 1 or a.warmup_steps < 0 or a.repeats < 1:
        ap.error("--context, --steps and --repeats must be >= 1, --warmup-steps >= 0")
    a.dtype = a.dtype or ("fp32" if a.tiny else "bf16")
    if a.dtype not in ("bf16", "fp16", "fp32"):
        ap.error("--dtype must be bf16, fp16 or fp32")
    return a


def build(a):
    import torch
    from tr_model.serving.runtime.torch_executor import SlotModel, load_shape, random_weights, tiny_shape
    cuda = torch.cuda.is_available() and not a.tiny
    if a.tiny:
        shapes = [tiny_shape(hidden=32, layers=2, vocab_size=256), tiny_shape(hidden=64, layers=2, vocab_size=256)]
    else:
        shapes = [load_shape(a.small_config), load_shape(a.large_config)]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    dev = "cuda:0" if cuda else "cpu"
    sizes = sorted(set(a.batch_sizes) | set(a.other_batch_sizes))
    models, info = [], []
    for k, shape in enumerate(shapes):
        t0 = time.perf_counter()
        w = random_weights(shape, device=dev, dtype=dtype, seed=a.seed + k)
        m = SlotModel(shape, w, n_slots=max(sizes), max_len=a.context + 2, t_buckets=(1,), device=dev, dtype=dtype,
                      cuda_graphs=cuda, graph_batch_sizes=sizes, name=NAMES[k])
        del w
        models.append(m)
        info.append({"name": NAMES[k], "weight_bytes": shape.weight_bytes(2 if dtype != torch.float32 else 4),
                     "layers": shape.num_layers, "graphs": len(m.graphs), "build_s": round(time.perf_counter() - t0, 2)})
    device = torch.cuda.get_device_name(0) if cuda else (platform.processor() or "cpu")
    return models, info, device, cuda


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(models, a, rows, save):
    """Append the rows of each timed model to ``rows``; ``save()`` after each (partial results survive)."""
    from tr_model.serving.runtime.torch_executor import profile_step_latency
    kw = dict(context=a.context, steps=a.steps, warmup=a.warmup_steps)
    timed = [0, 1] if a.models == "both" else [NAMES.index(a.models)]
    for i in timed:
        m, other = models[i], models[1 - i]
        alone = {b: [] for b in a.batch_sizes}
        for r in range(a.repeats):
            for b, ms in profile_step_latency(m, a.batch_sizes, seed=a.seed + r, **kw).items():
                alone[b].append(ms)
        for o in a.other_batch_sizes:
            co = {b: [] for b in a.batch_sizes}
            for r in range(a.repeats):
                res = profile_step_latency(m, a.batch_sizes, other=other, other_batch=o, seed=a.seed + r, **kw)
                for b, ms in res.items():
                    co[b].append(ms)
            for b in a.batch_sizes:
                ratios = [c / s for c, s in zip(co[b], alone[b])]
                rows.append({"model": NAMES[i], "batch_size": b, "other_batch_size": o,
                             "alone_step_ms": spread(alone[b]), "corun_step_ms": spread(co[b]),
                             "slowdown": spread(ratios)})
            print(f"{NAMES[i]} beside {NAMES[1 - i]} b = {o}: " + ", ".join(
                f"b {r['batch_size']} x{r['slowdown']['median']:.2f}" for r in rows[-len(a.batch_sizes):]), flush=True)
        save()


def render(doc) -> str:
    lines = [f"Co-running probe on {doc['device']} ({doc['dtype']}, context {doc['context_tokens']} tokens, "
             f"{'tiny models' if doc['tiny'] else 'Qwen3-0.6B / Qwen3-32B configs'}, random weights, "
             f"{doc['repeats']} repeats x {doc['steps']} steps; median [min-max] of the repeats' medians).", "",
             "| timed model | b | other model's b | alone ms | co-running ms | slowdown |", "|---|---|---|---|---|---|"]

    def f(s, d=2):
        return f"{s['median']:.{d}f} [{s['min']:.{d}f}-{s['max']:.{d}f}]"

    for r in doc["rows"]:
        lines.append(f"| {r['model']} | {r['batch_size']} | {r['other_batch_size']} | {f(r['alone_step_ms'])} | "
                     f"{f(r['corun_step_ms'])} | x{f(r['slowdown'])} |")
    return "\n".join(lines)


def run(a) -> int:
    try:
        import torch
    except ImportError:
        print("error: torch is not installed", file=sys.stderr)
        return 2
    if not a.tiny and not torch.cuda.is_available():
        print("error: no CUDA device; run with --tiny for the CPU pipeline", file=sys.stderr)
        return 2
    if a.tiny:
        torch.set_num_threads(1)  # two model threads on a small CPU: one intra-op thread each
    from tr_core.fileio import atomic_write
    os.makedirs(a.out_dir, exist_ok=True)
    t0 = time.perf_counter()
    models, info, device, cuda = build(a)
    t_build = time.perf_counter() - t0
    print(f"built both models on {device} in {t_build:.1f} s", flush=True)
    rows: list = []

    def save():
        doc = {"schema_version": 1, "kind": "corun_probe", "tiny": a.tiny, "device": device, "cuda": cuda,
               "dtype": a.dtype, "context_tokens": a.context, "steps": a.steps, "warmup_steps": a.warmup_steps,
               "repeats": a.repeats, "models": info, "rows": rows,
               "seconds": {"build": round(t_build, 1), "total": round(time.perf_counter() - t0, 1)},
               "torch_version": torch.__version__}
        md = render(doc)
        atomic_write(os.path.join(a.out_dir, "corun_probe.json"), lambda f: json.dump(doc, f, indent=1))
        atomic_write(os.path.join(a.out_dir, "corun_probe.md"), lambda f: f.write(md + "\n"))
        return md

    measure(models, a, rows, save)
    print(save())
    return 0


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        return run(a)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a failure on the device: one line here, the traceback beside the results
        import traceback
        err = os.path.join(a.out_dir, "corun_probe_error.txt")
        try:
            os.makedirs(a.out_dir, exist_ok=True)
            with open(err, "w", encoding="utf-8") as f:
                traceback.print_exc(file=f)
        except OSError:
            pass
        print(f"error: {type(e).__name__}: {str(e)[:300]} (traceback in {err})", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
