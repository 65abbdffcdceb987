"""Tests of bandits.sequence (token-level sequence bandits, their simulator) and bandits.partial."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gapdyn
from bandits.partial import PartialSharingBandit, position_features
from bandits.sequence import (
    RULES,
    SequenceDynamics,
    SharedSequenceBandit,
    TabularSequenceBandit,
    place_for_success_rate,
    rule_reward,
    sequence_sampled_direction,
    simulate,
)

# ---------------------------------------------------------------------------------------------
# closed forms vs brute-force enumeration (an independent route: explicit sequence probabilities
# and scores fed to gapdyn.gradient_gap)


def _enumerate_shared(env: SharedSequenceBandit, theta):
    """All responses with their probability, reward and score s(o) = sum_t phi(o_t) - |o| mu."""
    logp = env.token_logprobs(theta)
    p, phi = np.exp(logp), env.features
    mu = p @ phi
    content = [v for v in range(env.V) if v != env.end_token]
    seqs = []
    if env.end_token is None:
        seqs = [(s, False) for s in itertools.product(range(env.V), repeat=env.T)]
    else:
        for m in range(env.T + 1):
            seqs += [(s, m < env.T) for s in itertools.product(content, repeat=m)]
    P, R, S = [], [], []
    for s, ended in seqs:
        toks = list(s) + ([env.end_token] if ended else [])
        P.append(np.prod(p[toks]) if toks else 1.0)
        n = sum(t in env.correct for t in s)
        R.append(float(rule_reward(n, len(s), env.rule)))
        S.append(phi[toks].sum(0) - len(toks) * mu)
    return np.array(P), np.array(R), np.array(S)


@pytest.mark.parametrize("rule", ["AC", "MAJ"])
@pytest.mark.parametrize("V,T,variable", [(3, 1, False), (4, 3, False), (3, 4, False), (4, 3, True), (5, 2, True)])
def test_shared_closed_form_matches_enumeration(rule, V, T, variable, rng):
    env = SharedSequenceBandit.random(V=V, d=3, T=T, rule=rule, seed=int(rng.integers(1000)), variable_length=variable)
    theta = rng.standard_normal(3)
    P, R, S = _enumerate_shared(env, theta)
    assert P.sum() == pytest.approx(1.0, abs=1e-12)
    ex = env.exact(theta)
    assert ex["J"] == pytest.approx(float(gapdyn.success_rate(P, R)), abs=1e-12)
    g_plus, g_minus = gapdyn.conditional_scores(P, R, S)
    np.testing.assert_allclose(ex["g_plus"], g_plus, atol=1e-11)
    np.testing.assert_allclose(ex["g_minus"], g_minus, atol=1e-11)
    np.testing.assert_allclose(ex["gap"], gapdyn.gradient_gap(P, R, S), atol=1e-11)
    assert env.success_rate(theta) == pytest.approx(ex["J"], abs=1e-13)
    lengths = [len(s) + e for s, e in _seqs_and_ends(env)]
    assert ex["mean_length"] == pytest.approx(float(P @ np.array(lengths)), abs=1e-12)


def _seqs_and_ends(env):
    content = [v for v in range(env.V) if v != env.end_token]
    if env.end_token is None:
        return [(s, False) for s in itertools.product(range(env.V), repeat=env.T)]
    out = []
    for m in range(env.T + 1):
        out += [(s, m < env.T) for s in itertools.product(content, repeat=m)]
    return out


@pytest.mark.parametrize("rule", ["AC", "MAJ"])
def test_binomial_form_and_gap_is_grad_phi(rule, rng):
    """Fixed T: Gap = (E[N | r=1] - E[N | r=0]) (mu_c - mu_w), and Gap = grad Phi (finite differences)."""
    T = 7
    env = SharedSequenceBandit.random(V=6, d=4, T=T, rule=rule, seed=3)
    theta = 0.5 * rng.standard_normal(4)
    p = np.exp(env.token_logprobs(theta))
    q = p[0]
    mu_c, mu_w = env.features[0], (p[1:] @ env.features[1:]) / p[1:].sum()
    N = np.arange(T + 1)
    from scipy.stats import binom

    pmf = binom.pmf(N, T, q)
    r = rule_reward(N, T, rule)
    gap = ((pmf * r) @ N / (pmf @ r) - (pmf * (1 - r)) @ N / (pmf @ (1 - r))) * (mu_c - mu_w)
    ex = env.exact(theta)
    np.testing.assert_allclose(ex["gap"], gap, rtol=1e-10, atol=1e-12)
    h = 1e-6
    fd = np.array([(env.exact(theta + h * e)["Phi"] - env.exact(theta - h * e)["Phi"]) / (2 * h) for e in np.eye(4)])
    np.testing.assert_allclose(ex["gap"], fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("variable", [False, True])
def test_shared_sampling_matches_closed_form_monte_carlo(variable):
    env = SharedSequenceBandit.random(V=6, d=3, T=5, rule="MAJ", seed=11, variable_length=variable)
    theta = np.array([0.4, -0.3, 0.2])
    ex = env.exact(theta)
    n = 200_000
    smp = env.sample(np.broadcast_to(theta, (n, 3)), 1, np.random.default_rng(5))
    r, s, L = smp.reward[:, 0], smp.score[:, 0], smp.length[:, 0]
    se_J = np.sqrt(ex["J"] * (1 - ex["J"]) / n)
    assert abs(r.mean() - ex["J"]) < 5 * se_J
    assert abs(L.mean() - ex["mean_length"]) < 5 * L.std() / np.sqrt(n) + 1e-12
    for mask, g in ((r == 1, ex["g_plus"]), (r == 0, ex["g_minus"])):
        est = s[mask].mean(0)
        se = s[mask].std(0) / np.sqrt(mask.sum())
        assert np.all(np.abs(est - g) < 5 * se + 1e-12), (est, g, se)
    # counts are consistent with the summary fields
    assert np.all(smp.counts.sum(-1) == smp.length)
    assert np.all(smp.n <= smp.m) and np.all(smp.m <= env.T)


def test_grpo_direction_expectation_is_cG_times_gap():
    """E[w] of sampled GRPO groups = c_G(J) Gap (docs/equations.md §2): sampling + gapdyn advantages."""
    env = SharedSequenceBandit.random(V=6, d=3, T=4, rule="MAJ", seed=2)
    theta = np.array([0.3, 0.1, -0.2])
    B = 60_000
    w = sequence_sampled_direction("grpo", env, np.broadcast_to(theta, (B, 3)), group_size=8,
                                   rng=np.random.default_rng(1))
    ex = env.exact(theta)
    expected = gapdyn.expected_scalar("grpo", ex["J"], 8) * ex["gap"]
    se = w.std(0) / np.sqrt(B)
    assert np.all(np.abs(w.mean(0) - expected) < 5 * se)


@pytest.mark.parametrize("rule", ["AC", "MAJ"])
@pytest.mark.parametrize("V,T", [(2, 1), (3, 3), (3, 4), (2, 6)])
def test_tabular_closed_form_matches_enumeration(rule, V, T, rng):
    env = TabularSequenceBandit(V=V, T=T, rule=rule)
    z = rng.standard_normal((T, V))
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    seqs = list(itertools.product(range(V), repeat=T))
    P = np.array([np.prod([p[t, s[t]] for t in range(T)]) for s in seqs])
    S = np.array([(np.eye(V)[list(s)] - p).ravel() for s in seqs])
    R = np.array([float(rule_reward(sum(t == env.correct for t in s), T, rule)) for s in seqs])
    ex = env.exact(z)
    assert ex["J"] == pytest.approx(P @ R, abs=1e-12)
    assert ex["Jbar"] == pytest.approx(P @ (1 - R), abs=1e-12)
    assert env.success_rate(z) == pytest.approx(P @ R, abs=1e-12)
    np.testing.assert_allclose(ex["gap"].ravel(), gapdyn.gradient_gap(P, R, S), atol=1e-11)
    # Monte Carlo of the sampler against the same enumeration
    smp = env.sample(np.broadcast_to(z, (40_000, T, V)), 1, np.random.default_rng(0))
    assert abs(smp.reward.mean() - ex["J"]) < 5 * np.sqrt(ex["J"] * (1 - ex["J"]) / 40_000) + 1e-9


def test_vectorised_exact_equals_loop(rng):
    env = SharedSequenceBandit.random(V=7, d=3, T=6, rule="MAJ", seed=4, variable_length=True)
    th = rng.standard_normal((3, 2, 3))
    ex = env.exact(th)
    for i, j in itertools.product(range(3), range(2)):
        one = env.exact(th[i, j])
        assert ex["J"][i, j] == pytest.approx(one["J"], abs=1e-14)
        np.testing.assert_allclose(ex["gap"][i, j], one["gap"], atol=1e-13)
    tab = TabularSequenceBandit(V=4, T=5, rule="AC")
    z = rng.standard_normal((3, 5, 4))
    ex = tab.exact(z)
    for i in range(3):
        np.testing.assert_allclose(ex["gap"][i], tab.exact(z[i])["gap"], atol=1e-14)


def test_extreme_parameters_stay_finite():
    env = SharedSequenceBandit.random(V=5, d=2, T=32, rule="MAJ", seed=0, variable_length=True)
    for th in (np.array([200.0, -150.0]), np.array([-300.0, 80.0])):
        ex = env.exact(th)
        assert np.isfinite(ex["Phi"]) or np.isinf(ex["Phi"])
        assert np.all(np.isfinite(ex["gap"])) and 0 <= ex["J"] <= 1
    # the end token holding all the mass: sampling still works (empty responses, reward 0)
    th = 1000.0 * env.features[env.end_token]
    smp = env.sample(np.stack([th, np.zeros(2)]), 4, np.random.default_rng(0))
    assert np.all(smp.m[0] == 0) and np.all(smp.reward[0] == 0) and np.all(np.isfinite(smp.score))


# ---------------------------------------------------------------------------------------------
# the partial-sharing token model (bandits.partial)


def _enumerate_partial(env: PartialSharingBandit, theta):
    """All T-token responses with probability, reward and score sum_t phi_t(o_t) - mu_t (a loop, no DP)."""
    p = np.exp(env.token_logprobs(theta))
    f = env.features
    mu = np.einsum("tv,tvd->td", p, f)
    P, R, S = [], [], []
    for s in itertools.product(range(env.V), repeat=env.T):
        P.append(np.prod([p[t, v] for t, v in enumerate(s)]))
        n = sum(v == env.correct for v in s)
        R.append(float(rule_reward(n, env.T, env.rule)))
        S.append(sum(f[t, v] - mu[t] for t, v in enumerate(s)))
    return np.array(P), np.array(R), np.array(S)


@pytest.mark.parametrize("rule", ["AC", "MAJ"])
@pytest.mark.parametrize("T,rho", [(1, 0.5), (2, 0.0), (3, 0.25), (4, 0.75), (3, 1.0)])
def test_partial_closed_form_matches_enumeration(rule, T, rho, rng):
    env = PartialSharingBandit.random(T=T, rho=rho, V=3, d=2, rule=rule, seed=int(rng.integers(1000)))
    theta = rng.standard_normal(2)
    P, R, S = _enumerate_partial(env, theta)
    ex = env.exact(theta)
    assert ex["J"] == pytest.approx(float(P @ R), abs=1e-13)
    assert ex["Jbar"] == pytest.approx(float(P @ (1 - R)), abs=1e-13)
    np.testing.assert_allclose(ex["gap"], gapdyn.gradient_gap(P, R, S), atol=1e-11)
    assert env.success_rate(theta) == pytest.approx(ex["J"], abs=1e-14)
    h = 1e-6
    fd = [(env.log_odds(theta + h * e) - env.log_odds(theta - h * e)) / (2 * h) for e in np.eye(2)]
    np.testing.assert_allclose(ex["gap"], fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("rule", ["AC", "MAJ"])
def test_partial_at_full_sharing_is_the_shared_model(rule, rng):
    """rho = 1: every position has phi, so the model is SharedSequenceBandit (binomial state sums)."""
    phi = position_features(4, V=6, d=3, T=5, rho=1.0)
    env = PartialSharingBandit(phi, rule)
    ref = SharedSequenceBandit(phi[0], (0,), rule, 5)
    th = rng.standard_normal((4, 3))
    a, b = env.exact(th), ref.exact(th)
    for k in ("J", "Phi", "gap"):
        np.testing.assert_allclose(a[k], b[k], rtol=1e-10, atol=1e-12, err_msg=k)


def test_partial_features_are_nested_in_T():
    a = position_features(3, V=5, d=2, T=2, rho=0.3)
    b = position_features(3, V=5, d=2, T=6, rho=0.3)
    np.testing.assert_array_equal(a, b[:2])


def test_partial_sampling_matches_closed_form_monte_carlo():
    env = PartialSharingBandit.random(T=4, rho=0.5, V=5, d=3, rule="MAJ", seed=2)
    theta = np.array([0.3, -0.2, 0.4])
    ex = env.exact(theta)
    n = 100_000
    smp = env.sample(np.broadcast_to(theta, (n, 3)), 1, np.random.default_rng(5))
    r, s = smp.reward[:, 0], smp.score[:, 0]
    assert abs(r.mean() - ex["J"]) < 5 * np.sqrt(ex["J"] * (1 - ex["J"]) / n)
    gap_mc = s[r == 1].mean(0) - s[r == 0].mean(0)
    se = np.sqrt(s[r == 1].var(0) / (r == 1).sum() + s[r == 0].var(0) / (r == 0).sum())
    assert np.all(np.abs(gap_mc - ex["gap"]) < 5 * se)


def test_partial_gap_finite_near_J_one():
    """q_t -> 1: the Gap uses the wrong tokens' own mean (no 1 - q cancellation)."""
    env = PartialSharingBandit.random(T=3, rho=1.0, V=4, d=2, seed=0)
    u = env.features[0, 0] - env.features[0, 1:].mean(0)
    for scale in (10.0, 100.0, 1000.0):
        ex = env.exact(scale * u)
        assert np.all(np.isfinite(ex["gap"])) and np.isfinite(ex["Phi"])


