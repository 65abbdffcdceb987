"""gapdyn.evidence.stats.fieller_paired_ratio against a brute-force inversion of the paired t test, and its coverage kind
(gapdyn.evidence.coverage, kind "paired_ratio") against a plain loop."""

import math

import numpy as np
import pytest
from scipy.stats import t

from gapdyn.evidence import coverage as cov
from gapdyn.evidence.stats import fieller_paired_ratio


def not_rejected(num, den, rhos, confidence):
    """The rhos at which the two-sided paired t test of num - rho den keeps H0: mean 0 (one t statistic per rho)."""
    d = num[None, :] - rhos[:, None] * den[None, :]
    n = num.size
    tstat = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))
    return rhos[np.abs(tstat) <= t.ppf(0.5 + confidence / 2, n - 1)]


@pytest.mark.parametrize("confidence", [0.95, 0.8])
def test_fieller_is_the_set_of_ratios_the_paired_t_test_keeps(confidence):
    rng = np.random.default_rng(7)
    for _ in range(10):
        n = int(rng.integers(3, 40))
        den = rng.gamma(3.0, 15.0, n) + 5.0
        num = rng.uniform(0.1, 1.5) * den + rng.normal(0, rng.uniform(1, 15), n)
        est = fieller_paired_ratio(num, den, confidence=confidence)
        step = 2e-4
        grid = np.arange(est.estimate - 3.0, est.estimate + 3.0, step)
        kept = not_rejected(num, den, grid, confidence)
        assert kept.size and kept.min() > grid[0] and kept.max() < grid[-1]  # bounded, inside the grid
        assert kept.max() - kept.min() == pytest.approx(kept.size * step - step, abs=2 * step)  # one interval
        assert est.lo == pytest.approx(kept.min(), abs=step) and est.hi == pytest.approx(kept.max(), abs=step)
        assert est.estimate == pytest.approx(num.mean() / den.mean(), rel=1e-12)
        assert (est.n, est.confidence) == (n, confidence)


def test_fieller_refuses_an_unbounded_set_and_bad_input_by_name():
    rng = np.random.default_rng(1)
    den = rng.normal(0.0, 1.0, 10)  # mean(den) indistinguishable from 0
    with pytest.raises(ValueError, match="unbounded"):
        fieller_paired_ratio(den + 1.0, den)
    with pytest.raises(ValueError, match="num and den"):
        fieller_paired_ratio([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="num and den"):
        fieller_paired_ratio([1.0], [2.0])
    with pytest.raises(ValueError, match="confidence"):
        fieller_paired_ratio([1.0, 2.0, 3.0], [2.0, 2.5, 4.0], confidence=1.5)


def test_paired_ratio_coverage_equals_a_plain_loop_over_the_same_draws():
    """coverage_table's paired-ratio cell = the share of data sets (drawn by draw_pairs from the same child stream)
    whose Fieller interval holds the true ratio 2/9; on normal pairs that share is nominal within MC error."""
    reps, n = 60, 12
    tab = cov.coverage_table(["fieller_paired_ratio"], ns=(n,), reps=reps, rng=np.random.default_rng(5),
                             dgps=("normal rho=0.5", "gamma-Poisson counts"))
    stream = np.random.default_rng(5).spawn(4)[3]
    for r in tab.itertuples():
        x, y, truth = cov.draw_pairs("paired_ratio", r.dgp, n, reps * cov.VECTORISED_REPS_FACTOR, stream)
        ests = [fieller_paired_ratio(x[i], y[i]) for i in range(x.shape[0])]
        hits = [e.lo <= truth <= e.hi for e in ests]
        assert r.reps == reps * cov.VECTORISED_REPS_FACTOR and r.coverage == pytest.approx(np.mean(hits), abs=1e-12)
        assert truth == pytest.approx(x.mean() / y.mean(), rel=0.02)  # the stated truth is the DGP's
    normal = tab[tab["dgp"] == "normal rho=0.5"].iloc[0]
    assert abs(normal.coverage - 0.95) <= 4 * math.sqrt(0.95 * 0.05 / normal.reps)
