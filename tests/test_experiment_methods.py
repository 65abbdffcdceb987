"""Machinery of the methods experiment, each against an independent route: the rank permutation p against a
brute-force loop over orders with scipy's Spearman, the sign-flip p against enumeration by itertools, the
matched-step design against expected step lengths recomputed from theta_k with gapdyn's Gap, the clustering
of paired runs by instance against a hand count, and the identity rows reproduced in test mode."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

import gapdyn
from bandits.experiments import mechanisms as mech
from bandits.experiments import methods as meth
from bandits.experiments._common import run_cells_serial


@pytest.mark.parametrize("instance", [0, 3])
def test_matched_etas_give_equal_first_steps(instance):
    """mechanisms.matched_step_etas (first-step matching, kept for reference): eta_m ||E[w_m](theta0)|| = L,
    checked on the engine's (numba) first exact step."""
    from bandits.engine import Dynamics, simulate

    b = mech.instance_bandit(instance)
    L = np.array([2.0, 20.0])
    for m, etas in mech.matched_step_etas(b, meth.MATCHED, 8, L).items():
        tr = simulate(b, Dynamics(method=m, gradient="exact", steps=1), eta=etas)
        np.testing.assert_allclose(np.linalg.norm(tr.theta_final[:, 0], axis=-1), L, rtol=1e-10)


def test_matched_etas_validate():
    with pytest.raises(ValueError, match="step_lengths"):
        mech.matched_step_etas(mech.instance_bandit(0), ("wapo",), 8, [1.0, -1.0])


def _brute_rank_p(x, y, alternative):
    """Share of the orders of y whose scipy Spearman with x is >= (greater) / <= (less) the observed one."""
    obs = spearmanr(x, y).statistic
    rhos = np.array([spearmanr(x, [y[i] for i in perm]).statistic for perm in itertools.permutations(range(len(y)))])
    if alternative == "greater":
        return np.mean(rhos >= obs - 1e-12), np.mean(rhos >= rhos.max() - 1e-12)
    return np.mean(rhos <= obs + 1e-12), np.mean(rhos <= rhos.min() + 1e-12)


@pytest.mark.parametrize("alternative", ["greater", "less"])
def test_rank_permutation_p_matches_brute_force(alternative):
    # a constructed ranking over 5 methods with a three-way tie in the scalar, as reinforce = rloo = nsr
    x = [0.09, 0.09, 0.09, 0.0788, 0.099]
    y = [0.03, 0.59, 0.10, 0.05, 0.56]
    t = meth.rank_permutation_test(x, y, alternative=alternative)
    p, p_min = _brute_rank_p(x, y, alternative)
    assert t.rho == pytest.approx(spearmanr(x, y).statistic)
    assert t.p == pytest.approx(p) and t.p_min == pytest.approx(p_min)
    assert t.k == 5 and t.null_lo < 0 < t.null_hi


def test_rank_permutation_smallest_p_of_distinct_values():
    """Five distinct scalars and outcomes in the same order: p = p_min = 1/5!."""
    t = meth.rank_permutation_test([1, 2, 3, 4, 5], [0.1, 0.2, 0.3, 0.5, 0.9])
    assert t.rho == pytest.approx(1.0) and t.p == pytest.approx(1 / 120) and t.p_min == pytest.approx(1 / 120)


def test_rank_permutation_validates():
    with pytest.raises(ValueError, match="x and y"):
        meth.rank_permutation_test([1, 2], [1, 2])
    with pytest.raises(ValueError, match="distinct"):
        meth.rank_permutation_test([1, 1, 1], [1, 2, 3])
    with pytest.raises(ValueError, match="alternative"):
        meth.rank_permutation_test([1, 2, 3], [1, 2, 3], alternative="two-sided")


@pytest.mark.parametrize("d", [[-0.2, -0.1, 0.0, 0.05, -0.3, -0.1], [0.1] * 3 + [-0.05] * 4,
                               list(np.random.default_rng(1).normal(-0.1, 0.3, 12))])
