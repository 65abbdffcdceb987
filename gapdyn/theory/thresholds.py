"""Step-size thresholds: the sharp (line-search) one, the local curvature one, Theorem 1's bound,
and the scaling of the critical step with response length T and success rate J.

docs/equations.md §3:
- sharp threshold [derived]: the largest eta such that Phi(theta + e w) > Phi(theta) for every
  e in (0, eta]; found by a geometric scan and bisection on the exact Phi.
- local threshold [derived]: 2 Delta mu / (w^T (-Hess Phi) w)_+ (second-order Taylor model of Phi).
- Theorem 1 step condition [paper, constants unconfirmed]: eta <= [Delta mu]_+ / (2 (L_o + 8 G_o^2)).
- Theorem 3 scaling [paper, exact form open]: eta* ~ (1 - J) / T; with 1/|o| normalisation one T
  cancels. Stagnation ceiling J_max ~ 1 - c eta T [open].
"""

from __future__ import annotations

import numbers
from typing import Callable, NamedTuple

import numpy as np
from scipy import stats
from scipy.special import logsumexp

from .._validate import as_float_array, as_rewards, check_open_unit, check_positive

_MAX_SCAN_POINTS = 1_000_000
_MAX_BISECTIONS = 2_000  # log2 of the float64 range: every bisection ends well before this
_ROUNDING_FLOOR = 2.0**-40  # a change of Phi below this (relative to max(1, |Phi|)) is rounding, not a rise

__all__ = [
    "sharp_step_threshold",
    "local_step_threshold",
    "theorem1_step_bound",
    "loglinear_bound_constants",
    "loglinear_logodds_fn",
    "tabular_logodds_fn",
    "predicted_critical_step",
    "stagnation_ceiling",
    "LogLogFit",
    "loglog_slope",
]


def loglinear_logodds_fn(features, rewards) -> Callable[[np.ndarray], float]:
    """theta -> Phi(theta) for pi(a) ~ exp(phi(a) . theta) (one context), stable via log-sum-exp."""
    phi = as_float_array(features, "features", min_ndim=2)
    if phi.ndim != 2:
        raise ValueError(f"features must have shape [K, d] (one context), got {phi.shape}")
    r = as_rewards(rewards, phi.shape[:1])
    if r.sum() in (0, r.size):
        raise ValueError("rewards must contain both a correct and an incorrect response")
    pos, neg = phi[r == 1], phi[r == 0]

    def phi_fn(theta):
        return float(logsumexp(pos @ theta) - logsumexp(neg @ theta))

    return phi_fn


def tabular_logodds_fn(rewards) -> Callable[[np.ndarray], float]:
    """z -> Phi(z) for a tabular softmax over logits z."""
    r = as_float_array(rewards, "rewards", min_ndim=1)
    return loglinear_logodds_fn(np.eye(r.shape[-1]), r)


