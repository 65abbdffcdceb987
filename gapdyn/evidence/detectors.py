"""Online detectors on one logged series, as scalar "run doctors" apply them: CUSUM, Mann-Kendall trend, levels.

Every detector reads a series (values at increasing steps; NaN entries are steps where the statistic was not
logged and are skipped) and turns it into a causal **score** s_t (higher = more alarming; it uses only the values
logged at steps <= t; -inf where it is not defined yet, e.g. inside a reference period). It **fires** at the first
step t with s_t >= c, c its ``cutoff`` (the ``threshold`` in score units). So a detector is its score rule plus one
number, and a threshold calibrated at a false-alarm rate is the choice of c (gapdyn.evidence.alarm).

* :class:`Cusum`        one-sided CUSUM (Page 1954, Biometrika 41:100) on the series standardised by its first
                        ``reference_steps`` values: z_t = direction (x_t - mu_ref) / sd_ref,
                        S_t = max(0, S_{t-1} + z_t - drift), S = 0 at the end of the reference; s_t = S_t.
* :class:`MannKendall`  Mann-Kendall trend test (Mann 1945, Econometrica 13:245; Kendall 1975) over the last
                        ``window`` logged values: s_t = direction x Z (:func:`mann_kendall`); a cutoff c is a
                        one-sided level alpha = 1 - Phi(c) (c = 1.645: 5 %).
* :class:`Threshold`    a generic threshold crossing of any statistic: m_t = mean of the last ``window`` logged
                        values, fires when sign (m_t - threshold) >= 0 (sign +1: at or above, -1: at or below).
* :class:`Level`        a level relative to the run's own start (run doctors' entropy rules): m_t / mean of the
                        first ``reference_steps`` values, fires when sign (ratio - threshold) >= 0.
* :func:`zero_std_share` the share of groups with no reward variance (TRL's ``frac_reward_zero_std``) at or
                        above a level: a :class:`Threshold`.

numpy only at import time (scipy's normal tail inside :func:`mann_kendall`); no torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

import numpy as np

__all__ = ["Detector", "Cusum", "MannKendall", "Threshold", "Level", "zero_std_share", "MKResult", "mann_kendall",
           "as_series", "DETECTOR_KINDS", "detector_from_dict"]


def _direction(v, name: str) -> int:
    if isinstance(v, bool) or v not in (1, -1):
        raise ValueError(f"{name} must be +1 or -1, got {v!r}")
    return int(v)


def _positive_int(v, name: str, low: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
    return int(v)


def _real(v, name: str, *, finite: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or math.isnan(v) \
            or (finite and not math.isfinite(v)):
        raise ValueError(f"{name} must be a {'finite ' if finite else ''}number, got {v!r}")
    return float(v)


def as_series(values, steps=None) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the logged entries: ``values`` 1-D (NaN = not logged, dropped), ``steps`` increasing
    integers of the same length (default 0, 1, ...). +-inf values are kept (a score may use them)."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1:
        raise ValueError(f"values must be 1-D, got shape {x.shape}")
    t = np.arange(len(x)) if steps is None else np.asarray(steps)
    if t.shape != x.shape:
        raise ValueError(f"steps and values must have the same length, got {t.shape} and {x.shape}")
    if t.size and (not np.issubdtype(t.dtype, np.integer) or np.any(np.diff(t) <= 0)):
        raise ValueError("steps must be strictly increasing integers")
    keep = ~np.isnan(x)
    return t[keep].astype(np.int64), x[keep]


def _rolling_mean(x: np.ndarray, w: int) -> np.ndarray:
    """Mean of x[t-w+1 .. t] at every t >= w-1, NaN before (window by window: an inf stays in its own windows)."""
    from numpy.lib.stride_tricks import sliding_window_view

    out = np.full(len(x), np.nan)
    if len(x) >= w:
        out[w - 1:] = sliding_window_view(x, w).mean(axis=1)
    return out


def _pair_signs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sign(b - a) by comparison (defined for infinite values too)."""
    return (b > a).astype(float) - (b < a).astype(float)


