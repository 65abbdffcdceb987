"""Machinery of experiment 2 (bandits.experiments.length) and of the slope estimators, each against an
independent route: the 1/|o| identity from two separate eta* searches, the within slope against a
dummy-variable least-squares fit, the censored (Tobit) fit against the within slope and a looped sandwich
when nothing is censored and against the known slope of censored synthetic data (where dropping the
censored points is biased). Its claims per block are checked by the experiment contract
(tests/test_bandits_experiments.py). No claim is required to hold."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

import gapdyn
from bandits.experiments import length
from bandits.experiments._slopes import (EXACT, LEFT, RIGHT, censored_slope_estimate, censored_within_slope,
                                         within_slope, within_slope_estimate)
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


LOG_T = np.log([1.0, 2.0, 4.0, 8.0, 16.0])


def _censored_series(G, rng, *, slope=-0.8, sd_slope=0.0, noise=0.5, lo=-1.6, hi=1.4):
    """G series y = a_g + b_g log T + noise over LOG_T, values below lo / above hi censored there."""
    x = np.tile(LOG_T, G)
    inst = np.repeat(np.arange(G), LOG_T.size)
    b = rng.normal(slope, sd_slope, G) if sd_slope > 0 else np.full(G, slope)
    y = rng.normal(0.0, 1.0, G)[inst] + b[inst] * x + rng.normal(0.0, noise, x.size)
    code = np.where(y < lo, LEFT, np.where(y > hi, RIGHT, EXACT))
    return x, np.clip(y, lo, hi), code, inst


def test_censored_fit_recovers_the_slope_that_dropping_biases():
    """slope -0.8, about 40 % of the points censored: the Tobit fit is within 3 se of -0.8, the fit on the
    uncensored points alone is not (it is flattened by more than 0.15)."""
    x, y, code, inst = _censored_series(150, np.random.default_rng(3))
    assert 0.3 < np.mean(code != EXACT) < 0.5
    fit = censored_within_slope(x, y, inst, code)
    assert abs(fit.slope + 0.8) < 3 * fit.se
    ex = code == EXACT
    assert within_slope(x[ex], y[ex], inst[ex]) > -0.8 + 0.15


def test_censored_fit_without_censoring_is_the_within_slope_and_its_sandwich(rng):
    """No censored row: b = the within-series least-squares slope, se² = G/(G-1) Σ_g (Σ_i xc_i u_i)² / (Σ xc²)²
    (the cluster sandwich of the within slope, summed in a loop over instances)."""
    x, y, _, series = _censored_series(12, rng)
    inst = series // 2  # two series per instance
    fit = censored_within_slope(x, y, series, np.zeros(x.size, int), clusters=inst)
    b = within_slope(x, y, series)
    assert fit.slope == pytest.approx(b, abs=1e-6)
    meat, sxx = 0.0, 0.0
    for g in np.unique(inst):
        s_g = 0.0
        for s in np.unique(series[inst == g]):
            m = series == s
            xc, yc = x[m] - x[m].mean(), y[m] - y[m].mean()
            s_g += float(xc @ (yc - b * xc))
            sxx += float(xc @ xc)
        meat += s_g ** 2
    G = np.unique(inst).size
    assert fit.se == pytest.approx(np.sqrt(G / (G - 1) * meat) / sxx, rel=1e-3)


def test_censored_fit_leaves_out_series_without_an_exact_point():
    x, y, code, inst = _censored_series(6, np.random.default_rng(1))
    code[inst == 0] = RIGHT
    fit = censored_within_slope(x, y, inst, code)
    assert 0 not in set(fit.series) and fit.n_clusters == 5


def _synthetic_results(n_inst, rng, *, cfg, slope=-1.0):
    """Results of length.run_cell shape from eta* = c_i T^slope e, censored by the scan [eta_lo, eta_hi]."""
    rows = []
    for rho in length.RHOS:
        for J0 in length.J0S:
            for i in range(n_inst):
                c = np.exp(rng.normal(np.log(3.0), 1.5))
                for T in cfg.Ts:
                    eta = c * T ** slope * np.exp(rng.normal(0.0, 0.1))  # one stream: the 1/|o| twin is T x raw
                    for norm in (False, True) if rho == length.IDENTITY_RHO else (False,):
                        status = ("collapsed_at_lo" if eta <= cfg.eta_lo else "none_in_range" if eta > cfg.eta_hi
                                  else "found")
                        e = {"found": eta, "collapsed_at_lo": cfg.eta_lo, "none_in_range": np.nan}[status]
                        rows.append({"instance": i, "seed": 0, "rho": rho, "J0": J0, "T": T, "normalized": norm,
                                     "status": status, "eta_star": e * (T if norm else 1.0)})
    return pd.DataFrame(rows)


def test_law_claims_from_censored_power_laws():
    """eta* = c_i / T with censoring at the scan ends: 12 instances give measured 90 % intervals around -1 that
    see the censored points; 6 instances are below the interval method's valid n: not measured, with why."""
    cfg = dataclasses.replace(length.Config.quick(), Ts=(1, 2, 4, 8, 16), eta_lo=0.2, eta_hi=8.0)
    res = _synthetic_results(12, np.random.default_rng(0), cfg=cfg)
    assert (res["status"] != "found").mean() > 0.1
    claims = {c.id: c for c in length.analyse(res, cfg, block="discovery")}
    c = claims[length.slope_claim_id(0.5, 0.1)]
    assert c.measured and c.confidence == 0.90 and c.form == "law" and c.n == 12
    assert c.interval[0] < -1.0 < c.interval[1] and c.verdict == "holds"
    assert claims[length.identity_claim_id(0.1)].verdict == "identity"
    few = {c.id: c for c in length.analyse(res[res["instance"] < 6], cfg, block="discovery")}
    c = few[length.slope_claim_id(0.5, 0.1)]
    assert not c.measured and c.reason.startswith("too few instances for a valid interval")


@pytest.mark.slow
def test_censored_interval_covers_at_the_gate_n():
    """The 90 % interval at the smallest n the claims allow (10 instances), 200 censored data sets with
    instance-specific slopes (sd 0.15): coverage within 0.05 of nominal (MC SE 0.021)."""
    rng = np.random.default_rng(5)
    hits = []
    for _ in range(200):
        x, y, code, inst = _censored_series(10, rng, sd_slope=0.15)
        e = censored_slope_estimate(x, y, censor=code, series=inst, instance=inst)
        hits.append(e.lo <= -0.8 <= e.hi)
    assert np.mean(hits) > 0.85


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
        (lambda: censored_within_slope([0.0, 1.0], [0.0, 1.0], [0, 0], [0, 2]), "censor"),
        (lambda: censored_within_slope([0.0, 1.0], [0.0, np.nan], [0, 0], [0, 0]), "finite"),
        (lambda: censored_within_slope([0.0, 1.0], [0.0, 1.0], [0, 0], [1, 1]), "identified"),
    ],
)
def test_bad_input(make, match):
    with pytest.raises(ValueError, match=match):
        make()