def sharp_step_threshold(
    logodds_fn: Callable[[np.ndarray], float],
    theta,
    direction,
    *,
    eta_min: float = 1e-8,
    eta_max: float = 1e8,
    points_per_decade: int = 16,
    rtol: float = 1e-9,
) -> float:
    """Largest eta with Phi(theta + e w) > Phi(theta) for all e in (0, eta]  [derived].

    A geometric scan from eta_min to eta_max (``points_per_decade`` points a decade, spaced in log eta)
    finds the first eta where Phi no longer rises; bisection (in log eta while the bracket spans more
    than a factor 2, then linear) locates the crossing to relative tolerance rtol. rtol must lie in
    (0, 1); the bisection also stops at adjacent floats, so it always ends.

    Steps too small to move Phi beyond rounding, |Phi(theta + e w) - Phi(theta)| <= 2^-40 max(1, |Phi(theta)|)
    (theta + e w == theta included), decide nothing and are skipped (probed at doubling strides up to
    the first step that moves Phi), so a bracket reaching down to eta_min = 1e-300 gives the same
    answer as a narrow one. Returns 0.0 when the first step that moves
    Phi beyond rounding lowers it, or no step does (w is not an ascent direction), and inf when Phi rises
    over the whole scan. Crossings narrower than the grid spacing can be missed: raise
    ``points_per_decade`` for rugged Phi. A non-finite Phi (at theta or at a scanned step) or a step
    theta + eta w that overflows raises ValueError naming eta: no silent answer from a NaN.
    """
    if not callable(logodds_fn):
        raise ValueError("logodds_fn must be a callable theta -> Phi(theta)")
    th = as_float_array(theta, "theta", min_ndim=1)
    w = as_float_array(direction, "direction", min_ndim=1)
    if w.shape != th.shape:
        raise ValueError(f"direction has shape {w.shape} but theta has {th.shape}")
    eta_min, eta_max = check_positive(eta_min, "eta_min"), check_positive(eta_max, "eta_max")
    if eta_max <= eta_min:
        raise ValueError("eta_max must exceed eta_min")
    if isinstance(points_per_decade, bool) or not isinstance(points_per_decade, numbers.Integral) or points_per_decade < 1:
        raise ValueError(f"points_per_decade must be an integer >= 1, got {points_per_decade!r}")
    rtol = check_positive(rtol, "rtol")
    if rtol >= 1:
        raise ValueError(f"rtol must be in (0, 1), got {rtol!r}")
    log_lo, log_hi = np.log(eta_min), np.log(eta_max)  # logs: eta_max / eta_min overflows for 1e-300 .. 1e300
    n = int(np.ceil((log_hi - log_lo) / np.log(10.0) * points_per_decade)) + 1
    if n > _MAX_SCAN_POINTS:
        raise ValueError(f"points_per_decade x decades asks for {n} scan points (at most {_MAX_SCAN_POINTS})")
    phi0 = _logodds_value(logodds_fn, th, 0.0)
    noise = _ROUNDING_FLOOR * max(1.0, abs(phi0))

    def change(eta):  # Phi(theta + eta w) - Phi(theta)
        with np.errstate(over="ignore"):
            step = th + eta * w
        if not np.all(np.isfinite(step)):
            raise ValueError(f"theta + eta * direction overflows at eta = {float(eta)!r}: lower eta_max")
        return _logodds_value(logodds_fn, step, eta) - phi0

    grid = np.exp(np.linspace(log_lo, log_hi, n))
    grid[0], grid[-1] = eta_min, eta_max
    first = _first_resolved(lambda i: abs(change(grid[i])) > noise, n)
    if first is None or change(grid[first]) < 0:
        return 0.0
    lo = hi = None
    for eta in grid[first:]:
        if change(eta) > 0:
            lo = eta
        else:
            hi = eta
            break
    if hi is None:
        return float("inf")
    for _ in range(_MAX_BISECTIONS):  # bounded: ~60 halvings reach any rtol >= 1e-16 of a float64
        if hi - lo <= rtol * hi:
            break
        log_ratio = np.log(hi) - np.log(lo)
        mid = np.exp(np.log(lo) + 0.5 * log_ratio) if log_ratio > np.log(2.0) else lo + 0.5 * (hi - lo)
        if not lo < mid < hi:  # adjacent floats: nothing left to split
            break
        lo, hi = (mid, hi) if change(mid) > 0 else (lo, mid)
    return float(lo)


def _first_resolved(resolved, n: int) -> int | None:
    """Smallest grid index whose step moves Phi beyond rounding, probing at doubling strides (1, 2, 4, ...)
    from the last index known to be unresolved: O(log^2 n) calls instead of n over 600 decades.

    A skipped index counts as unresolved because a larger step (the probe above it) was: inside the
    rounding floor Phi's change does not rise above it and fall back within one stride."""
    start = 0
    while start < n:
        offset, prev = 1, start - 1
        while True:
            i = min(start + offset - 1, n - 1)
            if resolved(i):
                break
            if i == n - 1:
                return None
            prev, offset = i, 2 * offset
        if i == prev + 1:
            return i
        start = prev + 1
    return None


def _logodds_value(logodds_fn, theta, eta) -> float:
    """logodds_fn(theta) as a finite float; ValueError naming the value and eta otherwise."""
    value = logodds_fn(theta)
    try:
        out = float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"logodds_fn must return a real scalar, got {value!r} at eta = {float(eta)!r}") from exc
    if not np.isfinite(out):
        raise ValueError(f"logodds_fn returned the non-finite value {out!r} at eta = {float(eta)!r}")
    return out


