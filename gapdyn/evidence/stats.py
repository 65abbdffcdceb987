"""Uncertainty for verdicts: intervals, bootstrap, exact tests, multiplicity, ROC AUC.

Every estimate a claim rests on carries a 95 % interval (docs/evidence.md). scipy.stats supplies
the exact routines (``binomtest``, ``fisher_exact``, ``wilcoxon``, ``mannwhitneyu``, ``beta``);
written here are only what it lacks: the Wilson closed form, the cluster (instance-level)
bootstrap, Holm's step-down adjustment and the Hanley-McNeil AUC variance. scipy.stats is
imported inside the functions so ``import gapdyn`` stays light.

The methods whose coverage is measured (gapdyn.evidence.coverage, docs/coverage.md) for a claim to choose
from: ``t_interval_cluster_means``, ``studentized_cluster_bootstrap_mean``, ``bca_cluster_mean`` /
``bca_cluster_bootstrap`` (means and other statistics), ``t_interval_cluster_slope``,
``wild_cluster_bootstrap_slope``, ``bca_cluster_slope`` (OLS slopes), ``clopper_pearson_upper``
(one-sided bound on a proportion), each with a ``bound`` for one-sided limits,
``cluster_bounds_proportion`` (a proportion of trials nested in clusters), ``newcombe_difference``
(the difference of two proportions) and ``fieller_paired_ratio`` (a ratio of means over pairs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .._validate import as_float_array


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a two-sided interval.

    estimate: the statistic on the full data; lo, hi: interval bounds; n: sample size (trials,
    instances or pairs); confidence: nominal coverage; method: how the interval was made.
    """

    estimate: float
    lo: float
    hi: float
    n: int
    confidence: float
    method: str

    @property
    def interval(self) -> tuple[float, float]:
        return (self.lo, self.hi)


@dataclass(frozen=True)
class NotMeasured(Estimate):
    """An estimate that could not be made, with its reason: the one "not measured" value. A claim built from it
    (:meth:`gapdyn.Claim.from_estimate`) is not measured and says ``reason`` (docs/evidence.md); ``estimate``,
    ``lo``, ``hi`` are placeholders inside the statistic's natural range, never evidence. Make it with
    :func:`not_measured`."""

    reason: str = ""


def not_measured(lo: float, hi: float, reason: str = "", *, estimate: float | None = None, n: int = 1,
                 confidence: float = 0.95) -> NotMeasured:
    """The :class:`NotMeasured` placeholder on [lo, hi] (estimate: their midpoint unless given) with ``reason``
    (empty: the claim gives its default reason); its method reads ``no data[: reason]`` for display only."""
    mid = (lo + hi) / 2 if estimate is None else estimate
    return NotMeasured(mid, lo, hi, n, confidence, "no data" + (f": {reason}" if reason else ""), reason)


@dataclass(frozen=True)
class TestResult:
    """A hypothesis test: statistic, two-sided p-value, n (tables: total count; pairs: informative pairs)."""

    __test__ = False  # not a pytest class

    statistic: float
    p_value: float
    n: int
    method: str


MAX_RESAMPLES = 10**6
"""Most bootstrap resamples a function here draws (the replicates are held in memory at once)."""


def _check_confidence(confidence) -> float:
    c = float(confidence)
    if not (0.0 < c < 1.0):
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    return c


def _as_count(v, name: str) -> int:
    """A non-negative integer count (Python or numpy integer, or an integral finite float)."""
    arr = None if isinstance(v, str) else np.asarray(v)
    numeric = arr is not None and (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating))
    if not numeric or arr.shape != ():
        raise ValueError(f"{name} must be an integer scalar, got {v!r}")
    x = float(arr)
    if not math.isfinite(x) or x != round(x) or x < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
    return int(x)


def _check_count(k, n, k_name: str = "k", n_name: str = "n") -> tuple[int, int]:
    k, n = _as_count(k, k_name), _as_count(n, n_name)
    if n < 1:
        raise ValueError(f"{n_name} must be a positive integer, got {n!r}")
    if k > n:
        raise ValueError(f"{k_name} must be an integer in [0, {n_name}={n}], got {k!r}")
    return k, n


# --- proportions -------------------------------------------------------------------------------


def wilson_interval(k: int, n: int, *, confidence: float = 0.95) -> Estimate:
    """Wilson score interval for a proportion k/n (Wilson 1927).

    centre = (p + z²/2n) / (1 + z²/n), half = z √(p(1-p)/n + z²/4n²) / (1 + z²/n),
    p = k/n, z = Φ⁻¹(1 - α/2). Near-nominal coverage for every p, never outside [0, 1].
    """
    from scipy.stats import norm

    k, n = _check_count(k, n)
    c = _check_confidence(confidence)
    z = float(norm.ppf(0.5 + c / 2.0))
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return Estimate(p, lo, hi, n, c, "wilson")


