"""Uncertainty for verdicts: intervals, bootstrap, exact tests, multiplicity, ROC AUC.

Every estimate a claim rests on carries a 95 % interval (docs/evidence.md). scipy.stats supplies
the exact routines (``binomtest``, ``fisher_exact``, ``wilcoxon``, ``mannwhitneyu``, ``beta``);
written here are only what it lacks: the Wilson closed form, the cluster (instance-level)
bootstrap, Holm's step-down adjustment and the Hanley-McNeil AUC variance. scipy.stats is
imported inside the functions so ``import gapdyn`` stays light.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ._validate import as_float_array


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
class TestResult:
    """A hypothesis test: statistic, two-sided p-value, n (tables: total count; pairs: informative pairs)."""

    __test__ = False  # not a pytest class

    statistic: float
    p_value: float
    n: int
    method: str


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


def _check_count(k, n) -> tuple[int, int]:
    k, n = _as_count(k, "k"), _as_count(n, "n")
    if n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if k > n:
        raise ValueError(f"k must be an integer in [0, n={n}], got {k!r}")
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


# --- bootstrap ---------------------------------------------------------------------------------


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
    if int(n_resamples) != n_resamples or n_resamples < 100:
        raise ValueError(f"n_resamples must be an integer >= 100, got {n_resamples!r}")
    c = _check_confidence(confidence)
    if not arrays:
        raise ValueError("arrays must hold at least one array")
    data = [np.asarray(a) for a in arrays]
    if any(not (np.issubdtype(a.dtype, np.number) or a.dtype == bool) for a in data):
        raise ValueError("arrays must be numeric")
    n_rows = data[0].shape[0] if data[0].ndim else 0
    if n_rows < 2 or any(a.ndim == 0 or a.shape[0] != n_rows for a in data):
        raise ValueError("arrays must share a first axis of length >= 2")
    labels = np.arange(n_rows) if clusters is None else np.asarray(clusters)
    if labels.shape != (n_rows,):
        raise ValueError(f"clusters must have shape ({n_rows},), got {labels.shape}")
    uniq, inverse = np.unique(labels, return_inverse=True)
    if uniq.size < 2:
        raise ValueError("clusters must contain at least 2 distinct clusters")
    members = [np.flatnonzero(inverse == j) for j in range(uniq.size)]
    point = float(statistic(*data))
    reps = np.empty(int(n_resamples))
    for b in range(reps.size):
        pick = rng.integers(0, uniq.size, size=uniq.size)
        rows = np.concatenate([members[j] for j in pick])
        reps[b] = statistic(*(a[rows] for a in data))
    finite = reps[np.isfinite(reps)]
    if finite.size < reps.size / 2:
        raise ValueError(f"statistic was not finite on {reps.size - finite.size} of {reps.size} resamples")
    lo, hi = np.quantile(finite, [(1 - c) / 2, (1 + c) / 2])
    return Estimate(point, float(lo), float(hi), int(uniq.size), c, "cluster bootstrap (percentile)")


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
