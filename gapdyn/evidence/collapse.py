"""One definition of a run's outcome, of collapse and of the critical step size eta* (docs/evidence.md).

Collapse as Suk & Duan (arXiv 2510.08539), Thm 2 state it: above a threshold the success rate falls
to J -> 0. A run of horizon K has states k = 0..K (J_k at theta_k; state K after the last update);
its last quarter is the states k >= K - K // 4 (:func:`tail_start`). Its outcome, with precedence
in this order (:func:`bandit_outcome`):

* ``collapsed``  J < COLLAPSE_J = 1e-3 at every state of the last quarter (J -> 0);
* ``dipped``     not collapsed, but J < COLLAPSE_J at some state (a transient dip that recovered);
* ``converged``  J > CONVERGED_J = 0.99 at every state of the last quarter;
* ``undecided``  otherwise.

J is the success rate the claim is about: for a multi-context bandit the mean over contexts. The
horizon is part of the setting. J < SENSITIVITY_J = 1e-2 over the last quarter is reported beside
eta* as a sensitivity check.

The first collapsed eta (``eta_star``) is the smallest scanned step size whose run is ``collapsed``;
eta_dip, the smallest whose run dips (J_min < COLLAPSE_J: collapsed or dipped), is reported beside it
with the share of dipping grid points that recover. The collapsing set is often fragmented into
islands narrower than any grid, so the first collapsed eta moves with the grid's alignment; beside it
:func:`find_eta_star` reports what a scan certifies, ``eta_safe`` (no scanned eta below it collapses,
at the scan's resolution), and a window quantity, ``eta_50`` (the smallest eta whose +-5 % log window
is at least half collapsed, :func:`collapsed_window_eta`). The scan: (1) a geometric grid on
[eta_lo, eta_hi] whose neighbours differ by at most ``max_ratio`` (default 1 %), (2) the whole range
below its first collapsing point rescanned at 1 + ``rtol`` (default 0.1 %), (3) eta_50's window
rescanned likewise, (4) the first crossing refined (vectorised bisection in log eta) to ``rtol``.
A point reported as the threshold is always an eta whose run collapsed (for eta_50: the window's
stated bounds). Islands narrower than the fine spacing can be missed; the spacing is the method's
resolution.

The two kinds of bandit collapse have one name each (:data:`COLLAPSE_KINDS`): under exact expected updates
the step is proportional to J, so J -> 0 is an *excursion* that can end after the horizon
(:func:`excursion_lengths` measures it); with sampled groups an all-incorrect group gives no update and
J -> 0 is *absorbing*. docs/evidence.md says which one each experiment tests.

The simulator enters as ``run_stats(etas) -> RunStats``: for a 1-D array of step sizes it returns,
for each, the three numbers that decide the outcome (min J over the run, min and max J over the
last quarter). A callable returning one array (a min J) is refused: a minimum cannot tell a dip
from a collapse.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from .._validate import as_float_array

COLLAPSE_J = 1e-3
"""J below this at every state of the last quarter is collapse (Thm 2's J -> 0)."""
SENSITIVITY_J = 1e-2
"""Looser collapse level, reported beside eta* as a sensitivity check."""
CONVERGED_J = 0.99
"""J above this at every state of the last quarter is convergence."""
BANDIT_OUTCOMES = ("collapsed", "dipped", "converged", "undecided")
"""Outcomes of a bandit run (:func:`bandit_outcome`), in order of precedence."""
COLLAPSE_KINDS = {"exact": "excursion", "sampled": "absorbing"}
"""Gradient (bandits.engine.GRADIENTS) -> the kind of collapse its runs show (docs/evidence.md section 6): exact
expected updates move by a step proportional to J, so J -> 0 is an excursion that ends; sampled groups give no
update when all G answers are wrong, so J -> 0 is absorbing up to an escape chance <= G J per step."""


def tail_start(horizon: int) -> int:
    """First state of the last quarter of a run with ``horizon`` updates: K - K // 4 (K < 4: K)."""
    if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
        raise ValueError(f"horizon must be a positive integer (updates in the run), got {horizon!r}")
    K = int(horizon)
    return K - K // 4


def _unit(values, name: str) -> np.ndarray:
    a = as_float_array(values, name)
    if np.any(np.isnan(a)):
        raise ValueError(f"{name} holds NaN: give J of a diverged run as 0")
    if np.any((a < 0) | (a > 1)):
        bad = a[(a < 0) | (a > 1)].ravel()[0]
        raise ValueError(f"{name} must be success rates in [0, 1], got {bad!r}")
    return a


@dataclass(frozen=True, eq=False)
class RunStats:
    """What decides a run's outcome, per run (arrays of one shape).

    J_min: min of J over states 0..K; J_tail_min, J_tail_max: min and max of J over the last quarter
    (states k >= tail_start(K)). Each in [0, 1]; J_min <= J_tail_min <= J_tail_max.
    """

    J_min: np.ndarray
    J_tail_min: np.ndarray
    J_tail_max: np.ndarray

    def __post_init__(self):
        arrs = [_unit(getattr(self, n), n) for n in ("J_min", "J_tail_min", "J_tail_max")]
        if not arrs[0].shape == arrs[1].shape == arrs[2].shape:
            raise ValueError(f"J_min, J_tail_min and J_tail_max must share a shape, got "
                             f"{[a.shape for a in arrs]}")
        tol = 1e-12
        if np.any(arrs[0] > arrs[1] + tol) or np.any(arrs[1] > arrs[2] + tol):
            raise ValueError("run stats must satisfy J_min <= J_tail_min <= J_tail_max")
        for n, a in zip(("J_min", "J_tail_min", "J_tail_max"), arrs):
            a.setflags(write=False)
            object.__setattr__(self, n, a)

    @classmethod
    def from_trajectory(cls, J, *, axis: int = -1) -> RunStats:
        """From the states J_0..J_K of each run along ``axis`` (the full trajectory, final state included)."""
        a = _unit(J, "J")
        a = np.moveaxis(a, axis, -1)
        if a.shape[-1] < 2:
            raise ValueError(f"J must hold the states 0..K (K >= 1) along axis {axis}, got length {a.shape[-1]}")
        tail = a[..., tail_start(a.shape[-1] - 1):]
        return cls(a.min(axis=-1), tail.min(axis=-1), tail.max(axis=-1))

    @classmethod
    def constant(cls, J) -> RunStats:
        """Runs that sit at J for the whole horizon (synthetic scans; every dip is then a collapse)."""
        a = _unit(J, "J")
        return cls(a, a, a)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.J_min.shape

    def take(self, idx) -> RunStats:
        return RunStats(self.J_min[idx], self.J_tail_min[idx], self.J_tail_max[idx])


def bandit_outcome(stats: RunStats, *, threshold: float = COLLAPSE_J, converged: float = CONVERGED_J) -> np.ndarray:
    """Outcome of each run (an array of strings from BANDIT_OUTCOMES; precedence collapsed > dipped > converged)."""
    if not isinstance(stats, RunStats):
        raise ValueError(f"stats must be a RunStats, got {type(stats).__name__}")
    if not (0 < threshold < converged < 1):
        raise ValueError(f"threshold and converged must satisfy 0 < threshold < converged < 1, got "
                         f"{threshold!r}, {converged!r}")
    out = np.full(stats.shape, "undecided", dtype=object)
    out[stats.J_tail_min > converged] = "converged"
    out[stats.J_min < threshold] = "dipped"
    out[stats.J_tail_max < threshold] = "collapsed"
    return out


def is_collapsed(stats: RunStats, *, threshold: float = COLLAPSE_J) -> np.ndarray:
    """collapsed = J < threshold at every state of the last quarter (elementwise; Thm 2's J -> 0)."""
    if not isinstance(stats, RunStats):
        raise ValueError("stats must be a RunStats (a min J alone cannot tell a dip from a collapse)")
    return stats.J_tail_max < threshold


def has_dipped(stats: RunStats, *, threshold: float = COLLAPSE_J) -> np.ndarray:
    """J < threshold at some state of the run (collapsed or dipped; elementwise)."""
    if not isinstance(stats, RunStats):
        raise ValueError("stats must be a RunStats")
    return stats.J_min < threshold


RunStatsFn = Callable[[np.ndarray], RunStats]


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


MAX_GRID_POINTS = 10_000_000
"""Largest grid :func:`eta_grid` builds (80 MB of etas)."""


def eta_grid(eta_lo: float, eta_hi: float, *, max_ratio: float = 1.01) -> np.ndarray:
    """Geometric grid from eta_lo to eta_hi (both included) with neighbour ratio <= max_ratio.

    n = ceil((log eta_hi - log eta_lo) / log(max_ratio)) + 1 points, spaced evenly in log eta (logs, so
    any bracket of positive finite floats works: eta_hi / eta_lo overflows for 1e-200 .. 1e200);
    deterministic in its arguments. Subnormal etas (below 2.2e-308) are as far apart as the floats
    there allow: coinciding points are dropped, so the grid is strictly increasing. More than
    MAX_GRID_POINTS points is refused.
    """
    lo, hi, r = _check_range(eta_lo, eta_hi, max_ratio)
    a, b = math.log(lo), math.log(hi)
    n = int(math.ceil((b - a) / math.log(r) * (1 - 1e-12))) + 1
    if n > MAX_GRID_POINTS:
        raise ValueError(f"max_ratio={max_ratio!r} puts {n} points on [eta_lo, eta_hi] (at most {MAX_GRID_POINTS}): "
                         "raise max_ratio or narrow the range")
    with np.errstate(over="ignore", under="ignore"):
        grid = np.geomspace(lo, hi, max(n, 2))
    grid[0], grid[-1] = lo, hi
    return np.unique(np.clip(grid, lo, hi))


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


def _cell_edges(grid: np.ndarray) -> np.ndarray:
    """log eta edges of the cells the scanned etas stand for (geometric midpoints; the ends stop at the range)."""
    logs = np.log(grid)
    return np.concatenate([[logs[0]], (logs[1:] + logs[:-1]) / 2, [logs[-1]]])


def _collapsed_intervals(grid: np.ndarray, collapsed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The collapsed part of the scanned range as disjoint log eta intervals [A_i, B_i] (merged cells)."""
    edges = _cell_edges(grid)
    flips = np.diff(np.concatenate([[0], collapsed.astype(np.int8), [0]]))
    return edges[np.flatnonzero(flips == 1)], edges[np.flatnonzero(flips == -1)]


def _window_fraction(x, w: float, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Collapsed share of the log eta windows [x - w, x + w] (x an array of centres)."""
    x = np.asarray(x, dtype=float)[..., None]
    return np.clip(np.minimum(B, x + w) - np.maximum(A, x - w), 0.0, None).sum(axis=-1) / (2 * w)


def collapsed_window_eta(grid, collapsed, *, half_width: float = 1.05, level: float = 0.5) -> tuple[str, float]:
    """Smallest eta whose log window [eta / half_width, eta x half_width] is at least ``level`` collapsed.

    The scanned etas ``grid`` (increasing) stand for their log cells (between geometric midpoints with
    their neighbours) and a cell is collapsed when its eta is; the window's collapsed share
    f(eta) = |C cap [log eta - w, log eta + w]| / 2w, w = log(half_width), is piecewise linear in log eta
    with breaks where a window edge meets a cell edge, so its first crossing of ``level`` is exact for
    the scan. Only windows inside the scanned range count. Returns (status, eta): "found"; "at_lo"
    (the lowest window inside the range is already at ``level``: eta = eta_lo x half_width); or
    "none_in_range" (NaN).
    """
    g = as_float_array(grid, "grid")
    c = np.asarray(collapsed)
    if c.dtype != np.bool_:
        raise ValueError(f"collapsed must be a boolean array (True where the run collapsed), got dtype {c.dtype}")
    if g.ndim != 1 or g.size < 2 or np.any(np.diff(g) <= 0) or g[0] <= 0:
        raise ValueError("grid must be a 1-D increasing array of at least two positive etas")
    if c.shape != g.shape:
        raise ValueError(f"collapsed must have the grid's shape {g.shape}, got {c.shape}")
    for name, v in (("half_width", half_width), ("level", level)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) or not math.isfinite(v):
            raise ValueError(f"{name} must be a finite real number, got {v!r}")
    if half_width <= 1.0:
        raise ValueError(f"half_width must be > 1 (the window is eta / half_width .. eta x half_width), got {half_width!r}")
    if not 0 < level <= 1:
        raise ValueError(f"level must lie in (0, 1], got {level!r}")
    w = math.log(half_width)
    x0, x1 = math.log(g[0]) + w, math.log(g[-1]) - w
    A, B = _collapsed_intervals(g, c)
    if x1 < x0 or A.size == 0:
        return "none_in_range", math.nan
    cand = np.unique(np.concatenate([A - w, A + w, B - w, B + w, [x0, x1]]))
    cand = cand[(cand >= x0) & (cand <= x1)]
    f = _window_fraction(cand, w, A, B)
    ok = np.flatnonzero(f >= level * (1 - 1e-12))
    if ok.size == 0:
        return "none_in_range", math.nan
    k = int(ok[0])
    if k == 0:
        return "at_lo", float(math.exp(cand[0]))
    xa, xb, fa, fb = cand[k - 1], cand[k], f[k - 1], f[k]
    return "found", float(math.exp(xa + (level - fa) / (fb - fa) * (xb - xa)))


def excursion_lengths(J, *, threshold: float = COLLAPSE_J, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """(longest, final) stretch of consecutive states with J < threshold along ``axis``, in states.

    longest: the longest such stretch of each run; final: the stretch that holds the last state (0 when
    the last state is at or above the threshold), an excursion still under way at the horizon (censored).
    Under exact expected updates the step is proportional to J (Suk & Duan, arXiv 2510.08539, eq. of
    E[w] = scalar x Gap), so J -> 0 is an excursion whose length these measure.
    """
    a = np.moveaxis(_unit(J, "J"), axis, -1)
    if a.shape[-1] < 1:
        raise ValueError("J must hold at least one state along axis")
    below = a < threshold
    idx = np.broadcast_to(np.arange(a.shape[-1]), a.shape)
    last_above = np.maximum.accumulate(np.where(below, -1, idx), axis=-1)
    run = idx - last_above  # length of the stretch below the threshold ending at each state (0 when above)
    return run.max(axis=-1), run[..., -1]


def _evaluate(run_stats: RunStatsFn, etas: np.ndarray) -> RunStats:
    out = run_stats(etas.copy())
    if isinstance(out, Mapping) and not isinstance(out, RunStats):
        out = RunStats(**{k: out[k] for k in ("J_min", "J_tail_min", "J_tail_max")})
    if not isinstance(out, RunStats):
        raise ValueError("run_stats must return a gapdyn.RunStats (J_min, J_tail_min, J_tail_max per eta); a min J "
                         "alone cannot tell a dip from a collapse")
    if out.shape != etas.shape:
        raise ValueError(f"run_stats must return one run per eta: expected shape {etas.shape}, got {out.shape}")
    return out


def _refine(run_stats: RunStatsFn, hit_fn, lo: float, hi: float, rtol: float, max_iter: int,
            points: int) -> tuple[float, float, int]:
    """Shrink (lo has no hit, hi hits) until hi/lo - 1 <= rtol.

    Each call evaluates ``points`` geometrically spaced interior etas at once and keeps the
    sub-bracket ending at the first hit (points = 1 is bisection in log eta); the bracket ratio
    shrinks to its (points + 1)-th root per call. Returns (lo, hi, etas evaluated).
    """
    evaluated = 0
    for _ in range(max_iter):
        if hi / lo - 1.0 <= rtol:
            return lo, hi, evaluated
        inner = np.geomspace(lo, hi, points + 2)[1:-1]
        hit = np.flatnonzero(hit_fn(_evaluate(run_stats, inner)))
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


WINDOW = 1.05
"""eta_50's window: eta / WINDOW .. eta x WINDOW (+-5 % in log eta)."""
WINDOW_LEVEL = 0.5
"""eta_50: the smallest eta whose window is at least this share collapsed."""


@dataclass(frozen=True, eq=False)
class EtaStar:
    """Result of :func:`find_eta_star` (all etas in the caller's units).

    status: "found" (a collapsing eta inside the range), "collapsed_at_lo" (eta_lo already collapses),
      "none_in_range" (no scanned eta collapses: eta_star is NaN).
    eta_star: the first collapsed eta, the smallest scanned eta whose run collapsed (bracket[1]; a run that
      did collapse, never a midpoint); bracket: (largest non-collapsing, smallest collapsing) eta with
      bracket[1]/bracket[0] - 1 <= rtol.
    eta_safe, safe_resolution: no scanned eta below eta_safe collapses, and neighbouring scanned etas up to
      eta_star are at most safe_resolution apart (ratio): what the scan certifies. eta_safe = bracket[0]
      ("found"), eta_hi ("none_in_range", certified at the base grid's spacing), NaN ("collapsed_at_lo").
    eta_50, eta_50_status, eta_50_window: the smallest eta whose window [eta / window, eta x window] is at
      least window_level collapsed (:func:`collapsed_window_eta` on the scan), its status and the window.
    eta_dip, bracket_dip, dip_status: the same as eta_star for the first eta whose run dips (J_min < threshold);
      dip_recover_share: share of the dipping base-grid points whose run did not collapse (NaN if none dips);
      reconverge_share: share of base-grid points above eta_star whose run ends converged (NaN without any).
    islands: (first, last) collapsing scanned eta of each run of collapsing scanned etas.
    collapse_per_decade: (decade start, decade end, fraction of log eta that collapses).
    eta_star_loose, bracket_loose: eta_star at the sensitivity level J < loose_threshold over the last quarter.
    grid, base, outcomes, J_min, J_tail_max: the scan (the base grid and the fine scans merged in eta order;
      ``base`` marks the base grid's etas; read-only arrays); n_evaluations: etas simulated in total.
    Compared by identity (it holds arrays); compare ``to_dict()`` for equality.
    """

    status: str
    eta_star: float
    bracket: tuple[float, float]
    dip_status: str
    eta_dip: float
    bracket_dip: tuple[float, float]
    dip_recover_share: float
    islands: tuple[tuple[float, float], ...]
    collapse_per_decade: tuple[tuple[float, float, float], ...]
    eta_star_loose: float
    bracket_loose: tuple[float, float]
    threshold: float
    loose_threshold: float
    max_ratio: float
    rtol: float
    grid: np.ndarray
    outcomes: np.ndarray
    J_min: np.ndarray
    J_tail_max: np.ndarray
    n_evaluations: int
    eta_safe: float = math.nan
    safe_resolution: float = math.nan
    eta_50: float = math.nan
    eta_50_status: str = "none_in_range"
    eta_50_window: tuple[float, float] = (math.nan, math.nan)
    window: float = WINDOW
    window_level: float = WINDOW_LEVEL
    reconverge_share: float = math.nan
    base: np.ndarray | None = None

    @property
    def n_islands(self) -> int:
        return len(self.islands)

    def to_dict(self) -> dict:
        """Plain JSON-able summary (arrays as lists)."""
        return {
            "status": self.status, "eta_star": self.eta_star, "bracket": list(self.bracket),
            "eta_safe": self.eta_safe, "safe_resolution": self.safe_resolution, "eta_50": self.eta_50,
            "eta_50_status": self.eta_50_status, "eta_50_window": list(self.eta_50_window), "window": self.window,
            "window_level": self.window_level, "dip_status": self.dip_status, "eta_dip": self.eta_dip,
            "bracket_dip": list(self.bracket_dip), "dip_recover_share": self.dip_recover_share,
            "reconverge_share": self.reconverge_share,
            "n_islands": self.n_islands, "islands": [list(i) for i in self.islands],
            "collapse_per_decade": [list(r) for r in self.collapse_per_decade],
            "eta_star_loose": self.eta_star_loose, "bracket_loose": list(self.bracket_loose),
            "threshold": self.threshold, "loose_threshold": self.loose_threshold,
            "max_ratio": self.max_ratio, "rtol": self.rtol, "grid": self.grid.tolist(),
            "base": None if self.base is None else self.base.tolist(),
            "outcomes": [str(o) for o in self.outcomes], "J_min": self.J_min.tolist(),
            "J_tail_max": self.J_tail_max.tolist(), "n_evaluations": self.n_evaluations,
        }


class _Scan:
    """The scanned etas (increasing), their stats and which belong to the base grid; grows by fine scans."""

    def __init__(self, run_stats: RunStatsFn, grid: np.ndarray, fine_ratio: float):
        self.run_stats, self.grid, self.fine_ratio = run_stats, grid, fine_ratio
        self.stats = _evaluate(run_stats, grid)
        self.base = np.ones(grid.size, bool)
        self.added = 0
        self._lattice = None

    def fine(self, a: float, b: float) -> None:
        """Scan [a, b] at neighbour ratio fine_ratio: the etas of the fine lattice eta_grid(eta_lo, eta_hi,
        fine_ratio) (one lattice per scan, so every fine scan of a range lands on the same etas) inside
        (a, b) that fall between scanned neighbours more than fine_ratio apart."""
        ratio = self.fine_ratio
        if b / a <= ratio:
            return
        if self._lattice is None:
            self._lattice = eta_grid(float(self.grid[0]), float(self.grid[-1]), max_ratio=ratio)
        lat = self._lattice
        cand = lat[(lat > a) & (lat < b)]
        j = np.searchsorted(self.grid, cand)
        inside = (j > 0) & (j < self.grid.size)
        gap = np.full(cand.shape, np.inf)
        gap[inside] = self.grid[j[inside]] / self.grid[j[inside] - 1]
        cand = cand[(gap > ratio * (1 + 1e-9)) & ~np.isin(cand, self.grid)]
        if cand.size == 0:
            return
        extra = _evaluate(self.run_stats, cand)
        order = np.argsort(np.concatenate([self.grid, cand]), kind="stable")
        self.grid = np.concatenate([self.grid, cand])[order]
        self.base = np.concatenate([self.base, np.zeros(cand.size, bool)])[order]
        self.stats = RunStats(**{n: np.concatenate([getattr(self.stats, n), getattr(extra, n)])[order]
                                 for n in ("J_min", "J_tail_min", "J_tail_max")})
        self.added += int(cand.size)

    def max_gap(self, upto: float) -> float:
        """Largest neighbour ratio among scanned etas <= upto (1.0 for fewer than two)."""
        g = self.grid[self.grid <= upto * (1 + 1e-12)]
        return float(np.max(g[1:] / g[:-1])) if g.size > 1 else 1.0


def _first_crossing(run_stats, hit_fn, grid, hits, rtol, max_iter, points):
    idx = np.flatnonzero(hits)
    if idx.size == 0:
        return "none_in_range", math.nan, (math.nan, math.nan), 0
    i = int(idx[0])
    if i == 0:
        return "collapsed_at_lo", float(grid[0]), (0.0, float(grid[0])), 0
    lo, hi, calls = _refine(run_stats, hit_fn, float(grid[i - 1]), float(grid[i]), rtol, max_iter, points)
    return "found", hi, (lo, hi), calls


def find_eta_star(
    run_stats: RunStatsFn,
    eta_lo: float,
    eta_hi: float,
    *,
    max_ratio: float = 1.01,
    rtol: float = 1e-3,
    max_iter: int = 60,
    refine_points: int = 9,
    threshold: float = COLLAPSE_J,
    loose_threshold: float = SENSITIVITY_J,
    island_scan: bool = True,
    window: float = WINDOW,
    window_level: float = WINDOW_LEVEL,
) -> EtaStar:
    """The first collapsed eta (eta_star), eta_safe and eta_50 of a run family; eta_dip likewise for dips.

    run_stats: vectorised callable, 1-D array of etas -> :class:`RunStats` (one run per eta) or a
    mapping with its three keys. eta_lo < eta_hi: the scanned range; max_ratio: largest ratio of
    neighbouring base-grid etas; rtol: relative width of the final brackets and the fine scans' spacing;
    refine_points: etas evaluated per refinement call (1 = plain bisection; the default 9 takes a 1 %
    bracket to 0.1 % in one call); max_iter: refinement calls allowed per threshold.

    Steps: (1) the base grid eta_grid(eta_lo, eta_hi, max_ratio); (2) island_scan: the whole range below
    the first collapsing base-grid eta rescanned at neighbour ratio 1 + rtol (the collapse set of exact
    GRPO-type dynamics is fragmented into islands narrower than a 1 % grid; an island narrower than the
    fine spacing can still be missed, which is the stated resolution, ``safe_resolution``); (3) eta_50's
    window rescanned at 1 + rtol until the window of the returned eta_50 lies in the fine scan; (4)
    refinement of the first crossing to rtol. eta_star is the smallest scanned eta whose run collapsed;
    the shares (dip_recover_share, reconverge_share) are over the base grid only, the measures (islands,
    per decade, eta_50) over every scanned eta. run_stats must be deterministic in eta (the same seeds /
    common random numbers for every eta), otherwise scan and refinement disagree.
    """
    lo, hi, r = _check_range(eta_lo, eta_hi, max_ratio)
    if not callable(run_stats):
        raise ValueError("run_stats must be callable: etas (1-D array) -> gapdyn.RunStats")
    if not (isinstance(rtol, (int, float)) and 0 < rtol < r - 1):
        raise ValueError(f"rtol must lie in (0, max_ratio - 1 = {r - 1:.3g}), got {rtol!r}")
    if isinstance(max_iter, bool) or int(max_iter) != max_iter or not (1 <= max_iter <= 200):
        raise ValueError(f"max_iter must be an integer in [1, 200], got {max_iter!r}")
    if isinstance(refine_points, bool) or int(refine_points) != refine_points or not (1 <= refine_points <= 1000):
        raise ValueError(f"refine_points must be an integer in [1, 1000], got {refine_points!r}")
    if not isinstance(island_scan, (bool, np.bool_)):
        raise ValueError(f"island_scan must be True or False, got {island_scan!r}")
    if not (0 < threshold <= loose_threshold < CONVERGED_J):
        raise ValueError(
            f"threshold and loose_threshold must satisfy 0 < threshold <= loose_threshold < {CONVERGED_J}, got "
            f"{threshold!r}, {loose_threshold!r}"
        )
    collapsed_window_eta(np.array([1.0, 2.0]), np.zeros(2, bool), half_width=window, level=window_level)  # validate
    fine_ratio = 1.0 + float(rtol)
    if island_scan and (math.log(hi) - math.log(lo)) / math.log1p(rtol) > MAX_GRID_POINTS:
        raise ValueError(f"rtol={rtol!r} would rescan [eta_lo, eta_hi] at more than {MAX_GRID_POINTS} points: raise "
                         "rtol or pass island_scan=False")
    scan = _Scan(run_stats, eta_grid(lo, hi, max_ratio=r), fine_ratio)

    def collapsed(s, t=threshold):
        return is_collapsed(s, threshold=t)

    def dipped(s):
        return has_dipped(s, threshold=threshold)

    def loose(s):
        return is_collapsed(s, threshold=loose_threshold)

    first = np.flatnonzero(collapsed(scan.stats))
    if island_scan and first.size and first[0] > 0:
        scan.fine(lo, float(scan.grid[first[0]]))
    w50 = ("none_in_range", math.nan)
    for _ in range(8):
        w50 = collapsed_window_eta(scan.grid, collapsed(scan.stats), half_width=window, level=window_level)
        if not island_scan or w50[0] == "none_in_range":
            break
        a, b = max(lo, w50[1] / window**2), min(hi, w50[1] * window**2)
        before = scan.added
        scan.fine(a, b)
        if scan.added == before:
            break
    opts = (rtol, int(max_iter), int(refine_points))
    grid, stats, base = scan.grid, scan.stats, scan.base
    status, star, bracket, calls = _first_crossing(run_stats, collapsed, grid, collapsed(stats), *opts)
    dstatus, dip, bracket_d, calls_d = _first_crossing(run_stats, dipped, grid, dipped(stats), *opts)
    _, star_l, bracket_l, calls_l = _first_crossing(run_stats, loose, grid, loose(stats), *opts)
    col, dp = collapsed(stats), dipped(stats)
    outcomes = bandit_outcome(stats, threshold=threshold)
    bcol, bdp = col[base], dp[base]
    share = float(np.mean(~bcol[bdp])) if bdp.any() else math.nan
    if status == "found":
        above = base & (grid > bracket[1])
        reconv = float(np.mean(outcomes[above] == "converged")) if above.any() else math.nan
        safe, resolution = bracket[0], max(scan.max_gap(bracket[0]), bracket[1] / bracket[0])
    elif status == "none_in_range":
        reconv, safe, resolution = math.nan, hi, scan.max_gap(hi)
    else:
        above = base & (grid > grid[0])
        reconv = float(np.mean(outcomes[above] == "converged")) if above.any() else math.nan
        safe, resolution = math.nan, math.nan
    e50 = w50[1]
    for a in (grid, outcomes, base):
        a.setflags(write=False)
    return EtaStar(
        status=status, eta_star=star, bracket=bracket, dip_status=dstatus, eta_dip=dip, bracket_dip=bracket_d,
        dip_recover_share=share, islands=_islands(grid, col), collapse_per_decade=_per_decade(grid, col),
        eta_star_loose=star_l, bracket_loose=bracket_l, threshold=float(threshold),
        loose_threshold=float(loose_threshold), max_ratio=r, rtol=float(rtol), grid=grid, outcomes=outcomes,
        J_min=stats.J_min, J_tail_max=stats.J_tail_max,
        n_evaluations=scan.grid.size + calls + calls_d + calls_l,
        eta_safe=float(safe), safe_resolution=float(resolution), eta_50=float(e50), eta_50_status=w50[0],
        eta_50_window=(e50 / window, e50 * window), window=float(window), window_level=float(window_level),
        reconverge_share=reconv, base=base,
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