# ---------------------------------------------------------------------------------------------
# dynamics: simulate(env, SequenceDynamics, eta=, seed=, theta0=) -> SequenceTrajectory

ENVS = {
    "shared": lambda: (SharedSequenceBandit.random(V=6, d=3, T=4, rule="MAJ", seed=1), np.array([0.2, 0.0, 0.1])),
    "variable": lambda: (SharedSequenceBandit.random(V=6, d=3, T=4, rule="MAJ", seed=1, variable_length=True),
                         np.array([0.2, 0.0, 0.1])),
    "tabular": lambda: (TabularSequenceBandit(V=4, T=3, rule="MAJ"), 0.3 * np.arange(12.0).reshape(3, 4) % 1),
    "partial": lambda: (PartialSharingBandit.random(T=4, rho=0.5, V=6, d=3, seed=1), np.array([0.2, 0.0, 0.1])),
}


@pytest.mark.parametrize("name", sorted(ENVS))
@pytest.mark.parametrize("method", ["grpo", "reinforce", "gap"])
def test_exact_step_is_scalar_times_gap(name, method):
    """One exact step equals theta + eta scalar(J, G) Gap computed by hand (gapdyn.expected_scalar)."""
    env, th0 = ENVS[name]()
    tr = simulate(env, SequenceDynamics(method=method, steps=1), eta=[0.3, 2.0], theta0=th0)
    ex = env.exact(th0)
    c = 1.0 if method == "gap" else float(gapdyn.expected_scalar(method, ex["J"], 8))
    for i, eta in enumerate((0.3, 2.0)):
        np.testing.assert_allclose(tr.theta_final[i], th0 + eta * c * ex["gap"], rtol=1e-12, atol=1e-14)
        assert tr.J_final[i] == pytest.approx(float(env.success_rate(th0 + eta * c * ex["gap"])), abs=1e-13)


