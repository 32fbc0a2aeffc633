"""``tr-plan``: rank the GPU placements of a routed model pair (docs/plan.md).

    tr-plan --model data/models/Qwen3-0.6B/config.json --model data/models/Qwen3-32B/config.json \\
            --gpu h200 --gpus 4 --p 0.35 --N 1 4 8 16

Validate -> compute (:func:`tr_model.plan.plan`) -> one result document -> render (table, json, csv).
"""

from __future__ import annotations

import json
import math

from tr_core.cli import (Parser, Progress, add_list_arg, add_output_args, add_quiet_arg, add_version, emit,
                         finite_float, format_gain, format_table, output_format, parse_int_ranges, run_cli, to_csv)
from tr_core.errors import SpecError

HEADERS = ["N", "rank", "placement", "colocated", "gpus_used", "B", "throughput_tok_s", "ratio_to_best",
           "per_request_tok_s", "admission_latency_ms", "latency_ms_b1", "kv_headroom_tokens"]


def build_parser() -> Parser:
    p = Parser(prog="tr-plan", description="Rank the GPU placements of a routed model pair (small model first): "
               "each model's GPUs and tensor-parallel size, co-located or not, by the exact chain's throughput at "
               "B*(N), with per-request tok/s, admission latency and KV headroom. Step latencies come from "
               "measured profiles where given, else from the GPU's roofline (docs/plan.md).")
    add_version(p)
    g = p.add_argument_group("system")
    g.add_argument("--model", action="append", required=True, metavar="CONFIG.json",
                   help="a model's config.json, once per model, small model first")
    g.add_argument("--gpu", required=True, metavar="KIND",
                   help="GPU kind: a100, h100, h200 (data/gpus/*.json) or a JSON file with the same fields")
    g.add_argument("--gpus", required=True, metavar="G", help="number of GPUs in all (an integer >= 1)")
    g.add_argument("--p", type=finite_float, metavar="P", help="R2R escalation probability (default 0.35)")
    g.add_argument("--spec", metavar="FILE", help="a spec file whose routing matrix and committed tokens are used "
                   "instead of --p")
    g.add_argument("--N", nargs="+", default=["1", "4", "8", "16"], metavar="N",
                   help="concurrencies: ints and ranges (default 1 4 8 16; at most 64)")
    g.add_argument("--context-tokens", type=int, default=2048, metavar="C",
                   help="tokens each request keeps in the KV cache and reads per step (default 2048)")
    g.add_argument("--memory-budget-fraction", type=finite_float, default=0.9, metavar="F",
                   help="fraction of each GPU's memory the models may use together (default 0.9)")
    g.add_argument("--delta-ms", type=finite_float, default=0.25, metavar="MS",
                   help="the chain's latency quantum in ms (latencies rounded to it; default 0.25)")
    m = p.add_argument_group("measured inputs (replace the estimates)")
    m.add_argument("--latency-profile", action="append", default=[], metavar="FILE",
                   help="a tr-profile latency file, matched to a --model by name (repeatable)")
    add_list_arg(m, "--corun-slowdown", convert=float, what="a number", metavar="F",
                 help="co-running slowdown factors, one per model, for co-located placements")
    m.add_argument("--corun-L-table", metavar="FILE", help="measured co-running latency tables (JSON or CSV like "
                   "--L-table) for co-located placements")
    o = p.add_argument_group("output")
    o.add_argument("--min-per-request-tok-s", type=finite_float, metavar="X",
                   help="keep only plans whose per-request speed is at least X tok/s")
    o.add_argument("--show-dropped", action="store_true", help="also list dropped candidates in the table")
    add_quiet_arg(o)
    add_output_args(p, group=o)
    return p


def _gpus(text: str) -> int:
    try:
        v = int(text, 10)
    except ValueError:
        raise SpecError(f"--gpus must be an integer >= 1, got {text!r}") from None
    if v < 1:
        raise SpecError(f"--gpus must be an integer >= 1, got {v}")
    return v


def _place(d: dict) -> str:
    return " + ".join(f"{m['model']}:TP{m['tensor_parallel']}@{','.join(map(str, m['gpus']))}"
                      for m in d["placement"])


