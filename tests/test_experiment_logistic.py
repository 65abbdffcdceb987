"""The logistic experiment: contract, blocks, and its estimators against constructed data and plain loops."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from scipy.special import expit, logit
from scipy.stats import beta, t

import gapdyn
from bandits.experiments import load
from tests.conftest import EXPERIMENT_CONFIRMATION
from tests.experiment_views import discovery_only

lg = load("logistic")


@pytest.fixture(scope="module")
def test_run(experiment_runs):
    return discovery_only(experiment_runs["logistic"][1])


def test_claims_follow_the_contract(test_run):
    claims = test_run.claims
    assert {c.id for c in claims} == set(lg.CRITERIA) == set(lg.STATEMENTS) == set(lg.FORMS)
    for c in claims:
        assert c.interval[0] <= c.interval[1] and (c.n >= 2 or not c.measured)
        assert c.criteria_hash == gapdyn.criteria_hash(lg.CRITERIA) and c.block == "discovery"
        assert c.form == lg.FORMS[c.id] and c.criterion == lg.CRITERIA[c.id]
        assert c.measured or c.reason
    assert sorted(c.id for c in claims if not c.counts_as_evidence) == ["logistic.exact_slope_identity",
                                                                       "logistic.thm1_bound_meeting"]
    bounds = [c for c in claims if c.form == "bound"]
    assert len(bounds) == len(lg.METHODS) + 1
    assert all(c.criterion == gapdyn.Criterion.below(lg.VIOLATION_CAP) for c in bounds)
    assert set(test_run.results["part"]) == {"fit", "identity", "thm1"}


def test_confirmation_uses_only_its_seeds(experiment_runs):
    res = experiment_runs["logistic"][1]  # the session's test-mode run, confirmation block on 1000, 1001
    by_block = res.results.groupby("block")["instance"].unique()
    assert sorted(by_block["discovery"]) == sorted(lg.Config.test().instances)
    assert sorted(by_block["confirmation"]) == sorted(EXPERIMENT_CONFIRMATION)


def test_run_cell_is_deterministic():
    for cell in lg.cells(lg.Config.test(), (0,)):
        pd.testing.assert_frame_equal(lg.run_cell(**cell), lg.run_cell(**cell))


# --- the bound's statistic -------------------------------------------------------------------------


def _trajectory(instance, method, J0, gains, M, run=0, collapsed=False):
    """Constructed pairs: Phi_k = logit J0 + gains_k (k = 0..K), M_k given; the bound asks gains_k >= M_k / 2."""
    gains, M = np.asarray(gains, float), np.asarray(M, float)
    return pd.DataFrame({"part": "fit", "sampling": "sampled", "method": method, "instance": instance, "run": run,
                         "step": np.arange(gains.size), "M": M, "Phi": logit(J0) + gains, "J": expit(logit(J0) + gains),
                         "J0": J0, "Phi0": logit(J0), "collapsed": collapsed})


def _constructed():
    """Three instances: known violations at chosen steps, one run collapsing (J -> 0, every later step violates)."""
    M = np.linspace(0.0, 4.0, 11)
    ok = M / 2 + 0.3  # every step above the bound
    bad = ok.copy()
    bad[[3, 7]] = M[[3, 7]] / 2 - 0.01  # two violations
    crash = ok.copy()
    crash[6:] = -30.0  # a collapsed run: J ~ 1e-14 from step 6 on (5 violating pairs)
    frames = [_trajectory(0, "grpo", 0.1, ok, M), _trajectory(0, "grpo", 0.1, bad, M, run=1),
              _trajectory(1, "grpo", 0.3, crash, M, collapsed=True), _trajectory(1, "grpo", 0.3, ok, M, run=1),
              _trajectory(2, "grpo", 0.2, bad, M), _trajectory(2, "grpo", 0.2, bad, M, run=1)]
    return pd.concat(frames, ignore_index=True)


def _plain_shares(d):
    """The per-instance share of violating pairs (steps >= 1, every run), by a plain loop on J."""
    out = {}
    for i in sorted(set(d["instance"])):
        pairs = viol = 0
        for row in d[d["instance"] == i].itertuples():
            if row.step < 1:
                continue
            pairs += 1
            bound = row.J0 / (row.J0 + (1 - row.J0) * math.exp(-row.M / 2))  # Theorem 1, by hand
            viol += row.J < bound * (1 - 1e-6)
        out[i] = viol / pairs
    return out


def test_violation_shares_match_a_plain_loop_and_the_known_violations():
    d = _constructed()
    got = lg.violation_shares(lg.bound_pairs(d)).set_index("instance")
    # known: instance 0 has 2 of 20 violating pairs, instance 1 (collapsed run kept) 5 of 20, instance 2 4 of 20
    np.testing.assert_array_equal(got["violations"], [2, 5, 4])
    np.testing.assert_array_equal(got["pairs"], [20, 20, 20])
    plain = _plain_shares(d)
    np.testing.assert_allclose(got["share"], [plain[i] for i in got.index], rtol=0, atol=0)


def test_bound_value_and_ratio_against_a_hand_computation():
    J0, M = 0.2, np.array([0.0, 0.5, 2.0, 6.0])
    hand = np.array([J0 / (J0 + (1 - J0) * math.exp(-m / 2)) for m in M])
    np.testing.assert_allclose(gapdyn.logodds_lower_bound(J0, M), hand, rtol=1e-14)
    J = np.array([0.2, hand[1] * 1.01, hand[2] * 0.99, 1 - 1e-15])
    np.testing.assert_array_equal(lg.violates_bound(logit(J), logit(J0), M), J < hand * (1 - 1e-9))
    ratio = lg.bound_ratio(logit(J), logit(J0), M)
    assert math.isnan(ratio[0])
    np.testing.assert_allclose(ratio[1:], (np.log(J / (1 - J)) - math.log(J0 / (1 - J0)))[1:] / (M[1:] / 2),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="M"):
        lg.violates_bound(0.0, 0.0, -1.0)


def test_violation_estimate_is_the_studentized_bootstrap_where_it_is_valid(mean_interval_valid_from_40):
    from gapdyn.evidence.stats import studentized_cluster_bootstrap_mean

    rng = np.random.default_rng(3)
    s = rng.beta(0.5, 5.0, size=40)
    est, reason = lg.violation_estimate(s)
    ref = studentized_cluster_bootstrap_mean(s, rng=np.random.default_rng(20261201))
    assert reason == "" and est.n == 40 and est.confidence == lg.BOUND_CONFIDENCE
    np.testing.assert_allclose([est.estimate, est.lo, est.hi], [ref.estimate, max(0.0, ref.lo), min(1.0, ref.hi)])
    few, why = lg.violation_estimate(s[:20])  # below the n at which the method covers: not measured
    assert few.method.startswith("no data") and "too few instances for a valid interval" in why
    zero, _ = lg.violation_estimate(np.zeros(20))  # no violation anywhere: the exact limit over instances
    np.testing.assert_allclose(zero.hi, beta.ppf(0.95, 1, 20), rtol=1e-12)
    np.testing.assert_allclose(zero.hi, 1 - 0.05 ** (1 / 20), rtol=1e-12)
    sparse = np.zeros(40)
    sparse[[3, 17]] = [0.02, 0.5]  # two instances violate: bootstrap resamples without spread give no interval
    est, reason = lg.violation_estimate(sparse)
    assert reason == "" and est.lo == 0.0 and est.hi == pytest.approx(beta.ppf(0.95, 3, 38))
    assert est.hi >= sparse.mean()
    assert lg.violation_estimate(np.array([0.1]))[0].method == "no data"
    assert lg.violation_estimate(np.full(4, 0.3))[1]  # no spread: not measured, with a reason


def test_conservativeness_is_the_median_over_non_violating_pairs():
    d = lg.bound_pairs(_constructed())
    keep = d[~d["violates"] & (d["M"] > 0)]
    hand = np.median([(r.Phi - r.Phi0) / (r.M / 2) for r in keep.itertuples()])
    np.testing.assert_allclose(lg.conservativeness(d["ratio"], d["violates"]), hand, rtol=1e-12)
    assert lg.conservativeness([np.nan], [False]) is None


def test_pairs_keep_collapsed_runs_and_the_final_state(test_run):
    fit = test_run.results[test_run.results["part"] == "fit"]
    cfg = lg.Config.test()
    per_run = fit.groupby(["instance", "method", "sampling", "eta", "seed"])
    assert (per_run["step"].max() == cfg.steps).all() and (per_run["step"].size() == cfg.n_records + 1).all()
    p = lg.bound_pairs(test_run.results)
    assert len(p) == len(fit[(fit["sampling"] == "sampled") & (fit["step"] >= 1)])  # no run dropped
    assert set(fit["outcome"]) <= set(gapdyn.BANDIT_OUTCOMES)
    np.testing.assert_array_equal(fit["collapsed"], fit["outcome"] == "collapsed")


# --- the other estimators ------------------------------------------------------------------------------


def _pairs(slope, n_inst=3):
    M = np.linspace(0, 4, 25)
    rows = [pd.DataFrame({"part": "identity", "method": "reinforce", "sampling": "exact", "instance": i,
                          "M": M, "J": expit(logit(0.1 + 0.05 * i) + slope * M), "J0": 0.1 + 0.05 * i,
                          "collapsed": False}) for i in range(n_inst)]
    return pd.concat(rows, ignore_index=True)


@pytest.mark.parametrize("slope", [1.0, 0.5, 2.0])
def test_identity_estimator_recovers_a_constructed_slope(slope):
    got = lg.identity_slopes(_pairs(slope))
    np.testing.assert_allclose(got["slope"], slope, rtol=1e-10)


def test_fit_view_recovers_a_constructed_logistic():
    d = _pairs(0.7).assign(part="fit", sampling="sampled")
    got = lg.instance_slopes(d)
    np.testing.assert_allclose(got["slope"], 0.7, rtol=1e-6)
    np.testing.assert_allclose(got["intercept"], got["logit_J0"], atol=1e-6)


def test_thm1_pairs_split_by_the_step_condition(test_run):
    th = test_run.results[test_run.results["part"] == "thm1"]
    steps = lg.Config.test().thm1_steps
    assert ((th["pairs_meeting"] + th["pairs_beyond"]) == steps).all()
    assert (th["viol_meeting"] <= th["pairs_meeting"]).all() and (th["viol_beyond"] <= th["pairs_beyond"]).all()
    met = th[th["meets"].astype(bool)]
    assert (met["pairs_beyond"] == 0).all()
    worst_ok = th["worst_violation"] <= 1e-9  # J units vs log-odds: the same inequality
    np.testing.assert_array_equal(th["above_bound"].astype(bool), worst_ok)
