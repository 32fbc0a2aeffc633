"""tr-plan for the R2R pair (Qwen3-0.6B / Qwen3-32B, p = 0.35, N = 1 4 8 16): seconds and peak memory of the whole
command per GPU kind and count, and the plan it ranks first at N = 16."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from . import _common

TITLE = "tr-plan: the R2R pair ranked on A100s and H200s (seconds per GPU count, the best plan at N = 16)"
TOPIC = "search"
COMMAND = "python benchmarks/run.py plan"
COLUMNS = ["gpu", "gpus", "exit", "seconds", "peak_rss_mb", "candidates", "best_placement", "best_B",
           "best_tok_s", "best_per_request_tok_s"]
NOTES = ("One process per row: tr-plan --model data/models/Qwen3-0.6B/config.json --model "
         "data/models/Qwen3-32B/config.json --gpu GPU --gpus G --p 0.35 --N 1 4 8 16 --format json (warm numba "
         "cache: a first call compiles before the rows).  seconds: the whole command; target <= 30 s per GPU "
         "count on 2 cores.  best_*: the first plan at N = 16.")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = [os.path.join(ROOT, "data", "models", m, "config.json") for m in ("Qwen3-0.6B", "Qwen3-32B")]


def _tool() -> str:
    exe = os.path.join(os.path.dirname(sys.executable), "tr-plan")
    return exe if os.path.exists(exe) else "tr-plan"


def _one(gpu: str, gpus: int) -> dict:
    argv = [_tool(), "--model", MODELS[0], "--model", MODELS[1], "--gpu", gpu, "--gpus", str(gpus), "--p", "0.35",
            "--N", "1", "4", "8", "16", "--format", "json"]
    code, out, err, seconds, peak_mb = _common.run_process(argv, 600)
    row = {"gpu": gpu, "gpus": gpus, "exit": code, "seconds": seconds, "peak_rss_mb": peak_mb}
    if code != 0:
        return row
    doc = json.loads(out)
    plans = [p for p in doc["plans"] if p.get("N") == 16] or doc["plans"]
    best = plans[0]
    cands = doc.get("candidates")
    row.update(candidates=cands if isinstance(cands, int) else len(cands or ()),
               best_placement=" + ".join(f"{m.get('gpus')}/TP{m.get('tensor_parallel')}" for m in best["placement"]),
               best_B=best.get("B"), best_tok_s=best.get("throughput_tok_s"),
               best_per_request_tok_s=best.get("per_request_tok_s"))
    return row


def run(quick: bool) -> list[dict]:
    subprocess.run([_tool(), "--model", MODELS[0], "--model", MODELS[1], "--gpu", "h200", "--gpus", "2",
                    "--N", "1", "4"], capture_output=True)   # compile the kernels before the timed rows
    rows = []
    for gpu in ("a100", "h200"):
        for g in ((2, 8) if quick else (2, 3, 4, 8)):
            rows.append(_one(gpu, g))
    return rows
