"""Independent check of the class rows of experiments/policy_table.py: the runtime runs each row's best class
member (and B*) on the virtual clock, next to the chain's exact value (issue 27 item 4, ME without the process).

    PYTHONPATH=. python experiments/policy_me_runtime_check.py rows.json [rows2.json ...] [--virtual-s 300]
        [--N 2 3 ...] [--seeds 0 1]

The runtime (``tr_model.serving.runtime.measure_closed_loop``, emulated executor with the chain's grid latencies, solo
and co-running, endless requests so that N stay active) decides with the vendorable reader's rule from a
version-3 table (``experiments/policy_runtime.policy_table``), not with ``optimizer.policy``'s kernels, so a
difference beyond the interval would point at either.  Interval: 20-slice batch means, 95 %; several seeds are
pooled (mean of the seeds' means, their intervals combined as independent).
"""

from __future__ import annotations

import argparse
import json
import math


from policy_runtime import measure, policy_table  # noqa: E402

from optimizer.policy import CLASS_PARAMS  # noqa: E402
from tr_core.spec import preset  # noqa: E402
from tr_model.launch_policy import threshold_row_fields  # noqa: E402


def spec_of(row):
    spec = preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2]) if row.get("algo", "me") == "me" \
        else preset("r2r", [6.0, 27.9], p=0.35)
    if row.get("corun_slowdown"):
        f = list(row["corun_slowdown"])
        spec = spec.with_corun(f + [1.0] * (spec.M - len(f)))
    return spec


def pooled(rs):
    m = sum(r.throughput_tok_s for r in rs) / len(rs)
    half = math.sqrt(sum(r.throughput_ci95_tok_s ** 2 for r in rs)) / len(rs)
    return m, half


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--virtual-s", type=float, default=300.0)
    ap.add_argument("--N", type=int, nargs="*", default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    a = ap.parse_args()
    print("| setting | N | policy | parameters | chain tok/s | runtime tok/s (95 % CI) | runtime / chain | inside CI |")
    print("|---|---|---|---|---|---|---|---|")
    for path in a.rows:
        for row in json.load(open(path)):
            N = int(row["N"])
            if (a.N and N not in a.N) or "best_class" not in row:
                continue
            spec = spec_of(row)
            setting = "solo" if not row.get("corun_slowdown") else "co-running x" + "/".join(
                f"{x:g}" for x in row["corun_slowdown"])
            cls = row["best_class"]
            k = CLASS_PARAMS[cls]
            p = row["classes"][cls]["params"]
            params = [p[j * k:(j + 1) * k] for j in range(spec.M)]
            if cls in ("window", "ratio"):
                params_file = [(b, float(f"{w * spec.delta_ms:.12g}")) for b, w in params]
            else:
                params_file = [tuple(None if (c > 0 and x > N) else x for c, x in enumerate(r)) for r in params]
            B = row["B_star"]
            for name, tab, want in (
                    ("B*", policy_table(spec, N, cls, B, [list(r) for r in threshold_row_fields(cls, B)[
                        "policy_thresholds"]], row["B_star_tok_s"]), row["B_star_tok_s"]),
                    (cls, policy_table(spec, N, cls, B, params_file, row["best_class_tok_s"]),
                     row["best_class_tok_s"])):
                rs = [measure(spec, N, tab, a.virtual_s, seed=s)[0] for s in a.seeds]
                m, half = pooled(rs)
                print(f"| {setting} | {N} | {name} | {B if name == 'B*' else params} | {want:.2f} "
                      f"| {m:.2f} +- {half:.2f} | {m / want:.4f} | {'yes' if abs(m - want) <= half else 'no'} |",
                      flush=True)


if __name__ == "__main__":
    main()
