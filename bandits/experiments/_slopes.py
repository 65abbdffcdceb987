"""The log-log slope estimator shared by the length and success-rate experiments.

Rows come in series (e.g. one instance and random stream over T, or one trajectory over its
checkpoints); each series is centred in x and y and the pooled least-squares slope is taken
(a within-series, fixed-effects slope: series-level offsets such as an instance's overall scale do
not enter). The 95 % interval is a cluster bootstrap over instances (gapdyn.cluster_bootstrap,
docs/evidence.md §3): a drawn instance brings all its series.
"""

from __future__ import annotations

import numpy as np

import gapdyn

__all__ = ["within_slope", "within_slope_estimate"]


def within_slope(x, y, series) -> float:
    """sum (x - xbar_s)(y - ybar_s) / sum (x - xbar_s)^2 with means per series label s; NaN if x is constant
    within every series. A series drawn twice by the bootstrap is centred once (same label)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    _, inv = np.unique(np.asarray(series), return_inverse=True)
    cnt = np.bincount(inv)
    xc = x - (np.bincount(inv, x) / cnt)[inv]
    yc = y - (np.bincount(inv, y) / cnt)[inv]
    sxx = float(xc @ xc)
    return float(xc @ yc / sxx) if sxx > 0 else float("nan")


def within_slope_estimate(x, y, *, series, instance, rng: np.random.Generator,
                          n_resamples: int = 2000) -> gapdyn.Estimate:
    """:func:`within_slope` of y on x with a cluster-bootstrap interval over ``instance`` labels
    (integers); n = number of instances."""
    series = np.asarray(series)
    instance = np.asarray(instance)
    if not (np.issubdtype(series.dtype, np.integer) and np.issubdtype(instance.dtype, np.integer)):
        raise ValueError("series and instance must be integer labels")
    return gapdyn.cluster_bootstrap(within_slope, np.asarray(x, float), np.asarray(y, float), series,
                                    clusters=instance, rng=rng, n_resamples=n_resamples)
