"""Cost of timing every decoding step: CUDA events vs an untimed loop vs a synchronize per step.

Usage (GPU):  python benchmarks/profiler_overhead.py --config benchmarks/profiler_configs/small-llama.json \
                  [--batch-sizes 1 8 32] [--context 512] [--steps 50] [--repeats 7] [--out overhead.json]

For each batch size and for eager and CUDA-graph steps, alternates ``--repeats``
times three loops of ``--steps`` decode steps, each bracketed once by a pair of
CUDA events: untimed; a CUDA event pair around every step (what
``tr-profile latency`` does, resolved after the loop); ``torch.cuda.synchronize``
plus ``perf_counter`` around every step (the naive way).  Prints the median
per-step time of each loop and the overheads relative to the untimed loop.
The target is events < 1%.  On CPU it runs the perf_counter variant only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "benchmarks", "profiler_configs", "small-llama.json"))
    ap.add_argument("--batch-sizes", nargs="+", default=["1", "8", "32"], help="space-separated (commas read too)")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import torch

    from profiler.latency import _Stepper, load_model, measure_timing_overhead

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = a.dtype or ("bf16" if cuda else "fp32")
    model, name = load_model(config_path=a.config, dtype=dtype, device=device)
    rows = []
    for graph in ([False, True] if cuda else [False]):
        for b in [int(x) for v in a.batch_sizes for x in v.split(",") if x]:
            st = _Stepper(model, b, a.context, 1, static=graph, device=device, seed=b)
            if graph:
                st.capture(3)
            for _ in range(5):
                st.step()
                st.rewind()
            ev = measure_timing_overhead(st, a.steps, cuda, repeats=a.repeats)
            row = {"cuda_graph": graph, "batch_size": b, "untimed_step_ms": ev["untimed_step_ms"],
                   "events_step_ms": ev["timed_step_ms"], "events_overhead": ev["overhead"]}
            if cuda:
                syn = []
                for _ in range(a.repeats):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(a.steps):
                        s0 = time.perf_counter()
                        st.step()
                        torch.cuda.synchronize()
                        _ = time.perf_counter() - s0
                        st.rewind()
                    torch.cuda.synchronize()
                    syn.append((time.perf_counter() - t0) * 1e3 / a.steps)
                row["sync_step_ms"] = statistics.median(syn)
                row["sync_overhead"] = row["sync_step_ms"] / ev["untimed_step_ms"] - 1.0
            rows.append(row)
            del st
    cols = list(rows[0])
    print(f"model {name} ({dtype}, {device}), context {a.context}, {a.steps} steps x {a.repeats} repeats (medians)")
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in cols))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"model": name, "dtype": dtype, "device": torch.cuda.get_device_name() if cuda else "cpu",
                       "context": a.context, "steps": a.steps, "repeats": a.repeats, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