@pytest.mark.parametrize("name", sorted(ENVS))
@pytest.mark.parametrize("mode", ["exact", "sampled"])
def test_records_match_a_replay_in_segments(name, mode):
    """J recorded at step k equals J after replaying k steps (chained calls, same seed for exact runs);
    J_min and collapse_step agree with the records."""
    env, th0 = ENVS[name]()
    dyn = SequenceDynamics(method="grpo" if mode == "sampled" else "gap", gradient=mode, steps=6, group_size=4)
    tr = simulate(env, dyn, eta=[0.5, 30.0], seed=3, theta0=th0)
    path = np.concatenate([tr.J, tr.J_final[:, None]], axis=1)
    np.testing.assert_array_equal(tr.J_min, path.min(1))
    first = [int(np.argmax(row < gapdyn.COLLAPSE_J)) if (row < gapdyn.COLLAPSE_J).any() else -1 for row in path]
    np.testing.assert_array_equal(tr.collapse_step, first)
    if mode == "exact":
        th = th0
        for k in range(1, 6):
            th = simulate(env, SequenceDynamics(method="gap", steps=1), eta=[30.0], theta0=th).theta_final[0]
            assert tr.J[1, k] == pytest.approx(float(env.success_rate(th)), abs=1e-12)


@pytest.mark.parametrize("name", sorted(ENVS))
def test_equal_seeds_share_the_stream_across_etas(name):
    """A batch of etas with one seed equals one call per eta (common random numbers); other seeds differ."""
    env, th0 = ENVS[name]()
    dyn = SequenceDynamics(gradient="sampled", steps=5, group_size=4)
    etas = np.array([0.1, 1.0, 10.0])
    batch = simulate(env, dyn, eta=etas, seed=7, theta0=th0)
    for i, e in enumerate(etas):
        one = simulate(env, dyn, eta=e, seed=7, theta0=th0)
        np.testing.assert_allclose(batch.J[i], one.J[0], rtol=1e-12, atol=1e-15)
    other = simulate(env, dyn, eta=etas, seed=8, theta0=th0)
    assert not np.allclose(other.J, batch.J)


