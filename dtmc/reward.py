r"""Long-run rewards of the delayed-batching chain (renewal-reward theorem).

With stationary distribution :math:`\pi` of the embedded chain, holding times
:math:`\tau(s)` (quanta) and per-epoch rewards :math:`g(s)`:

.. math::  T(B) = \frac{\sum_s \pi(s) g(s)}{\sum_s \pi(s)\tau(s)}
   \ \text{tokens per quantum}, \qquad \text{tokens/s} = T(B)\cdot 1000/\delta_{ms}.

Queue lengths are constant while a state is held, so the time-average number
waiting at model i is :math:`\bar k_i = \sum_s \pi(s)\tau(s) k_i(s) / \sum_s\pi(s)\tau(s)`.
Requests are routed into queue i at rate
:math:`\lambda_i = \sum_s \pi(s) a_i(s) / \sum_s \pi(s)\tau(s)` per quantum, with
:math:`a_i(s) = \sum_{j\in A(s)} b_j P_{ji}`, and Little's law gives the mean
admission latency (time from routing to the start of the batch that serves the
request) :math:`W_i = \bar k_i / \lambda_i`.
"""

from __future__ import annotations

import numpy as np


def throughput_per_quantum(pi: np.ndarray, g: np.ndarray, tau: np.ndarray) -> float:
    """Tokens per time quantum ``sum(pi g) / sum(pi tau)``."""
    # elementwise sums rather than BLAS dot: some OpenBLAS settings make tiny dots slow
    return float(np.sum(pi * g) / np.sum(pi * tau))


def mean_waiting(pi: np.ndarray, tau: np.ndarray, waiting: np.ndarray) -> np.ndarray:
    """Time-average number of requests waiting at each model."""
    w = pi * tau
    return (w[:, None] * waiting).sum(axis=0) / w.sum()


def arrival_rate_per_quantum(pi: np.ndarray, tau: np.ndarray, arrivals: np.ndarray) -> np.ndarray:
    """Rate at which requests are routed into each model's queue, per quantum."""
    return (pi[:, None] * arrivals).sum(axis=0) / float(np.sum(pi * tau))
