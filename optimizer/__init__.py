"""Threshold search: B* = argmax of the chain's throughput over the feasible thresholds."""

from optimizer.evaluate import Evaluation, check_thresholds, evaluate_thresholds
from optimizer.search import (Optimum, count_feasible, evaluate_many, evaluations_table, feasible_thresholds,
                              optimize_local, optimize_sweep, optimize_thresholds, pick_best)

__all__ = ["Evaluation", "Optimum", "check_thresholds", "evaluate_thresholds", "evaluate_many",
           "evaluations_table", "feasible_thresholds", "count_feasible", "optimize_thresholds",
           "optimize_sweep", "optimize_local", "pick_best"]