@pytest.mark.parametrize("name", ["shared", "tabular", "partial"])
def test_fixed_T_length_normalisation_is_eta_over_T(name):
    """Fixed length T: w/|o| at eta is w at eta/T (same stream; exact mode too)."""
    env, th0 = ENVS[name]()
    T = env.T
    etas = np.geomspace(0.5, 50, 4)
    for mode in ("exact", "sampled"):
        a = simulate(env, SequenceDynamics(gradient=mode, steps=8, length_normalized=True), eta=etas, seed=3, theta0=th0)
        b = simulate(env, SequenceDynamics(gradient=mode, steps=8), eta=etas / T, seed=3, theta0=th0)
        np.testing.assert_allclose(a.J, b.J, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["shared", "tabular"])
def test_a_run_that_dips_keeps_running_and_recovers(name):
    """No run is stopped at its first dip: started at J0 = 1e-5 < gapdyn.COLLAPSE_J (collapse_step 0), log-odds
    ascent raises J above the level again; the run equals its replay in two segments (the second from the
    first's theta_final), so every step was taken."""
    assert "freeze_below" not in {f.name for f in dataclasses.fields(SequenceDynamics)}
    env, th0 = ENVS[name]()
    gap = env.gap(th0)
    start = place_for_success_rate(env, gap / np.linalg.norm(gap), 1e-5, base=th0)  # back along the Gap
    full = simulate(env, SequenceDynamics(method="gap", steps=24), eta=1.0, theta0=start)
    assert full.collapse_step[0] == 0 and full.J_min[0] < gapdyn.COLLAPSE_J
    assert full.J_tail_min[0] > 0.5 and full.J_final[0] > 0.5 and not full.collapsed[0]  # a dip, not a collapse
    first = simulate(env, SequenceDynamics(method="gap", steps=10), eta=1.0, theta0=start)
    rest = simulate(env, SequenceDynamics(method="gap", steps=14), eta=1.0, theta0=first.theta_final[0])
    np.testing.assert_array_equal(full.J, np.concatenate([first.J, rest.J], axis=1))
    np.testing.assert_array_equal(full.theta_final, rest.theta_final)


def test_sampled_direction_is_the_simulators_step():
    """sequence_sampled_direction with default_rng(seed) uniforms G x T gives the simulator's first step."""
    env, th0 = ENVS["partial"]()
    tr = simulate(env, SequenceDynamics(gradient="sampled", steps=1, group_size=4), eta=0.7, seed=11, theta0=th0)
    w = sequence_sampled_direction("grpo", env, th0[None], group_size=4, rng=np.random.default_rng(11))
    np.testing.assert_allclose(tr.theta_final[0], th0 + 0.7 * w[0], rtol=1e-12, atol=1e-14)


def test_tabular_exact_ascent_never_lowers_J(rng):
    """Negative control: for position-wise logits, any step along the Gap raises every q_t, hence J."""
    for rule in ("AC", "MAJ"):
        env = TabularSequenceBandit(V=5, T=6, rule=rule)
        z = rng.standard_normal((6, 5))
        J = env.exact(z)["J"]
        for eta in np.geomspace(1e-2, 1e4, 13):
            assert env.exact(z + eta * env.gap(z))["J"] >= J - 1e-12


# ---------------------------------------------------------------------------------------------
# bad input


BAD_INPUT = [
    (lambda: SharedSequenceBandit(np.zeros((1, 2)), (0,), "MAJ", 2), "features"),
        (lambda: SharedSequenceBandit(np.zeros((3, 2)), (5,), "MAJ", 2), "correct"),
        (lambda: SharedSequenceBandit(np.zeros((3, 2)), (0,), "ANY", 2), "rule"),
        (lambda: SharedSequenceBandit(np.zeros((3, 2)), (0,), "MAJ", 0), "T"),
        (lambda: SharedSequenceBandit(np.zeros((3, 2)), (0,), "MAJ", 2, end_token=0), "end_token"),
        (lambda: SharedSequenceBandit(np.zeros((2, 2)), (0,), "MAJ", 2, end_token=1), "wrong"),
        (lambda: SharedSequenceBandit(np.full((3, 2), np.nan), (0,), "MAJ", 2), "features"),
        (lambda: TabularSequenceBandit(V=1, T=2, rule="MAJ"), "V"),
        (lambda: TabularSequenceBandit(V=3, T=2, rule="MAJ", correct=3), "correct"),
        (lambda: SharedSequenceBandit.random(T=2).exact(np.zeros(3)), "theta"),
        (lambda: SharedSequenceBandit.random(T=2).sample(np.zeros(4), 4, np.random.RandomState(0)), "rng"),
        (lambda: SharedSequenceBandit.random(T=2).draw(np.zeros(4), np.zeros((4, 3))), "u"),
        (lambda: TabularSequenceBandit(V=3, T=2, rule="AC").exact(np.zeros((3, 3))), "z"),
        (lambda: PartialSharingBandit(np.zeros((2, 3))), "features"),
        (lambda: PartialSharingBandit.random(T=2, rho=1.5), "rho"),
        (lambda: PartialSharingBandit.random(T=2, rho=0.5, rule="ANY"), "rule"),
        (lambda: PartialSharingBandit.random(T=2, rho=0.5).draw(np.zeros(4), np.zeros((3, 3))), "u"),
        (lambda: SequenceDynamics(method="ppo"), "method"),
        (lambda: SequenceDynamics(method="gap", gradient="sampled"), "gap"),
        (lambda: SequenceDynamics(length_normalized=1), "length_normalized"),
        (lambda: simulate(SharedSequenceBandit.random(T=2), SequenceDynamics(), eta=-1.0), "eta"),
        (lambda: simulate(SharedSequenceBandit.random(T=2), SequenceDynamics(), eta=[1.0, 2.0], seed=[1, 2, 3]),
         "broadcast"),
        (lambda: simulate(SharedSequenceBandit.random(T=2), SequenceDynamics(), eta=1.0, seed=-1), "seed"),
        (lambda: simulate(SharedSequenceBandit.random(T=2), SequenceDynamics(), eta=1.0, theta0=np.zeros(3)), "theta"),
        (lambda: simulate(SharedSequenceBandit.random(T=2), {"method": "grpo"}, eta=1.0), "SequenceDynamics"),
        (lambda: simulate(object(), SequenceDynamics(), eta=1.0), "env"),
        (lambda: simulate(SharedSequenceBandit.random(T=2, variable_length=True),
                          SequenceDynamics(length_normalized=True), eta=1.0), "fixed-length"),
        (lambda: sequence_sampled_direction("ppo", SharedSequenceBandit.random(T=2), np.zeros(4), group_size=4,
                                            rng=np.random.default_rng(0)), "method"),
        (lambda: place_for_success_rate(SharedSequenceBandit.random(T=2), np.zeros(4), 0.3), "reachable"),
        (lambda: place_for_success_rate(SharedSequenceBandit.random(T=2), np.ones(4), 1.5), "J0"),
    ]


