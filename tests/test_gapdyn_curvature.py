"""gapdyn.theory.curvature.curvature_gap against a plain-Python loop, for both uses' ddof, and its edge cases."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gapdyn.theory.curvature import curvature_gap
from gapdyn.theory.safe_step import KAPPA_DDOF, safe_step_estimates

from tests.strategies import safe_step_batches


def _loop_gap(x, success, groups, ddof):
    """docs/theory.md, section 11, written out: per group var_{r=0} - var_{r=1} (divisor n - ddof, 0 when
    n <= ddof), averaged over the groups holding both rewards; no numpy moments."""
    by_group = {}
    for xi, si, gi in zip(x, success, groups):
        by_group.setdefault(int(gi), []).append((float(xi), bool(si)))

    def var(v):
        if len(v) <= ddof:
            return 0.0
        m = sum(v) / len(v)
        return sum((t - m) ** 2 for t in v) / (len(v) - ddof)

    terms = []
    for items in by_group.values():
        won = [t for t, s in items if s]
        lost = [t for t, s in items if not s]
        if won and lost:
            terms.append(var(lost) - var(won))
    return (sum(terms) / len(terms) if terms else math.nan), len(terms)


@settings(max_examples=150, deadline=None)
@given(safe_step_batches(), st.sampled_from([0, 1]))
def test_matches_a_plain_loop(batch, ddof):
    x, r, groups = batch
    got, q = curvature_gap(x, r == 1.0, groups, ddof=ddof)
    want, q_want = _loop_gap(x, r == 1.0, groups, ddof)
    assert q == q_want
    if q == 0:
        assert math.isnan(got)
    else:
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12 * float(np.abs(x).max()) ** 2)


def test_ddof_tells_the_two_uses_apart():
    """One group, losers (1, 3), winners (0, 0): population variance 1 (warn/curv_gap), unbiased 2 (kappa_hat);
    a lone loser counts 0 at ddof = 1 and its (zero) population variance at ddof = 0."""
    x, won = [1.0, 3.0, 0.0, 0.0], [0, 0, 1, 1]
    assert curvature_gap(x, won, ddof=0) == (1.0, 1)
    assert curvature_gap(x, won, ddof=1) == (2.0, 1)
    assert curvature_gap([5.0, 1.0, 2.0, 4.0], [0, 1, 1, 1], ddof=1)[0] == pytest.approx(-7.0 / 3.0, rel=1e-15)
    assert curvature_gap([5.0, 1.0, 2.0, 4.0], [0, 1, 1, 1], ddof=0)[0] == pytest.approx(-14.0 / 9.0, rel=1e-15)


def test_safe_step_kappa_is_the_unbiased_gap():
    rng = np.random.default_rng(0)
    x, r, groups = rng.normal(size=24), (rng.random(24) < 0.5).astype(float), np.repeat(np.arange(4), 6)
    assert KAPPA_DDOF == 1
    assert safe_step_estimates(x, r, groups)[1] == pytest.approx(_loop_gap(x, r == 1.0, groups, 1)[0], rel=1e-12)


def test_edges_and_inputs():
    assert math.isnan(curvature_gap([1.0, 2.0], [1, 1], ddof=0)[0])  # no mixed group
    assert curvature_gap([1.0, 2.0], [1, 1], ddof=0)[1] == 0
    with np.errstate(all="raise"):  # a non-finite x gives a non-finite gap, silently
        assert math.isnan(curvature_gap([np.inf, 1.0, 0.0], [0, 0, 1], ddof=0)[0])
    assert curvature_gap([np.nan, 1.0, 2.0, 0.0], [1, 1, 1, 0], [0, 0, 1, 1], ddof=0) == (0.0, 1)  # unmixed: ignored
    for kwargs, match in (({"x": [[1.0, 2.0]]}, "x"), ({"success": [1]}, "success"), ({"success": [0.5, 1]}, "success"),
                          ({"groups": [0]}, "groups"), ({"ddof": -1}, "ddof"), ({"ddof": 1.0}, "ddof"),
                          ({"ddof": True}, "ddof")):
        args = {"x": [1.0, 2.0], "success": [1, 0], "groups": None, "ddof": 0, **kwargs}
        with pytest.raises(ValueError, match=match):
            curvature_gap(args["x"], args["success"], args["groups"], ddof=args["ddof"])
