"""Mechanisms of collapse on a single-context log-linear bandit: eta* search, trap geometry, predictors.

Shared by the threshold and methods experiments (docs/bandits_contextual.md, docs/equations.md §5).

- :func:`search_eta_star`: eta* of one (bandit, dynamics, theta0) with :func:`gapdyn.find_eta_star`
  on one shared grid, keeping the final J of every simulated eta (for sharpness and re-convergence).
- Trap (beyond the papers): every exact method moves along scalar(J, G) x Gap, so one step of size
  eta from theta0 gives logits phi_a . theta0 + eta s phi_a . Gap(theta0); as eta grows the softmax
  puts all its mass on argmax_a phi_a . Gap(theta0). If that arm is wrong, a large enough step sends
  J to 0 (a finite eta* exists); if it is correct, a huge step solves the instance.
  :func:`trap_margin` = max_{wrong a} phi_a . Gap - max_{correct a} phi_a . Gap (> 0: a trap).
- Predictors of eta* at theta0: the one-step ones (:func:`one_step_predictors`: line-search,
  local curvature, Theorem 1's condition) and a two-step lookahead (:func:`lookahead_eta`).
- :func:`matched_step_etas`: step sizes that give every method the same expected first step length.
"""

from __future__ import annotations

import math

import numpy as np

import gapdyn
from bandits.engine import Dynamics, simulate
from bandits.envs import ContextualBandit, make_bandit

__all__ = [
    "instance_bandit", "start_theta", "search_eta_star", "transition_width", "reconverge_share",
    "trap_margin", "gap_norm", "one_step_predictors", "lookahead_eta", "matched_step_etas",
]


def instance_bandit(instance: int, *, n_arms: int = 100, dim: int = 16, n_correct: int = 10) -> ContextualBandit:
    """The single-context log-linear bandit of one instance seed (Suk & Duan's setting: K = 100)."""
    return make_bandit(n_contexts=1, n_arms=n_arms, dim=dim, n_correct=n_correct, seed=int(instance))


def start_theta(bandit: ContextualBandit, start: int, *, scale: float) -> np.ndarray:
    """theta0 [1, d]: 0 for start 0, else scale x N(0, I_d) from default_rng([bandit seed, start])."""
    if isinstance(start, bool) or int(start) != start or start < 0:
        raise ValueError(f"start must be a non-negative integer, got {start!r}")
    if start == 0:
        return bandit.zeros()
    rng = np.random.default_rng([int(bandit.seed), int(start)])
    return scale * rng.normal(size=(bandit.n_params, bandit.dim))


def search_eta_star(bandit: ContextualBandit, dyn: Dynamics, theta0, *, eta_lo: float, eta_hi: float,
                    max_ratio: float, rtol: float):
    """(EtaStar, etas, J_final) for exact or seeded dynamics from theta0 (context 0).

    eta* = the first eta whose run is collapsed (J < gapdyn.COLLAPSE_J over the last quarter of the horizon
    dyn.steps; gapdyn.bandit_outcome), eta_dip beside it. Every eta the search simulates is returned with its
    final J, sorted by eta.
    """
    from ._common import run_stats

    seen: dict[float, float] = {}

    def stats(etas):
        tr = simulate(bandit, dyn, eta=etas, theta0=theta0)
        seen.update(zip(etas.tolist(), tr.J_final[:, 0].tolist()))
        return run_stats(tr, 0)

    res = gapdyn.find_eta_star(stats, eta_lo, eta_hi, max_ratio=max_ratio, rtol=rtol)
    etas = np.array(sorted(seen))
    return res, etas, np.array([seen[e] for e in etas])


def transition_width(res, etas, J_final, *, converged: float = 0.99) -> float:
    """eta* / (largest simulated eta below the bracket whose run ends with J > converged).

    1 + rtol when the last surviving eta already converges (a step-like transition); eta*/eta_lo
    when no simulated eta below eta* converges. NaN without a finite eta*.
    """
    if res.status != "found":
        return math.nan
    below = (etas <= res.bracket[0]) & (J_final > converged)
    ref = etas[below].max() if below.any() else etas[0]
    return float(res.eta_star / ref)


def reconverge_share(res) -> float:
    """Share of base-grid etas above eta* whose run ends converged (gapdyn.bandit_outcome "converged").

    The base grid is gapdyn.eta_grid(eta_lo, eta_hi, max_ratio) of the search, not the merged scan: the
    island scan and eta_50's window add etas near eta*, which would weight its neighbourhood (= the
    estimator's EtaStar.reconverge_share; for an EtaStar rebuilt from rows stored without ``base`` the base
    grid is rebuilt from the scan's ends and max_ratio). NaN when no eta* is found or none lies above it.
    """
    if res.status == "none_in_range":
        return math.nan
    grid = np.asarray(res.grid, dtype=float)
    if res.base is not None:
        base = np.asarray(res.base, dtype=bool)
    else:
        want = gapdyn.eta_grid(float(grid[0]), float(grid[-1]), max_ratio=res.max_ratio)
        j = np.clip(np.searchsorted(want, grid), 1, want.size - 1)
        near = np.minimum(np.abs(grid / want[j] - 1), np.abs(grid / want[j - 1] - 1))
        base = near <= 1e-12
    above = base & (grid > res.bracket[1])
    if not above.any():
        return math.nan
    return float(np.mean(np.asarray(res.outcomes)[above] == "converged"))