def test_bad_input():
    """Each (call, text) row: a ValueError whose message contains the text (one item, every failing row listed)."""
    import re

    from tests.tables import check_table

    def row(make, match):
        with pytest.raises(ValueError) as info:
            make()
        assert re.search(match, str(info.value)), f"ValueError without {match!r}: {info.value}"

    assert check_table(((f"{i}: {m}", (f, m)) for i, (f, m) in enumerate(BAD_INPUT)), row) == 30


def test_success_rate_from_log_space_sums_never_exceeds_one():
    """J = exp(log J) with log J from log-space sums can round to 1 + 2e-16; it is capped at 1 (found by the
    finite-configuration property test: tabular, V = 5, T = 2, MAJ, log-odds ascent at eta = 10)."""
    env = TabularSequenceBandit(V=5, T=2, rule="MAJ")
    p0 = np.random.default_rng(0).normal(size=(2, 2, 5)) * 10.0
    dyn = SequenceDynamics(method="gap", gradient="exact", group_size=2, steps=10)
    out = simulate(env, dyn, eta=np.array([10.0, 1.0]), seed=0, theta0=p0)
    assert np.all(out.J <= 1.0) and np.all(out.J_final <= 1.0) and np.all(out.J_final >= 0.0)
    ex = env.exact(out.theta_final)
    assert np.all(ex["J"] <= 1.0) and np.all(ex["Jbar"] <= 1.0)


# ---------------------------------------------------------------------------------------------
# numba kernels (bandits._sequence_kernels) vs the numpy methods, and the inverse-CDF sampler


def _partial_configs(seed: int, n: int):
    """n random partial-sharing problems (T, V, d, rho, rule) with a batch of parameters each."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        T, V, d = int(rng.integers(1, 13)), int(rng.integers(2, 9)), int(rng.integers(1, 5))
        env = PartialSharingBandit.random(T=T, rho=float(rng.choice([0.0, 0.3, 1.0])), V=V, d=d,
                                          rule=str(rng.choice(["AC", "MAJ"])), seed=int(rng.integers(100)))
        yield env, float(rng.choice([0.3, 2.0, 30.0, 500.0])) * rng.standard_normal((5, d)), rng


def test_partial_kernels_equal_the_numpy_methods():
    """Kernel J, Phi, Gap and tokens equal PartialSharingBandit.exact / log_odds / draw on random problems
    (round-off: 1e-12 relative; the draws token for token, from the same uniforms)."""
    from bandits import _sequence_kernels as K

    for env, th, rng in _partial_configs(0, 40):
        ex, k = env.exact(th), env._k()
        lJ, lJbar, gap = K.partial_exact(env.features, th, env.correct, k)
        np.testing.assert_allclose(lJ - lJbar, ex["Phi"], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.exp(np.minimum(lJ, 0)), ex["J"], rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(gap, ex["gap"], rtol=1e-11, atol=1e-12 * np.abs(ex["gap"]).max())
        lJ2, lJbar2 = K.partial_log_terms(env.features, th, env.correct, k)
        np.testing.assert_array_equal(lJ2 - lJbar2, lJ - lJbar)
        np.testing.assert_allclose(env._kernel_log_odds(th[None]), env.log_odds(th)[None], rtol=1e-12, atol=1e-12)
        u = rng.random((5, 6, env.T))
        u[0, 0] = 0.0  # the edges of the stream
        tok = K.partial_draw(env.features, th, u, env.correct)
        smp = env.draw(th, u)
        counts = (tok[..., None] == np.arange(env.V)).sum(-2)
        np.testing.assert_array_equal(counts, smp.counts)
        np.testing.assert_array_equal((tok == env.correct).sum(-1), smp.n)


def test_advantage_table_is_group_advantages():
    """The sampled kernels' table A[c, r] gives gapdyn.group_advantages of random reward groups (every method)."""
    from bandits.sequence import _advantage_table

    rng = np.random.default_rng(1)
    for method in gapdyn.METHOD_NAMES:
        for G in (2, 5, 8):
            opts = SequenceDynamics(method=method, group_size=G).method_opts
            table = _advantage_table(method, G, opts)
            r = (rng.random((200, G)) < rng.random((200, 1))).astype(float)
            A = gapdyn.group_advantages(method, r, **opts)
            c = r.sum(-1, keepdims=True).astype(int)
            np.testing.assert_allclose(table[c, r.astype(int)], A, rtol=1e-15, atol=1e-15, err_msg=method)


_TRAJ_FIELDS = ("J", "Phi", "J_final", "Phi_final", "J_min", "J_tail_min", "J_tail_max", "theta_final")


def _assert_same_trajectory(a, b, tag):
    """Every field to 1e-12 relative: J fields on the logit scale (J near 0 is known to the relative
    precision of Phi) or to 1e-15 absolute (J near 1 holds 1 - J only to a few ulp of 1), theta relative
    to its largest entry (and at least 1: the scale of the logits); collapse_step and the record steps exactly."""
    from scipy.special import logit

    for f in _TRAJ_FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        close = x == y
        if f.startswith("J"):
            close |= np.abs(x - y) <= 1e-15
            x, y = logit(x), logit(y)
        scale = np.abs(y).max(-1, keepdims=True) if f == "theta_final" else np.abs(y)
        tol = 1e-12 * np.maximum(scale, 1.0)
        with np.errstate(invalid="ignore"):  # equal infinities are caught by ``close``
            err = np.abs(x - y)
        assert np.all(close | (err <= tol)), (tag, f, np.nanmax(np.where(close, 0.0, err / tol)) * 1e-12)
    np.testing.assert_array_equal(a.collapse_step, b.collapse_step)
    np.testing.assert_array_equal(a.steps, b.steps)