def clopper_pearson_interval(k: int, n: int, *, confidence: float = 0.95) -> Estimate:
    """Exact (Clopper-Pearson 1934) interval: lo = Beta⁻¹(α/2; k, n-k+1), hi = Beta⁻¹(1-α/2; k+1, n-k).

    Coverage >= confidence for every p (conservative).
    """
    from scipy.stats import beta

    k, n = _check_count(k, n)
    c = _check_confidence(confidence)
    a = 1.0 - c
    lo = 0.0 if k == 0 else float(beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a / 2, k + 1, n - k))
    return Estimate(k / n, lo, hi, n, c, "clopper-pearson")


def newcombe_difference(k_a: int, n_a: int, k_b: int, n_b: int, *, confidence: float = 0.95) -> Estimate:
    """Difference of two independent proportions p_a - p_b with Newcombe's hybrid score interval.

    From the Wilson intervals [l_a, u_a] of k_a/n_a and [l_b, u_b] of k_b/n_b (``wilson_interval``),
    D = p̂_a - p̂_b, lo = D - √((p̂_a - l_a)² + (u_b - p̂_b)²), hi = D + √((u_a - p̂_a)² + (p̂_b - l_b)²)
    (Newcombe 1998, Statistics in Medicine 17:873, method 10). Always inside [-1, 1]; unlike a Wald or
    percentile-bootstrap interval it does not collapse to a point when both arms show 0 (or n) events.
    Arms assumed independent; for arms paired by seed it ignores the pairing (conservative when the
    outcomes of a pair are positively correlated). Coverage by n: docs/coverage.md. n = min(n_a, n_b),
    the per-arm count the coverage table is indexed by.
    """
    k_a, n_a = _check_count(k_a, n_a, "k_a", "n_a")
    k_b, n_b = _check_count(k_b, n_b, "k_b", "n_b")
    c = _check_confidence(confidence)
    a, b = wilson_interval(k_a, n_a, confidence=c), wilson_interval(k_b, n_b, confidence=c)
    d = a.estimate - b.estimate
    lo = d - math.hypot(a.estimate - a.lo, b.hi - b.estimate)
    hi = d + math.hypot(a.hi - a.estimate, b.estimate - b.lo)
    return Estimate(d, max(-1.0, lo), min(1.0, hi), min(n_a, n_b), c, "newcombe hybrid score (method 10)")


# --- bootstrap ---------------------------------------------------------------------------------


def _row_aligned(arrays) -> tuple[list[np.ndarray], int]:
    """The numeric arrays of a bootstrap, row-aligned along axis 0 (>= 2 rows), and their row count."""
    if not arrays:
        raise ValueError("arrays must hold at least one array")
    data = [np.asarray(a) for a in arrays]
    if any(not (np.issubdtype(a.dtype, np.number) or a.dtype == bool) for a in data):
        raise ValueError("arrays must be numeric")
    n_rows = data[0].shape[0] if data[0].ndim else 0
    if n_rows < 2 or any(a.ndim == 0 or a.shape[0] != n_rows for a in data):
        raise ValueError("arrays must share a first axis of length >= 2")
    return data, n_rows


def cluster_bootstrap(
    statistic: Callable[..., float],
    *arrays,
    clusters=None,
    rng: np.random.Generator,
    n_resamples: int = 2000,
    confidence: float = 0.95,
) -> Estimate:
    """Percentile bootstrap of ``statistic(*arrays)`` resampling whole clusters (instances).

    Rows sharing a cluster label (e.g. the seeds of one bandit instance) are drawn together, so
    the interval reflects instance-to-instance variation rather than treating correlated rows
    as independent (Efron & Tibshirani 1993, §8; Davison & Hinkley 1997, §3.8). ``clusters=None``
    makes every row its own cluster (ordinary bootstrap). ``arrays`` are row-aligned along axis 0.
    Replicates where the statistic is not finite are dropped; more than half dropped is an error.
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a numpy.random.Generator")
    if int(n_resamples) != n_resamples or n_resamples < 100 or n_resamples > MAX_RESAMPLES:
        raise ValueError(f"n_resamples must be an integer in [100, 10**6], got {n_resamples!r}")
    c = _check_confidence(confidence)
    data, n_rows = _row_aligned(arrays)
    G, inverse = _cluster_labels(clusters, n_rows)
    members = [np.flatnonzero(inverse == j) for j in range(G)]
    point = float(statistic(*data))
    reps = np.empty(int(n_resamples))
    for b in range(reps.size):
        pick = rng.integers(0, G, size=G)
        rows = np.concatenate([members[j] for j in pick])
        reps[b] = statistic(*(a[rows] for a in data))
    finite = reps[np.isfinite(reps)]
    if finite.size < reps.size / 2:
        raise ValueError(f"statistic was not finite on {reps.size - finite.size} of {reps.size} resamples")
    lo, hi = np.quantile(finite, [(1 - c) / 2, (1 + c) / 2])
    return Estimate(point, float(lo), float(hi), G, c, "cluster bootstrap (percentile)")


def ols_slope(x, y) -> float:
    """Least-squares slope cov(x, y) / var(x); NaN when x is constant."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    dx = x - x.mean()
    sxx = float(dx @ dx)
    return float(dx @ (y - y.mean()) / sxx) if sxx > 0 else math.nan


