"""The log-log slope estimator shared by the length and success-rate experiments.

Rows come in series (e.g. one instance and random stream over T, or one trajectory over its
checkpoints); each series is centred in x and y and the pooled least-squares slope is taken
(a within-series, fixed-effects slope: series-level offsets such as an instance's overall scale do
not enter). The 95 % interval is a cluster bootstrap over instances (gapdyn.cluster_bootstrap,
docs/evidence.md §3): a drawn instance brings all its series.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import gapdyn

__all__ = ["within_slope", "within_slope_estimate", "EXACT", "LEFT", "RIGHT", "CensoredFit", "censored_within_slope",
           "censored_slope_estimate"]


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


# --- censored within-series slope (Tobit likelihood, fixed effect per series) --------------------

EXACT, LEFT, RIGHT = 0, -1, 1
"""Censoring codes: y observed; the true y <= the given y (left); the true y >= the given y (right)."""


def _tobit_parts(params, x, y, code, inv):
    """(log-likelihood, per-row scores [N, S + 2]) of y = a_s + b x + sigma e, e ~ N(0, 1), params =
    (a_1..a_S, b, log sigma); rows censored by ``code`` (Tobin 1958; Amemiya 1984, §2)."""
    from scipy.special import log_ndtr

    S = params.size - 2
    b, sigma = params[S], math.exp(params[S + 1])
    z = (y - params[:S][inv] - b * x) / sigma
    ex, le, ri = code == EXACT, code == LEFT, code == RIGHT
    ll = np.empty_like(z)
    d_mu = np.empty_like(z)  # d loglik / d mu
    d_ls = np.empty_like(z)  # d loglik / d log sigma
    ll[ex] = -0.5 * z[ex] ** 2 - math.log(sigma) - 0.5 * math.log(2 * math.pi)
    d_mu[ex], d_ls[ex] = z[ex] / sigma, z[ex] ** 2 - 1
    lam_l = np.exp(-0.5 * z[le] ** 2 - 0.5 * math.log(2 * math.pi) - log_ndtr(z[le]))  # phi(z)/Phi(z)
    ll[le], d_mu[le], d_ls[le] = log_ndtr(z[le]), -lam_l / sigma, -z[le] * lam_l
    lam_r = np.exp(-0.5 * z[ri] ** 2 - 0.5 * math.log(2 * math.pi) - log_ndtr(-z[ri]))  # phi(z)/(1 - Phi(z))
    ll[ri], d_mu[ri], d_ls[ri] = log_ndtr(-z[ri]), lam_r / sigma, z[ri] * lam_r
    scores = np.zeros((z.size, S + 2))
    scores[np.arange(z.size), inv] = d_mu
    scores[:, S], scores[:, S + 1] = x * d_mu, d_ls
    return float(ll.sum()), scores


@dataclass(frozen=True)
class CensoredFit:
    """Result of :func:`censored_within_slope`: slope b, sigma, the series kept (labels), the cluster-robust
    covariance of b (CR1-scaled sandwich), and the counts of rows by censoring code."""

    slope: float
    sigma: float
    se: float
    n_clusters: int
    series: np.ndarray
    counts: dict


def censored_within_slope(x, y, series, censor, *, clusters=None) -> CensoredFit:
    """Maximum-likelihood slope of y on x with one intercept per series and censored rows (Tobit).

    y_i = a_s(i) + b x_i + sigma e_i, e ~ N(0, 1); ``censor`` per row: EXACT (0), LEFT (-1: true y <= y_i),
    RIGHT (+1: true y >= y_i). A series without any EXACT row has an unbounded intercept and no information
    on b; it is left out (the kept labels are ``series`` of the result). ValueError when b is not identified:
    no series with EXACT rows at two x, or no finite maximum (observed information not positive definite). With no censored row, b is the
    within-series least-squares slope (:func:`within_slope`). se: the sandwich H⁻¹ [Σ_g s_g s_gᵀ] H⁻¹ with
    scores s_g summed over ``clusters`` (default: the series), times G/(G - 1) (Liang & Zeger 1986;
    Cameron & Miller 2015, §VI.B); H is the observed information (finite differences of the score).
    """
    from scipy.optimize import minimize

    x, y = np.asarray(x, float), np.asarray(y, float)
    code = np.asarray(censor)
    series = np.asarray(series)
    clusters = series if clusters is None else np.asarray(clusters)
    if not (x.shape == y.shape == code.shape == series.shape == clusters.shape) or x.ndim != 1:
        raise ValueError("x, y, series, censor and clusters must be 1-d arrays of one length")
    if not np.all(np.isin(code, (EXACT, LEFT, RIGHT))):
        raise ValueError(f"censor must hold {EXACT} (exact), {LEFT} (left) or {RIGHT} (right) per row")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("x and y must be finite")
    has_exact = {s for s in np.unique(series[code == EXACT])}
    keep = np.array([s in has_exact for s in series], dtype=bool)
    x, y, code, series, clusters = x[keep], y[keep], code[keep], series[keep], clusters[keep]
    labels, inv = np.unique(series, return_inverse=True)
    S = labels.size
    xc_ok = [np.ptp(x[inv == s]) > 0 for s in range(S)]
    if S == 0 or not any(xc_ok):
        raise ValueError("no series with an exact row and x varying within it: the slope is not identified")
    ex = code == EXACT
    if not any(np.unique(x[ex & (inv == s)]).size >= 2 for s in range(S)):
        raise ValueError("the slope is not identified: no series has exact rows at two x (censored rows alone "
                         "bound it on one side only)")
    b0 = within_slope(x[ex], y[ex], series[ex])
    b0 = 0.0 if not math.isfinite(b0) else b0
    a0 = np.array([np.mean(y[ex & (inv == s)] - b0 * x[ex & (inv == s)]) for s in range(S)])
    r0 = y[ex] - a0[inv[ex]] - b0 * x[ex]
    p0 = np.concatenate([a0, [b0, math.log(max(float(np.std(r0)), 1e-3))]])

    def nll(p):
        ll, sc = _tobit_parts(p, x, y, code, inv)
        return -ll, -sc.sum(axis=0)

    with np.errstate(over="ignore", invalid="ignore"):
        p = minimize(nll, p0, jac=True, method="BFGS", options={"gtol": 1e-9, "maxiter": 5000}).x
    h = 1e-5 * np.maximum(1.0, np.abs(p))
    H = np.empty((p.size, p.size))
    for j in range(p.size):
        e = np.zeros(p.size)
        e[j] = h[j]
        H[:, j] = (nll(p + e)[1] - nll(p - e)[1]) / (2 * h[j])
    H = (H + H.T) / 2
    if not (np.all(np.isfinite(p)) and np.all(np.isfinite(H)) and np.linalg.eigvalsh(H).min() > 0):
        raise ValueError("the censored likelihood has no finite maximum here (the slope is not identified)")
    _, sc = _tobit_parts(p, x, y, code, inv)
    _, cinv = np.unique(clusters, return_inverse=True)
    G = int(cinv.max()) + 1
    Sg = np.stack([np.bincount(cinv, weights=sc[:, j], minlength=G) for j in range(p.size)], axis=1)
    Hinv = np.linalg.pinv(H)
    V = Hinv @ (Sg.T @ Sg) @ Hinv * (G / (G - 1) if G > 1 else math.nan)
    counts = {"exact": int(ex.sum()), "left": int((code == LEFT).sum()), "right": int((code == RIGHT).sum())}
    return CensoredFit(float(p[S]), math.exp(p[S + 1]), math.sqrt(max(float(V[S, S]), 0.0)), G, labels, counts)


def censored_slope_estimate(x, y, *, censor, series, instance, confidence: float = 0.90) -> gapdyn.Estimate:
    """:func:`censored_within_slope` with the t interval b ± t_{G-1} se over G instances (clusters), the
    censored counterpart of gapdyn.evidence.stats.t_interval_cluster_slope; n = instances with a kept series."""
    from scipy.stats import t

    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    fit = censored_within_slope(x, y, series, censor, clusters=instance)
    if fit.n_clusters < 2:
        raise ValueError("instance: the interval needs at least 2 instances with a kept series")
    q = float(t.ppf((1 + confidence) / 2, fit.n_clusters - 1))
    return gapdyn.Estimate(fit.slope, fit.slope - q * fit.se, fit.slope + q * fit.se, fit.n_clusters, confidence,
                           "censored (Tobit) within-series slope, CR1 sandwich t interval")
