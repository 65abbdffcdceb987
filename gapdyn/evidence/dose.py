"""Dose-response of a binary run outcome against the learning rate: the logistic model in log10(lr), the lr at
which the outcome has probability p (lr_p, e.g. lr10 and lr50 of collapse), and its profile-likelihood interval.

Model: P(event | lr) = sigmoid(b (x - x_p) + logit p), x = log10 lr, fitted by maximum likelihood on per-run 0/1
outcomes (the quantal-response model of bioassay; Finney, *Probit Analysis*, 1971). The interval of x_p is the
set where the profile deviance D(x_p) - D_min stays below the chi-square(1) quantile (Venzon & Moolgavkar, Appl.
Statist. 37, 1988): unlike the delta method it stays inside the data's range and asymmetric where it should be,
and it is finite under complete separation (every run below some lr without the event, every run above with it),
where the MLE of b is infinite: the slope is then capped at :data:`MAX_SLOPE` per decade and the point estimate is
the middle of the separating gap in log lr.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["DoseFit", "fit_dose_response", "MAX_SLOPE"]

MAX_SLOPE = 200.0
"""Cap on the logistic slope b (per decade of lr): 200 moves P from 10 % to 90 % within 2.2 % of the lr, finer than
any grid a study runs; it only binds under (near-)complete separation."""


class DoseFit(NamedTuple):
    """lr_p with its profile-likelihood interval (``lo``, ``hi``; NaN or an end of the tested range when the data
    do not bound it: ``bounded_lo`` / ``bounded_hi`` say which), the slope b per decade, the runs it rests on."""

    p: float
    lr: float
    lo: float
    hi: float
    slope: float
    n: int
    events: int
    separated: bool
    bounded_lo: bool
    bounded_hi: bool

    def to_dict(self) -> dict:
        return self._asdict()


def _nll(x: np.ndarray, y: np.ndarray, b: float, xp: float, lp: float) -> float:
    """Negative log-likelihood of 0/1 outcomes y at log-doses x under sigmoid(b (x - xp) + lp)."""
    z = b * (x - xp) + lp
    return float(np.sum(np.logaddexp(0.0, z) - y * z))


def _profile(x: np.ndarray, y: np.ndarray, xp: float, lp: float) -> float:
    """min over b in [0, MAX_SLOPE] of the negative log-likelihood at fixed xp (convex in b: bounded scalar search)."""
    from scipy.optimize import minimize_scalar

    r = minimize_scalar(lambda b: _nll(x, y, b, xp, lp), bounds=(0.0, MAX_SLOPE), method="bounded",
                        options={"xatol": 1e-6})
    return min(float(r.fun), _nll(x, y, 0.0, xp, lp), _nll(x, y, MAX_SLOPE, xp, lp))


def _profile_grid(x: np.ndarray, y: np.ndarray, xs: np.ndarray, lp: float) -> np.ndarray:
    """:func:`_profile` at every value of ``xs`` approximately (b on a grid of 0 and 150 log-spaced values up to
    MAX_SLOPE): locates the region; its ends are then refined on the exact profile."""
    bs = np.concatenate([[0.0], np.geomspace(1e-2, MAX_SLOPE, 150)])
    out = np.empty(len(xs))
    for k in range(0, len(xs), 64):
        chunk = xs[k:k + 64]
        z = bs[None, :, None] * (x[None, None, :] - chunk[:, None, None]) + lp
        out[k:k + 64] = (np.logaddexp(0.0, z) - y * z).sum(-1).min(1)
    return out


def fit_dose_response(lrs, events, *, p: float = 0.5, confidence: float = 0.95, grid_points: int = 241) -> DoseFit:
    """lr_p of a 0/1 outcome (``events``, one per run) against the runs' learning rates ``lrs`` (> 0).

    The profile deviance is evaluated on ``grid_points`` values of x_p spanning the tested range widened by half
    its width on each side (at least half a decade), then refined by bisection at the interval's ends; an end that
    reaches the widened range is reported unbounded (``bounded_lo`` / ``bounded_hi`` False). The slope is
    constrained to b >= 0 (the event's probability does not fall as lr rises: collapse, not learning). With no run
    with the event, or none without it, lr_p lies outside the data: ``lr`` is NaN and the interval one-sided."""
    from scipy.optimize import brentq, minimize_scalar
    from scipy.stats import chi2

    lr = np.asarray(lrs, dtype=float)
    y = np.asarray(events, dtype=float)
    if lr.ndim != 1 or lr.shape != y.shape or lr.size == 0:
        raise ValueError(f"lrs and events must be 1-d of one length >= 1, got shapes {lr.shape} and {y.shape}")
    if not np.all(np.isfinite(lr) & (lr > 0)):
        raise ValueError("lrs must be finite and > 0")
    x = np.log10(lr)
    if not np.all((y == 0) | (y == 1)):
        raise ValueError("events must be 0 or 1")
    if not 0.0 < p < 1.0 or not 0.0 < confidence < 1.0:
        raise ValueError(f"p and confidence must lie in (0, 1), got {p} and {confidence}")
    lp = math.log(p / (1.0 - p))
    width = max(float(x.max() - x.min()), 1.0)
    xs = np.linspace(x.min() - width / 2, x.max() + width / 2, grid_points)
    prof = _profile_grid(x, y, xs, lp)
    i = int(np.argmin(prof))
    zero, one = x[y == 0], x[y == 1]
    separated = zero.size > 0 and one.size > 0 and zero.max() < one.min()
    degenerate = zero.size == 0 or one.size == 0  # no run with (or without) the event: lr_p outside the data
    if separated:  # the MLE slope is infinite: the middle of the gap (in log lr), the gap's profile is flat
        xhat = 0.5 * (zero.max() + one.min())
        nll_hat = _profile(x, y, xhat, lp)
    elif degenerate:
        xhat, nll_hat = float("nan"), float(prof[i])
    else:
        lo_i, hi_i = xs[max(i - 1, 0)], xs[min(i + 1, len(xs) - 1)]
        r = minimize_scalar(lambda v: _profile(x, y, v, lp), bounds=(lo_i, hi_i), method="bounded",
                            options={"xatol": 1e-7})
        xhat, nll_hat = float(r.x), float(r.fun)
    cut = 0.5 * float(chi2.ppf(confidence, 1))
    inside = prof - nll_hat <= cut

    def f(v: float) -> float:  # the exact profile deviance over the cut
        return _profile(x, y, v, lp) - nll_hat - cut

    def end(direction: int) -> tuple[float, bool]:
        """The interval's end on one side: the first grid point outside (the exact profile), then a root between
        it and the nearest point inside (the grid point, or the estimate itself)."""
        idx = np.flatnonzero(inside)
        j = int(idx[0] if direction < 0 else idx[-1])
        while 0 <= j + direction < len(xs) and f(xs[j + direction]) <= 0:  # the coarse grid ended it too early
            j += direction
        if j + direction < 0 or j + direction >= len(xs):
            return float(xs[j]), False
        a = float(xs[j + direction])
        b = float(xs[j]) if f(xs[j]) <= 0 else (xhat if np.isfinite(xhat) else float(xs[i]))
        try:
            return float(brentq(f, min(a, b), max(a, b), xtol=1e-9)), True
        except ValueError:  # no sign change (the inside point is not inside on the exact profile): the grid point
            return float(xs[j]), True

    (xlo, blo), (xhi, bhi) = end(-1), end(+1)
    slope = float("nan") if degenerate else float(minimize_scalar(
        lambda b: _nll(x, y, b, xhat, lp), bounds=(0.0, MAX_SLOPE), method="bounded").x)
    return DoseFit(p=p, lr=10 ** xhat, lo=10 ** xlo, hi=10 ** xhi, slope=slope, n=int(x.size),
                   events=int(y.sum()), separated=bool(separated), bounded_lo=blo, bounded_hi=bhi)
