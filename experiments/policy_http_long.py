"""A compact launch policy against B* over HTTP, long enough to resolve the gain (issue 27 item 4).

``tr-autotune run --policy CLASS --N N`` (a schema-version-3 file) and a plain ``tr-autotune run --N N`` (B*), each
served by ``tr-autotune serve`` (emulated steps, ``--time-scale``) and measured by ``tr-profile serve-bench``'s
closed loop at concurrency N (``profiler.serve_bench.run_phase``, the code behind the CLI), in blocks run one
after the other in the order ``--order`` (default ``B P P B``: a linear drift of the machine's load falls on both
sides alike), block k with the server's routing seed ``--seeds[k]`` (default 1 1 2 2: a B* block and a policy
block share their requests' routing draws; the two blocks of a side are independent).  Each block: a fresh
server, ``--warmup-s`` of warm-up, a ``--window-s`` window, ``--slices`` slices.

Per block: the server-side throughput (the runtime's committed-token counter read from /health at the slice
boundaries, 95 % interval by ratio-estimator batch means) and the client-side one (each answer's tokens spread
over its request's lifetime), the mean number of requests inside the server, the emulator's wake-up lateness
per model (model ms per step) and the load average.  Per side: the mean of its blocks' server-side rates with
the interval sqrt(sum h_k^2) / n.  Then the measured gain (delta method on the two intervals) and whether the
two sides' intervals are disjoint; and the exact chain's values at the spec's step lengths and at the step
lengths plus the measured lateness (``--delta-ms`` grid for that evaluation), after the HTTP blocks so that its
CPU time does not load the machine during them.

    PYTHONPATH=. python experiments/policy_http_long.py --N 8 --time-scale 2 --window-s 330 --json out.json
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

from profiler import serve_bench as sb  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _system_flags(a) -> list[str]:
    flags = ["--p", str(a.p), "--L", *map(str, a.L)]
    if a.corun_slowdown:
        flags += ["--corun-slowdown", *map(str, a.corun_slowdown), "--round"]   # Lco on the chain's grid
    return flags


def block(a, env, path: str, seed: int) -> dict:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tr_model.autotune_cli", "serve", "--thresholds", path,
                             "--port", str(port), "--time-scale", str(a.time_scale), "--seed", str(seed), "--quiet"],
                            stdout=subprocess.PIPE, text=True, env=env)
    box: list = []
    th = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    th.start()
    th.join(120)
    try:
        if not box or "http://" not in box[0]:
            raise RuntimeError("the server did not start")
        t = sb.Target("http", "127.0.0.1", port, "", "chat", "tokenrouter", a.max_tokens)
        t0 = time.time()
        r = sb.run_phase(t, a.N, warmup_s=a.warmup_s, duration_s=a.window_s, time_scale=a.time_scale,
                         slices=a.slices, seed=seed)
        h = sb.get_json(t, "/health", 5)[1]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    late = [1000 * x["overshoot_s"] / x["steps"] / a.time_scale if x["steps"] else 0.0 for x in h["timer_by_model"]]
    return {"seed": seed, "started_utc": time.strftime("%H:%M:%S", time.gmtime(t0)),
            "server_tok_s": r.server_throughput_tok_s, "server_ci95": r.server_throughput_ci95_tok_s,
            "server_slices": r.server_slices, "client_tok_s": r.throughput_tok_s, "client_ci95": r.throughput_ci95_tok_s,
            "client_slices": r.slices, "in_flight": r.server_mean_in_flight, "requests": r.window_requests,
            "retries": r.retries, "late_ms": late, "load": list(r.load_average), "policy": h["thresholds"].get("policy")}


def exact_at(a, late, cls, params, B, delta_ms) -> tuple[float, float]:
    """(B* tok/s, policy tok/s) of the exact chains on a ``delta_ms`` grid with every step ``late`` ms (per model)
    longer than the spec's: solo steps ``L_i + late_i`` and, with co-running, ``f_i L_i + late_i`` (the lateness
    is the wake-up after a step's deadline, whatever the step's length)."""
    import tr_model
    from optimizer import policy as POL

    spec = tr_model.preset("r2r", [x + y for x, y in zip(a.L, late)], p=a.p, delta_ms=delta_ms)
    if a.corun_slowdown:
        spec = spec.with_corun([{"batch_size": [1], "step_latency_ms": [f * x + y]}
                                for f, x, y in zip(a.corun_slowdown, a.L, late)])
    b = tr_model.evaluate(spec, a.N, tuple(B), round_to_grid=True).throughput_tok_s
    proc = POL.build_process(spec, a.N, round_to_grid=True)
    flat = [a.N + 1 if x is None else int(x) for row in params for x in row]
    sol = POL.evaluate_table(spec, a.N, POL.class_table(proc, cls, flat), d=proc.d, dco=proc.dco)
    return b, float(sol.throughput_per_quantum * 1000.0 / spec.delta_ms)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p", type=float, default=0.35)
    ap.add_argument("--L", type=float, nargs=2, default=[6.0, 27.9])
    ap.add_argument("--corun-slowdown", type=float, nargs=2, default=None)
    ap.add_argument("--N", type=int, default=8)
    ap.add_argument("--policy", default="residual")
    ap.add_argument("--time-scale", type=float, default=2.0)
    ap.add_argument("--window-s", type=float, default=330.0, help="wall seconds per block")
    ap.add_argument("--warmup-s", type=float, default=10.0)
    ap.add_argument("--slices", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--order", nargs="+", default=["B", "P", "P", "B"], choices=["B", "P"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 1, 2, 2])
    ap.add_argument("--exact-delta-ms", type=float, default=0.01, help="grid of the exact chains at the late steps")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args()
    if len(a.seeds) != len(a.order):
        ap.error("--seeds needs one seed per --order block")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    work = tempfile.mkdtemp(prefix="policy-http-long-")
    files = {}
    for name, extra in (("B", []), ("P", ["--policy", a.policy])):
        files[name] = os.path.join(work, f"{name}.json")
        subprocess.run([sys.executable, "-m", "tr_model.autotune_cli", "run", *_system_flags(a), "--N", str(a.N),
                        "--thresholds", files[name], "--quiet", *extra], check=True, env=env, stdout=subprocess.DEVNULL)
    entry = json.load(open(files["P"]))["entries"][a.N - 1]
    B, params = entry["thresholds"], entry["policy_thresholds"]
    exact = {"B": entry["predicted_tok_s"], "P": entry["policy_predicted_tok_s"]}
    print(f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; R2R p = {a.p}, L = {a.L} ms"
          f"{', co-running x' + '/'.join(map(str, a.corun_slowdown)) if a.corun_slowdown else ''}; N = {a.N}; "
          f"B* = {B} ({exact['B']:.2f} tok/s), {a.policy} {params} ({exact['P']:.2f} tok/s, "
          f"{100 * (exact['P'] / exact['B'] - 1):+.2f} %); time scale {a.time_scale:g}, blocks {' '.join(a.order)} "
          f"of {a.window_s:g} s (+ {a.warmup_s:g} s warm-up), {a.slices} slices", flush=True)
    print("\n| block | thresholds | seed | start UTC | server tok/s (95 % CI) | client tok/s (95 % CI) | in flight | "
          "requests | lateness ms/step (model 0, 1) | load (start, end) |")
    print("|---" * 10 + "|", flush=True)
    blocks = []
    for k, (name, seed) in enumerate(zip(a.order, a.seeds)):
        b = block(a, env, files[name], seed)
        b.update(block=k + 1, thresholds=name)
        blocks.append(b)
        print(f"| {k + 1} | {'B*' if name == 'B' else a.policy} | {seed} | {b['started_utc']} | {b['server_tok_s']:.2f} "
              f"+- {b['server_ci95']:.2f} | {b['client_tok_s']:.2f} +- {b['client_ci95']:.2f} ({b['client_slices']} "
              f"slices) | {b['in_flight']:.3f} | {b['requests']} | {b['late_ms'][0]:.3f}, {b['late_ms'][1]:.3f} | "
              f"{b['load'][0]:.1f}, {b['load'][1]:.1f} |", flush=True)
    side = {}
    for name in ("B", "P"):
        bs = [b for b in blocks if b["thresholds"] == name]
        n = len(bs)
        side[name] = {"tok_s": sum(b["server_tok_s"] for b in bs) / n,
                      "ci95": math.sqrt(sum(b["server_ci95"] ** 2 for b in bs)) / n,
                      "late_ms": [sum(b["late_ms"][i] for b in bs) / n for i in range(2)]}
    g = side["P"]["tok_s"] / side["B"]["tok_s"] - 1
    gci = (1 + g) * math.hypot(side["P"]["ci95"] / side["P"]["tok_s"], side["B"]["ci95"] / side["B"]["tok_s"])
    disjoint = side["P"]["tok_s"] - side["P"]["ci95"] > side["B"]["tok_s"] + side["B"]["ci95"]
    late = [sum(b["late_ms"][i] for b in blocks) / len(blocks) for i in range(2)]
    for b in blocks:   # each block against the chain at its own late steps (the lateness moves with the load)
        try:
            pair = exact_at(a, b["late_ms"], a.policy, params, B, a.exact_delta_ms)
            b["exact_late_tok_s"] = pair[0 if b["thresholds"] == "B" else 1]
        except Exception:  # noqa: BLE001 - reported as missing
            b["exact_late_tok_s"] = math.nan
        print(f"# block {b['block']} ({b['thresholds']}): exact at its late steps {b['exact_late_tok_s']:.2f}, measured "
              f"/ that {b['server_tok_s'] / b['exact_late_tok_s']:.4f}", flush=True)
    try:
        ex_late = exact_at(a, late, a.policy, params, B, a.exact_delta_ms)
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"# exact at the late steps: {type(e).__name__}: {e}", flush=True)
        ex_late = (math.nan, math.nan)
    print("\n| side | exact tok/s | exact at late steps | measured server tok/s (95 % CI) | measured / exact |")
    print("|---" * 5 + "|")
    for name, ex, exl in (("B", exact["B"], ex_late[0]), ("P", exact["P"], ex_late[1])):
        s = side[name]
        print(f"| {'B*' if name == 'B' else a.policy} | {ex:.2f} | {exl:.2f} | {s['tok_s']:.2f} +- {s['ci95']:.2f} | "
              f"{s['tok_s'] / ex:.4f} |")
    print(f"\nexact gain {100 * (exact['P'] / exact['B'] - 1):+.2f} % (at the late steps "
          f"{100 * (ex_late[1] / ex_late[0] - 1):+.2f} %); measured gain {100 * g:+.2f} % +- {100 * gci:.2f} %; "
          f"intervals {'disjoint' if disjoint else 'overlap'}; mean lateness {late[0]:.3f}, {late[1]:.3f} model ms "
          f"per step; load now {os.getloadavg()[0]:.1f}", flush=True)
    if a.json:
        doc = {"command": " ".join(sys.argv), "machine": f"{platform.node()}, {os.cpu_count()} CPUs", "B": B,
               "params": params, "exact": exact, "exact_late": list(ex_late), "blocks": blocks, "sides": side,
               "gain": g, "gain_ci95": gci, "disjoint": disjoint}
        with open(a.json + ".tmp", "w") as f:
            json.dump(doc, f, indent=1, default=lambda x: None if isinstance(x, float) and not math.isfinite(x)
                      else str(x))
        os.replace(a.json + ".tmp", a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
