"""The runtime executing a compact launch policy (schema-version-3 table) next to B*, measured (issue 27 item 4).

For R2R (``--p``, ``--L``) at each ``--N``, with and without co-running (``--corun-slowdown``, the chain's launch
law, latencies rounded to the 0.1 ms grid): B*(N) (exact search), the best compact class found from it
(``--classes``, each searched by steepest ascent, exact chain values; the better one is "best compact"), their
exact throughputs, and the runtime's measurement of both on the virtual clock (``measure_closed_loop``, endless
requests so the active count stays N; ``--virtual-s`` model seconds, 20-slice batch-means 95 % interval).
The policy runs from an in-memory version-3 table whose row N holds the class's thresholds (rows below N hold
the eager vector and are never used: the check ``active_view_range == (N, N)`` is printed).

With ``--http-N``: the same over HTTP for those N: ``tr-autotune serve`` (emulated executor, ``--time-scale``)
with a version-3 file from ``tr-autotune run --policy`` and with the plain B* file, each measured by
``tr-profile serve-bench``'s closed loop (``--http-s`` seconds after ``--http-warmup-s``).

    PYTHONPATH=. python experiments/policy_runtime.py --N 4 8 16 32 --virtual-s 400 --http-N 8
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import tr_model  # noqa: E402
from tr_model.autotune import thresholds_document  # noqa: E402
from tr_model.launch_policy import class_policy, threshold_row_fields  # noqa: E402
from tr_model.serving.runtime import EmulatedExecutor, measure_closed_loop  # noqa: E402
from tr_model.thresholds import ThresholdTable  # noqa: E402


def grid_latency(spec, N, corun: bool):
    """(model, b) -> ms on the chain's grid (what the chain evaluates), solo or co-running."""
    d = (spec.corun_quanta_table if corun else spec.quanta_table)(N, round_to_grid=True)[0]
    return lambda i, b: float(d[i, min(b, N)]) * spec.delta_ms


def policy_table(spec, N, cls, B, params, tok_s) -> ThresholdTable:
    """A version-3 table whose row N carries ``params`` (rows 1..N-1: the eager vector, unused)."""
    M = spec.M
    rows = [{"active_requests": n, "thresholds": [1] * M, "certificate": "local", **threshold_row_fields(cls, [1] * M)}
            for n in range(1, N)]
    rows.append({"active_requests": N, "thresholds": list(B), "certificate": "local",
                 "policy_thresholds": [list(r) for r in params], "policy_certificate": "local",
                 "policy_predicted_tok_s": tok_s})
    doc = thresholds_document(spec, N, rows, inputs_hash="0" * 64, policy=cls, round_to_grid=True)
    return ThresholdTable.from_dict(doc, where="policy table (in memory)")


def measure(spec, N, thresholds, virtual_s, seed=0):
    ex = EmulatedExecutor(grid_latency(spec, N, False),
                          corun_latency_ms=grid_latency(spec, N, True) if spec.has_corun else None)
    t0 = time.perf_counter()
    r = measure_closed_loop(spec, N, thresholds, ex, duration_s=virtual_s, warmup_s=5.0, clock="virtual",
                            max_output_tokens=10 ** 12, slices=20, seed=seed)
    return r, time.perf_counter() - t0


