"""The one feasibility rule: direct enumeration == brute force, closed-form counts, refusals before any work."""

import itertools
import math

import pytest
from hypothesis import given, settings, strategies as st

from tr_core import feasibility as F
from tr_core.errors import SpecError, StateSpaceTooLarge


def _brute(N, M):
    return [B for B in itertools.product(range(1, N + 1), repeat=M) if sum(b - 1 for b in B) < N]


@pytest.mark.parametrize("M", [1, 2, 3, 4])
@pytest.mark.parametrize("N", [1, 2, 3, 5, 7])
def test_enumeration_equals_brute_force_in_lexicographic_order(N, M):
    got = list(F.iter_feasible(N, M))
    assert got == _brute(N, M)
    assert len(got) == F.count_feasible(N, M) == math.comb(N - 1 + M, M)
    assert all(F.is_feasible(B, N) for B in got)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 4), st.lists(st.integers(1, 6), max_size=3))
def test_prefix_count_matches_enumeration(N, M, prefix):
    prefix = prefix[:M]
    want = sum(1 for B in F.iter_feasible(N, M) if B[:len(prefix)] == tuple(prefix))
    assert F.count_feasible_with(N, M, prefix) == want


def test_enumeration_is_lazy_and_refusal_comes_first():
    it = F.iter_feasible(10 ** 12, 3)         # nothing is built: the first vector comes at once
    assert next(it) == (1, 1, 1) and next(it) == (1, 1, 2)
    with pytest.raises(F.TooManyEvaluations) as e:
        F.iter_feasible(10 ** 9, 2, max_count=5)
    assert isinstance(e.value, StateSpaceTooLarge) and e.value.exit_code == 3
    assert e.value.count == math.comb(10 ** 9 + 1, 2) and e.value.limit == 5
    assert "--max-evaluations" in str(e.value)
    # a 12-model spec at N = 8: 50,388 feasible vectors among 8^12 candidates
    assert F.count_feasible(8, 12) == 50_388
    assert F.check_count(50_388, 50_388) == 50_388


@pytest.mark.parametrize("B,N,M,needle", [
    ((1, 5), 4, 2, "infeasible"),
    ((1,), 4, 2, "M = 2"),
    ((0, 1), 4, 2, "B[0]"),
    ((1, 2.5), 4, 2, "B[1]"),
    ((1, True), 4, 2, "B[1]"),
    ("12", 4, 2, "list"),
    (5, 4, 2, "list"),
    ((1, 1), 0, 2, "N must"),
])
def test_check_thresholds_names_the_field(B, N, M, needle):
    with pytest.raises(SpecError, match=None) as e:
        F.check_thresholds(B, N, M)
    assert needle in str(e.value)


def test_check_thresholds_accepts_integral_values_and_custom_name():
    assert F.check_thresholds([1.0, 3], 4, 2) == (1, 3)
    with pytest.raises(SpecError, match=r"--B\[1\]"):
        F.check_thresholds([1, 0], 4, 2, name="--B")
