"""The shadow-token budget of one iteration (ShadowPrefill's Algorithm 1) and its credit rule.

A serving scheduler calls :func:`shadow_budget` once per iteration, after it
has placed every running decode, in-flight prefill chunk and admission, to
learn how many shadow (low-priority prefill) tokens it may add::

    if the waiting queue is non-empty or an admission was blocked:  0       ("queue")
    elif the batch is empty:          t(shadow n)         <= beta * T        ("idle")
    elif harvest (fixed-credit mode): t(B + n) - t(B)     <= min(credit, beta * T)   ("harvest")
    elif a routed call is in B:       t(B + n) - t(B)     <= min(credit, beta * T)   ("routed", C2)
    else:                             t(B + n)            <= min(beta * T, min_r sigma_r)  ("slack", C1)
    n = the largest such n, at most min(free shadow KV, token budget left, pending shadow tokens);
    0 if n < n_min

``t`` is the latency model (:func:`~shadow_prefill.latency.lm_iteration_time`),
``T`` the instance's TPOT SLO, ``beta`` the iteration cap (0.5).  The slack of
a decode r that got its first token at ``f_r`` and has run ``k_r`` iterations
under TPOT SLO ``T_r`` is ``sigma_r = (1 - m) T_r (k_r + 1) - (now - f_r)``
(the longest the next iteration may last while r still meets its SLO with
margin m); of a prefilling request that arrived at ``a_r`` with TTFT SLO
``F_r`` and predicted remaining prefill time ``p_r``, ``sigma_r = (1 - m) F_r -
(now - a_r) - p_r``.  Shadow tokens form one chunk appended to a shadow job
that already holds ``shadow_context`` tokens (the chunk attends over them).

**Two readings made explicit.**  Algorithm 1 writes every branch as a bound on
``t(B + n)``; on the credit branches it bounds the *stretch* ``t(B + n) -
t(B)`` here, because the credit is a few percent of decode time and could
never cover a whole iteration, and the paper's argument ("the long-run
slowdown of routed calls is therefore at most delta") is about stretch.  A
prefill's slack is used as a bound on the whole iteration, like a decode's,
as the paper's "the iteration budget is the smallest slack in the batch"
says (this is the stricter reading).

**Credit** (:func:`credit_update`): after each iteration, ``credit <-
clip(credit - stretch + delta * t(B) [if B was decode-only], 0, beta * T)``:
it accrues at delta times the duration of decode-only (memory-bound)
iterations, pays for the stretch shadow work caused, and is capped by the
budget.  Harvest-SLO uses delta = 0.025 and spends credit only on iterations
that carry a routed call; Harvest (no SLO controller) uses delta = 0.1 on
every busy iteration (``harvest=True``).

Both functions are numba-compiled and allocation-free, so a simulator or a
scheduler loop in compiled code can call them every iteration;
:func:`shadow_budget` takes its batch, room and controller parameters as
records (:data:`BudgetBatch`, :data:`ShadowRoom`, :data:`Controller`: named
tuples of arrays and scalars).  The Python wrapper
:func:`decide_shadow_tokens` takes dataclasses instead, and validates them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from shadow_prefill import _kernels as _k
from shadow_prefill.errors import ShadowError
from shadow_prefill.latency import LatencyModel

__all__ = ["BudgetParams", "HARVEST_SLO", "HARVEST", "Decode", "PrefillChunk", "BudgetDecision", "CreditAccount",
           "shadow_budget", "credit_update", "decide_shadow_tokens", "BRANCH_QUEUE", "BRANCH_IDLE", "BRANCH_ROUTED",
           "BRANCH_SLACK", "BRANCH_HARVEST", "BRANCH_NAMES", "NO_LIMIT", "BudgetBatch", "ShadowRoom", "Controller"]

BRANCH_QUEUE = _k.BRANCH_QUEUE
BRANCH_IDLE = _k.BRANCH_IDLE
BRANCH_ROUTED = _k.BRANCH_ROUTED
BRANCH_SLACK = _k.BRANCH_SLACK
BRANCH_HARVEST = _k.BRANCH_HARVEST
BRANCH_NAMES = ("queue", "idle", "routed", "slack", "harvest")
NO_LIMIT = 1 << 62


@dataclass(frozen=True)
class BudgetParams:
    """Controller parameters: iteration cap ``beta`` (x TPOT SLO), SLO margin, credit rate, minimum chunk."""

    beta: float = 0.5
    margin: float = 0.1
    delta: float = 0.025
    n_min: int = 256
    harvest: bool = False

    def __post_init__(self):
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise ShadowError(f"beta must be > 0, got {self.beta!r}")
        if not (0.0 <= self.margin < 1.0):
            raise ShadowError(f"the SLO margin must be in [0, 1), got {self.margin!r}")
        if not (math.isfinite(self.delta) and self.delta >= 0):
            raise ShadowError(f"the credit rate delta must be >= 0, got {self.delta!r}")
        if not isinstance(self.n_min, int) or self.n_min < 1:
            raise ShadowError(f"the minimum shadow chunk must be an integer >= 1, got {self.n_min!r}")


HARVEST_SLO = BudgetParams()
HARVEST = BudgetParams(delta=0.1, harvest=True)

#: the compiled forms, for schedulers and simulators written in numba (arguments in the kernels' docstrings):
#: ``shadow_budget(now, BudgetBatch, queue_blocked, routed_in_batch, credit_s, lm, tpot_slo_s, ShadowRoom,
#: Controller) -> (n, budget_s, branch, base_s, with_shadow_s)``
shadow_budget = _k.shadow_budget
credit_update = _k.credit_update
#: the records :func:`shadow_budget` takes (named tuples of arrays and scalars, built in Python or compiled code)
BudgetBatch = _k.BudgetBatch
ShadowRoom = _k.ShadowRoom
Controller = _k.Controller


@dataclass(frozen=True)
class Decode:
    """A running decode: when it got its first token, iterations since, its TPOT SLO, its context."""

    first_token_s: float
    iterations: int
    tpot_slo_s: float
    context: int


@dataclass(frozen=True)
class PrefillChunk:
    """A prefill chunk in the batch: its request's arrival, TTFT SLO, predicted remaining prefill time,
    and the chunk's tokens and cached context."""

    arrival_s: float
    ttft_slo_s: float
    remaining_s: float
    tokens: int
    context: int = 0


