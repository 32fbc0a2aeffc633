"""An independent per-request Monte Carlo simulation of delayed batching (test oracle).

Written from the model's description only, without any of the chain code:
plain Python objects, one list of request ids per queue, integer time in
quanta.  Used to cross-check the exact chain within a few standard errors.
"""

from __future__ import annotations

import numpy as np


def _duration_table(d, M, N):
    """``d`` as an (M, N + 1) integer table: a per-model constant, or already a table over batch sizes."""
    a = np.asarray(d, dtype=np.int64)
    if a.ndim == 1:
        return np.repeat(a[:, None], N + 1, axis=1)
    return a


def simulate(P, C, d, N, B, epochs=200_000, n_batches=20, seed=0, warmup=2_000, dco=None, caps=None):
    """Simulate the closed system; return (tokens per quantum, standard error).

    ``d[i]`` is model i's step duration in quanta (a constant per model, or a table ``d[i][b]`` over
    batch sizes ``b = 0..N``).  ``dco`` (same forms): the co-running duration under the launch law: a
    batch launched while another model is running (after this instant's completions) or launches at
    the same instant takes ``dco``, otherwise ``d``; it keeps its duration to its end.  ``caps``: batch
    caps per model.  The standard error comes from ``n_batches`` batch means over equal numbers of
    completion epochs (ratio estimator per batch).
    """
    rng = np.random.default_rng(seed)
    P = np.asarray(P, dtype=float)
    C = np.asarray(C, dtype=float)
    M = P.shape[0]
    dt_ = _duration_table(d, M, N)
    dco_ = None if dco is None else _duration_table(dco, M, N)
    cap = [N] * M if caps is None else [min(int(c), N) for c in caps]
    queues = [[] for _ in range(M)]
    queues[0] = list(range(N))
    running = [None] * M          # list of request ids in the running batch
    finish = [0] * M              # absolute finish time of the running batch
    now = 0
    cum = np.cumsum(P, axis=1)

    def launch():
        starters = [j for j in range(M) if running[j] is None and len(queues[j]) >= B[j]]
        others_busy = any(running[j] is not None for j in range(M))
        together = len(starters) > 1
        for j in starters:
            take = min(len(queues[j]), cap[j])
            running[j] = queues[j][:take]
            queues[j] = queues[j][take:]
            shared = dco_ is not None and (others_busy or together)
            finish[j] = now + int((dco_ if shared else dt_)[j, take])

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


def exact_reference(P, C, d, N, B, dco=None, caps=None):
    """Tokens per quantum of the same dynamics, exactly: a plain-Python enumeration of the
    (queues, running batches, absolute-phase-free residuals) process and a dense solve.

    Independent of the project's chain code: states are tuples, routing outcomes come from
    ``itertools.product`` over each completing batch's requests (one destination per request, so no
    multinomial formula is shared with the chain), the stationary vector from a least-squares solve.
    Meant for tiny systems (N <= 4, short durations).
    """
    import itertools

    P = np.asarray(P, dtype=float)
    C = np.asarray(C, dtype=float)
    M = P.shape[0]
    dt_ = _duration_table(d, M, N)
    dco_ = None if dco is None else _duration_table(dco, M, N)
    cap = [N] * M if caps is None else [min(int(c), N) for c in caps]

    def launch(q, run):
        q, run = list(q), list(run)
        starters = [j for j in range(M) if run[j] is None and q[j] >= B[j]]
        busy = any(x is not None for x in run)
        for j in starters:
            take = min(q[j], cap[j])
            q[j] -= take
            shared = dco_ is not None and (busy or len(starters) > 1)
            run[j] = (take, int((dco_ if shared else dt_)[j, take]))
        return tuple(q), tuple(run)

    start = launch(tuple([N] + [0] * (M - 1)), tuple([None] * M))
    index = {start: 0}
    order = [start]
    rows = []
    pos = 0
    while pos < len(order):
        q, run = order[pos]
        pos += 1
        tau = min(x[1] for x in run if x is not None)
        ending = [i for i in range(M) if run[i] is not None and run[i][1] == tau]
        reward = sum(run[i][0] * float(C[i] @ P[i]) for i in ending)
        out = {}
        requests = [i for i in ending for _ in range(run[i][0])]
        for dests in itertools.product(range(M), repeat=len(requests)):
            p = 1.0
            for i, j in zip(requests, dests):
                p *= P[i, j]
            if p == 0.0:
                continue
            q2 = list(q)
            for j in dests:
                q2[j] += 1
            run2 = tuple(None if (x is None or i in ending) else (x[0], x[1] - tau) for i, x in enumerate(run))
            nxt = launch(tuple(q2), run2)
            out[nxt] = out.get(nxt, 0.0) + p
        for s in out:
            if s not in index:
                index[s] = len(order)
                order.append(s)
        rows.append((out, tau, reward))
    n = len(order)
    T = np.zeros((n, n))
    tau = np.zeros(n)
    g = np.zeros(n)
    for a, (out, t, r) in enumerate(rows):
        for s, p in out.items():
            T[a, index[s]] += p
        tau[a], g[a] = t, r
    A = np.vstack([T.T - np.eye(n), np.ones((1, n))])
    rhs = np.zeros(n + 1)
    rhs[-1] = 1.0
    pi = np.linalg.lstsq(A, rhs, rcond=None)[0]
    return float(pi @ g / (pi @ tau)), n
