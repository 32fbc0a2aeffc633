"""One layer's attention of a decode/extend step: transformers' masked path vs the serving attention (CPU or GPU).

Usage:  python benchmarks/profiler_attention_bench.py [--batch-sizes 1 4 16] [--context 512] [--repeats 30]

Shapes of the Qwen3-32B config (64 query heads, 8 KV heads, head dim 128).  ``masked`` is what transformers
runs for a static cache: K and V expanded to every query head (``repeat_kv``) and SDPA with a boolean mask over
the cache; ``serving`` is ``profiler.serving_attention`` (query heads folded onto their KV head, no copy, no
mask for decode).  Prints the median time per call and the bytes each path reads and writes for K/V
(``masked``: read K, V, write and read the expanded copy; ``serving``: read K, V once).  A CPU run shows the
direction only; the GPU run (benchmarks/gpu_check.sh) measures the whole step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4, 16])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F

    from profiler.serving_attention import serving_attention

    if a.threads:
        torch.set_num_threads(a.threads)
    cuda = torch.cuda.is_available()
    dev, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    hq, hkv, d = 64, 8, 128
    g = hq // hkv
    esize = torch.tensor([], dtype=dtype).element_size()

    def masked(q, k, v, mask):
        kk = k[:, :, None].expand(k.shape[0], hkv, g, k.shape[2], d).reshape(k.shape[0], hq, k.shape[2], d)
        vv = v[:, :, None].expand(v.shape[0], hkv, g, v.shape[2], d).reshape(v.shape[0], hq, v.shape[2], d)
        return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, scale=d ** -0.5)

    def timed(fn):
        for _ in range(3):
            fn()
        out = []
        for _ in range(a.repeats):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize()
            out.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(out)

    print(f"one attention layer, {hq} query / {hkv} KV heads, head dim {d}, context {a.context}, {dtype}, {dev} "
          f"(median of {a.repeats})")
    print(f"{'b':>3} {'T':>2} {'masked ms':>10} {'serving ms':>11} {'ratio':>6} {'masked KV MB':>13} "
          f"{'serving KV MB':>14}")
    for b in a.batch_sizes:
        for T in a.tokens:
            S = a.context + T
            q = torch.randn(b, hq, T, d, device=dev, dtype=dtype)
            k = torch.randn(b, hkv, S, d, device=dev, dtype=dtype)
            v = torch.randn(b, hkv, S, d, device=dev, dtype=dtype)
            mask = (torch.arange(S, device=dev)[None, :] <= (S - T + torch.arange(T, device=dev))[:, None])
            mask = mask[None, None].expand(b, 1, T, S)
            tm = timed(lambda: masked(q, k, v, mask))
            ts = timed(lambda: serving_attention(None, q, k, v, None, scaling=d ** -0.5))
            kv = 2 * b * hkv * S * d * esize
            print(f"{b:>3} {T:>2} {tm:>10.3f} {ts:>11.3f} {tm / ts:>6.2f} {(kv + 2 * g * kv) / 1e6:>13.1f} "
                  f"{kv / 1e6:>14.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
