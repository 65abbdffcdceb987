"""gapdyn.evidence.planner: power formulas against Monte Carlo simulation of the same interval rule, and the planner on
known effects."""

import numpy as np
import pytest
from scipy import stats

from gapdyn.evidence import planner as pl

RNG = np.random.default_rng(20261201)


def _mc_mean(effect, sd, n, value, reps=4000):
    x = RNG.normal(effect, sd, size=(reps, n))
    m, s = x.mean(1), x.std(1, ddof=1)
    h = stats.t.ppf(0.975, n - 1) * s / np.sqrt(n)
    return np.mean((m - h > value) | (m + h < value))


@pytest.mark.parametrize("effect, sd, n", [(0.5, 1.0, 10), (0.2, 1.0, 40), (-0.3, 0.5, 8), (0.0, 1.0, 20)])
def test_power_mean_matches_simulation(effect, sd, n):
    mc = _mc_mean(effect, sd, n, 0.0)
    assert pl.power_mean(effect, sd, n) == pytest.approx(mc, abs=4 * np.sqrt(0.25 / 4000) + 1e-3)


def test_power_mean_is_alpha_at_the_null_and_grows_with_n():
    assert pl.power_mean(0.0, 1.0, 30) == pytest.approx(0.05, abs=1e-9)
    pw = [pl.power_mean(0.3, 1.0, n) for n in (10, 20, 40, 80)]
    assert all(a < b for a, b in zip(pw, pw[1:]))


def test_planner_finds_the_textbook_n_for_half_an_sd():
    """d = 0.5, two-sided 5 %, 80 % power: n = 34 for the one-sample t-test (Cohen 1988, Table 2.4.1 gives 33-34)."""
    plan = pl.plan_n(lambda n: pl.power_mean(0.5, 1.0, n), n_min=2)
    assert plan.decidable and plan.n == 34 and plan.power >= 0.8
    assert pl.power_mean(0.5, 1.0, 33) < 0.8


def test_undecidable_within_budget_says_so():
    plan = pl.plan_n(lambda n: pl.power_mean(0.01, 1.0, n), n_max=60)
    assert not plan.decidable and plan.n == 60 and "not decidable within the budget" in plan.reason


def test_power_equivalence_matches_simulation():
    effect, sd, n, lo, hi, reps = -0.95, 0.3, 12, -1.25, -0.75, 4000
    x = RNG.normal(effect, sd, size=(reps, n))
    m, s = x.mean(1), x.std(1, ddof=1)
    h = stats.t.ppf(0.95, n - 1) * s / np.sqrt(n)
    mc = np.mean(((m - h >= lo) & (m + h <= hi)) | (m + h < lo) | (m - h > hi))
    assert pl.power_equivalence(effect, sd, n, lo=lo, hi=hi) == pytest.approx(mc, abs=0.035)


def test_power_proportion_matches_simulation():
    p, n, value = 0.02, 60, 0.1
    k = RNG.binomial(n, p, size=20000)
    lo = np.where(k == 0, 0, stats.beta.ppf(0.05, k, n - k + 1))
    hi = np.where(k == n, 1, stats.beta.ppf(0.95, k + 1, n - k))
    mc = np.mean((lo > value) | (hi < value))
    assert pl.power_proportion(p, n, value=value, one_sided=True) == pytest.approx(mc, abs=0.015)


def test_power_two_proportions_matches_fisher_on_simulated_tables():
    pa, pb, n, reps = 0.6, 0.2, 25, 1500
    ka, kb = RNG.binomial(n, pa, reps), RNG.binomial(n, pb, reps)
    p = np.array([stats.fisher_exact([[a, n - a], [b, n - b]], alternative="greater").pvalue for a, b in zip(ka, kb)])
    assert pl.power_two_proportions(pa, pb, n) == pytest.approx(np.mean(p < 0.05), abs=0.04)
    assert pl.power_two_proportions(0.3, 0.3, n) <= 0.05  # exact test: size at most alpha


@pytest.mark.parametrize("call, name", [
    (lambda: pl.power_mean(0.1, 0.0, 10), "sd"),
    (lambda: pl.power_mean(0.1, 1.0, 1), "n"),
    (lambda: pl.power_proportion(1.5, 10, value=0.1), "p"),
    (lambda: pl.power_equivalence(0.0, 1.0, 10, lo=1.0, hi=0.0), "band"),
    (lambda: pl.plan_n(3), "power_at"),
    (lambda: pl.plan_n(lambda n: 0.5, n_min=30, n_max=20), "n_max"),
])
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_power_mean_far_in_the_tail_is_a_probability():
    """scipy's noncentral t returns NaN for |delta| >> the critical value; power_mean then still gives a
    probability, near 1 where a Monte Carlo of the t interval decides every time."""
    import numpy as np

    from gapdyn.evidence.planner import power_mean

    for n in (2, 3, 5):
        p = power_mean(0.109, 0.006, n, confidence=0.95)
        assert 0.0 <= p <= 1.0
    rng = np.random.default_rng(0)
    from scipy.stats import t as t_dist

    x = rng.normal(0.109, 0.006, size=(4000, 3))
    half = t_dist.ppf(0.975, 2) * x.std(axis=1, ddof=1) / np.sqrt(3)
    mc = float(np.mean(x.mean(axis=1) - half > 0))
    assert abs(power_mean(0.109, 0.006, 3, confidence=0.95) - mc) < 0.02