@dataclass(frozen=True)
class BudgetDecision:
    tokens: int
    budget_s: float
    branch: str
    base_s: float
    with_shadow_s: float

    @property
    def stretch_s(self) -> float:
        """Iteration time the shadow tokens add (0 when none)."""
        return self.with_shadow_s - self.base_s if self.tokens > 0 else 0.0


def _limit(x: float | int | None) -> int:
    if x is None or (isinstance(x, float) and math.isinf(x)):
        return NO_LIMIT
    if x < 0:
        raise ShadowError(f"token limits must be >= 0, got {x!r}")
    return int(x)


def decide_shadow_tokens(now: float, decodes: Sequence[Decode], chunks: Sequence[PrefillChunk], *, lm: LatencyModel,
           tpot_slo_s: float, free_shadow_kv: int | None = None, queue_nonempty: bool = False,
           admission_blocked: bool = False, routed_in_batch: bool = False, credit_s: float = 0.0,
           shadow_context: int = 0, token_budget_left: int | None = None, pending_shadow_tokens: int | None = None,
           params: BudgetParams = HARVEST_SLO) -> BudgetDecision:
    """:func:`shadow_budget` on dataclasses (``None`` limits mean unlimited)."""
    if not (math.isfinite(tpot_slo_s) and tpot_slo_s > 0):
        raise ShadowError(f"the TPOT SLO must be > 0 s, got {tpot_slo_s!r}")
    f8 = np.float64
    batch = BudgetBatch(
        np.array([d.first_token_s for d in decodes], dtype=f8), np.array([d.iterations for d in decodes], dtype=f8),
        np.array([d.tpot_slo_s for d in decodes], dtype=f8), np.array([d.context for d in decodes], dtype=f8),
        np.array([c.arrival_s for c in chunks], dtype=f8), np.array([c.ttft_slo_s for c in chunks], dtype=f8),
        np.array([c.remaining_s for c in chunks], dtype=f8), np.array([c.tokens for c in chunks], dtype=f8),
        np.array([c.context for c in chunks], dtype=f8))
    room = ShadowRoom(int(shadow_context), _limit(free_shadow_kv), _limit(token_budget_left),
                      _limit(pending_shadow_tokens))
    ctl = Controller(float(params.beta), float(params.margin), int(params.n_min), bool(params.harvest))
    n, b, br, base, t = shadow_budget(float(now), batch, bool(queue_nonempty or admission_blocked),
                                      bool(routed_in_batch), float(credit_s), lm.params, float(tpot_slo_s), room, ctl)
    return BudgetDecision(int(n), float(b), BRANCH_NAMES[int(br)], float(base), float(t))


class CreditAccount:
    """The routed-step credit of one instance (Python convenience around :func:`credit_update`)."""

    def __init__(self, tpot_slo_s: float, params: BudgetParams = HARVEST_SLO, credit_s: float = 0.0):
        self.params = params
        self.cap_s = params.beta * tpot_slo_s
        self.credit_s = min(max(0.0, credit_s), self.cap_s)

    def update(self, base_s: float, decode_only: bool, stretch_s: float = 0.0) -> float:
        self.credit_s = float(credit_update(self.credit_s, float(base_s), bool(decode_only), float(stretch_s),
                                            float(self.params.delta), float(self.cap_s)))
        return self.credit_s
