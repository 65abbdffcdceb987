"""Measured coverage of the intervals in :mod:`gapdyn.evidence.stats`, and the rule a claim uses to pick one.

A nominal 95 % interval is only as good as its coverage at the claim's n (instances, clusters or trials).
``coverage_table`` measures it by simulation over data-generating processes (DGPs) that bracket what the
experiments produce:

- means (n = clusters): ``normal`` (one N(0, 1) row per cluster), ``lognormal`` (one exp(N(0, 1)) row,
  mean e^{1/2}: skewed), ``correlated`` (5 rows per cluster, y = u_g + e, var u = var e = 1/2, so the
  intra-cluster correlation is 0.5), and the harder shapes of ``draw_shape``, one value per cluster:
  ``bounded`` (Beta(0.3, 3), a skewed share), ``mixture`` (0.95 N(0, 1) + 0.05 N(6, 1): a few instances far
  away), ``rare swing`` (Bernoulli(0.03): 0 mostly, 1 rarely, as a threshold statistic) and ``rare swings ±``
  (N(0, 0.1²) plus ±0.8 with probability 0.025 each); the target is the population mean;
- slopes (n = clusters): 5 rows per cluster with their own x ~ N(0, 1), y = a_g + b_g x + e, a_g ~ N(0, 1),
  e ~ N(0, 0.5²), the per-cluster slope b_g = 1 + 0.3 z_g with z_g ~ N(0, 1) (``random_slope``) or a harder
  shape standardised to mean 0, variance 1 (``bounded``, ``mixture``, ``rare swing``); the target is the mean
  slope 1 (e.g. log eta* vs log T with instances as clusters);
- proportions (n = trials): k ~ Binomial(n, p) for p in {0.05, 0.4, 0.95}; coverage is summed exactly
  over k (Monte Carlo SE 0). The law of k is binomial whatever shape makes the 0/1 outcomes, so the harder
  shapes reduce to p here (p = 0.05 is the rare case);
- clustered proportions (n = clusters of 16 binary trials; the target is p̄ = E_g[p_g]): ``iid p=0.05``
  (p_g = 0.05), ``beta p=0.05`` and ``beta p=0.4`` (p_g ~ Beta with that mean and intra-cluster
  correlation 0.5), ``all-or-none p=0.05`` (p_g in {0, 1}: correlation 1), e.g. collapse of seeded runs
  nested in instances;
- two proportions (n = runs per arm, n in TWO_PROPORTION_NS): independent arms of n Bernoulli(p_a) and
  n Bernoulli(p_b) outcomes for (p_a, p_b) in {(0.05, 0.05), (0.3, 0.1), (0.5, 0.2), (0.1, 0)}; the target
  is p_a - p_b (e.g. "arm A ends collapsed more often than arm B"). The paired bootstrap resamples rows
  (run i of arm a with run i of arm b) as the studies do for runs paired by seed;
- paired differences (n = pairs, n in PAIRED_NS; the target is E[x - y]): ``normal rho=0.5`` ((x, y)
  bivariate normal, unit variances, correlation 0.5, mean difference 0) and ``lognormal rho=0.5``
  (x = exp(z1), y = exp(z2 / 2), corr(z1, z2) = 0.5: a skewed difference, mean e^{1/2} - e^{1/8}), e.g. a
  final reward, one arm minus the other, of runs paired by seed;
- paired ratios (n = pairs, n in PAIRED_NS; the target is E[num] / E[den], 2/9 ≈ 0.22 for the first three, as
  in steps to a reward level, one arm over the other): ``normal rho=0.5`` (den ~ N(45, 15²), num ~ N(10, 3²),
  correlation 0.5), ``lognormal rho=0.5`` (log den ~ N(log 45 - 1/8, 1/4), log num ~ N(log 10 - 1/8, 1/4),
  correlation 0.5), ``gamma-Poisson counts`` (a shared difficulty g ~ Gamma(2, scale 1/2) per pair,
  den = 1 + Poisson(44 g), num = 1 + Poisson(9 g): skewed, overdispersed, positively correlated counts), and
  the harder ``bounded`` (num ~ Beta(0.3, 3), den ~ Beta(3, 0.3): ratio 0.1), ``mixture`` (the normal pairs
  with num + 30, ten of its sd, in 5 % of pairs: ratio 11.5/45) and ``rare swing`` (the lognormal pairs with
  num = 450, a run capped at ten times the mean den, in 3 % of pairs: ratio RARE_SWING_RATIO ≈ 0.52).

A method with a vectorised twin (``_vectorised``: the claims' mean, slope and ratio intervals and the t companions
of the mean) is simulated on VECTORISED_REPS_FACTOR × reps data sets per cell of its own stream (10000 at the
default reps 2000: Monte Carlo SE √(c(1-c)/10000) <= 0.005 at any coverage c), as are the paired differences;
the others on reps data sets of the parent stream as before, and not on HARDER_DGPS (so not valid where those
are tabulated: ``valid_at`` needs every DGP of the kind). A data set on which a method gives no interval (NaN: every
cluster value equal, where the study says "not measured" and makes no claim) counts as covering, as an
unbounded Fieller set (-inf, inf) and the studentized bootstrap's infinite intervals do.

``valid_at(method, n)`` (measured on every DGP of its kind at n, worst coverage >= nominal - tol = 0.93) and
``min_valid_n`` read the
committed measurement ``gapdyn/evidence/data/coverage.csv`` unless given a table; regenerate it, and
docs/coverage.md, with ``python -m gapdyn.evidence.coverage --out docs/coverage.md``. Never edit either by hand.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import stats
from ..io import atomic_write_text, write_with
from .stats import Estimate

__all__ = ["KINDS", "DGPS", "NS", "CoverageMethod", "COVERAGE_METHODS", "draw_means", "draw_slopes",
           "draw_clustered_events", "draw_two_proportions", "draw_pairs", "NS_BY_KIND", "PAIRED_NS",
           "VECTORISED_REPS_FACTOR", "HARDER_DGPS", "SHAPES", "draw_shape", "base_reps",
           "coverage_table", "valid_at", "min_valid_n", "too_few_reason", "frozen_table", "coverage_markdown", "main",
           "MEAN_INTERVAL"]

MEAN_INTERVAL = "studentized_cluster_mean"
"""The interval method of every mean claim, bandit and LLM (gapdyn.evidence.stats.studentized_cluster_bootstrap_mean); its
coverage is in docs/coverage.md, :func:`valid_at` says from which n it is valid."""

KINDS = ("mean", "slope", "proportion", "clustered_proportion", "two_proportions", "paired_difference",
         "paired_ratio")
DGPS = {"mean": ("normal", "lognormal", "correlated", "bounded", "mixture", "rare swing", "rare swings ±"),
        "slope": ("random_slope", "bounded", "mixture", "rare swing"),
        "proportion": ("p=0.05", "p=0.4", "p=0.95"),
        "clustered_proportion": ("iid p=0.05", "beta p=0.05", "beta p=0.4", "all-or-none p=0.05"),
        "two_proportions": ("p_a=0.05 p_b=0.05", "p_a=0.3 p_b=0.1", "p_a=0.5 p_b=0.2", "p_a=0.1 p_b=0"),
        "paired_difference": ("normal rho=0.5", "lognormal rho=0.5"),
        "paired_ratio": ("normal rho=0.5", "lognormal rho=0.5", "gamma-Poisson counts", "bounded", "mixture",
                         "rare swing")}
TRIALS_PER_CLUSTER = 16
NS = (4, 8, 10, 20, 40, 60)
TWO_PROPORTION_NS = (10, 20, 30, 50, 80)
PAIRED_NS = (8, 16, 30, 50)
NS_BY_KIND = {**{kind: NS for kind in KINDS}, "two_proportions": TWO_PROPORTION_NS,
              "paired_difference": PAIRED_NS, "paired_ratio": PAIRED_NS}
"""The tabulated n of each kind (``coverage_table``'s default)."""
VECTORISED_REPS_FACTOR = 5
"""A method with a vectorised twin is simulated on this many times ``reps`` data sets per cell: 10000 at reps 2000,
so its Monte Carlo SE √(c(1-c)/10000) is at most 0.005 at any coverage c."""
RATIO_TRUTH = 10.0 / 45.0
RARE_SWING_RATIO = (0.97 * 10.0 + 0.03 * 450.0) / 45.0
ROWS_PER_CLUSTER = 5
ICC = 0.5
SLOPE_MEAN, SLOPE_SD, NOISE_SD = 1.0, 0.3, 0.5
DATA_PATH = Path(__file__).with_name("data") / "coverage.csv"
COLUMNS = ["method", "kind", "dgp", "n", "nominal", "bound", "coverage", "mc_se", "mean_width", "reps",
           "n_resamples", "seed"]


@dataclass(frozen=True)
class CoverageMethod:
    """An interval method under measurement.

    kind: "mean" (interval(values, clusters, rng, B)), "slope" (interval(x, y, clusters, rng, B)),
    "proportion" (interval(k, n)), "clustered_proportion" (interval(events, clusters, rng, B)) or
    "two_proportions" (interval(x, y, rng, B), x and y the 0/1 outcomes of arms a and b, row i of each a pair),
    "paired_difference" (interval(x, y, rng, B) for E[x - y]) or "paired_ratio" (interval(num, den, rng, B));
    confidence: the nominal coverage; bound: "two-sided" or "upper"
    (coverage of an upper limit is P(truth <= hi)).
    """

    name: str
    kind: str
    interval: Callable[..., Estimate]
    confidence: float = 0.95
    bound: str = "two-sided"


# --- vectorised twins of the percentile bootstrap (same draws as stats.cluster_bootstrap) ------------


def _percentile_cluster_mean(values, clusters, rng, B) -> Estimate:
    """stats.cluster_bootstrap(np.mean, values, clusters=...) on balanced clusters, without the Python loop:
    the same rng.integers(0, G, G) draws, the resample mean as the mean of the picked cluster means."""
    _, m = stats._values_and_clusters(values, clusters)
    reps = m[rng.integers(0, m.size, size=(B, m.size))].mean(axis=1)
    lo, hi = np.quantile(reps, [0.025, 0.975])
    return Estimate(float(np.mean(values)), float(lo), float(hi), m.size, 0.95, "cluster bootstrap (percentile)")


def _percentile_cluster_slope(x, y, clusters, rng, B) -> Estimate:
    """stats.bootstrap_slope(x, y, clusters=...) without the Python loop (same draws; slope from cluster sums)."""
    x, y, G, inv = stats._xy_clusters(x, y, clusters)
    S = stats.cluster_sums(x, y, inv, G)
    reps = stats._slope_from_sums(S[rng.integers(0, G, size=(B, G))].sum(axis=1))
    lo, hi = np.quantile(reps[np.isfinite(reps)], [0.025, 0.975])
    return Estimate(stats.ols_slope(x, y), float(lo), float(hi), G, 0.95, "cluster bootstrap (percentile)")


def _percentile_paired_difference(x, y, rng, B) -> Estimate:
    """stats.paired_bootstrap_difference(x, y) without the Python loop: the same rng.integers(0, n, n) draws
    of pairs, the resample statistic mean(x - y) over the picked pairs."""
    d = np.asarray(x, dtype=float) - np.asarray(y, dtype=float)
    reps = d[rng.integers(0, d.size, size=(B, d.size))].mean(axis=1)
    lo, hi = np.quantile(reps, [0.025, 0.975])
    return Estimate(float(d.mean()), float(lo), float(hi), d.size, 0.95, "cluster bootstrap (percentile)")


def _percentile_two_sample_difference(x, y, rng, B) -> Estimate:
    """Percentile bootstrap of mean(x) - mean(y) resampling each arm on its own (independent arms):
    the B resamples of arm a (n_a rows each), then the B of arm b (Efron & Tibshirani 1993, §8.3)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    reps_a = x[rng.integers(0, x.size, size=(B, x.size))].mean(axis=1)
    reps = reps_a - y[rng.integers(0, y.size, size=(B, y.size))].mean(axis=1)
    lo, hi = np.quantile(reps, [0.025, 0.975])
    return Estimate(float(x.mean() - y.mean()), float(lo), float(hi), min(x.size, y.size), 0.95,
                    "two-sample bootstrap (percentile)")


def _fieller_or_unbounded(num, den, rng, B) -> Estimate:
    """stats.fieller_paired_ratio, with an unbounded set (mean(den) not distinguishable from 0) as (-inf, inf):
    it counts as covering, as the studentized bootstrap's infinite intervals do (a claim makes no verdict on it)."""
    try:
        return stats.fieller_paired_ratio(num, den)
    except ValueError:
        return Estimate(stats.ratio_of_means(num, den), -math.inf, math.inf, len(num), 0.95,
                        "Fieller, paired (unbounded)")


COVERAGE_METHODS: dict[str, CoverageMethod] = {m.name: m for m in (
    CoverageMethod("t_cluster_means", "mean", lambda v, c, rng, B: stats.t_interval_cluster_means(v, c)),
    CoverageMethod("percentile_cluster_mean", "mean", _percentile_cluster_mean),
    CoverageMethod("bca_cluster_mean", "mean",
                   lambda v, c, rng, B: stats.bca_cluster_mean(v, c, rng=rng, n_resamples=B)),
    CoverageMethod("studentized_cluster_mean", "mean",
                   lambda v, c, rng, B: stats.studentized_cluster_bootstrap_mean(v, c, rng=rng, n_resamples=B)),
    CoverageMethod("t_cluster_means_upper", "mean",
                   lambda v, c, rng, B: stats.t_interval_cluster_means(v, c, bound="upper"), bound="upper"),
    CoverageMethod("percentile_cluster_slope", "slope", _percentile_cluster_slope),
    CoverageMethod("bca_cluster_slope", "slope",
                   lambda x, y, c, rng, B: stats.bca_cluster_slope(x, y, c, rng=rng, n_resamples=B)),
    CoverageMethod("cr1_t_slope", "slope", lambda x, y, c, rng, B: stats.t_interval_cluster_slope(x, y, c)),
    CoverageMethod("wild_webb_slope", "slope",
                   lambda x, y, c, rng, B: stats.wild_cluster_bootstrap_slope(x, y, c, rng=rng, n_resamples=B)),
    CoverageMethod("wild_rademacher_slope", "slope",
                   lambda x, y, c, rng, B: stats.wild_cluster_bootstrap_slope(x, y, c, rng=rng, n_resamples=B,
                                                                              weights="rademacher")),
    CoverageMethod("wilson", "proportion", lambda k, n: stats.wilson_interval(k, n)),
    CoverageMethod("clopper_pearson", "proportion", lambda k, n: stats.clopper_pearson_interval(k, n)),
    CoverageMethod("clopper_pearson_upper", "proportion", lambda k, n: stats.clopper_pearson_upper(k, n),
                   bound="upper"),
    CoverageMethod("pooled_clopper_pearson", "clustered_proportion",
                   lambda e, c, rng, B: stats.clopper_pearson_interval(int(e.sum()), int(e.size))),
    CoverageMethod("cluster_bounds_proportion", "clustered_proportion",
                   lambda e, c, rng, B: stats.cluster_bounds_proportion(e, c)),
    CoverageMethod("newcombe_difference", "two_proportions",
                   lambda x, y, rng, B: stats.newcombe_difference(int(x.sum()), x.size, int(y.sum()), y.size)),
    CoverageMethod("percentile_paired_difference", "two_proportions", _percentile_paired_difference),
    CoverageMethod("percentile_two_sample_difference", "two_proportions", _percentile_two_sample_difference),
    CoverageMethod("percentile_paired_mean", "paired_difference", _percentile_paired_difference),
    CoverageMethod("studentized_paired_mean", "paired_difference",
                   lambda x, y, rng, B: stats.studentized_cluster_bootstrap_mean(x - y, rng=rng, n_resamples=B)),
    CoverageMethod("t_paired_mean", "paired_difference", lambda x, y, rng, B: stats.t_interval_cluster_means(x - y)),
    CoverageMethod("fieller_paired_ratio", "paired_ratio", _fieller_or_unbounded),
)}
"""The measured methods, by name; a claim names one of these when it asks ``valid_at``."""


# --- data-generating processes ------------------------------------------------------------------------


HARDER_DGPS = {"mean": ("bounded", "mixture", "rare swing", "rare swings ±"),
               "slope": ("bounded", "mixture", "rare swing"),
               "paired_ratio": ("bounded", "mixture", "rare swing")}
"""The DGPs of each kind harder than its first ones (module doc): skewed on [0, 1], a 95/5 mixture with distant
means, a value that is 0 mostly and large rarely (as threshold and ratio statistics are). Simulated for the
methods with a vectorised twin only (the others are not measured on them, so not valid: ``valid_at``)."""

SHAPES = {"bounded": (0.3 / 3.3, 0.3 * 3.0 / (3.3 ** 2 * 4.3)),
          "mixture": (0.05 * 6.0, 1.0 + 0.05 * 0.95 * 36.0),
          "rare swing": (0.03, 0.03 * 0.97),
          "rare swings ±": (0.0, 0.01 + 0.05 * 0.64)}
"""(mean, variance) in closed form of each harder shape (``draw_shape``)."""


def draw_shape(dgp: str, size, rng: np.random.Generator) -> np.ndarray:
    """Draws of a harder shape: ``bounded`` Beta(0.3, 3) (mean 1/11); ``mixture`` 0.95 N(0, 1) + 0.05 N(6, 1)
    (mean 0.3, variance 1 + 0.05·0.95·6²); ``rare swing`` Bernoulli(0.03) (0 with probability 0.97, else 1);
    ``rare swings ±`` N(0, 0.1²) plus ±0.8 with probability 0.025 each (mean 0). Moments: SHAPES."""
    if dgp == "bounded":
        return rng.beta(0.3, 3.0, size=size)
    if dgp == "mixture":
        return rng.normal(size=size) + 6.0 * (rng.random(size) < 0.05)
    if dgp == "rare swing":
        return (rng.random(size) < 0.03).astype(float)
    if dgp == "rare swings ±":
        u = rng.random(size)
        return rng.normal(scale=0.1, size=size) + np.where(u < 0.025, -0.8, np.where(u > 0.975, 0.8, 0.0))
    raise ValueError(f"dgp must be one of {tuple(SHAPES)}, got {dgp!r}")


def draw_means(dgp: str, G: int, reps: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, float]:
    """(values [reps, rows], clusters [rows], true mean) for a mean DGP (module doc; the harder ones: one
    ``draw_shape`` value per cluster) with G clusters."""
    if dgp in HARDER_DGPS["mean"]:
        return draw_shape(dgp, (reps, G), rng), np.arange(G), SHAPES[dgp][0]
    if dgp == "normal":
        return rng.normal(size=(reps, G)), np.arange(G), 0.0
    if dgp == "lognormal":
        return np.exp(rng.normal(size=(reps, G))), np.arange(G), math.exp(0.5)
    if dgp == "correlated":
        u = rng.normal(scale=math.sqrt(ICC), size=(reps, G, 1))
        e = rng.normal(scale=math.sqrt(1 - ICC), size=(reps, G, ROWS_PER_CLUSTER))
        return (u + e).reshape(reps, -1), np.repeat(np.arange(G), ROWS_PER_CLUSTER), 0.0
    raise ValueError(f"dgp must be one of {DGPS['mean']}, got {dgp!r}")


def draw_slopes(G: int, reps: int, rng: np.random.Generator,
                dgp: str = "random_slope") -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(x, y [reps, rows], clusters [rows], true mean slope) for a slope DGP (module doc): ``random_slope`` has
    b_g ~ N(1, 0.3²); a harder one b_g = 1 + 0.3 z_g, z_g its ``draw_shape`` standardised to mean 0, variance 1."""
    shape = (reps, G, ROWS_PER_CLUSTER)
    x = rng.normal(size=shape)
    a = rng.normal(size=(reps, G, 1))
    if dgp == "random_slope":
        b = rng.normal(SLOPE_MEAN, SLOPE_SD, size=(reps, G, 1))
    elif dgp in HARDER_DGPS["slope"]:
        mu, var = SHAPES[dgp]
        b = SLOPE_MEAN + SLOPE_SD * (draw_shape(dgp, (reps, G, 1), rng) - mu) / math.sqrt(var)
    else:
        raise ValueError(f"dgp must be one of {DGPS['slope']}, got {dgp!r}")
    y = a + b * x + rng.normal(scale=NOISE_SD, size=shape)
    return x.reshape(reps, -1), y.reshape(reps, -1), np.repeat(np.arange(G), ROWS_PER_CLUSTER), SLOPE_MEAN


def draw_clustered_events(dgp: str, G: int, reps: int,
                          rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, float]:
    """(events [reps, rows] of 0/1, clusters [rows], true p̄) for a clustered-proportion DGP (module doc)."""
    if dgp not in DGPS["clustered_proportion"]:
        raise ValueError(f"dgp must be one of {DGPS['clustered_proportion']}, got {dgp!r}")
    family, p = dgp.split(" p=")
    p = float(p)
    if family == "iid":
        pg = np.full((reps, G, 1), p)
    elif family == "beta":  # ICC = 1 / (a + b + 1) = 0.5: a + b = 1
        pg = rng.beta(p, 1.0 - p, size=(reps, G, 1))
    else:
        pg = (rng.random((reps, G, 1)) < p).astype(float)
    events = (rng.random((reps, G, TRIALS_PER_CLUSTER)) < pg).astype(np.int8)
    return events.reshape(reps, -1), np.repeat(np.arange(G), TRIALS_PER_CLUSTER), p


def draw_two_proportions(dgp: str, n: int, reps: int,
                         rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, float]:
    """(x, y [reps, n] of 0/1, true p_a - p_b): n independent Bernoulli(p_a) and Bernoulli(p_b) outcomes
    per arm for a two-proportions DGP (module doc)."""
    if dgp not in DGPS["two_proportions"]:
        raise ValueError(f"dgp must be one of {DGPS['two_proportions']}, got {dgp!r}")
    p_a, p_b = (float(part.split("=")[1]) for part in dgp.split())
    x = (rng.random((reps, n)) < p_a).astype(np.int8)
    y = (rng.random((reps, n)) < p_b).astype(np.int8)
    return x, y, p_a - p_b


def _correlated_normals(reps: int, n: int, rho: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    z1 = rng.normal(size=(reps, n))
    return z1, rho * z1 + math.sqrt(1 - rho * rho) * rng.normal(size=(reps, n))


def draw_pairs(kind: str, dgp: str, n: int, reps: int,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, float]:
    """(x, y [reps, n], truth) for a paired-difference (truth E[x - y]) or paired-ratio (x = num, y = den,
    truth E[num] / E[den]) DGP (module doc)."""
    if kind not in ("paired_difference", "paired_ratio") or dgp not in DGPS[kind]:
        raise ValueError(f"kind and dgp must be a paired kind and one of its DGPs, got {kind!r}, {dgp!r}")
    if kind == "paired_ratio" and dgp == "bounded":  # skewed shares: E = 1/11 over 10/11
        return rng.beta(0.3, 3.0, size=(reps, n)), rng.beta(3.0, 0.3, size=(reps, n)), 0.1
    if kind == "paired_ratio" and dgp == "mixture":  # normal pairs, num + 30 (10 sd) in 5 % of pairs
        z1, z2 = _correlated_normals(reps, n, 0.5, rng)
        return 10.0 + 3.0 * z1 + 30.0 * (rng.random((reps, n)) < 0.05), 45.0 + 15.0 * z2, 11.5 / 45.0
    if kind == "paired_ratio" and dgp == "rare swing":  # lognormal pairs, num = 450 (a capped run) in 3 %
        z1, z2 = _correlated_normals(reps, n, 0.5, rng)
        num = np.exp(math.log(10.0) - 0.125 + 0.5 * z1)
        return (np.where(rng.random((reps, n)) < 0.03, 450.0, num), np.exp(math.log(45.0) - 0.125 + 0.5 * z2),
                RARE_SWING_RATIO)
    if dgp == "gamma-Poisson counts":
        g = rng.gamma(2.0, 0.5, size=(reps, n))
        den = 1.0 + rng.poisson(44.0 * g)
        return 1.0 + rng.poisson(9.0 * g), den, RATIO_TRUTH
    z1, z2 = _correlated_normals(reps, n, 0.5, rng)
    if kind == "paired_difference":
        if dgp == "normal rho=0.5":
            return z1, z2, 0.0
        return np.exp(z1), np.exp(0.5 * z2), math.exp(0.5) - math.exp(0.125)
    if dgp == "normal rho=0.5":
        return 10.0 + 3.0 * z1, 45.0 + 15.0 * z2, RATIO_TRUTH
    return np.exp(math.log(10.0) - 0.125 + 0.5 * z1), np.exp(math.log(45.0) - 0.125 + 0.5 * z2), RATIO_TRUTH


# --- vectorised over data sets (the coverage simulation's fast path) ----------------------------------
# Each takes a batch of R data sets and returns (lo [R], hi [R], width [R]) with width = hi - lo (hi - estimate
# for an upper limit). For R = 1 each draws exactly what its stats function draws from the same rng, so a
# twin equals the function it stands for on one data set (tests/test_gapdyn_coverage.py).


def _batch_cluster_means(values: np.ndarray, clusters: np.ndarray) -> np.ndarray:
    """Per-cluster means [R, G] of values [R, rows] (cluster order of np.unique, as stats._values_and_clusters)."""
    G, inv = stats._cluster_labels(clusters, values.shape[1])
    onehot = np.zeros((values.shape[1], G))
    onehot[np.arange(values.shape[1]), inv] = 1.0
    return (values @ onehot) / onehot.sum(axis=0)


def _batch_t_means(m: np.ndarray, bound: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """stats.t_interval_cluster_means on each row of the cluster means m [R, G]: m̄ ± t_{G-1} sd / √G."""
    from scipy.stats import t

    G = m.shape[1]
    point = m.mean(axis=1)
    se = m.std(axis=1, ddof=1) / math.sqrt(G)
    q = float(t.ppf(0.975 if bound == "two-sided" else 0.95, G - 1))
    hi = point + q * se
    if bound == "upper":
        return np.full_like(hi, -math.inf), hi, hi - point
    return point - q * se, hi, 2 * q * se


def _batch_studentized_means(m: np.ndarray, rng: np.random.Generator, B: int):
    """stats.studentized_cluster_bootstrap_mean (two-sided 95 %) on each row of m [R, G]: t*_b = (m̄*_b - m̄) /
    (sd(m*_b) / √G), [m̄ - q*(0.975) se, m̄ - q*(0.025) se] with inverted-CDF quantiles over the t* that are not 0/0;
    NaN when no t* is left (every cluster mean equal)."""
    R, G = m.shape
    point = m.mean(axis=1)
    se = m.std(axis=1, ddof=1) / math.sqrt(G)
    res = np.take_along_axis(m[:, None, :], rng.integers(0, G, size=(R, B, G)), axis=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_star = (res.mean(axis=2) - point[:, None]) / (res.std(axis=2, ddof=1) / math.sqrt(G))
    lo, hi = np.full(R, math.nan), np.full(R, math.nan)
    ok = ~np.all(np.isnan(t_star), axis=1)
    if ok.any():
        q_lo, q_hi = np.nanquantile(t_star[ok], [0.025, 0.975], axis=1, method="inverted_cdf")
        lo[ok], hi[ok] = point[ok] - q_hi * se[ok], point[ok] - q_lo * se[ok]
    return lo, hi, hi - lo


def _batch_cr1_t_slope(x: np.ndarray, y: np.ndarray, clusters: np.ndarray):
    """stats.t_interval_cluster_slope on each row of x, y [R, rows]: OLS slope ± t_{G-1}(0.975) CR1 se (cr1_slope)."""
    from scipy.stats import t

    R, N = x.shape
    G, inv = stats._cluster_labels(clusters, N)
    X = np.stack([np.ones_like(x), x], axis=2)  # [R, N, 2]
    M = np.linalg.inv(np.einsum("rni,rnj->rij", X, X))
    beta = np.einsum("rij,rnj,rn->ri", M, X, y)
    u = y - np.einsum("rni,ri->rn", X, beta)
    onehot = np.zeros((N, G))
    onehot[np.arange(N), inv] = 1.0
    C = np.einsum("rni,rn,ng->rgi", X, u, onehot)  # C_g = X_g' u_g, [R, G, 2]
    d = np.einsum("rgi,ri->rg", C, M[:, 1, :])
    se = np.sqrt(G / (G - 1) * (N - 1) / (N - 2) * np.sum(d * d, axis=1))
    q = float(t.ppf(0.975, G - 1))
    return beta[:, 1] - q * se, beta[:, 1] + q * se, 2 * q * se


def _batch_fieller(num: np.ndarray, den: np.ndarray):
    """``_fieller_or_unbounded`` on each row of num, den [R, n]: the roots of a ρ² - 2 b ρ + c0 = 0 (stats.fieller_paired_ratio),
    (-inf, inf) where a <= 0 (unbounded)."""
    from scipy.stats import t

    n = num.shape[1]
    q = float(t.ppf(0.975, n - 1)) ** 2 / n
    xm, ym = num.mean(axis=1), den.mean(axis=1)
    dx, dy = num - xm[:, None], den - ym[:, None]
    sxx, syy, sxy = (dx * dx).sum(1) / (n - 1), (dy * dy).sum(1) / (n - 1), (dx * dy).sum(1) / (n - 1)
    a, b, c0 = ym * ym - q * syy, xm * ym - q * sxy, xm * xm - q * sxx
    bounded = a > 0
    root = np.sqrt(np.maximum(b * b - a * c0, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        lo = np.where(bounded, (b - root) / a, -math.inf)
        hi = np.where(bounded, (b + root) / a, math.inf)
    return lo, hi, hi - lo


def _vectorised(name: str):
    """The batch twin of a method a claim uses, or of its one-sided or t companion (None: the method is simulated
    one data set at a time); each takes the kind's batch arrays (values, clusters | x, y, clusters | num, den) and
    (rng, B)."""
    means = lambda f: lambda v, c, rng, B: f(_batch_cluster_means(v, c), rng, B)  # noqa: E731
    return {
        "t_cluster_means": means(lambda m, rng, B: _batch_t_means(m, "two-sided")),
        "t_cluster_means_upper": means(lambda m, rng, B: _batch_t_means(m, "upper")),
        "studentized_cluster_mean": means(_batch_studentized_means),
        "cr1_t_slope": lambda x, y, c, rng, B: _batch_cr1_t_slope(x, y, c),
        "fieller_paired_ratio": lambda x, y, rng, B: _batch_fieller(x, y),
    }.get(name)


# --- the measurement ----------------------------------------------------------------------------------


def _covers(lo, hi, truth: float, bound: str):
    """Whether [lo, hi] (an upper limit hi) holds the truth; no interval (NaN: e.g. every cluster value equal, where
    the study makes no claim and says "not measured") counts as covering, as an unbounded one does."""
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    none = np.isnan(hi) if bound == "upper" else np.isnan(lo) | np.isnan(hi)
    inside = (truth <= hi) if bound == "upper" else (lo <= truth) & (truth <= hi)
    return none | inside


def _covered(e: Estimate, truth: float, bound: str) -> bool:
    return bool(_covers(e.lo, e.hi, truth, bound))


def _row(m: CoverageMethod, dgp: str, n: int, cov: float, se: float, width: float, reps: int, B: int,
         seed) -> dict:
    return dict(method=m.name, kind=m.kind, dgp=dgp, n=int(n), nominal=m.confidence, bound=m.bound,
                coverage=float(cov), mc_se=float(se), mean_width=float(width), reps=int(reps), n_resamples=int(B),
                seed=seed)


def _draw(kind: str, dgp: str, n: int, reps: int, rng: np.random.Generator):
    """(batch arrays of the kind's interval signature, truth) for ``reps`` data sets of a simulated kind."""
    if kind == "mean":
        values, clusters, truth = draw_means(dgp, n, reps, rng)
        return (values, clusters), truth
    if kind == "clustered_proportion":
        events, clusters, truth = draw_clustered_events(dgp, n, reps, rng)
        return (events, clusters), truth
    if kind == "two_proportions":
        x, y, truth = draw_two_proportions(dgp, n, reps, rng)
        return (x, y), truth
    if kind in ("paired_difference", "paired_ratio"):
        x, y, truth = draw_pairs(kind, dgp, n, reps, rng)
        return (x, y), truth
    x, y, clusters, truth = draw_slopes(n, reps, rng, dgp)
    return (x, y, clusters), truth


def _batch(arrays, sl: slice):
    """The data sets ``sl`` of a kind's batch arrays (the clusters labels are shared, 1-D)."""
    return tuple(a[sl] if a.ndim == 2 else a for a in arrays)


def _simulated_cells(methods, kind, dgp, n, reps, rng, B, seed, vec_rng) -> list[dict]:
    """One (kind, DGP, n) cell. The methods simulated one data set at a time (no vectorised twin) share ``reps``
    data sets from ``rng`` (common random numbers; the paired kinds VECTORISED_REPS_FACTOR × reps) and are not run
    on the kind's HARDER_DGPS; the methods with a twin (``_vectorised``) share VECTORISED_REPS_FACTOR × reps data
    sets from ``vec_rng``, in chunks."""
    looped = [m for m in methods if _vectorised(m.name) is None and dgp not in HARDER_DGPS.get(kind, ())]
    fast = [m for m in methods if _vectorised(m.name) is not None]
    rows = []
    if looped:
        n_looped = reps * VECTORISED_REPS_FACTOR if kind.startswith("paired_") else reps
        arrays, truth = _draw(kind, dgp, n, n_looped, rng)
        for m in looped:
            ests = [m.interval(*(a[r] if a.ndim == 2 else a for a in arrays), rng, B) for r in range(n_looped)]
            hit = np.array([_covered(e, truth, m.bound) for e in ests], dtype=float)
            width = np.mean([e.hi - (e.estimate if m.bound == "upper" else e.lo) for e in ests])
            cov = float(hit.mean())
            rows.append(_row(m, dgp, n, cov, math.sqrt(cov * (1 - cov) / n_looped), width, n_looped, B, seed))
        if kind == "mean" and any(m.name == "studentized_cluster_mean" for m in methods):
            # the studentized bootstrap ran last in this loop before it had a twin: its draws are drawn and dropped
            # so the next cell's looped methods see the stream as before (their rows stay as they were)
            G = int(np.unique(arrays[1]).size)
            for _ in range(reps):
                rng.integers(0, G, size=(B, G))
    if fast:
        total = reps * VECTORISED_REPS_FACTOR
        arrays, truth = _draw(kind, dgp, n, total, vec_rng)
        chunk = max(1, 4_000_000 // (B * max(n, 1)))
        for m in fast:
            f = _vectorised(m.name)
            hits, widths = [], []
            for start in range(0, total, chunk):
                lo, hi, width = f(*_batch(arrays, slice(start, start + chunk)), vec_rng, B)
                hits.append(_covers(lo, hi, truth, m.bound))
                widths.append(width)
            cov = float(np.concatenate(hits).mean())
            rows.append(_row(m, dgp, n, cov, math.sqrt(cov * (1 - cov) / total),
                             float(np.mean(np.concatenate(widths))), total, B, seed))
    order = {m.name: i for i, m in enumerate(methods)}
    return sorted(rows, key=lambda r: order[r["method"]])


def _exact_proportion_cells(methods, n, seed) -> list[dict]:
    """Coverage Σ_k Binom(k; n, p) 1[p covered by the interval at k], and the pmf-weighted mean width."""
    from scipy.stats import binom

    rows = []
    ks = np.arange(n + 1)
    for m in methods:
        ests = [m.interval(int(k), int(n)) for k in ks]
        lo = np.array([e.lo for e in ests])
        hi = np.array([e.hi for e in ests])
        for dgp in DGPS["proportion"]:
            p = float(dgp.split("=")[1])
            pmf = binom.pmf(ks, n, p)
            inside = (p <= hi) if m.bound == "upper" else (lo <= p) & (p <= hi)
            width = hi - (ks / n if m.bound == "upper" else lo)
            rows.append(_row(m, dgp, n, pmf[inside].sum(), 0.0, pmf @ width, 0, 0, seed))
    return rows


def _resolve(methods) -> list[CoverageMethod]:
    if methods is None:
        return list(COVERAGE_METHODS.values())
    out = []
    for m in methods:
        if isinstance(m, CoverageMethod):
            out.append(m)
        elif m in COVERAGE_METHODS:
            out.append(COVERAGE_METHODS[m])
        else:
            raise ValueError(f"methods: unknown method {m!r}; choose from {list(COVERAGE_METHODS)}")
    if not out:
        raise ValueError("methods must name at least one method")
    if any(m.kind not in KINDS for m in out):
        raise ValueError(f"methods: every kind must be one of {KINDS}")
    return out


def coverage_table(methods: Sequence[str | CoverageMethod] | None = None, ns: Sequence[int] | None = None, *,
                   reps: int = 2000, rng: np.random.Generator, n_resamples: int = 999,
                   dgps: Sequence[str] | None = None, seed=None):
    """Coverage of each method on each DGP of its kind at each n, as a pandas DataFrame.

    Columns: method, kind, dgp, n, nominal, bound, coverage, mc_se = √(c(1-c)/reps) (0 for the exact
    proportion sums), mean_width (hi - lo; hi - estimate for an upper limit), reps, n_resamples (bootstrap
    draws per interval), seed (a label stored with the rows). One data set per (DGP, n, rep) is shared by
    the looped methods of a kind (the vectorised ones share VECTORISED_REPS_FACTOR × reps of their own, module doc);
    the paired kinds simulate VECTORISED_REPS_FACTOR × reps data sets for every method. ``dgps`` restricts the DGPs (default: all of each kind); ``ns`` the n of every
    kind (default: each kind's own, ``NS_BY_KIND``).
    """
    import pandas as pd

    rng = stats._check_rng(rng)
    ms = _resolve(methods)
    if ns is not None:
        ns = [stats._as_count(n, "ns") for n in ns]
        if not ns or min(ns) < 3:
            raise ValueError(f"ns must be integers >= 3, got {ns!r}")
    reps = stats._as_count(reps, "reps")
    if reps < 1:
        raise ValueError("reps must be >= 1")
    B = stats._check_resamples(n_resamples)
    # the clustered proportions, the two proportions and the paired kinds draw from spawned child streams
    # (children 0 to 3; spawning more children leaves the first ones as they were), so adding them left the
    # other kinds' draws unchanged and regenerating a kind's rows alone (--methods, every method of the kind)
    # gives the same numbers as a full run
    streams = dict(zip(("clustered_proportion", "two_proportions", "paired_difference", "paired_ratio"),
                       rng.spawn(4)))
    # the vectorised methods of the means and slopes draw from two more children (4, 5), the paired ratio's from its
    # kind's child as before; the looped methods keep the parent stream, so their rows stay as they were
    vec_streams = {**streams, **dict(zip(("mean", "slope"), rng.spawn(2)))}
    rows = []
    for kind in KINDS:
        km = [m for m in ms if m.kind == kind]
        if not km:
            continue
        kind_dgps = [d for d in DGPS[kind] if dgps is None or d in dgps]
        kind_ns = NS_BY_KIND[kind] if ns is None else ns
        if kind == "proportion":
            for n in kind_ns:
                rows += [r for r in _exact_proportion_cells(km, n, seed) if r["dgp"] in kind_dgps]
            continue
        for dgp in kind_dgps:
            for n in kind_ns:
                rows += _simulated_cells(km, kind, dgp, n, reps, streams.get(kind, rng), B, seed, vec_streams[kind])
    if not rows:
        raise ValueError(f"dgps: none of {dgps!r} belongs to the kinds of the chosen methods")
    return pd.DataFrame(rows, columns=COLUMNS)


# --- the rule a claim uses ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _read_frozen():
    import pandas as pd

    return pd.read_csv(DATA_PATH)


def frozen_table():
    """The committed measurement (gapdyn/evidence/data/coverage.csv, written by ``python -m gapdyn.evidence.coverage``)."""
    return _read_frozen().copy()


def _method_rows(method: str, table):
    table = frozen_table() if table is None else table
    rows = table[table["method"] == method]
    if rows.empty:
        raise ValueError(f"method {method!r} is not in the coverage table; it holds {sorted(set(table['method']))}")
    return rows


def _valid_by_n(rows, tol: float, table) -> dict[int, bool]:
    """{n: worst coverage over the DGPs at n >= nominal - tol} for one method's rows; a method not measured at n
    on every DGP the table holds for its kind is not valid at n (not measured is not evidence of coverage)."""
    n, c = rows["n"].to_numpy(), rows["coverage"].to_numpy()
    floor = float(rows["nominal"].iloc[0]) - tol
    if "kind" in rows:
        need = set(table.loc[table["kind"] == rows["kind"].iloc[0], "dgp"])
    else:
        need = set(rows["dgp"])
    d = rows["dgp"].to_numpy()
    return {int(k): bool(c[n == k].min() >= floor and need <= set(d[n == k])) for k in np.unique(n)}


def _check_tol(tol) -> float:
    t = float(tol)
    if not (0.0 <= t < 1.0):
        raise ValueError(f"tol must lie in [0, 1), got {tol!r}")
    return t


def valid_at(method: str, n: int, table=None, *, tol: float = 0.02) -> bool:
    """Whether ``method`` is valid at n: worst coverage over the DGPs >= nominal - tol.

    An n between tabulated values is judged at the largest tabulated n' <= n (coverage of these methods
    rises with n up to Monte Carlo noise; the exact proportion curves oscillate, so this is an
    approximation there); n below the smallest tabulated value is not valid. ``table=None``: the
    committed measurement (``frozen_table``).
    """
    n = stats._as_count(n, "n")
    table = frozen_table() if table is None else table
    by_n = _valid_by_n(_method_rows(method, table), _check_tol(tol), table)
    below = [m for m in by_n if m <= n]
    return bool(below) and by_n[max(below)]


def min_valid_n(method: str, table=None, *, tol: float = 0.02) -> int | None:
    """The smallest tabulated n from which ``method`` is valid at every larger tabulated n (None: never)."""
    table = frozen_table() if table is None else table
    by_n = _valid_by_n(_method_rows(method, table), _check_tol(tol), table)
    best = None
    for n in sorted(by_n, reverse=True):
        if not by_n[n]:
            break
        best = n
    return best


def too_few_reason(method: str, n: int, unit: str, table=None) -> str:
    """Why a claim whose interval ``method`` is not valid at n is not measured (the one wording of every study):
    "too few <unit> for a valid interval (n = <n>; <method> valid from n = <min_valid_n> | never within the
    tabulated n, docs/coverage.md)"."""
    if not isinstance(unit, str) or not unit:
        raise ValueError(f"unit must be a non-empty string (what n counts), got {unit!r}")
    n = stats._as_count(n, "n")
    m = min_valid_n(method, table)
    need = "never within the tabulated n" if m is None else f"valid from n = {m}"
    return f"too few {unit} for a valid interval (n = {n}; {method} {need}, docs/coverage.md)"


def base_reps(table) -> int:
    """The ``reps`` a table was simulated with: the data sets per cell of a looped method outside the paired kinds
    (a vectorised method and the paired kinds hold VECTORISED_REPS_FACTOR times as many)."""
    sim = table["reps"] > 0
    one = ~table["method"].map(lambda m: _vectorised(m) is not None) & ~table["kind"].str.startswith("paired_")
    if (sim & one).any():
        return int(table.loc[sim & one, "reps"].max())
    return int(table.loc[sim, "reps"].max()) // VECTORISED_REPS_FACTOR if sim.any() else 0


# --- rendering and the command ------------------------------------------------------------------------


def coverage_markdown(table, *, command: str, tol: float = 0.02) -> str:
    """docs/coverage.md from a coverage table: the conclusions (min_valid_n), worst coverage by n, every cell."""
    reps = base_reps(table)
    B = int(table["n_resamples"].max())
    seed = table["seed"].iloc[0]
    lines = [
        "# Coverage of the interval methods",
        "",
        f"Generated by `{command}` (seed {seed}); do not edit by hand. The same numbers are committed as",
        "`gapdyn/evidence/data/coverage.csv`, which `gapdyn.evidence.coverage.valid_at` and `min_valid_n` read.",
        "",
        f"The methods with a vectorised twin (the t intervals of means, the studentized cluster bootstrap, the CR1 t "
        f"slope, Fieller) and the paired-difference methods: {reps * VECTORISED_REPS_FACTOR} simulated data sets per "
        f"cell, Monte Carlo SE √(c(1-c)/{reps * VECTORISED_REPS_FACTOR}) ≤ "
        f"{0.5 / math.sqrt(max(reps * VECTORISED_REPS_FACTOR, 1)):.4f} at any coverage c; the other simulated methods "
        f"(percentile and BCa bootstraps of means and slopes, wild bootstraps, clustered and two proportions): {reps} "
        f"per cell (SE ≈ √(0.95·0.05/{reps}) = {math.sqrt(0.95 * 0.05 / max(reps, 1)):.4f} at nominal coverage), "
        f"and not on the harder DGPs (so not valid where those are tabulated). {B} bootstrap "
        "draws per interval (fewer than the functions' default 1999, to keep the run short). Proportions: coverage "
        "summed exactly over the binomial law (no Monte Carlo error; the law of k is binomial whatever makes the "
        "outcomes, so the harder shapes reduce to p there). n is the number of clusters (means, slopes), trials "
        "(proportions), runs per arm (two proportions) or pairs (paired kinds). The data-generating processes are "
        "described in the `gapdyn.evidence.coverage` module docstring: means on normal, lognormal (σ = 1) and "
        "correlated (5 rows per cluster, intra-cluster correlation 0.5) data, and on four harder shapes, one value "
        "per cluster: bounded (Beta(0.3, 3)), mixture (0.95 N(0, 1) + 0.05 N(6, 1)), rare swing (Bernoulli(0.03): "
        "0 mostly, 1 rarely) and rare swings ± (N(0, 0.1²) plus ±0.8 with probability 0.025 each); slopes with a "
        "random within-cluster slope 1 + 0.3 z (z normal, or one of the bounded, mixture, rare-swing shapes "
        "standardised) and x drawn per cluster; proportions at p = 0.05, 0.4, 0.95; clustered proportions with 16 "
        "binary trials per cluster (independent, beta with intra-cluster correlation 0.5, all-or-none); two "
        "proportions p_a - p_b from two independent arms of n runs each at (p_a, p_b) = (0.05, 0.05), (0.3, 0.1), "
        "(0.5, 0.2), (0.1, 0), the paired bootstrap pairing run i of arm a with run i of arm b; paired differences "
        "x - y of bivariate normal and of skewed correlated lognormal pairs (correlation 0.5); ratios E[num] / "
        "E[den] of bivariate normal, correlated lognormal (σ = 0.5) and gamma-Poisson count pairs (2/9), of skewed "
        "shares (bounded), of normal pairs with a +30 shift of num in 5 % (mixture) and of lognormal pairs with a "
        "capped run num = 450 in 3 % (rare swing). No interval (NaN: every value equal, where the study makes no "
        "claim) and an unbounded Fieller set count as covering.",
        "",
        f"**Rule.** A method is *valid at n* when it is measured on every DGP of its kind at n and its worst "
        f"coverage over them is at least nominal − {tol} (0.93 for the 95 % intervals); it is valid *from* n when it "
        "is valid at n and at every larger tabulated n. A claim at an n between tabulated values is judged at the "
        "largest tabulated n below it; below its interval's valid n a claim is not measured, with the reason.",
        "",
        "## Conclusions",
        "",
        "| kind | method | bound | nominal | valid from n | valid from n, per DGP |",
        "|---|---|---|---|---|---|",
    ]
    methods = list(dict.fromkeys(table["method"]))
    for m in methods:
        r = table[table["method"] == m].iloc[0]
        never = f"never (n ≤ {int(table.loc[table['method'] == m, 'n'].max())})"
        v = min_valid_n(m, table, tol=tol)
        per_dgp = []
        for d in dict.fromkeys(table.loc[table["method"] == m, "dgp"]):
            vd = min_valid_n(m, table[table["dgp"] == d], tol=tol)
            per_dgp.append(f"{d}: {'never' if vd is None else vd}")
        missing = [d for d in dict.fromkeys(table.loc[table["kind"] == r.kind, "dgp"])
                   if d not in set(table.loc[table["method"] == m, "dgp"])]
        if missing:
            per_dgp.append(f"not measured on {', '.join(missing)}")
        lines.append(f"| {r.kind} | `{m}` | {r.bound} | {r.nominal:.2f} | {never if v is None else v} | "
                     f"{', '.join(per_dgp)} |")
    lines += ["", "## Worst coverage over the DGPs, by n"]
    grids = {}  # one table per grid of tabulated n (the kinds' NS_BY_KIND), in the methods' order
    for m in methods:
        grids.setdefault(tuple(sorted(set(int(n) for n in table.loc[table["method"] == m, "n"]))), []).append(m)
    for ns, grid_methods in grids.items():
        lines += ["", "| method | " + " | ".join(f"n = {n}" for n in ns) + " |", "|---|" + "---|" * len(ns)]
        for m in grid_methods:
            worst = table[table["method"] == m].groupby("n")["coverage"].min()
            lines.append(f"| `{m}` | " + " | ".join(f"{worst[n]:.3f}" for n in ns) + " |")
    lines += ["", "## Every cell", "", "| method | dgp | n | coverage | MC SE | mean width |",
              "|---|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| `{r.method}` | {r.dgp} | {r.n} | {r.coverage:.3f} | {r.mc_se:.3f} | {r.mean_width:.3f} |")
    return "\n".join(lines) + "\n"


@dataclass
class CoverageConfig:
    """Regenerate the coverage table (gapdyn/evidence/data/coverage.csv) and its markdown rendering."""

    out: str = "docs/coverage.md"
    """markdown file to write"""
    data: str = str(DATA_PATH)
    """CSV file for the frozen table that valid_at reads"""
    reps: int = 2000
    """simulated data sets per (method, DGP, n) cell"""
    n_resamples: int = 999
    """bootstrap draws per interval"""
    seed: int = 0
    """seed of the numpy Generator"""
    render_only: bool = False
    """re-render --out from the existing --data table without simulating (the table keeps its reps and seed)"""
    methods: tuple[str, ...] = ()
    """simulate only these methods and replace their rows in the existing --data table (default: all)"""


def _command_line(cfg: CoverageConfig) -> str:
    """The command that regenerates ``cfg``'s table (non-default options only)."""
    defaults = CoverageConfig()
    opts = [f"--{k.replace('_', '-')} {getattr(cfg, k)}" for k in ("reps", "n_resamples", "seed")
            if getattr(cfg, k) != getattr(defaults, k)]
    return " ".join(["python -m gapdyn.evidence.coverage", *opts, f"--out {cfg.out}"])


def _run(argv) -> int:
    import pandas as pd

    from ..cmdline import parse, say

    cfg = parse(CoverageConfig, argv, prog="python -m gapdyn.evidence.coverage", description=CoverageConfig.__doc__)
    if cfg.render_only:
        table = pd.read_csv(cfg.data)
        cfg = CoverageConfig(out=cfg.out, data=cfg.data, reps=base_reps(table),
                             n_resamples=int(table["n_resamples"].max()), seed=int(table["seed"].iloc[0]))
    elif cfg.methods:
        _resolve(cfg.methods)
        old = pd.read_csv(cfg.data)
        if base_reps(old) != cfg.reps or int(old["seed"].iloc[0]) != cfg.seed:
            raise ValueError(f"--methods: the table in {cfg.data} has reps {base_reps(old)} and seed "
                             f"{int(old['seed'].iloc[0])}; pass the same --reps and --seed")
        say("coverage", f"simulating {', '.join(cfg.methods)} x DGPs x each kind's n, {cfg.reps} reps")
        new = coverage_table(list(cfg.methods), reps=cfg.reps, rng=np.random.default_rng(cfg.seed),
                             n_resamples=cfg.n_resamples, seed=cfg.seed)
        table = pd.concat([old[~old["method"].isin(cfg.methods)], new], ignore_index=True)
        table = table.iloc[np.argsort(table["kind"].map(KINDS.index).to_numpy(), kind="stable")].reset_index(drop=True)
    else:
        say("coverage", f"simulating {len(COVERAGE_METHODS)} methods x DGPs x each kind's n, {cfg.reps} reps")
        table = coverage_table(reps=cfg.reps, rng=np.random.default_rng(cfg.seed), n_resamples=cfg.n_resamples,
                               seed=cfg.seed)
    Path(cfg.data).parent.mkdir(parents=True, exist_ok=True)
    write_with(cfg.data, lambda tmp: table.to_csv(tmp, index=False, float_format="%.10g"))
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(cfg.out, coverage_markdown(table, command=_command_line(cfg)))
    _read_frozen.cache_clear()
    say("coverage", f"wrote {cfg.data} and {cfg.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m gapdyn.evidence.coverage [--out docs/coverage.md] [--reps 2000] [--n-resamples 999] [--seed 0]``."""
    from ..cmdline import command

    return command("gapdyn coverage")(_run)(argv)


if __name__ == "__main__":
    raise SystemExit(main())
