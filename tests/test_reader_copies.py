"""The stdlib-only thresholds reader (``tr_model/thresholds.py``) is copied into servers by hand, so it cannot
import the project: the few rules it shares with the package are written twice on purpose.  Each such copy is
checked here against the package's own, on the same inputs."""

from __future__ import annotations

import math

import pytest

from optimizer import cache
from tr_model import thresholds


NUMBERS = [0, 1, -1, 2.5, -0.0, 1e308, 1e-308, 10 ** 400, -(10 ** 400), math.inf, -math.inf, math.nan,
           True, False, None, "1", [1], {"a": 1}, 3 + 0j, 2 ** 63, float(2 ** 1023)]


@pytest.mark.parametrize("x", NUMBERS, ids=repr)
def test_finite_json_number_rule_is_the_same(x):
    # the result cache and the reader both refuse a JSON value that is not a finite double
    assert cache._is_num(x) == thresholds._is_num(x)


def test_the_rule_accepts_and_refuses_what_it_should():
    assert thresholds._is_num(1) and thresholds._is_num(2.5)
    for bad in (True, math.nan, math.inf, 10 ** 400, "1", None):
        assert not thresholds._is_num(bad)