def test_sign_flip_p_matches_enumeration(d):
    a = np.abs([v for v in d if v != 0])
    sums = np.array([np.dot(s, a) for s in itertools.product((1, -1), repeat=a.size)])
    assert meth.sign_flip_p(d) == pytest.approx(np.mean(sums <= np.sum(d) + 1e-12))


def test_sign_flip_p_beyond_one_chunk_matches_the_binomial():
    """Equal magnitudes, 19 nonzero (the enumeration runs in chunks of 2^16): p = P(Binomial(19, 1/2) <= #plus)."""
    from scipy.stats import binom

    d = [-1.0] * 13 + [1.0] * 6 + [0.0]
    assert meth.sign_flip_p(d) == pytest.approx(binom.cdf(6, 19, 0.5), rel=1e-12)


def test_sign_flip_p_beyond_enumeration_is_the_monte_carlo_permutation_p():
    """40 equal magnitudes, 14 positive: the Monte Carlo p agrees with P(Binomial(40, 1/2) <= 14) within its SE."""
    from scipy.stats import binom

    d = [-1.0] * 26 + [1.0] * 14
    exact = binom.cdf(14, 40, 0.5)
    assert meth.sign_flip_p(d) == pytest.approx(exact, abs=4 * np.sqrt(exact * (1 - exact) / 200_000) + 1e-5)


def test_sign_flip_p_edge_cases():
    assert meth.sign_flip_p([0.0, 0.0]) == 1.0
    assert meth.sign_flip_p([-1.0] * 5) == pytest.approx(1 / 32)
    with pytest.raises(ValueError, match="d must"):
        meth.sign_flip_p([np.nan, 1.0])


def test_matched_ratio_is_the_scalar_ratio():
    J = np.array([0.1, 0.5, 0.9])
    np.testing.assert_allclose(meth.matched_ratio("dr_grpo", J, 8), 1 - J, rtol=1e-12)
    np.testing.assert_allclose(meth.matched_ratio("psr", J, 8), (1 - 1 / 8) * (1 - J), rtol=1e-12)
    np.testing.assert_allclose(meth.matched_ratio("wapo", J, 8), 1.0)


@pytest.mark.parametrize("method", ["dr_grpo", "grpo"])
def test_matched_runs_give_wapo_expected_step_along_the_trajectory(method):
    """At every state theta_k of an exact matched run: eta_k ||E[w_m](theta_k)|| equals WAPO's expected step
    eta scalar_wapo(J_k) ||Gap(theta_k)||, both recomputed from theta_k with gapdyn's probabilities and Gap."""
    b = mech.instance_bandit(2)
    eta = np.array([30.0, 300.0])
    tr = meth.matched_runs(b, method, eta=eta, seeds=np.zeros(2, np.int64), steps=12, group_size=8, gradient="exact",
                           keep_theta=True)
    phi, r = b.features[0], b.rewards[0]
    for i in range(2):
        for k in range(12):
            p = gapdyn.loglinear_probs(phi, tr.theta[i, k])
            gap = np.linalg.norm(gapdyn.gradient_gap(p, r, gapdyn.loglinear_scores(phi, tr.theta[i, k])))
            J = float(gapdyn.success_rate(p, r))
            assert J == pytest.approx(tr.J[i, k], rel=1e-9)
            want = eta[i] * float(gapdyn.expected_scalar("wapo", J, 8)) * gap
            got = tr.eta[i, k] * float(gapdyn.expected_scalar(method, J, 8)) * gap
            assert got == pytest.approx(want, rel=1e-9)
            assert tr.eta[i, k] * tr.wnorm[i, k] == pytest.approx(want, rel=1e-9)  # the engine's own step
    assert np.ptp(tr.J[:, -1] - tr.J[:, 0]) > 0  # the runs move