def ratio_of_means(num, den) -> float:
    """mean(num) / mean(den); NaN when mean(den) = 0."""
    d = float(np.mean(den))
    return float(np.mean(num)) / d if d != 0 else math.nan


def _paired(x, y, name_x: str, name_y: str) -> tuple[np.ndarray, np.ndarray]:
    x = as_float_array(x, name_x, min_ndim=1)
    y = as_float_array(y, name_y, min_ndim=1)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"{name_x} and {name_y} must be 1-D and paired (same length), got {x.shape} and {y.shape}")
    return x, y


def bootstrap_slope(x, y, *, clusters=None, rng: np.random.Generator, n_resamples: int = 2000,
                    confidence: float = 0.95) -> Estimate:
    """Cluster-bootstrap interval for the least-squares slope of y on x (e.g. log eta* vs log T)."""
    x, y = _paired(x, y, "x", "y")
    return cluster_bootstrap(ols_slope, x, y, clusters=clusters, rng=rng, n_resamples=n_resamples,
                             confidence=confidence)


def bootstrap_ratio(num, den, *, clusters=None, rng: np.random.Generator, n_resamples: int = 2000,
                    confidence: float = 0.95) -> Estimate:
    """Cluster-bootstrap interval for mean(num) / mean(den)."""
    num, den = _paired(num, den, "num", "den")
    return cluster_bootstrap(ratio_of_means, num, den, clusters=clusters, rng=rng,
                             n_resamples=n_resamples, confidence=confidence)


def fieller_paired_ratio(num, den, *, confidence: float = 0.95) -> Estimate:
    """Fieller interval for mean(num) / mean(den) over pairs (num_i, den_i).

    The set of rho whose paired t statistic of num - rho den stays within t* = t_{(1+c)/2, n-1}:
    a rho^2 - 2 b rho + c0 <= 0 with a = den_bar^2 - q s_dd, b = num_bar den_bar - q s_nd,
    c0 = num_bar^2 - q s_nn, q = t*^2 / n, s the sample (co)variances (Fieller 1954, J. R. Stat. Soc. B
    16:175). Exact under normal pairs; coverage on skewed pairs in docs/coverage.md. Unbounded
    (ValueError) when a <= 0: mean(den) is not distinguishable from 0.
    """
    from scipy.stats import t

    x, y = _paired(num, den, "num", "den")
    if x.size < 2:
        raise ValueError(f"num and den must hold at least 2 pairs, got {x.size}")
    c = _check_confidence(confidence)
    n = x.size
    q = float(t.ppf(0.5 + c / 2, n - 1)) ** 2 / n
    S = np.cov(np.vstack([x, y]), ddof=1)
    a = y.mean() ** 2 - q * S[1, 1]
    b = x.mean() * y.mean() - q * S[0, 1]
    c0 = x.mean() ** 2 - q * S[0, 0]
    if a <= 0:
        raise ValueError("the Fieller interval is unbounded: mean(den) is not distinguishable from 0")
    root = math.sqrt(max(b * b - a * c0, 0.0))
    return Estimate(float(x.mean() / y.mean()), float((b - root) / a), float((b + root) / a), n, c,
                    "Fieller, paired")


# --- exact tests -------------------------------------------------------------------------------


def fisher_exact_test(table, *, alternative: str = "two-sided") -> TestResult:
    """Fisher exact test of a 2x2 count table [[a, b], [c, d]] (statistic: odds ratio).

    two-sided: p = Σ of hypergeometric probabilities of tables with the same margins that are no more
    likely than the observed one; "greater" / "less": P(a' >= a) / P(a' <= a) under the hypergeometric
    law (odds ratio > 1 / < 1 as the alternative). scipy.stats.fisher_exact.
    """
    if alternative not in ("two-sided", "greater", "less"):
        raise ValueError(f"alternative must be 'two-sided', 'greater' or 'less', got {alternative!r}")
    from scipy.stats import fisher_exact

    t = np.asarray(table)
    if t.shape != (2, 2) or not np.issubdtype(t.dtype, np.number) or np.any(t < 0) or np.any(t != np.round(t)):
        raise ValueError(f"table must be a 2x2 array of non-negative integer counts, got {table!r}")
    res = fisher_exact(t.astype(np.int64), alternative=alternative)
    return TestResult(float(res.statistic), float(res.pvalue), int(t.sum()), f"fisher exact ({alternative})")


