"""The logistic experiment: contract, blocks, and its estimators against constructed data."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from scipy.special import expit, logit

import gapdyn
from bandits.experiments import load

lg = load("logistic")


@pytest.fixture(scope="module")
def test_run():
    return lg.run(lg.Config.test(), backend="serial", progress=False)


def test_claims_follow_the_contract(test_run):
    claims = test_run.claims
    assert {c.id for c in claims} == set(lg.CRITERIA)
    for c in claims:
        assert math.isfinite(c.estimate) and c.interval[0] <= c.interval[1] and c.n >= 2
        assert c.criteria_hash == gapdyn.criteria_hash(lg.CRITERIA) and c.block == "discovery"
    assert [c.id for c in claims if not c.counts_as_evidence] == ["logistic.exact_slope_identity"]
    assert set(test_run.results["part"]) == {"fit", "identity", "thm1"}


def test_confirmation_uses_only_its_seeds():
    cfg = dataclasses.replace(lg.Config.test(), instances=(0, 1), confirmation=(1000, 1001), steps=20,
                              identity_steps=20, thm1_steps=20)
    res = lg.run(cfg, backend="serial", progress=False)
    by_block = res.results.groupby("block")["instance"].unique()
    assert sorted(by_block["discovery"]) == [0, 1] and sorted(by_block["confirmation"]) == [1000, 1001]


def test_run_cell_is_deterministic():
    for cell in lg.cells(lg.Config.test(), (0,)):
        pd.testing.assert_frame_equal(lg.run_cell(**cell), lg.run_cell(**cell))


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


def test_fit_estimator_recovers_a_constructed_logistic():
    d = _pairs(0.7).assign(part="fit", sampling="sampled")
    got = lg.instance_slopes(d)
    np.testing.assert_allclose(got["slope"], 0.7, rtol=1e-6)
    np.testing.assert_allclose(got["intercept"], got["logit_J0"], atol=1e-6)


def test_thm1_pairs_split_by_the_step_condition(test_run):
    th = test_run.results[test_run.results["part"] == "thm1"]
    steps = lg.Config.test().thm1_steps
    assert ((th["pairs_meeting"] + th["pairs_beyond"]) == steps).all()
    assert (th["above_meeting"] <= th["pairs_meeting"]).all() and (th["above_beyond"] <= th["pairs_beyond"]).all()
    met = th[th["meets"].astype(bool)]
    assert (met["pairs_beyond"] == 0).all()
