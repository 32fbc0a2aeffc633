"""serve-bench's throughput estimators against the runtime's own commit count, on the virtual clock (no HTTP, no timer).

``RuntimeService`` (the service behind ``tr-autotune serve``) with R2R (p = 0.35, L = 6.0 / 27.9 ms) and B*(N), N
clients calling it back to back with ``--max-tokens``-token requests, ``/health`` read in process at the window's
slice boundaries as serve-bench reads it: per replicate (seed) the exact tokens committed inside the window, the
client-side estimate (``profiler.serve_bench._summarize``: each answer's tokens spread over its request's
lifetime, slices at least two lifetimes long; and, for comparison, the same spread estimate with a fixed number
of slices whatever the lifetimes) and the server-side estimate (``server_rate`` over the committed-token
readings, 5, 10 and 20 slices).  Over ``--replicates`` seeds: each estimator's spread, its error against the
exact count, the median 95 % half-width and how often the interval covers the replicates' mean of the exact
count.

    PYTHONPATH=. python experiments/serve_bench_estimator.py --window-s 12 --replicates 80
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
import time


import tr_model  # noqa: E402
from profiler import serve_bench as sb  # noqa: E402


def replicate(spec, N, B, tokens, warm, W, slices, seed):
    from tr_model.serving.runtime import EmulatedExecutor, FixedThresholds, VirtualTimeLoop
    from tr_model.serve import RuntimeService

    async def main():
        svc = RuntimeService(spec, FixedThresholds(B), EmulatedExecutor(spec.latency_ms), max_concurrency=N, seed=seed)
        svc.start()
        svc.rt.t_start, svc.rt.t_end = warm, warm + W
        loop = asyncio.get_running_loop()
        recs, readings = [], []

        async def client(c):
            while True:
                t0 = loop.time()
                out = await svc.generate([1, 2, 3], tokens)
                recs.append(sb._Record(c, t0, loop.time(), out["completion_tokens"], None))

        tasks = [asyncio.ensure_future(client(c)) for c in range(N)]
        for j in range(slices + 1):
            await asyncio.sleep(warm + j * W / slices - loop.time())
            h = svc.health()
            readings.append((h["clock_s"], h["committed_tokens"]))
        await asyncio.sleep(3 * tokens / 40.0)   # the tail: requests in flight at the window end finish
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await svc.stop()
        return recs, readings, svc.rt.tokens

    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def spread_fixed(recs, t0, W, k):
    """The client-side spread estimate with exactly k slices (no lifetime rule)."""
    acc = [0.0] * k
    width = W / k
    for r in recs:
        d = r.recv_t - r.send_t
        for j in range(k):
            ov = min(t0 + (j + 1) * width, r.recv_t) - max(t0 + j * width, r.send_t)
            if ov > 0 and d > 0:
                acc[j] += r.tokens * ov / d
    rates = [x / width for x in acc]
    m = sum(rates) / k
    sd = math.sqrt(sum((x - m) ** 2 for x in rates) / (k - 1))
    return m, sb.student_t95(k - 1) * sd / math.sqrt(k), k


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--N", type=int, default=8)
    ap.add_argument("--B", type=int, nargs=2, default=[1, 5])
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--window-s", type=float, default=12.0, help="model seconds")
    ap.add_argument("--warmup-s", type=float, default=5.0, help="model seconds")
    ap.add_argument("--replicates", type=int, default=80)
    a = ap.parse_args()
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    t_wall = time.perf_counter()
    rows: dict[str, list] = {}
    exact = []
    for s in range(a.replicates):
        recs, readings, tok = replicate(spec, a.N, tuple(a.B), a.max_tokens, a.warmup_s, a.window_s, 20, 1000 + s)
        true = tok / a.window_s
        exact.append(true)
        r = sb._summarize(a.N, recs, [], a.warmup_s, a.warmup_s + a.window_s, 1.0, 10, 0, (0.0, 0.0))
        rows.setdefault("client: spread, slices >= 2 lifetimes (serve-bench)", []).append(
            (r.throughput_tok_s, r.throughput_ci95_tok_s, r.slices, true))
        for k in (10, 20):
            rows.setdefault(f"client: spread, {k} fixed slices", []).append((*spread_fixed(recs, a.warmup_s,
                                                                                           a.window_s, k), true))
        for k in (5, 10, 20):
            rate, ci, kk = sb.server_rate(readings[::20 // k])
            rows.setdefault(f"server: committed-token counter, {k} slices (serve-bench)", []).append(
                (rate, ci, kk, true))
    ref = statistics.mean(exact)
    life = a.max_tokens / (ref / a.N)
    print(f"R2R p = 0.35, L = 6.0 / 27.9 ms, N = {a.N}, B = {a.B}, {a.max_tokens}-token requests (mean lifetime "
          f"{life:.2f} model s), window {a.window_s:g} model s after {a.warmup_s:g} s, {a.replicates} seeds; "
          f"exact count: mean {ref:.2f} tok/s, sd {statistics.stdev(exact):.2f} ({100 * statistics.stdev(exact) / ref:.2f} %); "
          f"wall {time.perf_counter() - t_wall:.0f} s")
    print("\n| estimator | slices | sd of the estimate tok/s | sd of (estimate - exact count) | median 95 % half-width "
          "(% of mean) | covers the mean |")
    print("|---" * 6 + "|")
    for name, v in rows.items():
        est = [x[0] for x in v]
        ci = [x[1] for x in v]
        ks = sorted({x[2] for x in v})
        cov = sum(abs(x[0] - ref) <= x[1] for x in v)
        print(f"| {name} | {'/'.join(map(str, ks))} | {statistics.stdev(est):.2f} | "
              f"{statistics.stdev([x[0] - x[3] for x in v]):.2f} | {statistics.median(ci):.2f} "
              f"({100 * statistics.median(ci) / ref:.2f} %) | {cov} / {len(v)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