class Detector:
    """Base of the detectors (module doc): subclasses define :meth:`score_values` and ``threshold``."""

    threshold: float

    def score_values(self, x: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def cutoff(self) -> float:
        """The threshold in score units: the detector fires at the first s_t >= cutoff."""
        return float(self.threshold)

    def at_cutoff(self, cutoff: float) -> Detector:
        """The same detector with its threshold set so that :attr:`cutoff` is ``cutoff``."""
        return replace(self, threshold=float(cutoff))

    def scores(self, values, steps=None) -> tuple[np.ndarray, np.ndarray]:
        """(steps, s_t) on the logged entries of the series (module doc); -inf where not defined."""
        t, x = as_series(values, steps)
        s = np.asarray(self.score_values(x), dtype=float)
        return t, np.where(np.isnan(s), -np.inf, s)

    def first_firing(self, values, steps=None) -> int | None:
        """The first step whose score reaches the cutoff; None when it never does."""
        t, s = self.scores(values, steps)
        hit = np.flatnonzero(s >= self.cutoff)
        return int(t[hit[0]]) if hit.size else None

    def to_dict(self) -> dict:
        """Kind and fields (for a spec's hash); inverse :func:`detector_from_dict`."""
        return {"kind": type(self).__name__, **asdict(self)}


@dataclass(frozen=True)
class Cusum(Detector):
    """One-sided standardised CUSUM (Page 1954): mu_ref, sd_ref (ddof 1, floored at ``min_sd``) of the first
    ``reference_steps`` logged values; after them z_t = direction (x_t - mu_ref) / sd_ref and
    S_t = max(0, S_{t-1} + z_t - drift) from S = 0; fires at S_t >= threshold. direction -1 watches a fall."""

    direction: int = -1
    reference_steps: int = 10
    drift: float = 0.5
    threshold: float = 5.0
    min_sd: float = 1e-8

    def __post_init__(self):
        _direction(self.direction, "direction")
        _positive_int(self.reference_steps, "reference_steps", 2)
        _real(self.drift, "drift")
        _real(self.threshold, "threshold", finite=False)
        if _real(self.min_sd, "min_sd") <= 0:
            raise ValueError(f"min_sd must be > 0, got {self.min_sd!r}")

    def score_values(self, x: np.ndarray) -> np.ndarray:
        w = self.reference_steps
        s = np.full(len(x), -np.inf)
        if len(x) <= w:
            return s
        ref = x[:w]
        sd = max(float(np.std(ref, ddof=1)), self.min_sd)
        y = self.direction * (x[w:] - float(np.mean(ref))) / sd - self.drift
        # Page's recursion in closed form: S_t = C_t - min(0, min_{s<=t} C_s), C the cumulative sum of y
        c = np.cumsum(y)
        s[w:] = c - np.minimum(np.minimum.accumulate(c), 0.0)
        return s


class MKResult(NamedTuple):
    """Mann-Kendall on one window: S = sum_{i<j} sign(x_j - x_i), its null variance (ties corrected), Z, the
    two-sided normal p-value, and Kendall's tau-b of (time, x)."""

    S: float
    var: float
    z: float
    p: float
    tau: float


def mann_kendall(x, *, continuity: bool = True) -> MKResult:
    """Mann-Kendall trend test of ``x`` (in time order, >= 3 values; +-inf rank as the largest / smallest).

    S = sum_{i<j} sign(x_j - x_i); Var S = [n(n-1)(2n+5) - sum_g u_g(u_g-1)(2u_g+5)] / 18 (u_g the sizes of the
    groups of tied values); Z = (S - sign(S)) / sqrt(Var S) with the continuity correction, S / sqrt(Var S)
    without (then Z and p equal scipy.stats.kendalltau(range(n), x)'s asymptotic test); p = 2 (1 - Phi(|Z|)).
    tau-b = S / sqrt(n0 (n0 - n2)), n0 = n(n-1)/2, n2 = sum_g u_g(u_g-1)/2. Z = 0 (p = 1) when every value ties.
    """
    from scipy.stats import norm

    v = np.asarray(x, dtype=float)
    if v.ndim != 1 or len(v) < 3 or np.isnan(v).any():
        raise ValueError(f"x must be 1-D with at least 3 values, none NaN, got shape {v.shape}")
    n = len(v)
    S = float(_pair_signs(v[:, None], v[None, :])[np.triu_indices(n, 1)].sum())
    _, u = np.unique(v, return_counts=True)
    var = (n * (n - 1) * (2 * n + 5) - float(np.sum(u * (u - 1) * (2 * u + 5)))) / 18.0
    n0, n2 = n * (n - 1) / 2, float(np.sum(u * (u - 1))) / 2
    if var <= 0:
        return MKResult(S, 0.0, 0.0, 1.0, math.nan)
    num = S - math.copysign(1.0, S) if continuity and S != 0 else S
    z = num / math.sqrt(var)
    return MKResult(S, var, z, float(2 * norm.sf(abs(z))), S / math.sqrt(n0 * (n0 - n2)))


@dataclass(frozen=True)
class MannKendall(Detector):
    """Sliding Mann-Kendall: at every logged step t with at least ``window`` values, Z of :func:`mann_kendall` on
    the last ``window`` of them; s_t = direction Z; fires at s_t >= threshold (one-sided level 1 - Phi(threshold);
    direction -1 watches a downward trend)."""

    direction: int = -1
    window: int = 20
    threshold: float = 1.645
    continuity: bool = True

    def __post_init__(self):
        _direction(self.direction, "direction")
        _positive_int(self.window, "window", 3)
        _real(self.threshold, "threshold", finite=False)
        if not isinstance(self.continuity, bool):
            raise ValueError(f"continuity must be a bool, got {self.continuity!r}")

    def score_values(self, x: np.ndarray) -> np.ndarray:
        w = self.window
        s = np.full(len(x), -np.inf)
        if len(x) < w:
            return s
        from numpy.lib.stride_tricks import sliding_window_view

        win = sliding_window_view(x, w)  # [m, w]
        i, j = np.triu_indices(w, 1)
        S = _pair_signs(win[:, i], win[:, j]).sum(axis=1)
        # sum over tie groups of u(u-1)(2u+5) = sum over values of 2c^2 + 3c - 5, c the size of the value's group
        c = (win[:, :, None] == win[:, None, :]).sum(axis=2)
        ties = (2 * c * c + 3 * c - 5).sum(axis=1)
        var = (w * (w - 1) * (2 * w + 5) - ties) / 18.0
        num = S - np.sign(S) if self.continuity else S
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(var > 0, num / np.sqrt(np.where(var > 0, var, 1.0)), 0.0)
        s[w - 1:] = self.direction * z
        return s


@dataclass(frozen=True)
class Threshold(Detector):
    """Generic threshold crossing: m_t = mean of the last ``window`` logged values; fires when
    sign (m_t - threshold) >= 0 (sign +1: m_t at or above the threshold; -1: at or below). Score: sign m_t."""

    sign: int = 1
    threshold: float = 0.0
    window: int = 1

    def __post_init__(self):
        _direction(self.sign, "sign")
        _real(self.threshold, "threshold", finite=False)
        _positive_int(self.window, "window")

    @property
    def cutoff(self) -> float:
        return self.sign * float(self.threshold)

    def at_cutoff(self, cutoff: float) -> Threshold:
        return replace(self, threshold=self.sign * float(cutoff))

    def score_values(self, x: np.ndarray) -> np.ndarray:
        return self.sign * _rolling_mean(x, self.window)


@dataclass(frozen=True)
class Level(Detector):
    """Level relative to the run's start: ratio_t = m_t / mu_ref, m_t the mean of the last ``window`` logged values
    (after the reference), mu_ref the mean of the first ``reference_steps``; fires when sign (ratio_t - threshold)
    >= 0 (entropy above 3x its start: sign +1, threshold 3; below a fifth: sign -1, threshold 0.2). No score when
    mu_ref <= 0 (a ratio to a non-positive level is undefined). Score: sign ratio_t."""

    sign: int = 1
    threshold: float = 3.0
    window: int = 5
    reference_steps: int = 10

    def __post_init__(self):
        _direction(self.sign, "sign")
        _real(self.threshold, "threshold", finite=False)
        _positive_int(self.window, "window")
        _positive_int(self.reference_steps, "reference_steps")

    @property
    def cutoff(self) -> float:
        return self.sign * float(self.threshold)

    def at_cutoff(self, cutoff: float) -> Level:
        return replace(self, threshold=self.sign * float(cutoff))

    def score_values(self, x: np.ndarray) -> np.ndarray:
        w = self.reference_steps
        s = np.full(len(x), -np.inf)
        if len(x) <= w:
            return s
        mu = float(np.mean(x[:w]))
        if not mu > 0:
            return s
        m = _rolling_mean(x[w:], self.window)
        s[w:] = self.sign * m / mu
        return s


def zero_std_share(threshold: float = 0.5, window: int = 5) -> Threshold:
    """The zero-std rule: the mean over the last ``window`` steps of the share of groups whose rewards all tie
    (``frac_reward_zero_std``: no learning signal in them) at or above ``threshold``."""
    return Threshold(sign=1, threshold=threshold, window=window)


DETECTOR_KINDS = {c.__name__: c for c in (Cusum, MannKendall, Threshold, Level)}
"""Kind name -> class, for :func:`detector_from_dict`."""


def detector_from_dict(d) -> Detector:
    """The detector of :meth:`Detector.to_dict`."""
    d = dict(d)
    kind = d.pop("kind", None)
    if kind not in DETECTOR_KINDS:
        raise ValueError(f"kind must be one of {sorted(DETECTOR_KINDS)}, got {kind!r}")
    return DETECTOR_KINDS[kind](**d)
