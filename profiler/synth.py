"""Synthetic routing traces with a known law (for tests, benchmarks and demos).

Markov traces: every request starts on model 0 and, after each step on model
i, moves to j with probability ``P[i, j]`` committing ``C[i, j]`` tokens, so
run lengths on model i are geometric with parameter ``1 - P[i, i]``.

Semi-Markov traces (``run_law``) break that on purpose: a run on model i lasts
a drawn number of steps (``"fixed:K"``: exactly K; ``"negbin:R"``: a sum of R
geometrics with the row's mean; ``"mixture:Q"``: half of the requests use
stay-probability ``P[i,i]`` and half ``Q``), then the request leaves to
``j != i`` with probability proportional to ``P[i, j]``.

Requests are written ``concurrency`` at a time with their steps interleaved,
the way a serving runtime would log them; the last step of each request has
``next_model = -1`` unless ``end_marker`` is false.
"""

from __future__ import annotations

import os

import numpy as np

from profiler import _kernels as K

__all__ = ["write_synthetic_trace", "synthetic_sequences"]


def _semi_markov(P: np.ndarray, n_steps: int, rng: np.random.Generator, law: str, p_alt: np.ndarray):
    M = P.shape[0]
    models = np.empty(n_steps, dtype=np.int64)
    nexts = np.empty(n_steps, dtype=np.int64)
    m, t = 0, 0
    kind, _, arg = law.partition(":")
    while t < n_steps:
        stay = P[m, m] if p_alt is None else p_alt[m]
        if kind == "fixed":
            run = int(arg)
        elif kind == "negbin":
            r = int(arg)
            q = min(1.0, r * (1.0 - stay))  # r geometrics of mean 1/q each: mean r/q = 1/(1-stay)
            run = int(rng.geometric(q, size=r).sum()) if q < 1 else r
        elif kind in ("geometric", "mixture"):
            run = int(rng.geometric(1.0 - stay)) if stay < 1 else n_steps
        else:
            raise ValueError(f"run_law must be fixed:K, negbin:R or mixture:Q, got {law!r}")
        off = P[m].copy()
        off[m] = 0.0
        tot = off.sum()
        nxt = int(rng.choice(M, p=off / tot)) if tot > 0 else m
        for k in range(run):
            if t >= n_steps:
                break
            models[t] = m
            nexts[t] = m if k < run - 1 else nxt
            t += 1
        m = nxt
    return models, nexts


def synthetic_sequences(P, n_steps: int, rng: np.random.Generator, run_law: str | None = None,
                        alt: bool = False):
    P = np.asarray(P, dtype=np.float64)
    if run_law is None:
        return K.simulate_routes(P, int(n_steps), 0, rng.random(n_steps))
    p_alt = None
    if run_law.startswith("mixture:") and alt:
        q = float(run_law.split(":", 1)[1])
        p_alt = np.full(P.shape[0], q)
    return _semi_markov(P, n_steps, rng, run_law, p_alt)


def write_synthetic_trace(path: str | os.PathLike, P, C, *, n_requests: int, steps_per_request: int,
                          seed: int = 0, concurrency: int = 16, run_law: str | None = None,
                          end_marker: bool = True, chunk_requests: int = 2048) -> int:
    """Write a trace; returns the number of lines.  ``C`` must hold integers."""
    P = np.asarray(P, dtype=np.float64)
    Ci = np.asarray(C)
    if not np.all(Ci == np.round(Ci)):
        raise ValueError("synthetic traces need integer committed tokens C")
    Ci = np.round(Ci).astype(np.int64)
    rng = np.random.default_rng(seed)
    lines = 0
    with open(path, "wb") as f:
        for lo in range(0, n_requests, chunk_requests):
            hi = min(n_requests, lo + chunk_requests)
            rid_l, step_l, mod_l, nxt_l = [], [], [], []
            for r in range(lo, hi):
                n = steps_per_request
                models, nexts = synthetic_sequences(P, n, rng, run_law, alt=(r % 2 == 1))
                nexts = nexts.copy()
                tok = Ci[models, nexts]
                if end_marker:
                    nexts[-1] = -1
                rid_l.append(np.full(n, r, dtype=np.int64))
                step_l.append(np.arange(n, dtype=np.int64))
                mod_l.append(models)
                nxt_l.append(nexts)
                if r == lo:
                    tok_l = []
                tok_l.append(tok)
            rid = np.concatenate(rid_l)
            step = np.concatenate(step_l)
            mod = np.concatenate(mod_l)
            nxt = np.concatenate(nxt_l)
            tok = np.concatenate(tok_l)
            group = (rid - lo) // max(1, concurrency)
            order = np.lexsort((rid, step, group))
            out = np.empty(rid.shape[0] * 112 + 64, dtype=np.uint8)
            used = K.format_trace_lines(rid[order], step[order], mod[order], nxt[order], tok[order], out)
            f.write(out[:used].tobytes())
            lines += rid.shape[0]
    return lines