def mcnemar_exact(x, y) -> TestResult:
    """Exact McNemar (sign) test for paired binary outcomes on common random numbers.

    b = #(x=1, y=0), c = #(x=0, y=1); under H0 b ~ Binomial(b + c, 1/2); two-sided
    scipy.stats.binomtest. statistic = b - c. No discordant pair gives p = 1.
    """
    from scipy.stats import binomtest

    x, y = _paired(x, y, "x", "y")
    if not np.all(np.isin(x, (0.0, 1.0))) or not np.all(np.isin(y, (0.0, 1.0))):
        raise ValueError("x and y must be binary (every entry 0 or 1)")
    b = int(np.sum((x == 1) & (y == 0)))
    c = int(np.sum((x == 0) & (y == 1)))
    p = 1.0 if b + c == 0 else float(binomtest(b, b + c, 0.5).pvalue)
    return TestResult(float(b - c), p, b + c, "exact mcnemar")


def wilcoxon_signed_rank(x, y) -> TestResult:
    """Two-sided Wilcoxon signed-rank test of paired continuous outcomes (scipy.stats.wilcoxon).

    Zero differences are dropped (``zero_method="wilcox"``); all differences zero gives p = 1.
    Exact null distribution for small samples without ties, normal approximation otherwise.
    """
    from scipy.stats import wilcoxon

    x, y = _paired(x, y, "x", "y")
    d = x - y
    nz = int(np.count_nonzero(d))
    if nz == 0:
        return TestResult(0.0, 1.0, 0, "wilcoxon signed-rank")
    res = wilcoxon(d[d != 0])
    return TestResult(float(res.statistic), float(res.pvalue), nz, "wilcoxon signed-rank")


def paired_bootstrap_difference(x, y, *, rng: np.random.Generator, n_resamples: int = 2000,
                                confidence: float = 0.95) -> Estimate:
    """Bootstrap interval for mean(x - y) over pairs (common random numbers keep the pairing)."""
    x, y = _paired(x, y, "x", "y")
    return cluster_bootstrap(lambda d: float(np.mean(d)), x - y, rng=rng, n_resamples=n_resamples,
                             confidence=confidence)


# --- multiplicity ------------------------------------------------------------------------------


def holm_adjust(p_values: Sequence[float]) -> np.ndarray:
    """Holm (1979) step-down adjusted p-values, in the input order.

    With p_(1) <= ... <= p_(m): p̃_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)). Rejecting
    p̃ < α controls the family-wise error rate at α.
    """
    p = as_float_array(p_values, "p_values", min_ndim=1)
    if p.ndim != 1 or np.any(p < 0) or np.any(p > 1):
        raise ValueError("p_values must be a 1-D sequence of probabilities in [0, 1]")
    m = p.size
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.maximum.accumulate(scaled)
    return out


# --- ROC AUC -----------------------------------------------------------------------------------


def roc_auc(scores_pos, scores_neg, *, confidence: float = 0.95) -> Estimate:
    """ROC AUC = P(S+ > S-) + ½ P(S+ = S-) with the Hanley & McNeil (1982) interval.

    AUC = U / (n+ n-) from the Mann-Whitney U of the positives (scipy.stats.mannwhitneyu).
    var = [A(1-A) + (n+ - 1)(Q1 - A²) + (n- - 1)(Q2 - A²)] / (n+ n-), Q1 = A/(2-A),
    Q2 = 2A²/(1+A); interval A ± z √var clipped to [0, 1]. n = n+ + n-.
    """
    from scipy.stats import mannwhitneyu, norm

    pos = as_float_array(scores_pos, "scores_pos", min_ndim=1).ravel()
    neg = as_float_array(scores_neg, "scores_neg", min_ndim=1).ravel()
    c = _check_confidence(confidence)
    n1, n0 = pos.size, neg.size
    a = float(mannwhitneyu(pos, neg).statistic) / (n1 * n0)
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (n1 - 1) * (q1 - a * a) + (n0 - 1) * (q2 - a * a)) / (n1 * n0)
    half = float(norm.ppf(0.5 + c / 2)) * math.sqrt(max(var, 0.0))
    return Estimate(a, max(0.0, a - half), min(1.0, a + half), n1 + n0, c, "hanley-mcneil")


# --- intervals with measured coverage (docs/coverage.md) ---------------------------------------
#
# bound: "two-sided" gives [lo, hi] at `confidence`; "upper" a one-sided upper limit (lo = -inf, or 0 for
# a proportion); "lower" a one-sided lower limit (hi = +inf, or 1). An equivalence test (TOST) at level
# alpha is the two-sided interval at confidence 1 - 2 alpha lying inside the margin (Schuirmann 1987).

BOUNDS = ("two-sided", "upper", "lower")


def _check_bound(bound) -> str:
    if bound not in BOUNDS:
        raise ValueError(f"bound must be one of {BOUNDS}, got {bound!r}")
    return bound


