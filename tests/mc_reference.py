"""An independent per-request Monte Carlo simulation of delayed batching (test oracle).

Written from the model's description only, without any of the chain code:
plain Python objects, one list of request ids per queue, integer time in
quanta.  Used to cross-check the exact chain within a few standard errors.
"""

from __future__ import annotations

import numpy as np


def simulate(P, C, d, N, B, epochs=200_000, n_batches=20, seed=0, warmup=2_000):
    """Simulate the closed system; return (tokens per quantum, standard error).

    ``d[i]`` is model i's step duration in quanta (constant in batch size).
    The standard error comes from ``n_batches`` batch means over equal numbers
    of completion epochs (ratio estimator per batch).
    """
    rng = np.random.default_rng(seed)
    P = np.asarray(P, dtype=float)
    C = np.asarray(C, dtype=float)
    M = len(d)
    queues = [[] for _ in range(M)]
    queues[0] = list(range(N))
    running = [None] * M          # list of request ids in the running batch
    finish = [0] * M              # absolute finish time of the running batch
    now = 0
    cum = np.cumsum(P, axis=1)

    def launch():
        for j in range(M):
            if running[j] is None and len(queues[j]) >= B[j]:
                running[j] = queues[j]
                queues[j] = []
                finish[j] = now + int(d[j])

    launch()
    tok_b = np.zeros(n_batches)
    time_b = np.zeros(n_batches)
    per_batch = max(1, epochs // n_batches)
    for e in range(warmup + per_batch * n_batches):
        t_next = min(finish[j] for j in range(M) if running[j] is not None)
        dt = t_next - now
        now = t_next
        tokens = 0.0
        for i in range(M):
            if running[i] is not None and finish[i] == now:
                batch = running[i]
                running[i] = None
                u = rng.random(len(batch))
                dest = np.searchsorted(cum[i], u, side="right")
                dest = np.minimum(dest, M - 1)
                for req, j in zip(batch, dest):
                    queues[j].append(req)
                    tokens += C[i, j]
        launch()
        if e >= warmup:
            k = (e - warmup) // per_batch
            tok_b[k] += tokens
            time_b[k] += dt
    rates = tok_b / time_b
    est = tok_b.sum() / time_b.sum()
    se = rates.std(ddof=1) / np.sqrt(n_batches)
    return est, se