@pytest.mark.parametrize("mode", ["exact", "sampled"])
def test_simulate_kernels_equal_numpy_backend(mode):
    """simulate(backend="numba") equals simulate(backend="numpy") on random partial-sharing problems, methods,
    seeds (shared across etas and not), 1/|o| and record_every, over 24 steps; sampled runs consume the same
    stream (default_rng(seed).random((G, T)) a step). Sampled steps are kept small here: at large ones the
    dynamics amplify round-off (10x in 2 steps at J ~ 3e-3, eta = 3), one step is checked below."""
    methods = ["grpo", "rloo", "reinforce", "w_reinforce", "dr_grpo"] + (["gap"] if mode == "exact" else [])
    etas = np.geomspace(0.05, 3.0, 5) if mode == "exact" else np.geomspace(0.01, 0.1, 5)
    for i, (env, th, rng) in enumerate(_partial_configs(2, 12)):
        dyn = SequenceDynamics(method=methods[i % len(methods)], gradient=mode, group_size=int(rng.integers(2, 7)),
                               steps=24, record_every=int(rng.integers(1, 4)), length_normalized=bool(i % 3 == 0))
        seed = [3, 3, 5, 3, 7] if i % 2 else 4
        th0 = th[0] * min(0.3, 3.0 / np.abs(th[0]).max())  # logits of O(1-10): no amplification of round-off
        a = simulate(env, dyn, eta=etas, seed=seed, theta0=th0)
        b = simulate(env, dyn, eta=etas, seed=seed, theta0=th0, backend="numpy")
        _assert_same_trajectory(a, b, i)


def test_one_sampled_kernel_step_equals_numpy_at_large_steps():
    """One sampled step from random states at eta up to 30: the kernel's theta_1, Phi_1 are numpy's to 1e-12."""
    for i, (env, th, rng) in enumerate(_partial_configs(5, 20)):
        dyn = SequenceDynamics(method=("grpo", "rloo", "w_reinforce")[i % 3], gradient="sampled", group_size=4, steps=1)
        etas = np.geomspace(0.1, 30.0, 5)
        a = simulate(env, dyn, eta=etas, seed=np.arange(5), theta0=th)
        b = simulate(env, dyn, eta=etas, seed=np.arange(5), theta0=th, backend="numpy")
        _assert_same_trajectory(a, b, i)


def test_zero_probability_tokens_are_never_drawn():
    """p = [0, 1] (token 0 underflows to p = 0) at u = 0.0 draws token 1 in every model and the kernel (the
    former (u > cdf).sum() drew token 0 there), and draws equal gapdyn.theory.sampling.inverse_cdf_draw."""
    from scipy.special import log_softmax

    from bandits import _sequence_kernels as K
    from gapdyn.theory.sampling import inverse_cdf_draw

    u = np.array([[[0.0, 0.5, 1.0 - 2.0**-53]]])  # [1, G=1, T=3]
    tab = TabularSequenceBandit(V=2, T=3, rule="MAJ", correct=1)
    z = np.array([[[-1000.0, 0.0]] * 3])
    assert np.all(np.exp(log_softmax(z, axis=-1))[..., 0] == 0) and np.all(tab.draw(z, u).counts[..., 0] == 0)
    feat = np.array([[[-1000.0], [0.0]]] * 3)  # [T, V=2, d=1]: p_t = [0, 1] at theta = 1
    part = PartialSharingBandit(feat, "MAJ", correct=1)
    assert np.all(part.draw(np.ones((1, 1)), u).counts[..., 0] == 0)
    assert np.all(K.partial_draw(part.features, np.ones((1, 1)), u, 1) == 1)
    shared = SharedSequenceBandit(feat[0], (1,), "MAJ", 3)
    assert np.all(shared.draw(np.ones((1, 1)), u).counts[..., 0] == 0)
    # random rows with zero-mass tokens: the kernel's draws are gapdyn's
    rng = np.random.default_rng(3)
    theta = rng.standard_normal((4, 2))
    feat = rng.standard_normal((3, 6, 2))
    feat[:, [0, 3]] = -1e4 * np.sign(theta[:, None, :]).mean(0)  # tokens 0, 3: p = 0 for every run
    part = PartialSharingBandit(feat, "MAJ", correct=1)
    uu = rng.random((4, 7, 3))
    uu[:, 0] = 0.0
    p = np.exp(part.token_logprobs(theta))
    assert np.all(p[..., [0, 3]] == 0)
    want = np.swapaxes(inverse_cdf_draw(p, np.swapaxes(uu, -1, -2)), -1, -2)
    np.testing.assert_array_equal(K.partial_draw(part.features, theta, uu, 1), want)
    assert not np.isin(want, [0, 3]).any()


def test_shared_kernels_equal_the_numpy_route():
    """Shared model (fixed and variable length, AC and MAJ, 1/|o|): the kernel's Phi is log_odds', and sampled
    simulate with backend="numba" equals backend="numpy" (same stream, every field to 1e-12 relative)."""
    rng = np.random.default_rng(7)
    methods = ["grpo", "rloo", "w_reinforce", "reinforce"]
    for i in range(12):
        variable = bool(i % 2)
        env = SharedSequenceBandit.random(V=int(rng.integers(3, 9)), d=int(rng.integers(1, 5)),
                                          T=int(rng.integers(1, 11)), rule=("AC", "MAJ")[i % 3 % 2], seed=i,
                                          variable_length=variable)
        th = float(rng.choice([0.3, 3.0, 300.0])) * rng.standard_normal((6, env.d))
        np.testing.assert_allclose(env._kernel_log_odds(th), env.log_odds(th), rtol=1e-12, atol=1e-12)
        dyn = SequenceDynamics(method=methods[i % 4], gradient="sampled", group_size=int(rng.integers(2, 7)), steps=24,
                               record_every=int(rng.integers(1, 4)), length_normalized=bool(i % 3 == 0))
        th0 = th[0] * min(1.0, 3.0 / np.abs(th[0]).max())
        seed = [3, 3, 5, 3, 7] if i % 4 < 2 else 4
        etas = np.geomspace(0.005, 0.05, 5)  # w_reinforce at J ~ 1e-4 doubles round-off a step at eta = 0.1
        a = simulate(env, dyn, eta=etas, seed=seed, theta0=th0)
        b = simulate(env, dyn, eta=etas, seed=seed, theta0=th0, backend="numpy")
        _assert_same_trajectory(a, b, i)
        one = SequenceDynamics(method=methods[i % 4], gradient="sampled", group_size=4, steps=1)  # large steps: one step
        a = simulate(env, one, eta=np.geomspace(0.1, 30.0, 6), seed=np.arange(6), theta0=th)
        b = simulate(env, one, eta=np.geomspace(0.1, 30.0, 6), seed=np.arange(6), theta0=th, backend="numpy")
        _assert_same_trajectory(a, b, f"{i} one step")