def test_matched_exact_dr_grpo_follows_exact_wapo():
    """Exact Dr. GRPO at eta (1 - J_k) is exact WAPO at eta (E[w_wapo] = (1 - J) E[w_dr_grpo])."""
    from bandits.engine import Dynamics, simulate

    b = mech.instance_bandit(0)
    eta = np.array([3.0, 100.0])
    dr = meth.matched_runs(b, "dr_grpo", eta=eta, seeds=np.zeros(2, np.int64), steps=30, group_size=8, gradient="exact")
    wa = simulate(b, Dynamics(method="wapo", gradient="exact", steps=30, group_size=8), eta=eta)
    np.testing.assert_allclose(dr.J[:, :30], wa.J[:, :, 0], atol=1e-10)
    np.testing.assert_allclose(dr.J[:, -1], wa.J_final[:, 0], atol=1e-10)


def test_matched_runs_share_uniforms_across_methods_and_validate():
    b = mech.instance_bandit(1)
    kw = dict(eta=np.array([10.0, 10.0]), seeds=np.array([3, 3]), steps=12, group_size=8)
    a = meth.matched_runs(b, "wapo", **kw)
    np.testing.assert_array_equal(a.J[0], a.J[1])  # same seed, same eta: the same run
    st = gapdyn.RunStats.from_trajectory(a.J)
    np.testing.assert_array_equal(a.J_tail_max[:, 0], st.J_tail_max)
    with pytest.raises(ValueError, match="eta"):
        meth.matched_runs(b, "wapo", eta=np.array([-1.0]), seeds=np.array([0]), steps=3, group_size=8)
    with pytest.raises(ValueError, match="gradient"):
        meth.matched_runs(b, "wapo", gradient="tabular", **kw)


def test_paired_claim_clusters_by_instance(mean_interval_valid_from_40):
    """d_i = mean over (eta, seed) of collapsed(wapo) - collapsed(other) within instance i; n = instances."""
    key = ["instance", "eta", "seed"]
    rng = np.random.default_rng(3)
    idx = pd.MultiIndex.from_product([range(5), [1.0, 10.0], range(4)], names=key).to_frame(index=False)
    a = idx.assign(method="wapo", collapsed=(rng.random(len(idx)) < 0.2).astype(float))
    b = idx.assign(method="grpo", collapsed=(rng.random(len(idx)) < 0.6).astype(float))
    R = pd.concat([a, b]).sample(frac=1.0, random_state=0)  # row order must not matter
    d = meth.instance_differences(R, "wapo", "grpo", key)
    hand = [a[a["instance"] == i]["collapsed"].mean() - b[b["instance"] == i]["collapsed"].mean() for i in range(5)]
    np.testing.assert_allclose(d.to_numpy(), hand)
    est, p, n, reason = meth._paired_claim(R, "wapo", "grpo", key)
    assert n == 5 and p == pytest.approx(meth.sign_flip_p(hand))
    assert "too few instances for a valid interval" in reason  # 5 instances: the mean interval does not cover
    big = pd.concat([R.assign(instance=R["instance"] + 5 * j) for j in range(8)])  # 40 instances
    est, p, n, reason = meth._paired_claim(big, "wapo", "grpo", key)
    assert n == 40 and est.n == 40 and reason == "" and est.estimate == pytest.approx(np.mean(hand))


def test_identity_rows_and_primaries_in_test_mode():
    cfg = meth.Config.test()
    claims = {c.id: c for c in gapdyn.holm_adjust_claims(meth.analyse(run_cells_serial(meth, cfg), cfg))}
    assert set(claims) == set(meth.CRITERIA)
    for cid in ("identity_baselines", "identity_dr_rescaled", "identity_wr_rescaled", "identity_psr_reinforce",
                "identity_matched_exact"):
        assert claims[cid].verdict == "identity", (cid, claims[cid].estimate)
    assert {c for c, v in claims.items() if v.primary} == meth.PRIMARY
    assert all(claims[c].form == "comparison" and claims[c].p_value is not None for c in meth.PRIMARY)
    for c in claims.values():  # exploratory tests keep their unadjusted p
        if c.p_value is not None and not c.primary:
            assert c.p_adjusted == c.p_value
