"""Step-size thresholds and the first-order step model (docs/theory.md §4-6)."""

import numpy as np
import pytest
from hypothesis import assume, given, settings

import gapdyn as g
from tests.strategies import loglinear_policies


@given(loglinear_policies(max_k=100))
def test_realised_change_is_eta_dmu_plus_O_eta2(policy):
    """Phi(theta + eta w) - Phi(theta) = eta dmu + O(eta^2): the residual shrinks 4x when eta halves."""
    phi, th, r = policy
    p, s = g.loglinear_probs(phi, th), g.loglinear_scores(phi, th)
    gap = g.gradient_gap(p, r, s)
    w = g.expected_direction("grpo", p, r, s, group_size=8)
    assume(np.linalg.norm(w) > 1e-6)
    w = w / np.linalg.norm(w)
    dmu = g.gap_alignment(w, gap)
    f = g.loglinear_logodds_fn(phi, r)
    H = g.logodds_hessian(p, r, s)
    quad = 0.5 * w @ H @ w

    def third_order_error(eta):
        return abs(f(th + eta * w) - f(th) - eta * dmu - quad * eta**2)

    def first_order_error(eta):
        return abs(f(th + eta * w) - f(th) - eta * dmu)

    # the residual after eta * dmu is O(eta^2): it shrinks ~4x per halving of eta
    e1, e2 = first_order_error(1e-3), first_order_error(2e-3)
    assert e1 <= e2 / 3 + 1e-13
    # ... and what is left after the quadratic term shrinks like eta^3 (8x per halving, 2x slack)
    assert third_order_error(1e-3) <= third_order_error(2e-3) / 4 + 1e-13


def _instance_with_threshold():
    """A 100-arm log-linear bandit where unit gap steps of a large eta collapse (docs/theory.md §5)."""
    rng = np.random.default_rng(3)
    phi = rng.normal(size=(100, 16))
    r = np.zeros(100)
    r[:10] = 1.0
    th = np.zeros(16)
    return phi, th, r


def test_phi_rises_below_and_falls_above_sharp_threshold():
    phi, th, r = _instance_with_threshold()
    p, s = g.loglinear_probs(phi, th), g.loglinear_scores(phi, th)
    gap = g.gradient_gap(p, r, s)
    w = gap / np.linalg.norm(gap)
    f = g.loglinear_logodds_fn(phi, r)
    eta_star = g.sharp_step_threshold(f, th, w)
    assert 0 < eta_star < np.inf
    assert f(th + 0.999 * eta_star * w) > f(th)
    assert f(th + 1.001 * eta_star * w) <= f(th)
    # below the threshold Phi rises all the way (scan)
    assert all(f(th + e * w) > f(th) for e in np.geomspace(1e-6, 0.999 * eta_star, 200))


@settings(max_examples=30)
@given(loglinear_policies(min_k=3, max_k=100, max_d=6))
def test_sharp_threshold_is_a_crossing(policy):
    phi, th, r = policy
    p, s = g.loglinear_probs(phi, th), g.loglinear_scores(phi, th)
    gap = g.gradient_gap(p, r, s)
    assume(np.linalg.norm(gap) > 1e-4)
    w = gap / np.linalg.norm(gap)
    f = g.loglinear_logodds_fn(phi, r)
    eta = g.sharp_step_threshold(f, th, w, eta_max=1e4)
    if np.isfinite(eta):
        assert f(th + eta * (1 - 1e-6) * w) > f(th)
        assert f(th + eta * (1 + 1e-6) * w) <= f(th)
    else:
        assert f(th + 1e4 * w) > f(th)


def test_sharp_threshold_zero_for_descent_direction():
    phi, th, r = _instance_with_threshold()
    gap = g.gradient_gap_from_logits(phi @ th, r, phi)
    assert g.sharp_step_threshold(g.loglinear_logodds_fn(phi, r), th, -gap) == 0.0


def test_local_threshold_is_the_root_of_the_quadratic_model(rng):
    for _ in range(20):
        P = 4
        A = rng.normal(size=(P, P))
        H = -(A @ A.T) - 0.1 * np.eye(P)
        w = rng.normal(size=P)
        dmu = abs(rng.normal())
        eta = g.local_step_threshold(dmu, w, H)
        roots = np.roots([0.5 * w @ H @ w, dmu, 0.0])
        assert np.isclose(eta, roots.max())
    assert g.local_step_threshold(1.0, np.ones(2), np.eye(2)) == np.inf
    assert g.local_step_threshold(-1.0, np.ones(2), -np.eye(2)) == 0.0


def test_theorem1_bound_is_tiny_compared_with_sharp_threshold():
    phi, th, r = _instance_with_threshold()
    p, s = g.loglinear_probs(phi, th), g.loglinear_scores(phi, th)
    gap = g.gradient_gap(p, r, s)
    w = gap / np.linalg.norm(gap)
    G_o, L_o = g.loglinear_bound_constants(phi)
    bound = g.theorem1_step_bound(g.gap_alignment(w, gap), L_o=L_o, G_o=G_o)
    sharp = g.sharp_step_threshold(g.loglinear_logodds_fn(phi, r), th, w)
    assert 0 < bound < sharp
    # one step within the bound never lowers Phi here
    f = g.loglinear_logodds_fn(phi, r)
    assert f(th + bound * w) > f(th)


def test_predicted_critical_step_scaling():
    T = np.array([1.0, 2, 4, 8, 16])
    eta = g.predicted_critical_step(1.0, T, 0.2)
    fit = g.loglog_slope(T, eta)
    assert np.isclose(fit.slope, -1.0)
    assert np.allclose(g.predicted_critical_step(1.0, T, 0.2, length_normalized=True), 1.0)
    assert np.isclose(g.predicted_critical_step(1.0, 1.0, 0.6, J_ref=0.2), 0.5)


def test_loglog_slope_recovers_power_law(rng):
    x = np.geomspace(1, 64, 7)
    y = 3.0 * x**-0.9 * np.exp(0.01 * rng.normal(size=7))
    fit = g.loglog_slope(x, y)
    assert abs(fit.slope + 0.9) < 4 * fit.slope_stderr + 1e-3
    with pytest.raises(ValueError, match="x and y"):
        g.loglog_slope([1, 2, 3], [1, -1, 2])