def _check_rng(rng) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a numpy.random.Generator")
    return rng


def _check_resamples(n_resamples) -> int:
    if isinstance(n_resamples, bool) or int(n_resamples) != n_resamples or n_resamples < 99 \
            or n_resamples > MAX_RESAMPLES:
        raise ValueError(f"n_resamples must be an integer in [99, 10**6], got {n_resamples!r}")
    return int(n_resamples)


def _cluster_labels(clusters, n_rows: int) -> tuple[int, np.ndarray]:
    """(G, inverse): the number of distinct clusters (>= 2) and each row's cluster index in [0, G)."""
    labels = np.arange(n_rows) if clusters is None else np.asarray(clusters)
    if labels.shape != (n_rows,):
        raise ValueError(f"clusters must have shape ({n_rows},), got {labels.shape}")
    uniq, inverse = np.unique(labels, return_inverse=True)
    if uniq.size < 2:
        raise ValueError("clusters must contain at least 2 distinct clusters")
    return int(uniq.size), inverse.reshape(-1)


def _values_and_clusters(values, clusters) -> tuple[np.ndarray, np.ndarray]:
    """1-D finite values and their per-cluster means (cluster order of np.unique)."""
    v = as_float_array(values, "values", min_ndim=1)
    if v.ndim != 1:
        raise ValueError(f"values must be 1-D, got shape {v.shape}")
    G, inv = _cluster_labels(clusters, v.size)
    means = np.bincount(inv, weights=v, minlength=G) / np.bincount(inv, minlength=G)
    return v, means


def _one_or_two_sided(point: float, se: float, q_lo: float, q_hi: float, bound: str) -> tuple[float, float]:
    """[point - q_hi se, point - q_lo se] with the open side at +-inf for a one-sided bound."""
    lo, hi = point - q_hi * se, point - q_lo * se
    if bound == "upper":
        lo = -math.inf
    elif bound == "lower":
        hi = math.inf
    return float(lo), float(hi)


def t_interval_cluster_means(values, clusters=None, *, confidence: float = 0.95,
                             bound: str = "two-sided") -> Estimate:
    """Mean of per-cluster means with a Student-t interval on G - 1 degrees of freedom.

    m_g = mean of cluster g's rows, estimate m̄ = Σ_g m_g / G, se = sd(m_g) / √G (ddof 1),
    two-sided m̄ ± t_{G-1}(1 - α/2) se; one-sided m̄ + t_{G-1}(1 - α) se (upper) or m̄ - ... (lower).
    Exact when the cluster means are normal (Student 1908); n = G. ``clusters=None``: one row per cluster.
    """
    from scipy.stats import t

    c = _check_confidence(confidence)
    bound = _check_bound(bound)
    _, m = _values_and_clusters(values, clusters)
    G = m.size
    point = float(m.mean())
    se = float(m.std(ddof=1)) / math.sqrt(G)
    tail = (1 - c) / 2 if bound == "two-sided" else 1 - c
    q = float(t.ppf(1 - tail, G - 1))
    lo, hi = _one_or_two_sided(point, se, -q, q, bound)
    return Estimate(point, lo, hi, G, c, f"t interval of cluster means ({bound})")


def studentized_cluster_bootstrap_mean(values, clusters=None, *, rng: np.random.Generator,
                                       n_resamples: int = 1999, confidence: float = 0.95,
                                       bound: str = "two-sided") -> Estimate:
    """Bootstrap-t interval for the mean of cluster means, resampling whole clusters.

    t*_b = (m̄*_b - m̄) / se*_b with se* = sd(m*) / √G on each resample of the G cluster means;
    interval [m̄ - q*(1 - α/2) se, m̄ - q*(α/2) se] (Efron & Tibshirani 1993, §12.5; Davison &
    Hinkley 1997, §5.2). A resample of one repeated cluster has se* = 0 and t* = ±inf; it stays in
    the distribution (order-statistic quantiles), a resample with t* = 0/0 is dropped.
    """
    rng = _check_rng(rng)
    B = _check_resamples(n_resamples)
    c = _check_confidence(confidence)
    bound = _check_bound(bound)
    _, m = _values_and_clusters(values, clusters)
    G = m.size
    point = float(m.mean())
    se = float(m.std(ddof=1)) / math.sqrt(G)
    res = m[rng.integers(0, G, size=(B, G))]  # [B, G]
    with np.errstate(divide="ignore", invalid="ignore"):
        t_star = (res.mean(axis=1) - point) / (res.std(axis=1, ddof=1) / math.sqrt(G))
    t_star = t_star[~np.isnan(t_star)]
    if t_star.size == 0:  # every cluster mean equal: no resample has a t statistic, the interval is undefined
        return Estimate(point, math.nan, math.nan, G, c, f"studentized cluster bootstrap ({bound}): no spread")
    tail = (1 - c) / 2 if bound == "two-sided" else 1 - c
    q_lo, q_hi = np.quantile(t_star, [tail, 1 - tail], method="inverted_cdf")
    lo, hi = _one_or_two_sided(point, se, float(q_lo), float(q_hi), bound)
    return Estimate(point, lo, hi, G, c, f"studentized cluster bootstrap ({bound})")


