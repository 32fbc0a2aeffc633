"""Reading R2R per-token records (tr-profile routing --trace-format r2r) beside the routing-trace estimator.

Usage:  .venv/bin/python experiments/r2r_records_bench.py [--tokens 200000] [--repeats 3] [--dir /tmp]

Writes synthetic R2R records (requests of 1000 tokens, each escalated with p = 0.2, the columns of
``GenerationRecorder.to_dataframe()`` plus ``request_id``) as CSV (pandas' ``to_csv``, index column
included) and JSON lines, and the same requests as a routing trace (JSONL, one line per chain step, end
lines).  Times ``estimate_r2r_routing`` on both record files and ``estimate_routing`` on the routing trace
(in process, after one untimed warm-up call that loads the numba kernels), median of ``--repeats``;
prints tokens/s and the ratio to the routing-trace estimator (which reads about 1.2 lines per token here).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def _write(folder: str, tokens: int, seed: int = 0) -> tuple[str, str, str, int]:
    import numpy as np
    import pandas as pd
    from tr_core.routing_trace import format_record
    rng = np.random.default_rng(seed)
    per = 1000
    n_req = max(1, tokens // per)
    is_ref = rng.random(n_req * per) < 0.2
    df = pd.DataFrame({"token_id": rng.integers(0, 150000, is_ref.size), "token_str": " tok",
                       "source_model": np.where(is_ref, "reference", "quick"),
                       "position": np.tile(np.arange(per), n_req),
                       "param_size": np.where(is_ref, 32.0, 0.6), "batch_id": np.repeat(np.arange(n_req) % 8, per),
                       "request_id": np.repeat([f"req-{r}" for r in range(n_req)], per)})
    csv_path, jsonl_path, trace_path = (os.path.join(folder, n) for n in ("r2r.csv", "r2r.jsonl", "trace.jsonl"))
    df.to_csv(csv_path)
    df.to_json(jsonl_path, orient="records", lines=True)
    with open(trace_path, "w") as f:
        for r in range(n_req):
            k = 0
            for ref in is_ref[r * per:(r + 1) * per]:
                if ref:
                    f.write(format_record(r, k, 0, 1, 0) + format_record(r, k + 1, 1, 0, 1))
                    k += 2
                else:
                    f.write(format_record(r, k, 0, 0, 1))
                    k += 1
            f.write(format_record(r, k, 0, -1, 1))
    return csv_path, jsonl_path, trace_path, int(is_ref.size)


def _median(fn, repeats: int) -> float:
    fn()  # warm-up: numba kernels from the cache, scipy imports
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    a = ap.parse_args()
    from profiler.r2r import estimate_r2r_routing
    from profiler.routing import estimate_routing
    with tempfile.TemporaryDirectory(dir=a.dir) as folder:
        csv_path, jsonl_path, trace_path, n = _write(folder, a.tokens)
        base = _median(lambda: estimate_routing(trace_path, n_models=2), a.repeats)
        rows = [("routing trace (baseline)", trace_path, base)]
        for name, path in (("R2R records, CSV", csv_path), ("R2R records, JSON lines", jsonl_path)):
            rows.append((name, path, _median(lambda p=path: estimate_r2r_routing(p), a.repeats)))
        p01 = {estimate_r2r_routing(csv_path).P[0, 1], estimate_r2r_routing(jsonl_path).P[0, 1],
               estimate_routing(trace_path, n_models=2).P[0, 1]}
        print(f"{n} tokens in {n // 1000} requests; p_01 from all three inputs: {sorted(p01)}; load "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; median of {a.repeats}")
        print(f"{'input':28s} {'MB':>7s} {'seconds':>8s} {'tokens/s':>10s} {'vs baseline':>11s}")
        for name, path, sec in rows:
            print(f"{name:28s} {os.path.getsize(path) / 1e6:7.1f} {sec:8.3f} {n / sec:10.0f} {sec / base:10.2f}x")


if __name__ == "__main__":
    main()
