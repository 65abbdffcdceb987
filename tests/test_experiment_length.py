"""Machinery of experiment 2 (bandits.experiments.length) and of the within-series slope estimator, each
against an independent route: the 1/|o| identity from two separate eta* searches, the slope against a
dummy-variable least-squares fit. Its claims per block are checked by the experiment contract
(tests/test_bandits_experiments.py). No claim is required to hold."""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest

import gapdyn
from bandits.experiments import length
from bandits.experiments._slopes import within_slope, within_slope_estimate
from tests.conftest import experiment_test_config

CFG = experiment_test_config(length)  # its claims and blocks: tests/test_bandits_experiments.py


def test_confirmation_cells_cover_their_instances():
    cells = length.cells(CFG, CFG.confirmation)
    assert {c["instance"] for c in cells} == set(CFG.confirmation)
    assert len(cells) == len(CFG.confirmation) * len(CFG.Ts) * (len(length.RHOS) * len(length.J0S) + len(length.J0S))


def test_every_cell_row_has_a_status():
    cell = length.cells(CFG, (0,))[0]
    df = length.run_cell(**cell)
    assert len(df) == CFG.seeds and set(df["status"]) <= {"found", "collapsed_at_lo", "none_in_range", "J0 unreachable"}
    pd.testing.assert_frame_equal(df, length.run_cell(**cell))  # deterministic


@pytest.mark.parametrize("T", [2, 4])
def test_normalised_eta_star_is_T_times_raw(T):
    """Two independent eta* searches (raw grid, grid x T with w/|o|) agree to the bisection tolerance."""
    cell = dict(instance=0, rho=1.0, J0=0.1, T=T, V=10, d=4, rule="MAJ", method="grpo", dynamics_mode="sampled",
                group_size=8, steps=40, eta_lo=0.05, eta_hi=500.0, max_ratio=1.05, seeds=1)
    raw = length.run_cell(**cell, normalized=False).iloc[0]
    nrm = length.run_cell(**cell, normalized=True).iloc[0]
    assert raw["status"] == nrm["status"] == "found"
    assert nrm["eta_star"] / raw["eta_star"] == pytest.approx(T, rel=3e-3)


def test_placement_reaches_J0():
    env, th0 = length.start(3, 0.5, 4, 0.1)
    assert env.success_rate(th0) == pytest.approx(0.1, abs=1e-9)


def test_within_slope_equals_a_dummy_variable_fit(rng):
    """Centring per series = least squares with one intercept per series (lstsq on an explicit design)."""
    series = np.repeat(np.arange(5), 4)
    x = rng.standard_normal(20)
    y = 2.0 * series + -0.8 * x + 0.1 * rng.standard_normal(20)
    design = np.column_stack([x, series[:, None] == np.arange(5)])
    coef = np.linalg.lstsq(design, y, rcond=None)[0]
    assert within_slope(x, y, series) == pytest.approx(coef[0], rel=1e-12)


def test_slope_estimate_of_an_exact_power_law():
    """eta = c_i T^-1 with instance-specific c_i: every resample gives slope -1 exactly."""
    T = np.tile([1.0, 2.0, 4.0, 8.0], 4)
    inst = np.repeat(np.arange(4), 4)
    eta = np.array([3.0, 0.5, 7.0, 1.0])[inst] / T
    est = within_slope_estimate(np.log(T), np.log(eta), series=inst, instance=inst, rng=np.random.default_rng(0),
                                n_resamples=200)
    assert (est.estimate, est.lo, est.hi, est.n) == pytest.approx((-1.0, -1.0, -1.0, 4))
    verdict = gapdyn.decide_verdict(est.estimate, est.lo, est.hi, length.CRITERIA["eta_star_vs_T/rho=1/J0=0.1"])
    assert verdict == "holds"


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: length.Config(mode="medium"), "mode"),
        (lambda: length.Config(Ts=(1, 1, 2)), "Ts"),
        (lambda: length.Config(Ts=(4,)), "two"),
        (lambda: length.Config(seeds=0), "seeds"),
        (lambda: length.Config(eta_lo=2.0, eta_hi=1.0), "eta_lo"),
        (lambda: length.Config(method="ppo"), "method"),
        (lambda: within_slope_estimate([0.0, 1.0], [0.0, 1.0], series=["a", "b"], instance=[0, 1],
                                       rng=np.random.default_rng(0)), "integer"),
    ],
)
def test_bad_input(make, match):
    with pytest.raises(ValueError, match=match):
        make()