def virtual_rows(a, out: list) -> None:
    from optimizer.search import optimize_thresholds

    for corun in ([] if a.skip_solo else [None]) + ([a.corun_slowdown] if a.corun_slowdown else []):
        spec = tr_model.preset("r2r", a.L, p=a.p)
        if corun:
            spec = spec.with_corun(list(corun))
        label = "solo" if corun is None else "co-running x" + "/".join(f"{f:g}" for f in corun)
        for N in a.N:
            t0 = time.perf_counter()
            opt = optimize_thresholds(spec, N, round_to_grid=True)
            B, b_tok = tuple(opt.best_B), opt.throughput_tok_s
            best = None
            for cls in a.classes:
                try:
                    res = class_policy(spec, N, cls, B, round_to_grid=True, max_states=a.max_process_states)
                except Exception as e:  # noqa: BLE001 - report and go on (PolicyTooLarge)
                    print(f"# {label} N = {N} {cls}: {type(e).__name__}: {e}", flush=True)
                    continue
                if best is None or res.throughput_tok_s > best.throughput_tok_s * (1 + 1e-12):
                    best = res
            search_s = time.perf_counter() - t0
            row = {"system": label, "N": N, "B": list(B), "b_star_tok_s": b_tok, "search_s": search_s}
            if best is None:
                out.append(row)
                continue
            rb, wb = measure(spec, N, B, a.virtual_s)
            tab = policy_table(spec, N, best.cls, B, best.params, best.throughput_tok_s)
            rp, wp = measure(spec, N, tab, a.virtual_s)
            row.update({"class": best.cls, "params": [list(r) for r in best.params],
                        "policy_tok_s": best.throughput_tok_s, "policy_error_bound": best.throughput_error_bound,
                        "gain": best.gain, "b_measured": rb.throughput_tok_s, "b_ci95": rb.throughput_ci95_tok_s,
                        "policy_measured": rp.throughput_tok_s, "policy_ci95": rp.throughput_ci95_tok_s,
                        "views": [list(v) for v in rp.active_view_range], "wall_s": [wb, wp],
                        "b_inside": abs(rb.throughput_tok_s - b_tok) <= rb.throughput_ci95_tok_s,
                        "policy_inside": abs(rp.throughput_tok_s - best.throughput_tok_s) <= rp.throughput_ci95_tok_s,
                        "load": os.getloadavg()[0]})
            out.append(row)
            pol = " ".join("(" + ", ".join("never" if x is None else str(x) for x in r) + ")" for r in best.params)
            print(f"| {label} | {N} | {' '.join(map(str, B))} | {b_tok:.2f} | {rb.throughput_tok_s:.2f} +- "
                  f"{rb.throughput_ci95_tok_s:.2f} | {'yes' if row['b_inside'] else 'no'} | {best.cls} {pol} | "
                  f"{best.throughput_tok_s:.2f} | {100 * best.gain:+.2f} % | {rp.throughput_tok_s:.2f} +- "
                  f"{rp.throughput_ci95_tok_s:.2f} | {'yes' if row['policy_inside'] else 'no'} | "
                  f"{100 * (rp.throughput_tok_s / rb.throughput_tok_s - 1):+.2f} % | "
                  f"{'N' if all(tuple(v) == (N, N) for v in rp.active_view_range) else rp.active_view_range} | "
                  f"{search_s:.0f} / {wb:.0f} / {wp:.0f} | {row['load']:.1f} |", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_rows(a, out: list) -> None:
    from profiler import serve_bench as sb

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    work = tempfile.mkdtemp(prefix="policy-runtime-")
    for N in a.http_N:
        files = {}
        for name, extra in (("B*", []), ("policy", ["--policy", a.classes[-1]])):
            path = os.path.join(work, f"{'b' if name == 'B*' else 'p'}{N}.json")
            subprocess.run([sys.executable, "-m", "tr_model.autotune_cli", "run", "--p", str(a.p), "--L",
                            *map(str, a.L), "--N", str(N), "--thresholds", path, "--quiet", *extra], check=True,
                           env=env, stdout=subprocess.DEVNULL)
            files[name] = path
        tab = ThresholdTable.load(files["policy"])
        for name, path in files.items():
            port = _free_port()
            proc = subprocess.Popen([sys.executable, "-m", "tr_model.autotune_cli", "serve", "--thresholds", path,
                                     "--port", str(port), "--time-scale", str(a.time_scale), "--quiet"],
                                    stdout=subprocess.PIPE, text=True, env=env)
            box = []
            th = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
            th.start()
            th.join(120)
            try:
                if not box or "http://" not in box[0]:
                    print(f"# HTTP N = {N} {name}: the server did not start", flush=True)
                    continue
                t = sb.Target("http", "127.0.0.1", port, "", "chat", "tokenrouter", a.max_tokens)
                r = sb.run_phase(t, N, warmup_s=a.http_warmup_s, duration_s=a.http_s, time_scale=a.time_scale)
                h = sb.get_json(t, "/health", 5)[1]
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
            pred = tab.policy_predicted_tok_s[N - 1] if name == "policy" else tab.predicted(N)
            late = [1000 * x["overshoot_s"] / x["steps"] / a.time_scale if x["steps"] else 0.0
                    for x in h["timer_by_model"]]
            row = {"system": "HTTP", "N": N, "thresholds": name, "predicted_tok_s": pred,
                   "measured_tok_s": r.throughput_tok_s, "ci95_tok_s": r.throughput_ci95_tok_s,
                   "step_overshoot_ms": late, "policy": h["thresholds"].get("policy"), "load": os.getloadavg()[0]}
            out.append(row)
            print(f"| HTTP | {N} | {name} | {pred:.2f} | {r.throughput_tok_s:.2f} +- {r.throughput_ci95_tok_s:.2f} | "
                  f"{r.throughput_tok_s / pred:.3f} | {late[0]:.2f}, {late[1]:.2f} | {row['load']:.1f} |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p", type=float, default=0.35)
    ap.add_argument("--L", type=float, nargs=2, default=[6.0, 27.9])
    ap.add_argument("--N", type=int, nargs="*", default=[4, 8, 16, 32])
    ap.add_argument("--corun-slowdown", type=float, nargs=2, default=[2.8, 1.05], help="co-running factors "
                    "(0 0: no co-running rows)")
    ap.add_argument("--skip-solo", action="store_true", help="only the co-running rows")
    ap.add_argument("--classes", nargs="+", default=["busy", "residual"])
    ap.add_argument("--virtual-s", type=float, default=400.0)
    ap.add_argument("--max-process-states", type=int, default=1_500_000)
    ap.add_argument("--http-N", type=int, nargs="*", default=[])
    ap.add_argument("--time-scale", type=float, default=5.0)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--http-s", type=float, default=60.0)
    ap.add_argument("--http-warmup-s", type=float, default=5.0)
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args()
    if a.corun_slowdown == [0.0, 0.0]:
        a.corun_slowdown = None
    print(f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; R2R p = {a.p}, L = {a.L} ms; "
          f"virtual clock {a.virtual_s:g} model s per run", flush=True)
    rows: list = []
    if a.N:
        print("| system | N | B* | B* exact tok/s | B* runtime tok/s (95 % CI) | exact inside CI | best compact "
              "class | class exact tok/s | exact gain | class runtime tok/s (95 % CI) | exact inside CI | measured "
              "gain | active view | wall s (search / B* run / class run) | load |")
        print("|---" * 15 + "|", flush=True)
        virtual_rows(a, rows)
    if a.http_N:
        print("\n| HTTP | N | thresholds | exact tok/s | serve-bench tok/s (95 % CI) | ratio | step overshoot ms | load |")
        print("|---" * 8 + "|", flush=True)
        http_rows(a, rows)
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump({"command": " ".join(sys.argv), "machine": f"{platform.node()}, {os.cpu_count()} CPUs",
                       "rows": rows}, f, indent=1, default=lambda x: None if isinstance(x, float) and not
                       math.isfinite(x) else str(x))
        os.replace(a.json + ".tmp", a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
