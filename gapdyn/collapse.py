"""One definition of collapse and of the critical step size eta* (docs/evidence.md).

Collapse (Suk & Duan, arXiv 2510.08539, Thm 2: above a threshold the success rate J falls to 0):
a run collapses when J < COLLAPSE_J = 1e-3 at any step within its horizon; the horizon is part of
the setting. The looser J < SENSITIVITY_J = 1e-2 is reported beside it as a sensitivity check.

eta* is the smallest step size that collapses. The collapsing set is often fragmented into
islands, so eta* is found by (1) scanning the whole range [eta_lo, eta_hi] on a geometric grid
whose neighbours differ by at most ``max_ratio`` (default 1 %), then (2) refining (vectorised
bisection in log eta) to relative width ``rtol`` (default 0.1 %) inside the bracket of the FIRST
collapsing grid point.
Islands narrower than the grid spacing can be missed; the spacing is the method's resolution.

The simulator enters as ``min_J(etas) -> array``: for a 1-D array of step sizes it returns, for
each, the minimum of J over the horizon (same shape). Collapse at threshold c is min_J < c, so one
callable serves both thresholds. Every method of an instance called with the same (eta_lo,
eta_hi, max_ratio) is scanned on the same grid (``eta_grid``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._validate import as_float_array

COLLAPSE_J = 1e-3
"""J below this at any step within the horizon is collapse."""
SENSITIVITY_J = 1e-2
"""Looser collapse threshold, reported beside eta* as a sensitivity check."""

MinJ = Callable[[np.ndarray], np.ndarray]


def _check_range(eta_lo, eta_hi, max_ratio) -> tuple[float, float, float]:
    for name, v in (("eta_lo", eta_lo), ("eta_hi", eta_hi), ("max_ratio", max_ratio)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or not math.isfinite(v):
            raise ValueError(f"{name} must be a finite real number, got {v!r}")
    if eta_lo <= 0:
        raise ValueError(f"eta_lo must be > 0, got {eta_lo!r}")
    if eta_hi <= eta_lo:
        raise ValueError(f"eta_hi must exceed eta_lo={eta_lo!r}, got {eta_hi!r}")
    if max_ratio <= 1.0:
        raise ValueError(f"max_ratio must be > 1 (neighbouring etas differ by this factor at most), got {max_ratio!r}")
    return float(eta_lo), float(eta_hi), float(max_ratio)


def eta_grid(eta_lo: float, eta_hi: float, *, max_ratio: float = 1.01) -> np.ndarray:
    """Geometric grid from eta_lo to eta_hi (both included) with neighbour ratio <= max_ratio.

    n = ceil(log(eta_hi/eta_lo) / log(max_ratio)) + 1 points; deterministic in its arguments.
    """
    lo, hi, r = _check_range(eta_lo, eta_hi, max_ratio)
    n = int(math.ceil(math.log(hi / lo) / math.log(r) * (1 - 1e-12))) + 1
    grid = np.geomspace(lo, hi, max(n, 2))
    grid[0], grid[-1] = lo, hi
    return grid


def is_collapsed(min_J, *, threshold: float = COLLAPSE_J) -> np.ndarray:
    """collapse(eta) = [min over the horizon of J < threshold] (elementwise)."""
    return as_float_array(min_J, "min_J") < threshold


def _evaluate(min_J: MinJ, etas: np.ndarray) -> np.ndarray:
    out = np.asarray(min_J(etas.copy()), dtype=np.float64)
    if out.shape != etas.shape:
        raise ValueError(f"min_J must return one value per eta: expected shape {etas.shape}, got {out.shape}")
    if np.any(np.isnan(out)):
        raise ValueError("min_J returned NaN; return the minimum J over the horizon (0 for a diverged run)")
    return out


def _islands(grid: np.ndarray, collapsed: np.ndarray) -> tuple[tuple[float, float], ...]:
    """Maximal runs of collapsing grid points as (first eta, last eta) of each run."""
    edges = np.diff(np.concatenate([[0], collapsed.astype(np.int8), [0]]))
    starts = np.flatnonzero(edges == 1)
    stops = np.flatnonzero(edges == -1) - 1
    return tuple((float(grid[a]), float(grid[b])) for a, b in zip(starts, stops))


def _per_decade(grid: np.ndarray, collapsed: np.ndarray) -> tuple[tuple[float, float, float], ...]:
    """Fraction of log eta that collapses in each decade [10^k, 10^(k+1)), clipped to the range.

    Grid point j stands for the log-cell between its geometric midpoints with its neighbours
    (the end cells stop at eta_lo and eta_hi); a cell counts as collapsing when its point does.
    Rows are (start, end, fraction) of the part of each decade the range covers.
    """
    logs = np.log10(grid)
    edges = np.concatenate([[logs[0]], (logs[1:] + logs[:-1]) / 2, [logs[-1]]])
    rows = []
    for k in range(int(np.floor(logs[0])), int(np.ceil(logs[-1]))):
        a, b = max(float(k), logs[0]), min(float(k + 1), logs[-1])
        if b - a <= 1e-12:
            continue
        overlap = np.clip(np.minimum(edges[1:], b) - np.maximum(edges[:-1], a), 0.0, None)
        rows.append((float(10.0**a), float(10.0**b), float(overlap[collapsed].sum() / overlap.sum())))
    return tuple(rows)


def _refine(min_J: MinJ, lo: float, hi: float, threshold: float, rtol: float, max_iter: int,
            points: int) -> tuple[float, float, int]:
    """Shrink (lo survives, hi collapses) until hi/lo - 1 <= rtol.

    Each call evaluates ``points`` geometrically spaced interior etas at once and keeps the
    sub-bracket ending at the first collapsing one (points = 1 is bisection in log eta); the
    bracket ratio shrinks to its (points + 1)-th root per call. Returns (lo, hi, etas evaluated).
    """
    evaluated = 0
    for _ in range(max_iter):
        if hi / lo - 1.0 <= rtol:
            return lo, hi, evaluated
        inner = np.geomspace(lo, hi, points + 2)[1:-1]
        hit = np.flatnonzero(_evaluate(min_J, inner) < threshold)
        evaluated += inner.size
        if hit.size == 0:
            lo = float(inner[-1])
        else:
            j = int(hit[0])
            hi = float(inner[j])
            lo = float(inner[j - 1]) if j > 0 else lo
    if hi / lo - 1.0 <= rtol:
        return lo, hi, evaluated
    raise ValueError(f"refinement did not reach rtol={rtol} in max_iter={max_iter} calls")


@dataclass(frozen=True, eq=False)
class EtaStar:
    """Result of :func:`find_eta_star` (all etas in the caller's units).

    status: "found" (eta* inside the range), "collapsed_at_lo" (eta_lo already collapses:
      eta* <= eta_lo, reported as eta_lo), "none_in_range" (no grid point collapses: eta* is NaN).
    eta_star: geometric mid of the final bracket; bracket: (largest surviving, smallest collapsing)
      eta with bracket[1]/bracket[0] - 1 <= rtol.
    islands: (first, last) collapsing grid eta of each run of collapsing grid points.
    collapse_per_decade: (decade start, decade end, fraction of log eta that collapses).
    eta_star_loose, bracket_loose: the same at the sensitivity threshold J < SENSITIVITY_J.
    grid, min_J: the scan (read-only arrays); n_evaluations: etas simulated in total.
    Compared by identity (it holds arrays); compare ``to_dict()`` for equality.
    """

    status: str
    eta_star: float
    bracket: tuple[float, float]
    islands: tuple[tuple[float, float], ...]
    collapse_per_decade: tuple[tuple[float, float, float], ...]
    eta_star_loose: float
    bracket_loose: tuple[float, float]
    threshold: float
    loose_threshold: float
    max_ratio: float
    rtol: float
    grid: np.ndarray
    min_J: np.ndarray
    n_evaluations: int

    @property
    def n_islands(self) -> int:
        return len(self.islands)

    def to_dict(self) -> dict:
        """Plain JSON-able summary (grid and min_J as lists)."""
        return {
            "status": self.status, "eta_star": self.eta_star, "bracket": list(self.bracket),
            "n_islands": self.n_islands, "islands": [list(i) for i in self.islands],
            "collapse_per_decade": [list(r) for r in self.collapse_per_decade],
            "eta_star_loose": self.eta_star_loose, "bracket_loose": list(self.bracket_loose),
            "threshold": self.threshold, "loose_threshold": self.loose_threshold,
            "max_ratio": self.max_ratio, "rtol": self.rtol, "grid": self.grid.tolist(),
            "min_J": self.min_J.tolist(), "n_evaluations": self.n_evaluations,
        }


def _first_crossing(min_J, grid, values, threshold, rtol, max_iter, points):
    hit = np.flatnonzero(values < threshold)
    if hit.size == 0:
        return "none_in_range", math.nan, (math.nan, math.nan), 0
    i = int(hit[0])
    if i == 0:
        return "collapsed_at_lo", float(grid[0]), (0.0, float(grid[0])), 0
    lo, hi, calls = _refine(min_J, float(grid[i - 1]), float(grid[i]), threshold, rtol, max_iter, points)
    return "found", math.sqrt(lo * hi), (lo, hi), calls


def find_eta_star(
    min_J: MinJ,
    eta_lo: float,
    eta_hi: float,
    *,
    max_ratio: float = 1.01,
    rtol: float = 1e-3,
    max_iter: int = 60,
    refine_points: int = 9,
    threshold: float = COLLAPSE_J,
    loose_threshold: float = SENSITIVITY_J,
) -> EtaStar:
    """eta* = inf{eta : min_{k <= horizon} J_k(eta) < threshold} by full scan + bisection.

    min_J: vectorised callable, 1-D array of etas -> min J over the horizon for each (same shape).
    eta_lo < eta_hi: the scanned range; max_ratio: largest ratio of neighbouring grid etas;
    rtol: relative width of the final bracket; refine_points: etas evaluated per refinement call
    (1 = plain bisection; the default 9 takes a 1 % bracket to 0.1 % in one call); max_iter:
    refinement calls allowed per threshold. The scan is one vectorised call on eta_grid(...).
    min_J must be deterministic in eta (the same seeds / common random numbers for every eta),
    otherwise scan and refinement disagree.
    """
    lo, hi, r = _check_range(eta_lo, eta_hi, max_ratio)
    if not callable(min_J):
        raise ValueError("min_J must be callable: etas (1-D array) -> min J over the horizon")
    if not (isinstance(rtol, (int, float)) and 0 < rtol < r - 1):
        raise ValueError(f"rtol must lie in (0, max_ratio - 1 = {r - 1:.3g}), got {rtol!r}")
    if isinstance(max_iter, bool) or int(max_iter) != max_iter or not (1 <= max_iter <= 200):
        raise ValueError(f"max_iter must be an integer in [1, 200], got {max_iter!r}")
    if isinstance(refine_points, bool) or int(refine_points) != refine_points or not (1 <= refine_points <= 1000):
        raise ValueError(f"refine_points must be an integer in [1, 1000], got {refine_points!r}")
    if not (0 < threshold <= loose_threshold < 1):
        raise ValueError(
            f"threshold and loose_threshold must satisfy 0 < threshold <= loose_threshold < 1, got "
            f"{threshold!r}, {loose_threshold!r}"
        )
    grid = eta_grid(lo, hi, max_ratio=r)
    values = _evaluate(min_J, grid)
    opts = (rtol, int(max_iter), int(refine_points))
    status, star, bracket, calls = _first_crossing(min_J, grid, values, threshold, *opts)
    _, star_l, bracket_l, calls_l = _first_crossing(min_J, grid, values, loose_threshold, *opts)
    collapsed = values < threshold
    grid.setflags(write=False)
    values.setflags(write=False)
    return EtaStar(
        status=status, eta_star=star, bracket=bracket, islands=_islands(grid, collapsed),
        collapse_per_decade=_per_decade(grid, collapsed), eta_star_loose=star_l, bracket_loose=bracket_l,
        threshold=float(threshold), loose_threshold=float(loose_threshold), max_ratio=r, rtol=float(rtol),
        grid=grid, min_J=values, n_evaluations=grid.size + calls + calls_l,
    )


@dataclass(frozen=True)
class RatioCheck:
    """Outcome of :func:`check_eta_star_ratio`.

    ratio: eta*_num / eta*_den; interval: [num.lo/den.hi, num.hi/den.lo] from the two brackets;
    holds: expected lies in the interval; missed_island: an island of one scan with no counterpart
    in the other (scaled by expected), or None; message: one line for reports.
    """

    ratio: float
    expected: float
    interval: tuple[float, float]
    holds: bool
    missed_island: tuple[str, tuple[float, float]] | None
    message: str


def check_eta_star_ratio(num: EtaStar, den: EtaStar, expected: float) -> RatioCheck:
    """Check an exact scaling identity eta*_num = expected x eta*_den to the bisection tolerance.

    E.g. exact Dr. GRPO at eta equals REINFORCE at (1 - 1/G) eta, so
    eta*_DrGRPO / eta*_REINFORCE = (1 - 1/G)^-1 (derived: docs/equations.md). The identity holds
    when expected lies in [num.lo/den.hi, num.hi/den.lo]. When it fails, the islands of the two
    scans are matched (den's scaled by expected, allowing one grid step) and the first unmatched one
    is named: usually a narrow island one scan hit and the other stepped over.
    """
    if not (isinstance(expected, (int, float)) and math.isfinite(expected) and expected > 0):
        raise ValueError(f"expected must be a finite ratio > 0, got {expected!r}")
    for name, res in (("num", num), ("den", den)):
        if not isinstance(res, EtaStar):
            raise ValueError(f"{name} must be an EtaStar from find_eta_star")
        if res.status != "found":
            raise ValueError(f"{name} has no eta* inside its range (status {res.status!r})")
    ratio = num.eta_star / den.eta_star
    interval = (num.bracket[0] / den.bracket[1], num.bracket[1] / den.bracket[0])
    holds = interval[0] <= expected <= interval[1]
    missed = None
    if not holds:
        slack = max(num.max_ratio, den.max_ratio)
        scaled = [(a * expected, b * expected) for a, b in den.islands]

        def unmatched(islands, others):
            for a, b in islands:
                if not any(a <= d * slack and c <= b * slack for c, d in others):
                    return (a, b)
            return None

        for tag, isl in (("num", unmatched(num.islands, scaled)), ("den", unmatched(scaled, num.islands))):
            if isl is not None:
                missed = (tag, isl if tag == "num" else (isl[0] / expected, isl[1] / expected))
                break
    if holds:
        msg = f"ratio {ratio:.6g} reproduces {expected:.6g} (interval [{interval[0]:.6g}, {interval[1]:.6g}])"
    elif missed is not None:
        other = "den" if missed[0] == "num" else "num"
        msg = (f"ratio {ratio:.6g} misses {expected:.6g}: island [{missed[1][0]:.6g}, {missed[1][1]:.6g}] of "
               f"{missed[0]} has no counterpart in {other}")
    else:
        msg = (f"ratio {ratio:.6g} misses {expected:.6g} (interval [{interval[0]:.6g}, {interval[1]:.6g}]) "
               "although the islands match; the first crossing lies inside a grid step")
    return RatioCheck(float(ratio), float(expected), interval, bool(holds), missed, msg)
