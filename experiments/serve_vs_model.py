"""Predicted (the chain's B*(N) throughput) versus measured over HTTP: tr-autotune serve + tr-profile serve-bench.

For N = 1..--N-max: computes the thresholds file (tr_model.autotune.tune), starts ``tr-autotune serve`` on
localhost (emulated executor, every step lasting L_i(b) x --time-scale), keeps exactly N requests in flight
with serve-bench's closed loop (profiler.serve_bench.run_phase) and prints, per N, the prediction, the
measurement with its 95 % interval, the ratio, the same service on the virtual clock (no timer, no HTTP:
what finite requests alone cost against the chain's endless ones), each model's mean step overshoot over the
window (the emulator's timer lateness, from /health) and the chain evaluated at those longer steps (what is
left between it and the measurement is the runtime's and the HTTP layer's own cost), the mean number of
requests inside the server, and the load average.

    .venv/bin/python experiments/serve_vs_model.py --time-scale 5 --max-tokens 64 --duration-s 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import tr_model  # noqa: E402
from profiler import serve_bench as sb  # noqa: E402
from tr_model.autotune import tune  # noqa: E402


def virtual_reference(spec, table, N, max_tokens, model_s, seed=0):
    """tokens/s of N clients calling RuntimeService.generate back to back on the virtual clock."""
    from tr_model.serving.runtime import EmulatedExecutor, VirtualTimeLoop
    from tr_model.serve import RuntimeService

    async def main():
        svc = RuntimeService(spec, table, EmulatedExecutor(spec.latency_ms), max_concurrency=N, seed=seed)
        svc.start()
        loop = asyncio.get_running_loop()
        t0, t1 = 20.0, 20.0 + model_s
        acc = [0.0]

        async def client():
            while True:
                a = loop.time()
                out = await svc.generate([1, 2, 3], max_tokens)
                b = loop.time()
                if b > t0 and a < t1:
                    acc[0] += out["completion_tokens"] * (min(b, t1) - max(a, t0)) / (b - a)

        tasks = [asyncio.ensure_future(client()) for _ in range(N)]
        await asyncio.sleep(t1 + 1e-9)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await svc.stop()
        return acc[0] / model_s

    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p", type=float, default=0.35)
    ap.add_argument("--L", type=float, nargs=2, default=[6.0, 27.9])
    ap.add_argument("--N", type=int, nargs="+", default=list(range(1, 17)))
    ap.add_argument("--time-scale", type=float, default=5.0)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--warmup-s", type=float, default=5.0)
    ap.add_argument("--virtual-s", type=float, default=600.0, help="model seconds of the virtual-clock reference "
                    "(0: skip it)")
    ap.add_argument("--out", default=os.path.join(ROOT, "experiments", "serve_vs_model.json"))
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))  # stop the server too

    spec = tr_model.preset("r2r", a.L, p=a.p)
    work = tempfile.mkdtemp(prefix="serve-vs-model-")
    th = os.path.join(work, "th.json")
    table = tune(spec, max(a.N), th)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tr_model.autotune_cli", "serve", "--thresholds", th, "--port",
                             str(port), "--time-scale", str(a.time_scale)], stdout=subprocess.PIPE, text=True, env=env)
    box = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(120)
    if not box or "http://" not in box[0]:
        proc.kill()
        print("error: the server did not start", file=sys.stderr)
        return 2
    url = box[0].split(" on ")[-1].strip()
    t = sb.Target("http", "127.0.0.1", port, "", "chat", "tokenrouter", a.max_tokens)
    rows = []
    header = ("| N | B*(N) | predicted tok/s | measured tok/s (95% CI) | ratio | step overshoot ms (0, 1) | "
              "predicted at L + overshoot | ratio | inside CI | virtual clock (ratio) | server in-flight | load avg |")
    print(f"server {url}, time scale {a.time_scale:g}, max_tokens {a.max_tokens}, {a.warmup_s:g} s warm-up + "
          f"{a.duration_s:g} s window per N; {platform.node()}, {os.cpu_count()} CPUs", flush=True)
    print(header)
    print("|---" * (header.count("|") - 1) + "|", flush=True)
    try:
        for n in a.N:
            h0 = sb.get_json(t, "/health", 5)[1]
            r = sb.run_phase(t, n, warmup_s=a.warmup_s, duration_s=a.duration_s, time_scale=a.time_scale)
            h1 = sb.get_json(t, "/health", 5)[1]
            pred = table.predicted(n)
            # each model's mean wake-up lateness per step in this phase (model ms; the totals are cumulative)
            late = []
            for i in range(spec.M):
                ds = h1["timer_by_model"][i]["steps"] - h0["timer_by_model"][i]["steps"]
                do = h1["timer_by_model"][i]["overshoot_s"] - h0["timer_by_model"][i]["overshoot_s"]
                late.append(1000.0 * do / ds / a.time_scale if ds else 0.0)
            ratio = r.throughput_tok_s / pred
            B = table.lookup(n)
            # the chain at the step lengths the emulator actually produced: what is left is the runtime's own cost
            spec_late = tr_model.preset("r2r", [L + d for L, d in zip(a.L, late)], p=a.p)
            pred_late = tr_model.evaluate(spec_late, n, B, round_to_grid=True).throughput_tok_s
            ratio_late = r.throughput_tok_s / pred_late
            inside = abs(r.throughput_tok_s - pred_late) <= r.throughput_ci95_tok_s
            vref = virtual_reference(spec, table, n, a.max_tokens, a.virtual_s) if a.virtual_s > 0 else math.nan
            row = {"N": n, "B": list(B), "predicted_tok_s": pred, **r.as_dict(), "ratio": ratio,
                   "step_overshoot_ms": late, "predicted_at_overshoot_tok_s": pred_late, "ratio_at_overshoot":
                   ratio_late, "inside_ci_at_overshoot": inside, "virtual_tok_s": vref}
            rows.append(row)
            print(f"| {n} | {' '.join(map(str, B))} | {pred:.2f} | {r.throughput_tok_s:.2f} +- "
                  f"{r.throughput_ci95_tok_s:.2f} | {ratio:.3f} | {late[0]:.2f}, {late[1]:.2f} | {pred_late:.2f} | "
                  f"{ratio_late:.3f} | {'yes' if inside else 'no'} | {vref:.2f} ({vref / pred:.4f}) | "
                  f"{r.server_mean_in_flight or math.nan:.3f} | {r.load_average[0]:.1f}-{r.load_average[1]:.1f} |",
                  flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    doc = {"schema_version": 1, "command": " ".join(sys.argv), "machine": f"{platform.node()}, {os.cpu_count()} CPUs",
           "time_scale": a.time_scale, "max_tokens": a.max_tokens, "duration_s": a.duration_s,
           "warmup_s": a.warmup_s, "p": a.p, "L_ms": a.L, "results": rows}
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
