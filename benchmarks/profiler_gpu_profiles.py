"""Several latency profiles of one model, loaded once: the GPU check's profiling step.

Usage::

    python benchmarks/profiler_gpu_profiles.py --config data/models/Qwen3-32B/config.json \
        --batch-sizes 1 2 4 8 16 --context 512 --variants decode:serving decode:transformers extend4:serving \
        --out-dir OUT

For each variant ``MODE[TOKENS]:ATTENTION`` it runs ``profile_latency`` (CUDA
graph on CUDA, eager on CPU) and writes ``<name>_<variant>.json`` (a latency
profile, readable by ``tr-profile system`` and ``tr-profile roofline``), then
prints one table: per variant and batch size the median step time, the
roofline floor at the device's memory bandwidth and measured / floor.  Loading a
32B random-weight model takes most of the time, hence one process for all
variants.  On CPU (tiny configs only) it is a smoke test of the same path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _variant(text: str) -> tuple[str, int, str]:
    mode, _, attention = text.partition(":")
    attention = attention or "serving"
    if mode.startswith("extend"):
        return "extend", int(mode[len("extend"):] or 8), attention
    if mode != "decode":
        raise SystemExit(f"error: variant {text!r}: use decode[:ATT] or extendT[:ATT]")
    return "decode", 1, attention


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--variants", nargs="+", default=["decode:serving", "decode:transformers"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out-dir", required=True)
    a = ap.parse_args(argv)
    from profiler.latency import ProfileError, load_model, profile_latency, resolve_device

    try:
        device = resolve_device(a.device)
        cuda = device.startswith("cuda")
        dtype = "bf16" if cuda else "fp32"
        t0 = time.perf_counter()
        model, name = load_model(config_path=a.config, dtype=dtype, device=device)
        print(f"loaded {name} ({dtype}, {device}) in {time.perf_counter() - t0:.1f} s", flush=True)
        os.makedirs(a.out_dir, exist_ok=True)
        rows = []
        for text in a.variants:
            mode, T, attention = _variant(text)
            t0 = time.perf_counter()
            prof = profile_latency(model, name=name, batch_sizes=a.batch_sizes, mode=mode, context=a.context,
                                   extend_tokens=T, warmup=a.warmup_steps, steps=a.steps, cuda_graph=cuda,
                                   device=device, dtype=dtype, attention=attention,
                                   arguments={"config": a.config, "variant": text})
            tag = f"{mode}{T if mode == 'extend' else ''}_{attention}"
            path = os.path.join(a.out_dir, f"{name}_{tag}.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(prof.to_dict(), f, indent=2)
            roof = {r["batch_size"]: r for r in (prof.roofline or {}).get("batches", [])}
            for s in prof.batches:
                r = roof.get(s.batch_size, {})
                rows.append((tag, prof.attention, s.batch_size, s.median_ms, s.p90_ms, r.get("floor_ms"),
                             r.get("measured_over_floor")))
            print(f"{tag}: {len(prof.batches)} batch sizes in {time.perf_counter() - t0:.1f} s -> {path}", flush=True)
            if prof.roofline:
                print(f"  bandwidth {prof.roofline['bandwidth_bytes_per_s'] / 1e12:.3g} TB/s "
                      f"({prof.roofline['bandwidth_source']}); measured copy "
                      f"{(prof.roofline['copy_bandwidth_bytes_per_s'] or 0) / 1e12:.3g} TB/s", flush=True)
    except ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"\n{name}, context {a.context}, {dtype}, {'CUDA graph' if cuda else 'eager'} (medians, ms)")
    print(f"{'variant':<22} {'attention':<28} {'b':>4} {'median':>9} {'p90':>9} {'floor':>8} {'x floor':>8}")
    for tag, att, b, med, p90, floor, ratio in rows:
        fl = f"{floor:.3f}" if floor is not None else "-"
        ra = f"{ratio:.2f}" if ratio is not None else "-"
        print(f"{tag:<22} {att[:28]:<28} {b:>4} {med:>9.3f} {p90:>9.3f} {fl:>8} {ra:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