def _scipy_bca(data, statistic, *, vectorized: bool, rng, B: int, c: float, bound: str) -> tuple[float, float]:
    """scipy.stats.bootstrap BCa limits (Efron 1987); ValueError when they are not finite (degenerate data)."""
    import warnings

    from scipy.stats import bootstrap

    alternative = {"two-sided": "two-sided", "upper": "less", "lower": "greater"}[bound]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = bootstrap(data, statistic, n_resamples=B, vectorized=vectorized, confidence_level=c,
                        alternative=alternative, method="BCa", rng=rng)
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if math.isnan(lo) or math.isnan(hi):
        raise ValueError("the BCa interval is undefined: the statistic does not vary over the resamples")
    return lo, hi


def bca_cluster_bootstrap(statistic: Callable[..., float], *arrays, clusters=None, rng: np.random.Generator,
                          n_resamples: int = 1999, confidence: float = 0.95,
                          bound: str = "two-sided") -> Estimate:
    """Bias-corrected and accelerated (BCa) bootstrap of ``statistic(*arrays)`` resampling whole clusters.

    The resampled unit is the cluster: scipy.stats.bootstrap (method="BCa", Efron 1987) runs on the
    cluster indices, and its jackknife for the acceleration leaves out one cluster at a time. ``arrays``
    are row-aligned along axis 0; ``clusters=None`` makes each row its own cluster. Loops over
    resamples in Python; ``bca_cluster_mean`` and ``bca_cluster_slope`` are the vectorised routes.
    """
    rng = _check_rng(rng)
    B = _check_resamples(n_resamples)
    c = _check_confidence(confidence)
    bound = _check_bound(bound)
    data, n_rows = _row_aligned(arrays)
    G, inv = _cluster_labels(clusters, n_rows)
    members = [np.flatnonzero(inv == j) for j in range(G)]

    def on_clusters(idx):
        rows = np.concatenate([members[j] for j in np.asarray(idx, dtype=np.int64)])
        return statistic(*(a[rows] for a in data))

    lo, hi = _scipy_bca((np.arange(G),), on_clusters, vectorized=False, rng=rng, B=B, c=c, bound=bound)
    return Estimate(float(statistic(*data)), lo, hi, G, c, f"cluster bootstrap (BCa, {bound})")


def bca_cluster_mean(values, clusters=None, *, rng: np.random.Generator, n_resamples: int = 1999,
                     confidence: float = 0.95, bound: str = "two-sided") -> Estimate:
    """BCa cluster bootstrap of the mean of cluster means (vectorised ``bca_cluster_bootstrap``)."""
    rng = _check_rng(rng)
    B = _check_resamples(n_resamples)
    c = _check_confidence(confidence)
    bound = _check_bound(bound)
    _, m = _values_and_clusters(values, clusters)
    lo, hi = _scipy_bca((m,), lambda s, axis=-1: s.mean(axis=axis), vectorized=True, rng=rng, B=B, c=c,
                        bound=bound)
    return Estimate(float(m.mean()), lo, hi, m.size, c, f"cluster bootstrap of cluster means (BCa, {bound})")


def _xy_clusters(x, y, clusters) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    x, y = _paired(x, y, "x", "y")
    G, inv = _cluster_labels(clusters, x.size)
    if float(np.ptp(x)) == 0.0:
        raise ValueError("x must not be constant (the slope is undefined)")
    return x, y, G, inv


