"""Cumulative alignment, Theorem 1's bound and the logistic fit."""

import numpy as np
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp
from scipy.special import expit, logit

import gapdyn as g


@given(hnp.arrays(np.float64, st.integers(1, 50), elements=st.floats(0, 10)),
       hnp.arrays(np.float64, st.integers(1, 50), elements=st.floats(-5, 5)))
def test_cumulative_alignment_equals_loop(etas, dmus):
    n = min(etas.size, dmus.size)
    etas, dmus = etas[:n], dmus[:n]
    M, loop = g.cumulative_alignment(etas, dmus), []
    total = 0.0
    for e, d in zip(etas, dmus):
        total += e * max(d, 0.0)
        loop.append(total)
    np.testing.assert_allclose(M, loop, atol=1e-9)
    assert np.all(np.diff(M) >= 0)


def test_lower_bound_closed_forms():
    J0 = np.array([0.1, 0.5, 0.9])
    np.testing.assert_allclose(g.logodds_lower_bound(J0, 0.0), J0)
    M = 3.0
    np.testing.assert_allclose(g.logodds_lower_bound(J0, M), J0 / (J0 + (1 - J0) * np.exp(-M / 2)))
    assert np.all(np.isfinite(g.logodds_lower_bound(1e-12, 1e4)))


def test_theorem1_bound_holds_on_exact_gap_ascent_with_small_steps():
    """Exact log-odds ascent within Theorem 1's step condition stays above sigmoid(logit J0 + M/2)."""
    rng = np.random.default_rng(7)
    phi = rng.normal(size=(100, 16)) / 4.0
    r = np.zeros(100)
    r[:10] = 1.0
    th = np.zeros(16)
    G_o, L_o = g.loglinear_bound_constants(phi)
    J0 = float(g.success_rate(g.loglinear_probs(phi, th), r))
    M = 0.0
    for _ in range(300):
        p, s = g.loglinear_probs(phi, th), g.loglinear_scores(phi, th)
        gap = g.gradient_gap(p, r, s)
        w = gap / max(np.linalg.norm(gap), 1.0)
        dmu = g.gap_alignment(w, gap)
        # 50x the Theorem-1 step (the paper's constant is conservative); still far below the sharp threshold
        eta = float(g.theorem1_step_bound(dmu, L_o=L_o, G_o=G_o)) * 50
        th = th + eta * w
        M += eta * max(dmu, 0.0)
        J = float(g.success_rate(g.loglinear_probs(phi, th), r))
        assert J >= g.logodds_lower_bound(J0, M) - 1e-12


def test_logistic_fit_recovers_parameters(rng):
    M = np.linspace(0, 10, 200)
    acc = np.clip(expit(0.7 * M - 1.5) + 0.01 * rng.normal(size=M.size), 0, 1)
    fit = g.fit_logistic_accuracy(M, acc)
    assert abs(fit.slope - 0.7) < 5 * fit.slope_stderr + 0.01
    assert abs(fit.intercept + 1.5) < 5 * fit.intercept_stderr + 0.02
    assert fit.r2 > 0.99 and fit.n == 200
    np.testing.assert_allclose(fit.predict(0.0), expit(fit.intercept))


def test_logistic_fit_detects_no_relation(rng):
    M = rng.uniform(0, 10, 300)
    acc = rng.uniform(0.2, 0.8, 300)
    fit = g.fit_logistic_accuracy(M, acc)
    assert fit.r2 < 0.05


def test_gap_cosine_zero_vectors():
    assert g.gap_cosine(np.zeros(3), np.ones(3)) == 0.0
    np.testing.assert_allclose(g.gap_cosine([1.0, 0], [2.0, 0]), 1.0)
    assert logit(0.5) == 0.0