def gap_norm(bandit: ContextualBandit, theta0) -> float:
    """||Gap(theta0)|| of context 0 (Suk & Duan, arXiv 2510.08539, eq. for g+ - g-)."""
    return float(np.linalg.norm(bandit.gap(theta0)[0]))


def trap_margin(bandit: ContextualBandit, theta0) -> float:
    """max_{a wrong} phi_a . Gap(theta0) - max_{a correct} phi_a . Gap(theta0); > 0 is a trap."""
    proj = bandit.features[0] @ bandit.gap(theta0)[0]
    correct = bandit.rewards[0] > 0
    return float(proj[~correct].max() - proj[correct].max())


def one_step_predictors(bandit: ContextualBandit, method: str, G: int, theta0) -> dict:
    """eta* predictors at theta0 for the method's exact direction w0 = scalar(J0, G) Gap(theta0).

    pred_sharp: gapdyn.sharp_step_threshold (one-step line search on Phi); pred_local: 2 dmu / (w^T -H w)_+;
    pred_thm1: Theorem 1's step condition for the unit direction divided by ||w0|| (a bound on eta for w0).
    """
    th = np.asarray(theta0, dtype=float).reshape(-1)
    phi, r = bandit.features[0], bandit.rewards[0]
    probs = gapdyn.loglinear_probs(phi, th)
    scores = gapdyn.loglinear_scores(phi, th)
    gap = gapdyn.gradient_gap(probs, r, scores)
    J = float(gapdyn.success_rate(probs, r))
    w = float(gapdyn.expected_scalar(method, J, G)) * gap
    dmu = float(gapdyn.gap_alignment(w, gap))
    hess = gapdyn.logodds_hessian(probs, r, scores)
    G_o, L_o = gapdyn.loglinear_bound_constants(phi)
    wn = float(np.linalg.norm(w))
    return {
        "J0": J,
        "pred_sharp": float(gapdyn.sharp_step_threshold(gapdyn.loglinear_logodds_fn(phi, r), th, w)),
        "pred_local": float(gapdyn.local_step_threshold(dmu, w, hess)),
        "pred_thm1": float(gapdyn.theorem1_step_bound(dmu / wn, L_o=L_o, G_o=G_o)) / wn,
    }


def lookahead_eta(bandit: ContextualBandit, method: str, G: int, theta0, grid) -> dict:
    """Two-step lookahead predictors of eta* on ``grid`` (smallest grid eta, NaN if none).

    Two exact steps theta1 = theta0 + eta w(theta0), theta2 = theta1 + eta w(theta1) per grid eta:
    pred_2dec: the smallest eta for which one of the two steps decreases Phi (an overshoot);
    pred_2col: the smallest eta whose two-step run ends collapsed (J_2 < gapdyn.COLLAPSE_J: the last quarter
    of a two-step horizon is its final state).
    """
    from ._common import run_stats

    grid = np.asarray(grid, dtype=float)
    tr = simulate(bandit, Dynamics(method=method, gradient="exact", group_size=G, steps=2, record_every=2),
                  eta=grid, theta0=theta0)
    dec = tr.n_decrease[:, 0] > 0
    col = gapdyn.is_collapsed(run_stats(tr, 0))
    first = lambda mask: float(grid[np.argmax(mask)]) if mask.any() else math.nan  # noqa: E731
    return {"pred_2dec": first(dec), "pred_2col": first(col)}


def matched_step_etas(bandit: ContextualBandit, methods, G: int, step_lengths, theta0=None) -> dict:
    """eta_m = L / ||E[w_m](theta0)|| = L / (scalar_m(J0, G) ||Gap(theta0)||) for every method m and L.

    At these etas every method's expected first step eta ||E[w](theta0)|| has length L.
    """
    th = bandit.zeros() if theta0 is None else np.asarray(theta0, dtype=float)
    J0 = float(bandit.success_rate(th)[0])
    gn = gap_norm(bandit, th)
    L = np.asarray(step_lengths, dtype=float)
    if L.ndim != 1 or L.size == 0 or np.any(~np.isfinite(L)) or np.any(L <= 0):
        raise ValueError(f"step_lengths must be a non-empty 1-D array of positive numbers, got {step_lengths!r}")
    return {m: L / (float(gapdyn.expected_scalar(m, J0, G)) * gn) for m in methods}
