"""gapdyn.evidence.stats against independent routes: exact coverage sums, enumeration, hand computations."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from scipy.stats import binom, binomtest, norm

import gapdyn as g
from tests.strategies import small_2x2_tables

Z95 = norm.ppf(0.975)


def exact_coverage(interval_fn, n, p):
    """Coverage of an interval for Binomial(n, p) by summing the pmf over covered k."""
    ks = np.arange(n + 1)
    covered = [interval_fn(int(k), n).lo <= p <= interval_fn(int(k), n).hi for k in ks]
    return float(binom.pmf(ks, n, p)[covered].sum())


@pytest.mark.parametrize("fn, floor", [(g.wilson_interval, 0.93), (g.clopper_pearson_interval, 0.95)])
@pytest.mark.parametrize("p", [0.1, 0.2, 0.3, 0.5])
def test_proportion_interval_coverage_by_simulation(fn, floor, p):
    n, draws = 50, 2000
    rng = np.random.default_rng(7)
    ks = rng.binomial(n, p, size=draws)
    table = [fn(k, n) for k in range(n + 1)]
    mc = np.mean([table[k].lo <= p <= table[k].hi for k in ks])
    exact = exact_coverage(fn, n, p)
    assert abs(mc - exact) <= 4 * math.sqrt(exact * (1 - exact) / draws) + 1e-12
    assert exact >= floor


def test_clopper_pearson_is_never_below_nominal_on_a_fine_grid():
    for p in np.linspace(0.01, 0.99, 49):
        assert exact_coverage(g.clopper_pearson_interval, 25, p) >= 0.95 - 1e-12


@given(st.integers(1, 200).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_endpoints_solve_the_score_equation(kn):
    k, n = kn
    e = g.wilson_interval(k, n)
    for q in (e.lo, e.hi):  # (k - n q)^2 = z^2 n q (1 - q) at both ends
        assert (k - n * q) ** 2 == pytest.approx(Z95**2 * n * q * (1 - q), rel=1e-7, abs=1e-7)
    assert e.lo <= k / n <= e.hi


@given(st.integers(1, 200).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_clopper_pearson_matches_binomtest_and_tail_equations(kn):
    k, n = kn
    e = g.clopper_pearson_interval(k, n)
    ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    assert (e.lo, e.hi) == pytest.approx((ref.low, ref.high), abs=1e-9)
    if k > 0:  # P(X >= k | lo) = alpha/2
        assert binom.sf(k - 1, n, e.lo) == pytest.approx(0.025, rel=1e-6)
    if k < n:  # P(X <= k | hi) = alpha/2
        assert binom.cdf(k, n, e.hi) == pytest.approx(0.025, rel=1e-6)


def test_bootstrap_of_a_mean_matches_the_analytic_standard_error():
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, size=400)
    e = g.cluster_bootstrap(np.mean, x, rng=np.random.default_rng(1), n_resamples=4000)
    half = Z95 * x.std(ddof=1) / math.sqrt(x.size)
    assert (e.hi - e.lo) / 2 == pytest.approx(half, rel=0.1)
    assert e.lo < x.mean() < e.hi and e.estimate == x.mean()


def test_cluster_bootstrap_resamples_instances_not_rows():
    """Random instance effect (sd 1) + row noise (sd 1), 40 instances x 10 seeds:
    SE of the grand mean = sqrt((1 + 1/10) / 40), far above the row-level SE."""
    rng = np.random.default_rng(2)
    n_inst, n_seed = 40, 10
    labels = np.repeat(np.arange(n_inst), n_seed)
    y = rng.normal(size=n_inst)[labels] + rng.normal(size=labels.size)
    clustered = g.cluster_bootstrap(np.mean, y, clusters=labels, rng=np.random.default_rng(3), n_resamples=3000)
    rows = g.cluster_bootstrap(np.mean, y, rng=np.random.default_rng(3), n_resamples=3000)
    se_cluster = np.std(y.reshape(n_inst, n_seed).mean(axis=1), ddof=1) / math.sqrt(n_inst)
    assert (clustered.hi - clustered.lo) / 2 == pytest.approx(Z95 * se_cluster, rel=0.15)
    assert clustered.n == n_inst and rows.n == labels.size
    assert rows.hi - rows.lo < 0.6 * (clustered.hi - clustered.lo)


def test_bootstrap_slope_matches_ols_standard_error():
    rng = np.random.default_rng(4)
    x = rng.uniform(0, 3, size=300)
    y = 1.5 * x + rng.normal(0, 0.5, size=x.size)
    e = g.bootstrap_slope(x, y, rng=np.random.default_rng(5), n_resamples=3000)
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - slope * x - intercept
    se = math.sqrt(resid @ resid / (x.size - 2) / np.sum((x - x.mean()) ** 2))
    assert e.estimate == pytest.approx(slope, rel=1e-12)
    assert (e.hi - e.lo) / 2 == pytest.approx(Z95 * se, rel=0.15)


def test_bootstrap_ratio_estimate_and_delta_method_width():
    rng = np.random.default_rng(6)
    num = rng.normal(2.0, 0.3, size=500)
    den = rng.normal(4.0, 0.3, size=500)
    e = g.bootstrap_ratio(num, den, rng=np.random.default_rng(7), n_resamples=3000)
    r = num.mean() / den.mean()
    se = r * math.sqrt(num.var(ddof=1) / num.mean() ** 2 / 500 + den.var(ddof=1) / den.mean() ** 2 / 500)
    assert e.estimate == pytest.approx(r)
    assert (e.hi - e.lo) / 2 == pytest.approx(Z95 * se, rel=0.15)


def brute_fisher(t):
    (a, b), (c, d) = t
    r1, c1, n = a + b, a + c, a + b + c + d
    pmf = {x: math.comb(c1, x) * math.comb(n - c1, r1 - x) / math.comb(n, r1)
           for x in range(max(0, r1 + c1 - n), min(r1, c1) + 1)}
    return sum(v for v in pmf.values() if v <= pmf[a] * (1 + 1e-7))


@given(small_2x2_tables())
def test_fisher_matches_hypergeometric_enumeration(t):
    assert g.fisher_exact_test(t).p_value == pytest.approx(min(1.0, brute_fisher(t)), rel=1e-9)


def brute_mcnemar(b, c):
    m = b + c
    pmf = [math.comb(m, j) / 2**m for j in range(m + 1)]
    return min(1.0, sum(v for v in pmf if v <= pmf[b] * (1 + 1e-7)))


@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=1, max_size=40))
def test_mcnemar_matches_sign_test_enumeration(pairs):
    x, y = np.array(pairs, dtype=float).T
    b, c = int(np.sum((x == 1) & (y == 0))), int(np.sum((x == 0) & (y == 1)))
    res = g.mcnemar_exact(x, y)
    assert res.n == b + c and res.statistic == b - c
    assert res.p_value == pytest.approx(1.0 if b + c == 0 else brute_mcnemar(b, c), rel=1e-9)


@given(st.lists(st.floats(-5, 5).filter(lambda v: abs(v) > 1e-3), min_size=2, max_size=10, unique=True))
def test_wilcoxon_matches_sign_flip_enumeration(diffs):
    d = np.array(diffs)
    assume(len(set(np.round(np.abs(d), 9))) == d.size)  # the exact null needs distinct |d|
    ranks = np.argsort(np.argsort(np.abs(d))) + 1
    t_obs = ranks[d > 0].sum()
    t_all = np.array([sum(r for r, s in zip(ranks, signs) if s) for signs in itertools.product([0, 1], repeat=d.size)])
    p = min(1.0, 2 * min(np.mean(t_all <= t_obs), np.mean(t_all >= t_obs)))
    assert g.wilcoxon_signed_rank(d, np.zeros_like(d)).p_value == pytest.approx(p, rel=1e-9)


def test_paired_bootstrap_difference_is_the_mean_difference():
    rng = np.random.default_rng(8)
    x = rng.normal(size=200)
    y = x - 0.5 + 0.1 * rng.normal(size=200)
    e = g.paired_bootstrap_difference(x, y, rng=np.random.default_rng(9))
    assert e.estimate == pytest.approx(np.mean(x - y))
    assert (e.hi - e.lo) / 2 == pytest.approx(Z95 * np.std(x - y, ddof=1) / math.sqrt(200), rel=0.15)


def test_holm_by_hand():
    # sorted: 0.005*4=0.02, 0.01*3=0.03, 0.03*2=0.06, 0.04*1=0.04 -> running max 0.06
    adj = g.holm_adjust([0.01, 0.04, 0.03, 0.005])
    np.testing.assert_allclose(adj, [0.03, 0.06, 0.06, 0.02])
    np.testing.assert_allclose(g.holm_adjust([0.5, 0.9]), [1.0, 1.0])


@given(st.lists(st.floats(0, 1), min_size=1, max_size=12))
def test_holm_matches_the_step_down_loop(ps):
    m = len(ps)
    order = sorted(range(m), key=lambda i: (ps[i], i))
    expected, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        expected[i] = running
    adj = g.holm_adjust(ps)
    np.testing.assert_allclose(adj, expected)
    assert np.all(adj >= np.array(ps) - 1e-15)


@given(st.lists(st.integers(0, 6), min_size=1, max_size=25), st.lists(st.integers(0, 6), min_size=1, max_size=25))
def test_auc_matches_pair_counting(pos, neg):
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    e = g.roc_auc(pos, neg)
    assert e.estimate == pytest.approx(wins / (len(pos) * len(neg)))
    assert 0 <= e.lo <= e.estimate <= e.hi <= 1


def test_hanley_mcneil_width_matches_the_simulated_spread():
    rng = np.random.default_rng(10)
    aucs = [g.roc_auc(rng.normal(1.0, 1, 60), rng.normal(0.0, 1, 60)).estimate for _ in range(600)]
    e = g.roc_auc(rng.normal(1.0, 1, 60), rng.normal(0.0, 1, 60))
    assert (e.hi - e.lo) / 2 / Z95 == pytest.approx(np.std(aucs), rel=0.2)


@pytest.mark.parametrize("call, name", [
    (lambda: g.wilson_interval(3, 0), "n"),
    (lambda: g.wilson_interval(5, 4), "k"),
    (lambda: g.clopper_pearson_interval(1, 4, confidence=1.0), "confidence"),
    (lambda: g.fisher_exact_test([[1, 2], [3, -1]]), "table"),
    (lambda: g.fisher_exact_test([[1, 2, 3], [3, 1, 1]]), "table"),
    (lambda: g.mcnemar_exact([1, 0, 2], [0, 0, 1]), "binary"),
    (lambda: g.mcnemar_exact([1, 0], [0, 0, 1]), "paired"),
    (lambda: g.holm_adjust([0.1, 1.2]), "p_values"),
    (lambda: g.cluster_bootstrap(np.mean, np.ones(5), rng=None), "rng"),
    (lambda: g.cluster_bootstrap(np.mean, np.ones(5), rng=np.random.default_rng(), n_resamples=10), "n_resamples"),
    (lambda: g.cluster_bootstrap(np.mean, np.ones(5), clusters=np.zeros(5), rng=np.random.default_rng()), "clusters"),
    (lambda: g.bootstrap_slope([1, 2, 3], [1, 2], rng=np.random.default_rng()), "x and y"),
    (lambda: g.roc_auc([], [1.0]), "scores_pos"),
])
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_one_sided_fisher_equals_the_hypergeometric_tail():
    """'greater': P(a' >= a) and 'less': P(a' <= a) for a' hypergeometric with the table's margins."""
    from math import comb

    from gapdyn import fisher_exact_test

    for a, b, c, d in ((5, 2, 2, 5), (0, 7, 3, 4), (6, 1, 6, 1), (3, 3, 1, 5)):
        n1, k, n = a + b, a + c, a + b + c + d
        pmf = {x: comb(k, x) * comb(n - k, n1 - x) / comb(n, n1) for x in range(max(0, n1 + k - n), min(n1, k) + 1)}
        greater = sum(v for x, v in pmf.items() if x >= a)
        less = sum(v for x, v in pmf.items() if x <= a)
        assert abs(fisher_exact_test([[a, b], [c, d]], alternative="greater").p_value - greater) < 1e-12
        assert abs(fisher_exact_test([[a, b], [c, d]], alternative="less").p_value - less) < 1e-12
