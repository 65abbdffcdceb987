"""Intervals with measured coverage (gapdyn.evidence.stats, gapdyn.evidence.coverage) against independent routes:
hand formulas, plain loops over the same draws, scipy's one-sided tests, exact binomial sums vs simulation."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import beta, binom, binomtest, norm, t

from hypothesis import given

from gapdyn.evidence import coverage as cov
from gapdyn.evidence import stats as S
from tests.strategies import two_arm_counts


def clustered(G=8, m=5, seed=0):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(G), m)
    x = rng.normal(size=G * m)
    y = rng.normal(size=G)[labels] + (1 + 0.3 * rng.normal(size=G))[labels] * x + 0.5 * rng.normal(size=G * m)
    return x, y, labels


# --- interval methods -----------------------------------------------------------------------------------


def test_t_interval_of_cluster_means_by_hand():
    x, y, labels = clustered(G=7, m=3)
    labels = np.array([f"inst{j}" for j in labels])  # any hashable labels
    means = np.array([y[labels == f"inst{j}"].mean() for j in range(7)])
    se = means.std(ddof=1) / math.sqrt(7)
    e = S.t_interval_cluster_means(y, labels)
    assert e.estimate == pytest.approx(means.mean()) and e.n == 7
    assert (e.lo, e.hi) == pytest.approx((means.mean() - t.ppf(0.975, 6) * se, means.mean() + t.ppf(0.975, 6) * se))
    up = S.t_interval_cluster_means(y, labels, bound="upper")  # one-sided 95 % = upper end of two-sided 90 %
    assert up.lo == -math.inf and up.hi == pytest.approx(S.t_interval_cluster_means(y, labels, confidence=0.9).hi)
    low = S.t_interval_cluster_means(y, labels, bound="lower")
    assert low.hi == math.inf and low.lo == pytest.approx(means.mean() - t.ppf(0.95, 6) * se)


def test_studentized_bootstrap_equals_a_plain_loop_over_the_same_draws():
    _, y, labels = clustered(G=6, m=4)
    e = S.studentized_cluster_bootstrap_mean(y, labels, rng=np.random.default_rng(5), n_resamples=499)
    m = np.array([y[labels == j].mean() for j in range(6)])
    se = m.std(ddof=1) / math.sqrt(6)
    draws = np.random.default_rng(5).integers(0, 6, size=(499, 6))
    ts = []
    for row in draws:
        r = m[row]
        s = r.std(ddof=1) / math.sqrt(6)
        d = r.mean() - m.mean()
        if s > 0:
            ts.append(d / s)
        elif d != 0:  # one repeated cluster: t* = +-inf stays in
            ts.append(math.copysign(math.inf, d))
    ts = np.sort(ts)
    k_lo, k_hi = math.ceil(0.025 * ts.size) - 1, math.ceil(0.975 * ts.size) - 1  # inverted-cdf order statistics
    assert (e.lo, e.hi) == pytest.approx((m.mean() - ts[k_hi] * se, m.mean() - ts[k_lo] * se))


def test_generic_bca_equals_the_vectorised_routes_on_the_same_draws():
    x, y, labels = clustered(G=9, m=4)
    fast = S.bca_cluster_mean(y, labels, rng=np.random.default_rng(3), n_resamples=499)
    slow = S.bca_cluster_bootstrap(np.mean, y, clusters=labels, rng=np.random.default_rng(3), n_resamples=499)
    assert (fast.lo, fast.hi, fast.estimate) == pytest.approx((slow.lo, slow.hi, slow.estimate), rel=1e-10)
    fast = S.bca_cluster_slope(x, y, labels, rng=np.random.default_rng(4), n_resamples=499)
    slow = S.bca_cluster_bootstrap(S.ols_slope, x, y, clusters=labels, rng=np.random.default_rng(4), n_resamples=499)
    assert (fast.lo, fast.hi, fast.estimate) == pytest.approx((slow.lo, slow.hi, slow.estimate), rel=1e-10)


def test_bca_of_a_mean_matches_efrons_formulas():
    """z0 = Φ⁻¹(#{θ* < θ̂}/B), a = Σ d³ / (6 (Σ d²)^{3/2}) with jackknife d = θ̄₍.₎ - θ₍ᵢ₎,
    limits at the quantiles Φ(z0 + (z0 + z)/(1 - a (z0 + z))) of the same resamples (Efron 1987)."""
    y = np.random.default_rng(8).lognormal(size=15)
    B = 1999
    e = S.bca_cluster_mean(y, rng=np.random.default_rng(9), n_resamples=B)
    reps = y[np.random.default_rng(9).integers(0, 15, size=(B, 15))].mean(axis=1)
    z0 = norm.ppf(np.mean(reps < y.mean()))
    jack = (y.sum() - y) / 14
    d = jack.mean() - jack
    a = (d**3).sum() / (6 * (d**2).sum() ** 1.5)
    q = [norm.cdf(z0 + (z0 + z) / (1 - a * (z0 + z))) for z in norm.ppf([0.025, 0.975])]
    lo, hi = np.quantile(reps, q)
    assert (e.lo, e.hi) == pytest.approx((lo, hi), abs=0.01 * (hi - lo))


def test_wild_bootstrap_point_estimate_se_and_draws_against_loops():
    x, y, labels = clustered(G=6, m=5)
    e = S.wild_cluster_bootstrap_slope(x, y, labels, rng=np.random.default_rng(0), n_resamples=199)
    assert e.estimate == pytest.approx(S.ols_slope(x, y), rel=1e-12)
    assert e.estimate == pytest.approx(np.polyfit(x, y, 1)[0], rel=1e-10)

    def ols_cr1(yy):  # textbook sandwich, one cluster at a time
        X = np.stack([np.ones_like(x), x], axis=1)
        bread = np.linalg.inv(X.T @ X)
        b = bread @ X.T @ yy
        u = yy - X @ b
        meat = sum(np.outer(X[labels == g].T @ u[labels == g], X[labels == g].T @ u[labels == g]) for g in range(6))
        N = x.size
        V = 6 / 5 * (N - 1) / (N - 2) * bread @ meat @ bread
        return b, u, math.sqrt(V[1, 1])

    b, u, se = ols_cr1(y)
    assert S.cr1_slope(x, y, labels) == pytest.approx((b[1], se), rel=1e-10)
    v = S.wild_weights("webb", (5, 6), np.random.default_rng(1))
    _, se_fast, t_fast = S._wild_t_draws(x, y, 6, labels, v)
    assert se_fast == pytest.approx(se, rel=1e-10)
    for row, t_row in zip(v, t_fast):
        b_star, _, se_star = ols_cr1(y - u + row[labels] * u)
        assert t_row == pytest.approx((b_star[1] - b[1]) / se_star, rel=1e-9)


@pytest.mark.parametrize("kind, support", [("rademacher", {-1.0, 1.0}),
                                           ("webb", {s * math.sqrt(q) for s in (-1, 1) for q in (0.5, 1, 1.5)})])
def test_wild_weights_have_mean_zero_variance_one(kind, support):
    v = S.wild_weights(kind, 60000, np.random.default_rng(2))
    assert set(np.round(np.unique(v), 12)) == {round(s, 12) for s in support}
    assert abs(v.mean()) < 4 / math.sqrt(v.size) and v.var() == pytest.approx(1.0, abs=0.02)
    assert np.mean(list(support)) == pytest.approx(0) and np.mean([s * s for s in support]) == pytest.approx(1)


def test_clopper_pearson_upper_against_beta_and_the_one_sided_binomial_test():
    for n in (1, 7, 20, 60):
        for k in range(n + 1):
            e = S.clopper_pearson_upper(k, n, confidence=0.9)
            assert e.lo == 0.0 and e.estimate == k / n
            assert e.hi == pytest.approx(1.0 if k == n else beta.ppf(0.9, k + 1, n - k))
            ref = binomtest(k, n, alternative="less").proportion_ci(confidence_level=0.9, method="exact")
            assert e.hi == pytest.approx(ref.high, abs=1e-9)
    ks = np.arange(26)  # exact one-sided coverage P(p <= hi) >= 0.95 for every p
    his = np.array([S.clopper_pearson_upper(int(k), 25).hi for k in ks])
    for p in np.linspace(0.005, 0.995, 67):
        assert binom.pmf(ks, 25, p)[p <= his].sum() >= 0.95 - 1e-12


def test_percentile_twins_equal_the_loop_bootstrap():
    x, y, labels = clustered(G=7, m=5)
    for B in (100, 333):
        loop = S.cluster_bootstrap(np.mean, y, clusters=labels, rng=np.random.default_rng(B), n_resamples=B)
        fast = cov._percentile_cluster_mean(y, labels, np.random.default_rng(B), B)
        assert (fast.estimate, fast.lo, fast.hi) == pytest.approx((loop.estimate, loop.lo, loop.hi), rel=1e-12)
        loop = S.bootstrap_slope(x, y, clusters=labels, rng=np.random.default_rng(B), n_resamples=B)
        fast = cov._percentile_cluster_slope(x, y, labels, np.random.default_rng(B), B)
        assert (fast.estimate, fast.lo, fast.hi) == pytest.approx((loop.estimate, loop.lo, loop.hi), rel=1e-10)


@pytest.mark.parametrize("call, match", [
    (lambda: S.t_interval_cluster_means([1.0, 2.0], [0, 0]), "clusters"),
    (lambda: S.t_interval_cluster_means([1.0, 2.0, 3.0], [0, 1]), "clusters"),
    (lambda: S.t_interval_cluster_means([1.0, np.nan], None), "values"),
    (lambda: S.t_interval_cluster_means([1.0, 2.0], None, bound="both"), "bound"),
    (lambda: S.t_interval_cluster_means([1.0, 2.0], None, confidence=1.0), "confidence"),
    (lambda: S.studentized_cluster_bootstrap_mean([1.0, 2.0], rng=0), "rng"),
    (lambda: S.bca_cluster_mean([1.0, 2.0, 3.0], rng=np.random.default_rng(), n_resamples=10), "n_resamples"),
    (lambda: S.bca_cluster_bootstrap(np.mean, rng=np.random.default_rng()), "arrays"),
    (lambda: S.bca_cluster_mean([1.0, 1.0, 1.0], rng=np.random.default_rng()), "BCa"),
    (lambda: S.wild_cluster_bootstrap_slope([1.0, 1.0, 1.0], [1.0, 2.0, 3.0], [0, 1, 2],
                                            rng=np.random.default_rng()), "x must not be constant"),
    (lambda: S.wild_cluster_bootstrap_slope([1.0, 2.0, 3.0], [1.0, 2.0], [0, 1, 2],
                                            rng=np.random.default_rng()), "paired"),
    (lambda: S.wild_cluster_bootstrap_slope([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [0, 1, 2],
                                            rng=np.random.default_rng(), weights="mammen"), "weights"),
    (lambda: S.clopper_pearson_upper(5, 4), "k"),
    (lambda: S.clopper_pearson_upper(1.5, 4), "k"),
])
def test_bad_input_raises_a_named_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- the coverage measurement ---------------------------------------------------------------------------


def test_coverage_at_40_normal_clusters_is_nominal_within_monte_carlo_error():
    tab = cov.coverage_table(["t_cluster_means", "wild_webb_slope", "t_cluster_means_upper"], ns=(40,), reps=240,
                             rng=np.random.default_rng(11), n_resamples=199, dgps=("normal", "random_slope"))
    assert set(tab["dgp"]) == {"normal", "random_slope"}
    for r in tab.itertuples():
        assert abs(r.coverage - 0.95) <= 3.5 * math.sqrt(0.95 * 0.05 / 240), r


def test_exact_proportion_coverage_agrees_with_simulation():
    tab = cov.coverage_table(["wilson", "clopper_pearson_upper"], ns=(13,), rng=np.random.default_rng(0))
    rng = np.random.default_rng(1)
    for r in tab.itertuples():
        p = float(r.dgp.split("=")[1])
        ks = rng.binomial(13, p, size=4000)
        fn = cov.COVERAGE_METHODS[r.method].interval
        table = [fn(k, 13) for k in range(14)]
        hit = [(table[k].lo <= p or r.bound == "upper") and p <= table[k].hi for k in ks]
        assert abs(np.mean(hit) - r.coverage) <= 4 * math.sqrt(max(r.coverage * (1 - r.coverage), 1e-4) / 4000)


def constructed_table():
    rows = []
    cells = {"a": {4: (0.80, 0.95), 8: (0.94, 0.96), 20: (0.931, 0.95), 40: (0.95, 0.95)},  # valid from 8
             "b": {4: (0.95, 0.95), 8: (0.92, 0.95), 20: (0.95, 0.95), 40: (0.96, 0.95)},  # dips at 8: from 20
             "c": {4: (0.90, 0.95), 8: (0.90, 0.95), 20: (0.92, 0.95), 40: (0.929, 0.95)}}  # never
    for m, by_n in cells.items():
        for n, (c1, c2) in by_n.items():
            rows += [dict(method=m, n=n, dgp=d, coverage=c, nominal=0.95) for d, c in (("d1", c1), ("d2", c2))]
    return pd.DataFrame(rows)


def test_valid_at_and_min_valid_n_on_a_constructed_table():
    tab = constructed_table()
    assert [cov.valid_at("a", n, tab) for n in (3, 4, 8, 10, 20, 40, 100)] == [False, False, True, True, True, True,
                                                                              True]
    assert [cov.valid_at("b", n, tab) for n in (4, 8, 19, 20)] == [True, False, False, True]
    assert cov.min_valid_n("a", tab) == 8 and cov.min_valid_n("b", tab) == 20 and cov.min_valid_n("c", tab) is None
    assert cov.min_valid_n("c", tab, tol=0.03) == 20 and cov.valid_at("a", 4, tab, tol=0.15)
    with pytest.raises(ValueError, match="method"):
        cov.valid_at("zzz", 10, tab)
    with pytest.raises(ValueError, match="tol"):
        cov.min_valid_n("a", tab, tol=-0.1)


# --- the committed table is current -------------------------------------------------------------------


def test_frozen_table_holds_every_method_dgp_and_n():
    tab = cov.frozen_table()
    expected = {(m.name, d, n) for m in cov.COVERAGE_METHODS.values() for d in cov.DGPS[m.kind]
                for n in cov.NS_BY_KIND[m.kind]
                if cov._vectorised(m.name) is not None or d not in cov.HARDER_DGPS.get(m.kind, ())}
    assert set(zip(tab["method"], tab["dgp"], tab["n"])) == expected and len(tab) == len(expected)
    for m in cov.COVERAGE_METHODS.values():
        rows = tab[tab["method"] == m.name]
        assert set(rows["kind"]) == {m.kind} and set(rows["bound"]) == {m.bound}


def test_frozen_proportion_cells_are_current_exactly():
    tab = cov.frozen_table()
    frozen = tab[tab["kind"] == "proportion"].reset_index(drop=True)
    names = list(dict.fromkeys(frozen["method"]))
    fresh = cov.coverage_table(names, ns=cov.NS, rng=np.random.default_rng(0))
    merged = frozen.merge(fresh, on=["method", "dgp", "n"], suffixes=("_frozen", "_fresh"))
    assert len(merged) == len(frozen)
    assert np.allclose(merged["coverage_frozen"], merged["coverage_fresh"], atol=1e-9)
    assert np.allclose(merged["mean_width_frozen"], merged["mean_width_fresh"], atol=1e-9)


@pytest.mark.parametrize("method, dgp, n, reps", [("t_cluster_means", "lognormal", 8, 1000),
                                                  ("wild_webb_slope", "random_slope", 10, 400),
                                                  ("bca_cluster_mean", "correlated", 4, 200),
                                                  ("percentile_paired_difference", "p_a=0.1 p_b=0", 20, 400),
                                                  ("fieller_paired_ratio", "gamma-Poisson counts", 8, 100)])
def test_frozen_simulated_cell_is_current_within_monte_carlo_error(method, dgp, n, reps):
    tab = cov.frozen_table()
    row = tab[(tab["method"] == method) & (tab["dgp"] == dgp) & (tab["n"] == n)].iloc[0]
    fresh = cov.coverage_table([method], ns=(n,), reps=reps, rng=np.random.default_rng(12345), dgps=(dgp,),
                               n_resamples=int(row.n_resamples)).iloc[0]
    se = math.hypot(row.mc_se, fresh.mc_se)
    assert abs(fresh.coverage - row.coverage) <= 4 * se, (fresh.coverage, row.coverage)


@pytest.mark.slow
def test_full_regeneration_reproduces_the_committed_table():
    tab = cov.frozen_table()
    fresh = cov.coverage_table(reps=cov.base_reps(tab), rng=np.random.default_rng(int(tab["seed"].iloc[0])),
                               n_resamples=int(tab["n_resamples"].max()), seed=int(tab["seed"].iloc[0]))
    assert list(fresh["method"]) == list(tab["method"]) and list(fresh["n"]) == list(tab["n"])
    assert np.allclose(fresh["coverage"], tab["coverage"], atol=1.5 / cov.base_reps(tab))


def test_markdown_states_every_method_and_its_verdict():
    tab = cov.frozen_table()
    md = cov.coverage_markdown(tab, command="python -m gapdyn.evidence.coverage --out docs/coverage.md")
    verdicts = {}
    for line in md.splitlines():  # | kind | `method` | bound | nominal | valid from n | per DGP |
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 6 and cells[0] in cov.KINDS:
            verdicts[cells[1].strip("`")] = cells[4]
    assert set(verdicts) == set(cov.COVERAGE_METHODS)
    for m, text in verdicts.items():
        v = cov.min_valid_n(m, tab)
        assert text == str(v) if v is not None else text.startswith("never")


# --- proportions of runs nested in instances ---------------------------------------------------------------


def test_cluster_bounds_proportion_by_hand():
    rng = np.random.default_rng(3)
    labels = np.repeat(np.arange(9), 6)
    events = (rng.random(labels.size) < np.repeat(rng.choice([0.0, 0.3, 1.0], 9), 6)).astype(int)
    e = S.cluster_bounds_proportion(events, labels)
    shares = [events[labels == g].mean() for g in range(9)]
    k_all, k_any = sum(s == 1 for s in shares), sum(s > 0 for s in shares)
    lo = 0.0 if k_all == 0 else beta.ppf(0.025, k_all, 9 - k_all + 1)
    hi = 1.0 if k_any == 9 else beta.ppf(0.975, k_any + 1, 9 - k_any)
    assert (e.estimate, e.lo, e.hi, e.n) == pytest.approx((np.mean(shares), lo, hi, 9))
    with pytest.raises(ValueError, match="0/1"):
        S.cluster_bounds_proportion(np.array([0, 2]), np.array([0, 1]))


def test_cluster_bounds_cover_under_perfect_correlation_where_pooling_does_not():
    """All-or-none instances (intra-cluster correlation 1): the pooled interval treats 16 G runs as independent."""
    rng = np.random.default_rng(11)
    events, labels, p = cov.draw_clustered_events("all-or-none p=0.05", 20, 400, rng)
    hit_b = np.mean([(lambda e: e.lo <= p <= e.hi)(S.cluster_bounds_proportion(ev, labels)) for ev in events])
    hit_p = np.mean([(lambda e: e.lo <= p <= e.hi)(S.clopper_pearson_interval(int(ev.sum()), ev.size))
                     for ev in events])
    assert hit_b >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / 400)
    assert hit_p < 0.8


def test_clustered_proportion_is_gated_by_its_coverage_and_existence_is_bonferroni_adjusted():
    from bandits.experiments._common import clustered_proportion, exists_on_some_instance

    labels = np.repeat(np.arange(3), 10)
    few = clustered_proportion(np.zeros(30, bool), labels)
    assert few.method.startswith("no data") and "cluster_bounds_proportion" in few.method
    events = np.zeros(30, bool)
    events[10:14] = True  # instance 1: 4 of 10
    ex = exists_on_some_instance(events, labels)
    ref = S.clopper_pearson_interval(4, 10, confidence=1 - 0.05 / 3)
    assert (ex.estimate, ex.lo, ex.hi, ex.n, ex.confidence) == pytest.approx((0.4, ref.lo, ref.hi, 10, 0.95))


def test_studentized_bootstrap_without_spread_has_no_interval_and_the_claim_says_so(monkeypatch):
    """At an n where the interval is valid (a constructed table: valid from 40) a data set without spread still has
    no interval, and the claim says why."""
    from bandits.experiments._common import mean_estimate

    table = pd.DataFrame([dict(method=cov.MEAN_INTERVAL, kind="mean", dgp="d", n=n, nominal=0.95, coverage=c)
                          for n, c in ((20, 0.9), (40, 0.95))])
    monkeypatch.setattr(cov, "frozen_table", lambda: table)

    e = S.studentized_cluster_bootstrap_mean(np.zeros(45), np.arange(45), rng=np.random.default_rng(0))
    assert e.estimate == 0 and math.isnan(e.lo) and math.isnan(e.hi)
    m = mean_estimate(np.zeros(45), np.arange(45), seed=0, natural=(0.0, 1.0))
    assert m.method.startswith("no data") and "same value" in m.method


# --- the difference of two proportions ---------------------------------------------------------------------


def wilson_roots(k, n, z):
    """Wilson limits as the roots of the score equation (k/n - p)² = z² p (1 - p) / n, by numpy."""
    p = k / n
    r = np.sort(np.roots([1 + z * z / n, -(2 * p + z * z / n), p * p]).real)
    return max(0.0, r[0]), min(1.0, r[1])


@pytest.mark.parametrize("counts, published", [  # Newcombe (1998), Table II, method 10
    ((56, 70, 48, 80), (0.0524, 0.3339)), ((9, 10, 3, 10), (0.1705, 0.8090)), ((6, 7, 2, 7), (0.0582, 0.8062)),
    ((5, 56, 0, 29), (-0.0381, 0.1926)), ((0, 10, 0, 20), (-0.1611, 0.2775)), ((0, 10, 0, 10), (-0.2775, 0.2775)),
    ((10, 10, 0, 20), (0.6791, 1.0)), ((10, 10, 0, 10), (0.6075, 1.0))])
def test_newcombe_difference_against_the_papers_table_and_the_score_roots(counts, published):
    k_a, n_a, k_b, n_b = counts
    e = S.newcombe_difference(*counts)
    assert (e.lo, e.hi) == pytest.approx(published, abs=5e-5)
    z = norm.ppf(0.975)
    (la, ua), (lb, ub) = wilson_roots(k_a, n_a, z), wilson_roots(k_b, n_b, z)
    pa, pb = k_a / n_a, k_b / n_b
    assert (e.estimate, e.lo, e.hi, e.n) == pytest.approx(
        (pa - pb, pa - pb - math.hypot(pa - la, ub - pb), pa - pb + math.hypot(ua - pa, pb - lb), min(n_a, n_b)),
        abs=1e-9)
    assert S.newcombe_difference(*counts, confidence=0.8).hi <= e.hi


@given(two_arm_counts())
def test_newcombe_difference_is_ordered_bounded_and_symmetric(counts):
    k_a, n_a, k_b, n_b = counts
    e = S.newcombe_difference(k_a, n_a, k_b, n_b)
    assert -1.0 <= e.lo <= e.estimate <= e.hi <= 1.0 and e.lo < e.hi
    swapped = S.newcombe_difference(k_b, n_b, k_a, n_a)  # p_b - p_a
    assert (swapped.estimate, swapped.lo, swapped.hi) == pytest.approx((-e.estimate, -e.hi, -e.lo), abs=1e-12)
    flipped = S.newcombe_difference(n_a - k_a, n_a, n_b - k_b, n_b)  # non-events: (1-p_a) - (1-p_b)
    assert (flipped.lo, flipped.hi) == pytest.approx((-e.hi, -e.lo), abs=1e-12)


@pytest.mark.parametrize("args, kwargs, match", [
    ((5, 4, 1, 4), {}, "k_a"), ((1, 0, 1, 4), {}, "n_a"), ((1, 4, 1.5, 4), {}, "k_b"), ((1, 4, 1, -2), {}, "n_b"),
    ((1, "4", 1, 4), {}, "n_a"), ((1, 4, 5, 4), {}, "k_b"), ((1, 4, 1, 4), {"confidence": 1.2}, "confidence")])
def test_newcombe_difference_rejects_bad_input_by_name(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        S.newcombe_difference(*args, **kwargs)


def test_difference_bootstraps_equal_their_loop_references():
    rng = np.random.default_rng(4)
    x, y = (rng.random(17) < 0.4).astype(int), (rng.random(17) < 0.2).astype(int)
    for B in (100, 257):
        loop = S.paired_bootstrap_difference(x, y, rng=np.random.default_rng(B), n_resamples=B)
        fast = cov._percentile_paired_difference(x, y, np.random.default_rng(B), B)
        assert (fast.estimate, fast.lo, fast.hi) == pytest.approx((loop.estimate, loop.lo, loop.hi), rel=1e-12)
    y = y[:11]  # unequal arms
    draws = np.random.default_rng(7)
    ia = [draws.integers(0, 17, size=17) for _ in range(199)]  # arm a's resamples, then arm b's
    ib = [draws.integers(0, 11, size=11) for _ in range(199)]
    reps = [x[i].mean() - y[j].mean() for i, j in zip(ia, ib)]
    fast = cov._percentile_two_sample_difference(x, y, np.random.default_rng(7), 199)
    assert (fast.estimate, fast.lo, fast.hi) == pytest.approx(
        (x.mean() - y.mean(), *np.quantile(reps, [0.025, 0.975])), rel=1e-12)


def test_frozen_newcombe_coverage_agrees_with_the_exact_double_binomial_sum():
    """Σ_{k_a, k_b} Binom(k_a; n, p_a) Binom(k_b; n, p_b) 1[p_a - p_b in the interval] vs the simulated rows."""
    tab = cov.frozen_table()
    rows = tab[tab["method"] == "newcombe_difference"]
    for n in (10, 20, 30):
        ks = np.arange(n + 1)
        ests = [[S.newcombe_difference(int(i), n, int(j), n) for j in ks] for i in ks]
        lo = np.array([[e.lo for e in row] for row in ests])
        hi = np.array([[e.hi for e in row] for row in ests])
        for dgp in cov.DGPS["two_proportions"]:
            p_a, p_b = (float(s.split("=")[1]) for s in dgp.split())
            w = np.outer(binom.pmf(ks, n, p_a), binom.pmf(ks, n, p_b))
            exact = w[(lo <= p_a - p_b) & (p_a - p_b <= hi)].sum()
            r = rows[(rows["dgp"] == dgp) & (rows["n"] == n)].iloc[0]
            assert abs(r.coverage - exact) <= 4 * math.sqrt(max(exact * (1 - exact), 1e-3) / r.reps), (dgp, n, exact)


def test_too_few_reason_names_the_valid_n_or_never():
    """The one wording of a claim not measured below its interval's valid n, from the coverage table."""
    import pandas as pd

    from gapdyn.evidence.coverage import min_valid_n, too_few_reason

    rows = [dict(method=m, kind="mean", dgp="normal", n=n, nominal=0.95, bound="two-sided", coverage=cov,
                 mc_se=0.005, mean_width=1.0, reps=2000, n_resamples=999, seed=0)
            for m, covs in (("late", (0.80, 0.94, 0.95)), ("never", (0.80, 0.85, 0.90))) for n, cov in zip((8, 16, 30), covs)]
    table = pd.DataFrame(rows)
    assert min_valid_n("late", table) == 16 and min_valid_n("never", table) is None
    assert too_few_reason("late", 8, "pairs", table) == (
        "too few pairs for a valid interval (n = 8; late valid from n = 16, docs/coverage.md)")
    assert too_few_reason("never", 30, "instances", table) == (
        "too few instances for a valid interval (n = 30; never never within the tabulated n, docs/coverage.md)")
    for bad in ("", None):
        with pytest.raises(ValueError, match="unit"):
            too_few_reason("late", 8, bad, table)
    with pytest.raises(ValueError, match="n"):
        too_few_reason("late", -1, "pairs", table)


@pytest.mark.parametrize("dgp", sorted(cov.SHAPES))
def test_harder_shapes_have_the_stated_mean_and_variance(dgp):
    """Each harder shape's closed-form mean and variance (SHAPES) against 1,000,000 draws: the mean within 5 standard
    errors, the variance within 5 % (the rare swings' sample variance has a heavy tail)."""
    v = cov.draw_shape(dgp, (1000, 1000), np.random.default_rng(3))
    mean, var = cov.SHAPES[dgp]
    assert abs(v.mean() - mean) < 5 * v.std() / math.sqrt(v.size), (v.mean(), mean)
    assert v.var() == pytest.approx(var, rel=0.05)
    values, clusters, truth = cov.draw_means(dgp, 400, 10, np.random.default_rng(4))
    assert values.shape == (10, 400) and np.array_equal(clusters, np.arange(400)) and truth == mean


@pytest.mark.parametrize("dgp", cov.HARDER_DGPS["slope"])
def test_harder_slope_dgps_have_per_cluster_slopes_of_mean_one_and_sd_point_three(dgp):
    """b_g = 1 + 0.3 z_g: with no noise the per-cluster OLS slopes are the b_g themselves; their mean and sd over
    400,000 clusters match 1 and 0.3 (SLOPE_MEAN, SLOPE_SD)."""
    x, y, clusters, truth = cov.draw_slopes(4000, 100, np.random.default_rng(5), dgp)
    a = np.random.default_rng(5)  # the same stream: x, a_g, b_g as draw_slopes draws them
    x2 = a.normal(size=(100, 4000, cov.ROWS_PER_CLUSTER))
    a_g = a.normal(size=(100, 4000, 1))
    mu, var = cov.SHAPES[dgp]
    b = 1.0 + 0.3 * (cov.draw_shape(dgp, (100, 4000, 1), a) - mu) / math.sqrt(var)
    assert np.array_equal(x2.reshape(100, -1), x) and truth == cov.SLOPE_MEAN
    assert abs(b.mean() - 1.0) < 5 * 0.3 / math.sqrt(b.size) and b.std() == pytest.approx(0.3, rel=0.05)
    resid = y - (a_g + b * x2).reshape(100, -1)
    assert resid.std() == pytest.approx(cov.NOISE_SD, rel=0.01)


@pytest.mark.parametrize("dgp", cov.HARDER_DGPS["paired_ratio"])
def test_harder_ratio_dgps_state_their_ratio_of_means(dgp):
    x, y, truth = cov.draw_pairs("paired_ratio", dgp, 1000, 1000, np.random.default_rng(6))
    assert x.shape == y.shape == (1000, 1000) and truth == pytest.approx(x.mean() / y.mean(), rel=0.01)


def _one(arrays, r):
    return tuple(a[r] if a.ndim == 2 else a for a in arrays)


@pytest.mark.parametrize("name", [m for m in cov.COVERAGE_METHODS if cov._vectorised(m) is not None])
def test_vectorised_twins_equal_their_interval_functions(name):
    """On one data set a twin draws what its function draws from the same seed, so both give the same interval; the
    deterministic twins (t, CR1, Fieller) equal the function row by row on a batch."""
    m = cov.COVERAGE_METHODS[name]
    dgp = {"mean": "correlated", "slope": "mixture"}.get(m.kind, "lognormal rho=0.5")
    arrays, _ = cov._draw(m.kind, dgp, 7, 5, np.random.default_rng(1))
    twin = cov._vectorised(name)
    for r in range(5):
        lo, hi, _ = twin(*(a[r:r + 1] if a.ndim == 2 else a for a in arrays), np.random.default_rng(7), 199)
        e = m.interval(*_one(arrays, r), np.random.default_rng(7), 199)
        assert (lo[0], hi[0]) == (pytest.approx(e.lo, rel=1e-12, abs=1e-12), pytest.approx(e.hi, rel=1e-12, abs=1e-12))
    if name in ("t_cluster_means", "t_cluster_means_upper", "cr1_t_slope", "t_paired_mean", "fieller_paired_ratio"):
        lo, hi, _ = twin(*arrays, np.random.default_rng(7), 199)
        ref = [m.interval(*_one(arrays, r), None, 199) for r in range(5)]
        assert np.allclose(lo, [e.lo for e in ref], rtol=1e-12) and np.allclose(hi, [e.hi for e in ref], rtol=1e-12)


def test_vectorised_coverage_of_an_exact_interval_is_nominal():
    """The t interval of cluster means is exact on normal clusters (Student 1908): its vectorised coverage over
    5 x 400 data sets lies within 4 Monte Carlo SE of 0.95, and so does the Fieller interval's on normal pairs
    (exact up to the sign of mean(den), far from 0 here)."""
    tab = cov.coverage_table(["t_cluster_means", "fieller_paired_ratio"], ns=(10,), reps=400,
                             rng=np.random.default_rng(8), n_resamples=199, dgps=("normal", "normal rho=0.5"))
    assert len(tab) == 2
    for r in tab.itertuples():
        assert r.reps == 400 * cov.VECTORISED_REPS_FACTOR
        assert abs(r.coverage - 0.95) <= 4 * math.sqrt(0.95 * 0.05 / r.reps), r


def test_a_data_set_without_an_interval_counts_as_covering_and_a_missing_dgp_is_not_valid():
    """No interval (NaN: the study makes no claim) covers; an interval beside the truth does not. A method not
    measured on every DGP the table holds for its kind at n is not valid there, whatever its coverage."""
    assert list(cov._covers([np.nan, 0.0, 0.5], [np.nan, 1.0, 0.9], 0.2, "two-sided")) == [True, True, False]
    assert list(cov._covers([-np.inf, -np.inf], [np.nan, 0.1], 0.2, "upper")) == [True, False]
    rows = [dict(method=m, kind="mean", dgp=d, n=n, coverage=0.95, nominal=0.95)
            for m, dgps in (("full", ("d1", "d2")), ("part", ("d1",))) for d in dgps for n in (10, 20)]
    tab = pd.DataFrame(rows)
    assert cov.valid_at("full", 20, tab) and not cov.valid_at("part", 20, tab) and cov.min_valid_n("part", tab) is None
