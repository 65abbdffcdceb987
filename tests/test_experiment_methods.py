"""Machinery of the methods experiment, each against an independent route: matched step lengths against the
engine's first exact step, the rank statistic against pandas + scipy, the paired comparison against counts by
hand, and the identity rows reproduced in test mode."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

import gapdyn
from bandits.engine import Dynamics, simulate
from bandits.experiments import mechanisms as mech
from bandits.experiments import methods as meth
from bandits.experiments._common import run_cells_serial


@pytest.mark.parametrize("instance", [0, 3])
def test_matched_etas_give_equal_first_steps(instance):
    """eta_m ||E[w_m](theta0)|| = L, checked on the engine's (numba) first exact step."""
    b = mech.instance_bandit(instance)
    L = np.array([2.0, 20.0])
    for m, etas in mech.matched_step_etas(b, meth.MATCHED, 8, L).items():
        tr = simulate(b, Dynamics(method=m, mode="exact", steps=1), eta=etas)
        np.testing.assert_allclose(np.linalg.norm(tr.theta_final[:, 0], axis=-1), L, rtol=1e-10)


def test_matched_etas_validate():
    with pytest.raises(ValueError, match="step_lengths"):
        mech.matched_step_etas(mech.instance_bandit(0), ("wapo",), 8, [1.0, -1.0])


def test_rank_statistic_matches_pandas_and_scipy():
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"instance": np.repeat(np.arange(5), 4), "method": np.tile(list("abcd"), 5),
                       "v": rng.random(20)})
    scal = {"a": 0.1, "b": 0.4, "c": 0.2, "d": 0.3}
    codes, names = pd.factorize(df["method"])
    got = meth._rank_statistic(codes, np.array([scal[n] for n in names])[codes], df["v"].to_numpy())
    means = df.groupby("method")["v"].mean()
    assert got == pytest.approx(spearmanr([scal[m] for m in means.index], means.to_numpy()).statistic)


def test_paired_claim_counts_discordant_pairs():
    key = ["instance", "eta", "seed"]
    a = pd.DataFrame({"instance": [0, 0, 1, 1], "eta": 1.0, "seed": [0, 1, 0, 1], "method": "wapo",
                      "collapsed": [0.0, 0.0, 1.0, 0.0]})
    b = a.assign(method="grpo", collapsed=[1.0, 1.0, 1.0, 0.0])
    est, p, n = meth._paired_claim(pd.concat([a, b]), "wapo", "grpo", key, seed=0)
    assert n == 2 and est.estimate == pytest.approx(-0.5)
    assert p == pytest.approx(gapdyn.mcnemar_exact([0, 0, 1, 0], [1, 1, 1, 0]).p_value)


def test_identity_rows_reproduce_in_test_mode():
    cfg = meth.Config.test()
    claims = {c.id: c for c in meth.analyse(run_cells_serial(meth, cfg), cfg, block="discovery")}
    for cid in ("identity_baselines", "identity_dr_rescaled", "identity_wr_rescaled"):
        assert claims[cid].verdict == "identity", (cid, claims[cid].estimate)
