"""Machinery of experiment 3 (bandits.experiments.success_rate), each against an independent route: the
checkpoints against a replay of the run, the sharp threshold against Phi itself, the c_G identity between the
two directions' thresholds. Its claims per block are checked by the experiment contract
(tests/test_bandits_experiments.py). No claim is required to hold."""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest

import gapdyn
from bandits.experiments import success_rate as sr
from tests.conftest import experiment_test_config

CFG = experiment_test_config(sr)  # its claims and blocks: tests/test_bandits_experiments.py


@pytest.fixture(scope="module")
def test_run(experiment_runs):
    return experiment_runs["success_rate"][1]


def test_grpo_threshold_is_the_gaps_over_cG(test_run):
    """Rows of the two sharp thresholds at one checkpoint: eta_grpo c_G(J) = eta_gap (gapdyn.expected_scalar)."""
    r = test_run.results
    g = r[(r["measure"] == "sharp_grpo") & (r["status"] == "ok")]
    h = r[(r["measure"] == "sharp_gap") & (r["status"] == "ok")]
    both = g.merge(h, on=["block", "setting", "instance", "level"], suffixes=("_grpo", "_gap"))
    assert len(both) > 0
    c = gapdyn.expected_scalar("grpo", both["J_grpo"].to_numpy(), CFG.group_size)
    np.testing.assert_allclose(both["eta_local_grpo"] * c, both["eta_local_gap"], rtol=1e-5)


@pytest.mark.parametrize("setting", sr.SETTINGS)
def test_checkpoints_are_first_crossings_of_a_replay(setting):
    prob = sr._Problem(setting, 1, {"group_size": 8, "J_start": 0.05, "rho": 0.5})
    eta = 1.0
    cps = sr.checkpoints(prob, eta, (0.1, 0.3, 0.5), 200)
    assert cps
    for level, k, theta in cps:
        J, _, _ = prob.state(theta)
        assert J >= level
        before = prob.run(prob.theta0, eta, k - 1)[1] if k > 1 else prob.theta0
        assert prob.state(before)[0] < level
        # the replay in one piece reaches the same parameters
        np.testing.assert_allclose(prob.run(prob.theta0, eta, k)[1], theta, rtol=1e-10, atol=1e-12)


def test_sharp_threshold_is_where_phi_returns(test_run):
    """At a finite threshold, Phi rises just below it and does not just above it (Phi evaluated directly)."""
    r = test_run.results
    row = r[(r["setting"] == "T=8") & (r["measure"] == "sharp_gap") & (r["status"] == "ok")].iloc[0]
    prob = sr._Problem("T=8", int(row["instance"]), {"group_size": 8, "J_start": CFG.J_start, "rho": CFG.rho})
    eta_run = float(row["eta_run"])
    theta = [t for lv, _, t in sr.checkpoints(prob, eta_run, CFG.levels, CFG.max_steps) if lv == row["level"]][0]
    gap = prob.state(theta)[2]
    phi0, eta = prob.logodds(theta), float(row["eta_local"])
    assert prob.logodds(theta + 0.999 * eta * gap) > phi0
    assert prob.logodds(theta + 1.001 * eta * gap) <= phi0


def test_run_cell_is_deterministic():
    cell = sr.cells(CFG, (2,))[1]
    pd.testing.assert_frame_equal(sr.run_cell(**cell), sr.run_cell(**cell))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: sr.Config(mode="x"), "mode"),
        (lambda: sr.Config(levels=(0.5, 0.3, 0.9)), "levels"),
        (lambda: sr.Config(levels=(0.2, 0.5)), "levels"),
        (lambda: sr.Config(J_start=0.5, levels=(0.3, 0.6, 0.9)), "levels"),
        (lambda: sr.Config(eta_frac=1.5), "eta_frac"),
        (lambda: sr._Problem("T=3", 0, {"group_size": 8, "J_start": 0.05, "rho": 0.5}), "setting"),
    ],
)
def test_bad_input(make, match):
    with pytest.raises(ValueError, match=match):
        make()
