"""The Gradient Gap identities (docs/theory.md §2), each checked against an independent route."""

import numpy as np
from hypothesis import given, strategies as st

import gapdyn as g
from tests.strategies import loglinear_policies, tabular_policies


def fd_gradient(f, x, h=1e-6):
    """Central finite differences of a scalar function."""
    grad = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = h
        grad[i] = (f(x + e) - f(x - e)) / (2 * h)
    return grad


@given(tabular_policies(max_k=60))
def test_gap_is_gradient_of_logodds_tabular(policy):
    z, r = policy
    gap = g.gradient_gap(g.softmax(z), r, g.softmax_scores(z))
    fd = fd_gradient(lambda x: float(g.log_odds_from_logits(x, r)), z)
    np.testing.assert_allclose(gap, fd, atol=1e-7, rtol=1e-5)


@given(loglinear_policies())
def test_gap_is_gradient_of_logodds_loglinear(policy):
    phi, th, r = policy
    p, s = g.loglinear_probs(phi, th), g.loglinear_scores(phi, th)
    fd = fd_gradient(g.loglinear_logodds_fn(phi, r), th)
    np.testing.assert_allclose(g.gradient_gap(p, r, s), fd, atol=1e-7, rtol=1e-5)


@given(loglinear_policies())
def test_conditional_scores_balance(policy):
    """E_pi[s] = 0  =>  J g+ + (1 - J) g- = 0."""
    phi, th, r = policy
    p, s = g.loglinear_probs(phi, th), g.loglinear_scores(phi, th)
    gp, gm = g.conditional_scores(p, r, s)
    J = g.success_rate(p, r)
    np.testing.assert_allclose(J * gp + g.failure_rate(p, r) * gm, 0.0, atol=1e-10)


@given(loglinear_policies())
def test_success_gradient_is_J_one_minus_J_gap(policy):
    phi, th, r = policy
    p, s = g.loglinear_probs(phi, th), g.loglinear_scores(phi, th)
    J = g.success_rate(p, r)
    fd = fd_gradient(lambda t: float(g.success_rate(g.loglinear_probs(phi, t), r)), th)
    np.testing.assert_allclose(g.success_gradient(p, r, s), fd, atol=1e-8)
    np.testing.assert_allclose(g.success_gradient(p, r, s), J * (1 - J) * g.gradient_gap(p, r, s), atol=1e-12)


@given(loglinear_policies(max_k=80, max_d=6))
def test_hessian_is_finite_difference_of_gap(policy):
    phi, th, r = policy

    def gap_at(t):
        return g.gradient_gap(g.loglinear_probs(phi, t), r, g.loglinear_scores(phi, t))

    h = 1e-6
    fd = np.stack([(gap_at(th + h * e) - gap_at(th - h * e)) / (2 * h) for e in np.eye(th.size)], axis=1)
    H = g.logodds_hessian(g.loglinear_probs(phi, th), r, g.loglinear_scores(phi, th))
    np.testing.assert_allclose(H, fd, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(H, H.T, atol=1e-12)


@given(tabular_policies(max_k=40))
def test_tabular_hessian_matches_fd(policy):
    z, r = policy
    h = 1e-6

    def gap_at(x):
        return g.gradient_gap_from_logits(x, r)

    fd = np.stack([(gap_at(z + h * e) - gap_at(z - h * e)) / (2 * h) for e in np.eye(z.size)], axis=1)
    H = g.logodds_hessian(g.softmax(z), r, g.softmax_scores(z))
    np.testing.assert_allclose(H, fd, atol=1e-6)


@given(loglinear_policies())
def test_logits_route_equals_probability_route(policy):
    phi, th, r = policy
    p, s = g.loglinear_probs(phi, th), g.loglinear_scores(phi, th)
    np.testing.assert_allclose(g.gradient_gap_from_logits(phi @ th, r, phi), g.gradient_gap(p, r, s), atol=1e-10)
    np.testing.assert_allclose(g.log_odds_from_logits(phi @ th, r), g.log_odds(p, r), atol=1e-9)


def test_vectorised_over_contexts_equals_loop(rng):
    phi = rng.normal(size=(5, 30, 4))
    th = rng.normal(size=(5, 4))
    r = (rng.random((5, 30)) < 0.3).astype(float)
    r[:, 0], r[:, 1] = 1.0, 0.0
    p, s = g.loglinear_probs(phi, th), g.loglinear_scores(phi, th)
    batched = g.gradient_gap(p, r, s)
    for c in range(5):
        np.testing.assert_allclose(batched[c], g.gradient_gap(p[c], r[c], s[c]), atol=1e-14)


@given(st.floats(-1e3, 1e3), st.integers(2, 200))
def test_extreme_logits_stay_finite(big, K):
    z = np.zeros(K)
    z[0] = big
    r = np.zeros(K)
    r[0] = 1.0
    assert np.isfinite(g.log_odds_from_logits(z, r))
    gap = g.gradient_gap_from_logits(z, r)
    assert np.all(np.isfinite(gap))
    phi = np.eye(K)
    assert np.all(np.isfinite(g.gradient_gap_from_logits(z, r, phi)))


def test_J_within_1e12_of_bounds_is_finite_and_accurate():
    for eps in (1e-12, 1e-13):
        p = np.array([1 - eps, eps / 2, eps / 2])
        r = np.array([1.0, 0.0, 0.0])
        s = g.softmax_scores(np.log(p))
        assert np.isclose(g.log_odds(p, r), np.log((1 - eps) / eps), rtol=1e-6)
        assert np.all(np.isfinite(g.gradient_gap(p, r, s)))
        p2 = p[::-1].copy()
        assert np.isclose(g.log_odds(p2, 1 - r[::-1]), np.log(eps / (1 - eps)), rtol=1e-6)


@given(loglinear_policies(max_k=60, max_d=5))
def test_hessian_from_logits_equals_probability_route(policy):
    phi, th, r = policy
    p, s = g.loglinear_probs(phi, th), g.loglinear_scores(phi, th)
    np.testing.assert_allclose(g.logodds_hessian_from_logits(phi @ th, r, phi), g.logodds_hessian(p, r, s), atol=1e-10)
    z = phi[:, 0] * 3
    np.testing.assert_allclose(
        g.logodds_hessian_from_logits(z, r), g.logodds_hessian(g.softmax(z), r, g.softmax_scores(z)), atol=1e-10
    )


def test_hessian_from_logits_finite_where_J_rounds_to_one():
    z = np.array([800.0, 0.0, -5.0, 1.0])
    r = np.array([1.0, 0.0, 0.0, 1.0])
    assert g.failure_rate(g.softmax(z), r) == 0.0  # the probability route would refuse
    H = g.logodds_hessian_from_logits(z, r)
    assert np.all(np.isfinite(H)) and np.abs(H).max() > 0