def local_step_threshold(dmu, direction, hessian) -> np.ndarray:
    """2 Delta mu / (w^T (-Hess Phi) w)_+: where the quadratic model of Phi returns to its start.

    inf where the curvature along w is >= 0 (the model never falls); 0 where Delta mu <= 0.
    """
    d = as_float_array(dmu, "dmu")
    w = as_float_array(direction, "direction", min_ndim=1)
    H = as_float_array(hessian, "hessian", min_ndim=2)
    if H.shape[-2:] != (w.shape[-1], w.shape[-1]):
        raise ValueError(f"hessian must be [..., P, P] with P = {w.shape[-1]}, got {H.shape}")
    curv = -np.einsum("...p,...pq,...q->...", w, H, w)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(curv > 0, 2.0 * np.maximum(d, 0.0) / curv, np.inf)
    return np.where(d <= 0, 0.0, out)


def theorem1_step_bound(dmu, *, L_o: float, G_o: float) -> np.ndarray:
    """Theorem 1's step condition [Delta mu]_+ / (2 (L_o + 8 G_o^2))  [paper, constants unconfirmed].

    Requires ||w|| <= 1; G_o bounds ||s(o)||, L_o bounds ||Hess log pi(o)||.
    """
    d = as_float_array(dmu, "dmu")
    L_o, G_o = check_positive(L_o, "L_o"), check_positive(G_o, "G_o")
    return np.maximum(d, 0.0) / (2.0 * (L_o + 8.0 * G_o**2))


class BoundConstants(NamedTuple):
    """Theorem 1's trajectory constants: G_o bounds ||s(o)||, L_o bounds ||Hess log pi(o)||."""

    G_o: float
    L_o: float


def loglinear_bound_constants(features) -> BoundConstants:
    """BoundConstants(G_o, L_o) for a log-linear policy: ||s|| <= 2 max||phi||, ||Cov_pi(phi)|| <= max||phi||^2.

    Pass them by name: ``theorem1_step_bound(dmu, **loglinear_bound_constants(phi)._asdict())``."""
    phi = as_float_array(features, "features", min_ndim=2)
    rmax = float(np.max(np.linalg.norm(phi, axis=-1)))
    if rmax == 0:
        raise ValueError("features must not all be zero")
    return BoundConstants(G_o=2.0 * rmax, L_o=rmax**2)


def predicted_critical_step(eta_ref, T, J, *, T_ref=1.0, J_ref=None, length_normalized=False) -> np.ndarray:
    """Theorem 3's scaling [paper, exact form open]: eta*(T, J) = eta_ref (T_ref/T) ((1-J)/(1-J_ref)).

    With 1/|o| normalisation one factor of T cancels: eta*(T) = eta_ref (1-J)/(1-J_ref).
    J_ref defaults to J (pure length scaling). The paper's own constant may differ.
    """
    eta_ref = check_positive(eta_ref, "eta_ref")
    T_ref = check_positive(T_ref, "T_ref")
    if not isinstance(length_normalized, (bool, np.bool_)):
        raise ValueError(f"length_normalized must be a bool, got {length_normalized!r}")
    T = as_float_array(T, "T")
    if np.any(T < 1):
        raise ValueError("T must be >= 1")
    J = check_open_unit(J)
    J_ref = J if J_ref is None else check_open_unit(J_ref, "J_ref")
    scale = np.ones_like(T) if length_normalized else T_ref / T
    return eta_ref * scale * (1.0 - J) / (1.0 - J_ref)


def stagnation_ceiling(eta, T, c) -> np.ndarray:
    """J_max ~ 1 - c eta T: where a fixed step stops improving [open: exact bound unknown]."""
    eta = check_positive(eta, "eta")
    c = check_positive(c, "c")
    T = as_float_array(T, "T")
    return np.clip(1.0 - c * eta * T, 0.0, 1.0)


class LogLogFit(NamedTuple):
    """Least-squares fit of log y = slope * log x + intercept."""

    slope: float
    intercept: float
    slope_stderr: float
    r2: float
    n: int


def loglog_slope(x, y) -> LogLogFit:
    """Slope of log y against log x (e.g. critical eta vs T), with its standard error."""
    x = as_float_array(x, "x", min_ndim=1)
    y = as_float_array(y, "y", min_ndim=1)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"x and y must be 1-D of equal length, got {x.shape} and {y.shape}")
    if np.any(x <= 0) or np.any(y <= 0):
        raise ValueError("x and y must be > 0 for a log-log fit")
    if x.size < 3 or np.ptp(x) == 0:
        raise ValueError("need at least 3 points with distinct x for a slope and its error")
    res = stats.linregress(np.log(x), np.log(y))
    return LogLogFit(float(res.slope), float(res.intercept), float(res.stderr), float(res.rvalue**2), int(x.size))