def _slope_from_sums(S: np.ndarray) -> np.ndarray:
    """OLS slope from summed [n, Σx, Σy, Σxx, Σxy] over the last axis: (Σxy - ΣxΣy/n) / (Σxx - (Σx)²/n)."""
    n, sx, sy, sxx, sxy = np.moveaxis(S, -1, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (sxy - sx * sy / n) / (sxx - sx * sx / n)


def cluster_sums(x, y, inverse: np.ndarray, G: int) -> np.ndarray:
    """Per-cluster [n_g, Σx, Σy, Σxx, Σxy], shape [G, 5]: a cluster resample of an OLS slope is a sum of rows."""
    cols = (np.ones_like(x), x, y, x * x, x * y)
    return np.stack([np.bincount(inverse, weights=w, minlength=G) for w in cols], axis=1)


def bca_cluster_slope(x, y, clusters=None, *, rng: np.random.Generator, n_resamples: int = 1999,
                      confidence: float = 0.95, bound: str = "two-sided") -> Estimate:
    """BCa cluster bootstrap of the pooled OLS slope of y on x (vectorised ``bca_cluster_bootstrap(ols_slope)``).

    A resample's slope comes from the summed per-cluster [n, Σx, Σy, Σxx, Σxy] (``cluster_sums``).
    """
    rng = _check_rng(rng)
    B = _check_resamples(n_resamples)
    c = _check_confidence(confidence)
    bound = _check_bound(bound)
    x, y, G, inv = _xy_clusters(x, y, clusters)
    S = cluster_sums(x, y, inv, G)

    def stat(idx, axis=-1):
        return _slope_from_sums(S[np.asarray(idx, dtype=np.int64)].sum(axis=-2))

    lo, hi = _scipy_bca((np.arange(G),), stat, vectorized=True, rng=rng, B=B, c=c, bound=bound)
    return Estimate(ols_slope(x, y), lo, hi, G, c, f"cluster bootstrap of the OLS slope (BCa, {bound})")


def cr1_slope(x, y, clusters) -> tuple[float, float]:
    """OLS slope of y on [1, x] and its CR1 cluster-robust standard error.

    V = (G/(G-1)) ((N-1)/(N-2)) (X'X)⁻¹ [Σ_g X_g'û_g û_g'X_g] (X'X)⁻¹, se = √V₁₁ (Liang & Zeger 1986;
    the CR1 small-sample factor of Cameron & Miller 2015, §VI.B).
    """
    x, y, G, inv = _xy_clusters(x, y, clusters)
    slope, M, C, scale, _ = _cr1_parts(x, y, G, inv)
    d = C @ M[1]  # cluster g's contribution to the slope: [M X_g'û_g]₁
    return slope, math.sqrt(scale * float(d @ d))


def _cr1_parts(x, y, G, inv):
    """(slope, M = (X'X)⁻¹, C [G, 2] with C_g = X_g'û_g, CR1 scale, X) for X = [1, x]."""
    N = x.size
    X = np.stack([np.ones(N), x], axis=1)
    M = np.linalg.inv(X.T @ X)
    beta = M @ (X.T @ y)
    u = y - X @ beta
    C = np.stack([np.bincount(inv, weights=X[:, j] * u, minlength=G) for j in range(2)], axis=1)
    scale = G / (G - 1) * (N - 1) / (N - 2)
    return float(beta[1]), M, C, scale, X


def t_interval_cluster_slope(x, y, clusters, *, confidence: float = 0.95, bound: str = "two-sided") -> Estimate:
    """OLS slope ± t_{G-1} · CR1 se (Cameron & Miller 2015, §VI.C: t with G - 1 degrees of freedom)."""
    from scipy.stats import t

    c = _check_confidence(confidence)
    bound = _check_bound(bound)
    slope, se = cr1_slope(x, y, clusters)
    G, _ = _cluster_labels(clusters, np.asarray(x).size)
    tail = (1 - c) / 2 if bound == "two-sided" else 1 - c
    q = float(t.ppf(1 - tail, G - 1))
    lo, hi = _one_or_two_sided(slope, se, -q, q, bound)
    return Estimate(slope, lo, hi, G, c, f"CR1 t interval of the OLS slope ({bound})")


WILD_WEIGHTS = ("webb", "rademacher")


def wild_weights(kind: str, size, rng: np.random.Generator) -> np.ndarray:
    """Cluster weights with mean 0, variance 1: Rademacher ±1 (p = 1/2 each), or Webb's six points
    ±√(1/2), ±1, ±√(3/2) (p = 1/6 each; Webb 2023), which give 6^G distinct draws instead of 2^G."""
    if kind == "rademacher":
        return rng.integers(0, 2, size=size) * 2.0 - 1.0
    if kind == "webb":
        pts = np.sqrt(np.array([0.5, 1.0, 1.5]))
        return pts[rng.integers(0, 3, size=size)] * (rng.integers(0, 2, size=size) * 2.0 - 1.0)
    raise ValueError(f"weights must be one of {WILD_WEIGHTS}, got {kind!r}")


def _wild_t_draws(x, y, G, inv, v) -> tuple[float, float, np.ndarray]:
    """(slope, CR1 se, t*) for wild cluster draws v [B, G]: y* = Xβ̂ + v_g û_g, t* = (b̂* - b̂) / se*(b̂*).

    Vectorised: β̂* - β̂ = δ = Σ_h v_h M c_h with c_h = X_h'û_h, and cluster g's slope score in the
    bootstrap world is d*_g = v_g [M c_g]₁ - [M H_g δ]₁ with H_g = X_g'X_g.
    """
    slope, M, C, scale, X = _cr1_parts(x, y, G, inv)
    d = C @ M[1]
    H = np.stack([np.bincount(inv, weights=X[:, i] * X[:, j], minlength=G) for i in range(2) for j in range(2)],
                 axis=1).reshape(G, 2, 2)
    delta = v @ (C @ M)  # [B, 2]
    rH = H @ M[1]  # [G, 2]: H_g M₁ = (M H_g)₁ row for symmetric M, H_g
    d_star = v * d - delta @ rH.T  # [B, G]
    se_star = np.sqrt(scale * np.sum(d_star * d_star, axis=1))
    with np.errstate(divide="ignore", invalid="ignore"):
        t_star = delta[:, 1] / se_star
    return slope, math.sqrt(scale * float(d @ d)), t_star


def wild_cluster_bootstrap_slope(x, y, clusters, *, rng: np.random.Generator, weights: str = "webb",
                                 n_resamples: int = 1999, confidence: float = 0.95,
                                 bound: str = "two-sided") -> Estimate:
    """Wild cluster bootstrap-t interval for the OLS slope of y on x (e.g. log eta* on log T, instances
    as clusters).

    Each draw multiplies cluster g's residuals by one weight v_g (``wild_weights``), refits OLS and
    studentizes with the CR1 se (``cr1_slope``): t* = (b̂* - b̂) / se*. Two-sided: b̂ ± q*_{|t|}(c) se
    (symmetric, Cameron, Gelbach & Miller 2008); one-sided: b̂ - q*_t(1 - c) se as the upper limit,
    b̂ - q*_t(c) se as the lower. Unrestricted residuals (WCU), which keeps the interval closed form;
    the restricted variant is the one for p-values (MacKinnon & Webb 2017).
    """
    rng = _check_rng(rng)
    B = _check_resamples(n_resamples)
    c = _check_confidence(confidence)
    bound = _check_bound(bound)
    if weights not in WILD_WEIGHTS:
        raise ValueError(f"weights must be one of {WILD_WEIGHTS}, got {weights!r}")
    x, y, G, inv = _xy_clusters(x, y, clusters)
    slope, se, t_star = _wild_t_draws(x, y, G, inv, wild_weights(weights, (B, G), rng))
    t_star = t_star[~np.isnan(t_star)]
    if bound == "two-sided":
        q = float(np.quantile(np.abs(t_star), c, method="inverted_cdf"))
        lo, hi = slope - q * se, slope + q * se
    else:
        q_lo, q_hi = np.quantile(t_star, [1 - c, c], method="inverted_cdf")
        lo, hi = _one_or_two_sided(slope, se, float(q_lo), float(q_hi), bound)
    return Estimate(slope, float(lo), float(hi), G, c, f"wild cluster bootstrap-t, {weights} ({bound})")


def cluster_bounds_proportion(events, clusters, *, confidence: float = 0.95) -> Estimate:
    """P(event) of a trial in a random cluster, p̄ = E_g[p_g], from binary trials nested in clusters.

    Valid whatever the within-cluster correlation: with G clusters, a_g = 1[every trial of g is an event]
    and b_g = 1[some trial of g is one], E[a_g] <= p̄ <= E[b_g] (a_g implies the first trial is an event,
    which implies b_g), and the G clusters are independent, so
    [Clopper-Pearson lower(Σ a_g, G; α/2), Clopper-Pearson upper(Σ b_g, G; α/2)] covers p̄ with
    probability >= confidence. Estimate: the mean of the per-cluster event shares. Conservative: its width
    is that of G trials, not of the rows (the price of not modelling the correlation).
    """
    from scipy.stats import beta

    c = _check_confidence(confidence)
    e = np.asarray(events)
    if e.ndim != 1 or e.size == 0:
        raise ValueError(f"events must be a non-empty 1-D array of 0/1, got shape {e.shape}")
    if not np.isin(e, (0, 1)).all():
        raise ValueError("events must hold only 0/1 (or False/True) values")
    e = e.astype(float)
    G, inv = _cluster_labels(clusters, e.size)
    share = np.bincount(inv, weights=e, minlength=G) / np.bincount(inv, minlength=G)
    k_all, k_any = int(np.sum(share == 1.0)), int(np.sum(share > 0.0))
    a = 1.0 - c
    lo = 0.0 if k_all == 0 else float(beta.ppf(a / 2, k_all, G - k_all + 1))
    hi = 1.0 if k_any == G else float(beta.ppf(1 - a / 2, k_any + 1, G - k_any))
    return Estimate(float(share.mean()), lo, hi, G, c, "cluster bounds (Clopper-Pearson over clusters)")


def clopper_pearson_upper(k: int, n: int, *, confidence: float = 0.95) -> Estimate:
    """One-sided exact upper limit for a proportion: hi = Beta⁻¹(c; k+1, n-k) (1 when k = n), lo = 0.

    P(p ≤ hi) ≥ c for every p (Clopper & Pearson 1934); the bound test for "share of violations ≤ x".
    """
    from scipy.stats import beta

    k, n = _check_count(k, n)
    c = _check_confidence(confidence)
    hi = 1.0 if k == n else float(beta.ppf(c, k + 1, n - k))
    return Estimate(k / n, 0.0, hi, n, c, "clopper-pearson (upper)")