def test_tabular_kernels_equal_the_numpy_route():
    """Tabular model: the kernel's Phi is log_odds', and sampled simulate with backend="numba" equals
    backend="numpy" (same stream, every field to 1e-12 relative; one step at large etas)."""
    rng = np.random.default_rng(8)
    methods = ["grpo", "rloo", "w_reinforce", "dr_grpo"]
    for i in range(10):
        env = TabularSequenceBandit(V=int(rng.integers(2, 7)), T=int(rng.integers(1, 11)), rule=("AC", "MAJ")[i % 2])
        z = float(rng.choice([0.3, 3.0, 300.0])) * rng.standard_normal((6, env.T, env.V))
        np.testing.assert_allclose(env._kernel_log_odds(z), env.log_odds(z), rtol=1e-12, atol=1e-12)
        dyn = SequenceDynamics(method=methods[i % 4], gradient="sampled", group_size=int(rng.integers(2, 7)), steps=24,
                               record_every=int(rng.integers(1, 4)), length_normalized=bool(i % 3 == 0))
        z0 = z[0] * min(1.0, 3.0 / np.abs(z[0]).max())
        seed = [3, 3, 5, 3, 7] if i % 4 < 2 else 4
        a = simulate(env, dyn, eta=np.geomspace(0.005, 0.05, 5), seed=seed, theta0=z0)
        b = simulate(env, dyn, eta=np.geomspace(0.005, 0.05, 5), seed=seed, theta0=z0, backend="numpy")
        _assert_same_trajectory(a, b, i)
        one = SequenceDynamics(method=methods[i % 4], gradient="sampled", group_size=4, steps=1)
        a = simulate(env, one, eta=np.geomspace(0.1, 30.0, 6), seed=np.arange(6), theta0=z)
        b = simulate(env, one, eta=np.geomspace(0.1, 30.0, 6), seed=np.arange(6), theta0=z, backend="numpy")
        _assert_same_trajectory(a, b, f"{i} one step")


# ---------------------------------------------------------------------------------------------
# the exact kernels of the shared and tabular models (shared_exact, tabular_exact) vs their numpy ``exact``

_SCALES = st.sampled_from([0.3, 3.0, 30.0, 300.0])  # logits of O(0.1) to O(1e3): both DP paths, J near 0 and 1


@st.composite
def _shared_problems(draw):
    variable = draw(st.booleans())
    env = SharedSequenceBandit.random(V=draw(st.integers(3, 8)), d=draw(st.integers(1, 4)), T=draw(st.integers(1, 10)),
                                      rule=draw(st.sampled_from(RULES)), seed=draw(st.integers(0, 10**6)),
                                      variable_length=variable)
    th = draw(_SCALES) * np.random.default_rng(draw(st.integers(0, 10**6))).standard_normal((3, env.d))
    return env, th


@st.composite
def _tabular_problems(draw):
    V = draw(st.integers(2, 6))
    env = TabularSequenceBandit(V=V, T=draw(st.integers(1, 10)), rule=draw(st.sampled_from(RULES)),
                                correct=draw(st.integers(0, V - 1)))
    z = draw(_SCALES) * np.random.default_rng(draw(st.integers(0, 10**6))).standard_normal((3, env.T, env.V))
    return env, z


def _log_scale(env, logits) -> np.ndarray:
    """Per row, a bound on the magnitude of the log-space sums both routes form: T positions, each a
    log-probability |z - logsumexp z| <= 2 max|z| + log V, plus the log binomial counts (<= T log 2)."""
    z = np.abs(np.asarray(logits)).reshape(len(logits), -1).max(axis=-1)
    return env.T * (2 * z + np.log(env.V) + 1)


def _log_tol(env, logits) -> np.ndarray:
    """Both routes reach log J, log(1 - J) as sums of terms up to _log_scale in magnitude, each rounded
    (relative eps): they may differ by a few eps x that scale (8 here), never less than 1e-12. That is the
    absolute tolerance of Phi and the relative one of J = exp(log J) (logits of 300 and T = 10: 1e-11)."""
    return np.maximum(1e-12, 8 * np.finfo(float).eps * _log_scale(env, logits))


def _check_shared_exact(env, th):
    """J to the log-space tolerance relative, Phi to it absolute (and 1e-12 relative), the Gap to 1e-10 relative;
    the Gap's floor is 1e-12 of |g+| + |g-|, the two conditional means whose difference it is (the
    cancellation both routes share)."""
    a, b = env._kernel_exact(th), env.exact(th)
    tol = _log_tol(env, np.asarray(th) @ env.features.T)
    assert np.all(np.abs(a["J"] - b["J"]) <= tol * np.abs(b["J"]) + 1e-300), (a["J"], b["J"], tol)
    assert np.all(np.abs(a["Phi"] - b["Phi"]) <= tol + 1e-12 * np.abs(b["Phi"])), (a["Phi"], b["Phi"], tol)
    floor = 1e-12 * (np.abs(b["g_plus"]) + np.abs(b["g_minus"]))
    assert np.all(np.abs(a["gap"] - b["gap"]) <= 1e-10 * np.abs(b["gap"]) + floor), (a["gap"], b["gap"])


