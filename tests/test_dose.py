"""gapdyn.evidence.dose: the logistic dose-response fit and its profile-likelihood interval, against independent routes."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize, minimize_scalar
from scipy.special import expit, logit
from scipy.stats import chi2

from gapdyn.evidence.dose import fit_dose_response

LRS = np.repeat([1e-4, 2e-4, 2.5e-4, 3e-4, 3.5e-4, 4e-4, 5e-4], 6)


def _data(seed: int, center: float = 3e-4, slope: float = 12.0):
    rng = np.random.default_rng(seed)
    return (rng.random(LRS.size) < expit(slope * (np.log10(LRS) - np.log10(center)))).astype(int)


def _nll_ab(theta, x, y):  # the usual (intercept, slope) parametrisation, written independently
    z = theta[0] + theta[1] * x
    return np.sum(np.log1p(np.exp(-np.abs(z))) + np.maximum(z, 0) - y * z)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_point_estimate_matches_the_intercept_slope_fit(p):
    x, y = np.log10(LRS), _data(1)
    r = minimize(_nll_ab, x0=[0.0, 1.0], args=(x, y), method="Nelder-Mead",
                 options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 20000})
    a, b = r.x
    fit = fit_dose_response(LRS, y, p=p)
    assert not fit.separated and fit.bounded_lo and fit.bounded_hi
    assert np.log10(fit.lr) == pytest.approx((logit(p) - a) / b, abs=1e-4)
    assert fit.slope == pytest.approx(b, rel=1e-3)
    assert fit.lo < fit.lr < fit.hi and fit.n == LRS.size and fit.events == y.sum()


def test_interval_ends_sit_on_the_chi_square_cut():
    x, y = np.log10(LRS), _data(2)
    dmin = minimize(_nll_ab, x0=[0.0, 1.0], args=(x, y), method="Nelder-Mead",
                    options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 20000}).fun
    fit = fit_dose_response(LRS, y, p=0.5)
    for end in (fit.lo, fit.hi):  # profile at a fixed x_p: logit P = b (x - x_p), minimised over b by another route
        prof = minimize_scalar(lambda b: _nll_ab([-b * np.log10(end), b], x, y), bounds=(0, 200), method="bounded",
                               options={"xatol": 1e-9}).fun
        assert prof - dmin == pytest.approx(0.5 * chi2.ppf(0.95, 1), abs=1e-4)


def test_complete_separation_gives_the_gap_middle_and_a_finite_interval():
    fit = fit_dose_response([1e-4, 1e-4, 2e-4, 4e-4, 4e-4], [0, 0, 0, 1, 1])
    assert fit.separated and fit.lr == pytest.approx(np.sqrt(2e-4 * 4e-4))
    assert fit.lo <= 2e-4 and fit.hi >= 4e-4 and fit.bounded_lo and fit.bounded_hi


def test_no_event_leaves_lr_p_above_the_data():
    fit = fit_dose_response([1e-4, 2e-4, 3e-4], [0, 0, 0])
    assert np.isnan(fit.lr) and fit.lo > 1e-4 and not fit.bounded_hi


@pytest.mark.parametrize("lrs, events, match", [([1e-4, -1.0], [0, 1], "finite"), ([1e-4], [2], "0 or 1"),
                                                ([1e-4, 2e-4], [0], "one length"), ([], [], "one length")])
def test_bad_input_is_one_line(lrs, events, match):
    with pytest.raises(ValueError, match=match):
        fit_dose_response(lrs, events)


@pytest.mark.slow
def test_interval_coverage_by_simulation():
    """The 95 % profile interval of lr50 covers the true value in about 95 % of simulated studies."""
    truth, hits = np.log10(3e-4), 0
    n = 200
    for seed in range(n):
        fit = fit_dose_response(LRS, _data(100 + seed), p=0.5)
        hits += fit.lo <= 10 ** truth <= fit.hi
    assert 0.90 <= hits / n <= 0.99
