"""Threshold search: B* = argmax of the chain's throughput over the feasible thresholds.

``optimize_thresholds(spec, N, search=...)`` returns an :class:`Optimum` that
says how it was obtained (``certificate``: exhaustive, pruned-exact, certified,
local), with a proven ``upper_bound_tok_s``, the relative ``gap`` and the
accounting of what was evaluated and pruned.  Bounds: :mod:`optimizer.bounds`.
"""

from optimizer.evaluate import Evaluation, check_thresholds, evaluate_thresholds
from optimizer.search import (CERTIFICATES, DEFAULT_MAX_GAP, SEARCHES, Optimum, count_feasible, evaluate_many,
                              evaluations_table, feasible_thresholds, optimize_local, optimize_sweep,
                              optimize_thresholds, pick_best)

__all__ = ["Evaluation", "Optimum", "check_thresholds", "evaluate_thresholds", "evaluate_many",
           "evaluations_table", "feasible_thresholds", "count_feasible", "optimize_thresholds",
           "optimize_sweep", "optimize_local", "pick_best", "SEARCHES", "CERTIFICATES", "DEFAULT_MAX_GAP"]