def _check_tabular_exact(env, z):
    """Block t of the Gap is g_t (e_c - u_t): g_t = P(x_t = 1 | r = 1) - P(x_t = 1 | r = 0) to 1e-10 relative,
    u_t to 1e-10. g_t's floor is the precision of the two probabilities (<= 1) whose difference it is: each is
    exp(log q_t + log P(N_{-t} ...) - log J), an exponent known to ~ulp |log J| + |log(1 - J)| ~ ulp |Phi|
    (1e-12 + 1e-13 |Phi| here; AC at logits of 300 puts |Phi| near 3e3 and both probabilities near 1)."""
    a, b = env._kernel_exact(z), env.exact(z)
    tol = _log_tol(env, z)
    assert np.all(np.abs(a["J"] - b["J"]) <= tol * np.abs(b["J"]) + 1e-300), (a["J"], b["J"], tol)
    assert np.all(np.abs(a["Phi"] - b["Phi"]) <= tol + 1e-12 * np.abs(b["Phi"])), (a["Phi"], b["Phi"], tol)
    c = env.correct
    ga, gb = a["gap"][..., c], b["gap"][..., c]
    floor = 1e-12 + 1e-13 * np.abs(b["Phi"])[:, None]
    assert np.all(np.abs(ga - gb) <= 1e-10 * np.abs(gb) + floor), np.max(np.abs(ga - gb) / floor)
    wrong = np.arange(env.V) != c
    ok = (ga != 0) & (gb != 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        ua, ub = -a["gap"][..., wrong] / ga[..., None], -b["gap"][..., wrong] / gb[..., None]
    np.testing.assert_allclose(ua[ok], ub[ok], rtol=1e-10, atol=1e-300)
    floor_all = np.broadcast_to(floor[..., None], a["gap"].shape)
    assert np.all(np.abs(a["gap"] - b["gap"])[~ok] <= floor_all[~ok])  # |entries| <= |g_t| there


@pytest.mark.parametrize("seed", [2009, 3792, 7088])
def test_shared_exact_kernel_tolerance_scales_with_the_logits(seed):
    """Problems found by a random search at logits of 300 (T = 8, 9), where the kernel's J differs from numpy's
    by more than 1e-12 relative (the two routes round log-space sums of ~5e3 differently): within
    :func:`_log_tol` (a fixed rtol of 1e-12 failed them, as it failed the random profile)."""
    rng = np.random.default_rng(seed)
    scale = [30.0, 300.0][rng.integers(2)]
    rng.integers(2)
    V, d, T = int(rng.integers(3, 9)), int(rng.integers(1, 5)), int(rng.integers(1, 11))
    rule, env_seed, variable = RULES_SEARCH[rng.integers(2)], int(rng.integers(10**6)), bool(rng.integers(2))
    env = SharedSequenceBandit.random(V=V, d=d, T=T, rule=rule, seed=env_seed, variable_length=variable)
    _check_shared_exact(env, scale * rng.standard_normal((3, env.d)))


RULES_SEARCH = ("AC", "MAJ")


@settings(max_examples=25, deadline=None)
@given(_shared_problems())
def test_shared_exact_kernel_equals_numpy(problem):
    """shared_exact (fixed and variable length, AC and MAJ) equals SharedSequenceBandit.exact."""
    _check_shared_exact(*problem)


@settings(max_examples=25, deadline=None)
@given(_tabular_problems())
def test_tabular_exact_kernel_equals_numpy(problem):
    """tabular_exact equals TabularSequenceBandit.exact."""
    _check_tabular_exact(*problem)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(_shared_problems(), _tabular_problems())
def test_exact_kernels_equal_numpy_many(shared, tabular):
    _check_shared_exact(*shared)
    _check_tabular_exact(*tabular)


def _exact_runs(seed: int, n: int):
    """n random shared / tabular problems with exact dynamics (every method, 1/|o| at fixed length)."""
    rng = np.random.default_rng(seed)
    methods = ["grpo", "rloo", "reinforce", "w_reinforce", "dr_grpo", "gap"]
    for i in range(n):
        if i % 2:
            variable = bool(i % 4 == 1)
            env = SharedSequenceBandit.random(V=int(rng.integers(3, 9)), d=int(rng.integers(1, 5)),
                                              T=int(rng.integers(1, 11)), rule=RULES[i % 3 % 2], seed=i,
                                              variable_length=variable)
            th = rng.standard_normal(env.d)
        else:
            variable = False
            env = TabularSequenceBandit(V=int(rng.integers(2, 7)), T=int(rng.integers(1, 11)), rule=RULES[i % 3 % 2])
            th = rng.standard_normal((env.T, env.V))
        dyn = SequenceDynamics(method=methods[i % 6], gradient="exact", group_size=int(rng.integers(2, 7)), steps=24,
                               record_every=int(rng.integers(1, 4)), length_normalized=not variable and i % 3 == 0)
        yield env, dyn, th * min(0.3, 3.0 / np.abs(th).max())


@pytest.mark.parametrize("n", [pytest.param(8, id="default"), pytest.param(60, id="many", marks=pytest.mark.slow)])
def test_simulate_exact_shared_tabular_kernels_equal_numpy_backend(n):
    """Exact simulate with backend="numba" (shared_exact / tabular_exact per step) equals backend="numpy" on
    random shared and tabular problems, every method and "gap": 24 steps at etas 0.05..1 and one step at etas
    0.1..30, every field to 1e-12. Longer runs at large etas are kept out: log-odds ascent that overshoots
    amplifies round-off (5x a step from step 4 at eta = 1.4, shared, end token, AC), as any change of
    summation order would."""
    for i, (env, dyn, th0) in enumerate(_exact_runs(11, n)):
        etas = np.geomspace(0.05, 1.0, 5)
        a = simulate(env, dyn, eta=etas, theta0=th0)
        b = simulate(env, dyn, eta=etas, theta0=th0, backend="numpy")
        _assert_same_trajectory(a, b, (i, type(env).__name__))
        one = dataclasses.replace(dyn, steps=1, record_every=1)
        big = np.geomspace(0.1, 30.0, 5)
        a = simulate(env, one, eta=big, theta0=th0 / min(0.3, 3.0 / np.abs(th0).max()))
        b = simulate(env, one, eta=big, theta0=th0 / min(0.3, 3.0 / np.abs(th0).max()), backend="numpy")
        _assert_same_trajectory(a, b, (i, type(env).__name__, "one step"))