def _lat(d: dict) -> str:
    parts = []
    for name, v in d["latency_ms"].items():
        s = f"{v['solo_ms']:.2f}"
        if v["corun_ms"] is not None:
            s += f"/{v['corun_ms']:.2f}"
        parts.append(s)
    return " ".join(parts)


def _rows(doc: dict) -> list[list]:
    rows = []
    for n in doc["N"]:
        ps = [d for d in doc["plans"] if d["N"] == n]
        for k, d in enumerate(ps, 1):
            rows.append([n, k, _place(d), "yes" if d["colocated"] else "no", d["gpus_used"],
                         " ".join(map(str, d["B"])), f"{d['throughput_tok_s']:.1f}", format_gain(d["ratio_to_best"]),
                         f"{d['per_request_tok_s']:.2f}",
                         " ".join("-" if x is None else f"{x:.2f}" for x in d["admission_latency_ms"]), _lat(d),
                         d["kv_headroom_tokens"]])
    return rows


def render(doc: dict, fmt: str, show_dropped: bool = False) -> str:
    if fmt == "json":
        return json.dumps(doc, indent=1) + "\n"
    rows = _rows(doc)
    if fmt == "csv":
        csv_rows = [[r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7].rstrip("x"), r[8], r[9], r[10], r[11]]
                    for r in rows]
        return to_csv(HEADERS, csv_rows)
    g = doc["gpu"]
    text = (f"{doc['gpus']} x {g['name']} ({g['memory_gib']:g} GiB, {g['memory_bandwidth_bytes_per_s'] / 1e12:g} TB/s); "
            f"models {', '.join(doc['models'])}; {doc['candidates']} candidates, {doc['chains_solved']} chains; "
            f"latency_ms_b1 = solo[/co-running] per model at b = 1\n")
    text += format_table(HEADERS, rows) + "\n"
    reasons: dict[str, int] = {}
    for d in doc["dropped"]:
        reasons[d["reason"]] = reasons.get(d["reason"], 0) + 1
    if reasons:
        text += "dropped: " + ", ".join(f"{v} {k}" for k, v in sorted(reasons.items())) + \
                ("" if show_dropped else " (--show-dropped or --format json lists them)") + "\n"
    if show_dropped and doc["dropped"]:
        text += format_table(["N", "placement", "reason", "detail"],
                             [["-" if d["N"] is None else d["N"], d["label"], d["reason"], d["detail"]]
                              for d in doc["dropped"]]) + "\n"
    return text


def main_impl(argv=None) -> int:
    a = build_parser().parse_args(argv)
    from tr_core.cli import check_out_path
    from tr_model.plan import load_gpu, plan, plan_to_dict
    if a.out:
        check_out_path(a.out)
    fmt = output_format(a)
    G = _gpus(a.gpus)
    Ns = list(parse_int_ranges(a.N, "--N", lo=1, hi=64))
    if a.spec is not None and a.p is not None:
        raise SpecError("give --p or --spec, not both")
    if fmt != "table":
        from tr_core.cli import refuse_given
        refuse_given(a, ["show_dropped"], f"applies to --format table, not --format {fmt} (json always lists the "
                     "dropped candidates; csv has one row per plan)")
    spec = None
    if a.spec is not None:
        from tr_core.spec import load_spec
        spec = load_spec(a.spec)
    gpu = load_gpu(a.gpu)
    corun_tables = None
    if a.corun_L_table is not None:
        from tr_core.grid import load_latency_table
        from tr_core.spec import CorunLatency
        curves = load_latency_table(a.corun_L_table, len(a.model))
        corun_tables = [None if c is None else CorunLatency("table", curve=c) for c in curves]
    prog = Progress("tr-plan", enabled=None if not a.quiet else False)
    res = plan(a.model, gpu, G, Ns, p=a.p, spec=spec,
               latency_profiles=a.latency_profile, corun_slowdown=a.corun_slowdown, corun_tables=corun_tables,
               context_tokens=a.context_tokens, memory_budget_fraction=a.memory_budget_fraction, delta_ms=a.delta_ms,
               min_per_request_tok_s=a.min_per_request_tok_s, progress=prog)
    emit(render(plan_to_dict(res), fmt, a.show_dropped), a.out)
    return 0


def main(argv=None) -> int:
    return run_cli(main_impl, argv, keep_heap=True)


if __name__ == "__main__":
    raise SystemExit(main())
