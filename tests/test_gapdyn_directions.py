"""Update directions: Monte Carlo vs closed form, registry semantics, numpy vs torch advantages."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import gapdyn as g
from tests.strategies import loglinear_policies, method_names

N_GROUPS = 20_000


@settings(max_examples=25)
@given(loglinear_policies(max_k=50, max_d=5), method_names, st.integers(2, 10), st.integers(0, 2**31))
def test_monte_carlo_mean_matches_expected_direction(policy, method, G, seed):
    """CLT tolerance: |mean - E[w]| <= 5 standard errors per coordinate (+1e-12 floor)."""
    phi, th, r = policy
    p, s = g.loglinear_probs(phi, th), g.loglinear_scores(phi, th)
    P = np.broadcast_to(p, (N_GROUPS,) + p.shape)
    S = np.broadcast_to(s, (N_GROUPS,) + s.shape)
    R = np.broadcast_to(r, P.shape)
    w = g.sampled_direction(method, P, R, S, group_size=G, rng=np.random.default_rng(seed))
    se = w.std(axis=0, ddof=1) / np.sqrt(N_GROUPS)
    expected = g.expected_direction(method, p, r, s, group_size=G)
    assert np.all(np.abs(w.mean(axis=0) - expected) <= 5 * se + 1e-12)


@pytest.mark.parametrize("opts", [{"std": "population"}, {"std": "bessel"}, {"std": "bessel", "eps": 0.05}])
def test_grpo_options_monte_carlo(opts, rng):
    phi = rng.normal(size=(40, 4))
    th = 0.4 * rng.normal(size=4)
    r = (np.arange(40) < 12).astype(float)
    p, s = g.loglinear_probs(phi, th), g.loglinear_scores(phi, th)
    n = 40_000
    w = g.sampled_direction(
        "grpo", np.broadcast_to(p, (n, 40)), np.broadcast_to(r, (n, 40)), np.broadcast_to(s, (n, 40, 4)),
        group_size=8, rng=rng, **opts,
    )
    se = w.std(axis=0, ddof=1) / np.sqrt(n)
    assert np.all(np.abs(w.mean(0) - g.expected_direction("grpo", p, r, s, group_size=8, **opts)) <= 5 * se)


@pytest.mark.parametrize("G", [2, 3, 5, 8])
@pytest.mark.parametrize("method", g.METHOD_NAMES)
def test_expected_scalar_by_enumerating_reward_patterns(method, G):
    """E[(1/G) sum_i A_i s_i] projected on the Gap, enumerating all 2^G reward patterns.

    Given the rewards, E[s_i] is g+ or g-; with g- = -J/(1-J) g+ and g+ = (1-J) gap, a pattern's
    contribution is (1/G) sum_i A_i [r_i (1-J) - (1 - r_i) J] along the Gap.
    """
    for J in (0.03, 0.3, 0.5, 0.81):
        total = 0.0
        for pattern in itertools.product([0.0, 1.0], repeat=G):
            rr = np.array(pattern)
            prob = np.prod(np.where(rr == 1, J, 1 - J))
            A = g.group_advantages(method, rr)
            total += prob * np.mean(A * np.where(rr == 1, 1 - J, -J))
        np.testing.assert_allclose(g.expected_scalar(method, J, G), total, rtol=1e-10, atol=1e-14)


def test_c_G_limits():
    J = np.linspace(0.05, 0.95, 19)
    np.testing.assert_allclose(g.c_G(J, 4000), np.sqrt(J * (1 - J)), rtol=2e-3)
    np.testing.assert_allclose(g.c_G(J, 8, std="bessel"), np.sqrt(7 / 8) * g.c_G(J, 8), rtol=1e-12)


def test_advantages_numpy_equal_torch():
    torch = pytest.importorskip("torch", reason="torch is in the [llm] extra")
    rng = np.random.default_rng(0)
    r = (rng.random((6, 8)) < 0.4).astype(float)
    r[0] = 1.0  # an all-equal group
    for method in g.METHOD_NAMES:
        a_np = g.group_advantages(method, r)
        a_t = g.group_advantages(method, torch.tensor(r))
        assert isinstance(a_t, torch.Tensor)
        np.testing.assert_allclose(a_t.numpy(), a_np, atol=1e-12)


def test_advantages_against_hand_loop():
    r = np.array([1.0, 0.0, 0.0, 1.0, 1.0])
    m, G = r.sum(), r.size
    mean = m / G
    np.testing.assert_allclose(g.group_advantages("rloo", r), [ri - (m - ri) / (G - 1) for ri in r])
    np.testing.assert_allclose(g.group_advantages("dr_grpo", r), r - mean)
    np.testing.assert_allclose(g.group_advantages("grpo", r), (r - mean) / np.std(r))
    np.testing.assert_allclose(g.group_advantages("grpo", r, std="bessel", eps=1e-4), (r - mean) / (np.std(r, ddof=1) + 1e-4))
    np.testing.assert_allclose(g.group_advantages("wapo", r), np.maximum(r - mean, 0))
    np.testing.assert_allclose(g.group_advantages("nsr", r), r - 1)
    np.testing.assert_allclose(g.group_advantages("w_reinforce", r, lam=0.3), np.where(r == 1, 0.3, -1.0))
    for m_ in ("grpo", "dr_grpo", "wapo", "rloo"):
        assert np.all(g.group_advantages(m_, np.ones(4)) == 0)
        assert np.all(g.group_advantages(m_, np.zeros(4)) == 0)


def test_every_method_points_along_the_gap_in_expectation(rng):
    phi = rng.normal(size=(30, 5))
    th = rng.normal(size=5) * 0.3
    r = (np.arange(30) < 9).astype(float)
    p, s = g.loglinear_probs(phi, th), g.loglinear_scores(phi, th)
    gap = g.gradient_gap(p, r, s)
    for m in g.METHOD_NAMES:
        w = g.expected_direction(m, p, r, s, group_size=8)
        np.testing.assert_allclose(g.gap_cosine(w, gap), 1.0, atol=1e-12)
