"""gapdyn.theory.safe_step against a direct (loop) computation of the rule, its invariances, its input checks."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import gapdyn as g

from tests.strategies import safe_step_batches


def _loop_rule(x, r, groups, c, delta):
    """docs/theory.md, section 11, written out with plain Python loops (no numpy moments)."""
    by_group = {}
    for xi, ri, gi in zip(x, r, groups):
        by_group.setdefault(int(gi), []).append((float(xi), float(ri)))

    def mean(v):
        return sum(v) / len(v)

    def var(v):
        if len(v) < 2:
            return 0.0
        m = mean(v)
        return sum((t - m) ** 2 for t in v) / (len(v) - 1)

    dmus, kappas, sd = [], [], 0.0
    for items in by_group.values():
        xs = [t for t, _ in items]
        sd = max(sd, math.sqrt(var(xs)))
        pos = [t for t, rr in items if rr == 1.0]
        neg = [t for t, rr in items if rr == 0.0]
        if pos and neg:
            dmus.append(mean(pos) - mean(neg))
            kappas.append(var(neg) - var(pos))
    dmu = mean(dmus) if dmus else 0.0
    kappa = mean(kappas) if kappas else 0.0
    a = 1.0
    if sd > 0:
        a = min(a, delta / sd)
    if dmus:
        if dmu <= 1e-12 * sd:
            return dmu, kappa, sd, len(dmus), 0.0
        if kappa > 0:
            a = min(a, c * dmu / kappa)
    return dmu, kappa, sd, len(dmus), a


@settings(max_examples=200, deadline=None)
@given(safe_step_batches(), st.floats(0.05, 4.0), st.floats(0.05, 8.0))
def test_matches_loop_computation(batch, c, delta):
    x, r, groups = batch
    got = g.safe_step_multiplier(x, r, groups, c=c, delta=delta)
    dmu, kappa, sd, n_mixed, a = _loop_rule(x, r, groups, c, delta)
    assert got.n_mixed == n_mixed
    np.testing.assert_allclose([got.dmu_hat, got.kappa_hat, got.sd_hat], [dmu, kappa, sd], rtol=1e-9, atol=1e-12)
    assert got.a == pytest.approx(a, rel=1e-9, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(safe_step_batches(), st.floats(0.05, 4.0), st.floats(0.05, 8.0))
def test_multiplier_in_unit_interval(batch, c, delta):
    x, r, groups = batch
    a = g.safe_step_multiplier(x, r, groups, c=c, delta=delta).a
    assert 0.0 <= a <= 1.0


@settings(max_examples=200, deadline=None)
@given(safe_step_batches(), st.floats(-3.0, 3.0), st.floats(0.05, 4.0), st.floats(0.05, 8.0))
def test_step_is_scale_invariant_where_a_cap_binds(batch, log10_scale, c, delta):
    """Scaling d by s scales x by s: where a cap binds at both scales, a(s x) s = a(x) (the step a d is fixed)."""
    x, r, groups = batch
    s = 10.0**log10_scale
    a1 = g.safe_step_multiplier(x, r, groups, c=c, delta=delta).a
    a2 = g.safe_step_multiplier(s * x, r, groups, c=c, delta=delta).a
    if 0.0 < a1 < 1.0 and 0.0 < a2 < 1.0:
        assert a2 * s == pytest.approx(a1, rel=1e-9)
    if a1 == 0.0 or a2 == 0.0:  # 'no ascent' does not depend on the scale either
        assert a1 == a2 == 0.0


@pytest.mark.parametrize(
    "x, r, expect_a",
    [
        ([1.0, 1.0, 2.0, -2.0], [1, 1, 0, 0], 0.125),  # curvature binds: 1 * 1 / 8
        ([0.1, 0.1, 0.1, 0.1], [1, 1, 0, 0], 0.0),  # a mixed group and dmu_hat = 0: no ascent, skip
        ([-1.0, 1.0], [1, 0], 0.0),  # descent of the log-odds
        ([0.0, 4.0, 0.0, 4.0], [1, 1, 1, 1], 2.0 / math.sqrt(16.0 / 3.0)),  # no mixed group: trust region only
        ([0.0, 0.0], [1, 1], 1.0),  # nothing moves: the full step
    ],
)
def test_edge_cases(x, r, expect_a):
    assert g.safe_step_multiplier(x, r).a == pytest.approx(expect_a, rel=1e-12, abs=0.0)


def test_step_size_is_eta0_times_multiplier():
    """safe_step_size along a unit direction with ceiling eta0 = eta0 * the multiplier along eta0 u."""
    rng = np.random.default_rng(3)
    for _ in range(50):
        x, r = rng.normal(size=8), (rng.random(8) < 0.5).astype(float)
        eta0 = 10.0 ** rng.uniform(-3, 3)
        dmu, kappa, sd, n = g.safe_step_estimates(x, r)
        eta = g.safe_step_size(dmu, kappa, sd, eta0, mixed=n > 0)
        assert eta == pytest.approx(eta0 * g.safe_step_multiplier(eta0 * x, r).a, rel=1e-9)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: g.safe_step_multiplier([1.0, np.nan], [1, 0]), "x"),
        (lambda: g.safe_step_multiplier([[1.0, 2.0]], [[1, 0]]), "x"),
        (lambda: g.safe_step_multiplier([1.0, 2.0], [1, 0.5]), "rewards"),
        (lambda: g.safe_step_multiplier([1.0, 2.0], [1, 0, 1]), "rewards"),
        (lambda: g.safe_step_multiplier([1.0, 2.0], [1, 0], [0]), "groups"),
        (lambda: g.safe_step_multiplier([1.0, 2.0], [1, 0], [0.5, 1.0]), "groups"),
        (lambda: g.safe_step_multiplier([1.0, 2.0], [1, 0], c=0.0), "c"),
        (lambda: g.safe_step_multiplier([1.0, 2.0], [1, 0], delta=-1.0), "delta"),
        (lambda: g.safe_step_size(np.inf, 0.0, 1.0), "dmu_hat"),
        (lambda: g.safe_step_size(1.0, "a", 1.0), "kappa_hat"),
        (lambda: g.safe_step_size(1.0, 0.0, -1.0), "sd_hat"),
        (lambda: g.safe_step_size(1.0, 0.0, 1.0, 0.0), "eta0"),
        (lambda: g.safe_step_size(1.0, 0.0, 1.0, mixed="yes"), "mixed"),
    ],
)
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# --- the bandit kernel's copy of the rule (bandits/engine.py: _group_safe_moments, _safe_step_size) ----------


@settings(max_examples=150, deadline=None)
@given(safe_step_batches(), st.floats(-3.0, 3.0), st.floats(0.05, 4.0), st.floats(0.05, 8.0))
def test_bandit_kernel_copy_equals_gapdyn_rule(batch, log10_eta0, c, delta):
    """The numba helpers the engine's adaptive schedule calls, group by group and aggregated as the kernel does,
    give gapdyn.safe_step_estimates and gapdyn.safe_step_size on the same inputs."""
    from bandits.engine import _group_safe_moments, _safe_step_size

    x, r, groups = batch
    eta0 = 10.0**log10_eta0
    dsum = ksum = sdmax = 0.0
    cnt = 0
    for gid in np.unique(groups):
        xg, rg = np.ascontiguousarray(x[groups == gid]), np.ascontiguousarray(r[groups == gid])
        d1, k1, s1, mixed = _group_safe_moments(xg, rg, xg.size)
        d2, k2, s2, n2 = g.safe_step_estimates(xg, rg)
        assert mixed == (n2 == 1)
        np.testing.assert_allclose([d1, k1, s1], [d2, k2, s2], rtol=1e-10, atol=1e-12 * max(1.0, np.abs(xg).max()) ** 2)
        sdmax = max(sdmax, s1)
        if mixed:
            dsum, ksum, cnt = dsum + d1, ksum + k1, cnt + 1
    dmu, kappa, sd, n_mixed = g.safe_step_estimates(x, r, groups)
    expect = g.safe_step_size(dmu, kappa, sd, eta0, c=c, delta=delta, mixed=n_mixed > 0)
    assert _safe_step_size(eta0, dsum, ksum, cnt, sdmax, c, delta) == pytest.approx(expect, rel=1e-9, abs=0.0)
