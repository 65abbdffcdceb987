"""Experiment 4: stagnation at a fixed step size, judged against the best reachable J* and by M.

Suk & Duan (arXiv 2510.08539) discuss that a fixed eta stalls below J = 1 (Theorem 3 discussion; exact bound
open) and that learning is driven by the cumulative alignment M = sum eta [Delta mu]_+ (Theorem 1), so that
convergence must be judged by M rather than by gradient norms. Parts (one cell each per instance):

- ``single``: one context (100-arm log-linear, d = 16), exact REINFORCE at fixed eta, every step recorded.
  Derived example (docs/theory.md §7, the same argument in this bandit): near J = 1,
  dPhi/dk ~ eta ||gap||^2 e^-Phi, so 1 - J ~ 1/(eta c k) (no plateau), M grows by log 2 per doubling of k,
  and S_k = sum eta ||grad J||^2 converges. Measured over the second half [K/2, K]: the tail exponent b of
  1 - J ~ k^-b, the share of S_K added there, M_K - M_{K/2} and (1 - J_K) / (1 - J_{K/2}).
- ``shared``: settings where one theta serves several contexts or the optimum is unreachable, exact GRPO at
  fixed etas: ``interference`` (C log-linear contexts sharing theta), ``tabular_shared`` (one tabular softmax,
  disjoint correct arms), ``unreachable`` (d = 2, correct arms strictly inside the feature hull). The best
  reachable J* is bracketed: J*_lo = max(multi-start BFGS, best run) <= J* <= J*_hi (:func:`reachable_upper`),
  and the plateau J* - J_final is reported as the interval [J*_lo - J_final, J*_hi - J_final].
- ``misalign``: controlled misalignment on one context: unit steps w = cos(a) g_hat + sin(a) xi with xi a fixed
  random direction made orthogonal to the Gap at every step; M grows as eta cos(a) ||gap||. At a = pi/2
  (M = 0 throughout) learning should stop; across angles the change of logit J should follow M.
- ``controllers``: sampled GRPO (G = 8) on fresh instances at large eta0: constant step vs the adaptive
  controller (``bandits.schedules``) on common random numbers (paired by instance, eta0 and seed).

Every claim is in :data:`CRITERIA`; intervals are cluster bootstraps over instances unless stated.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import linprog, minimize
from scipy.spatial import ConvexHull
from scipy.special import expit

import gapdyn
from bandits.engine import Dynamics, simulate
from bandits.envs import ContextualBandit, make_bandit
from bandits.schedules import Schedule

from ._common import run_experiment, steps_to

NAME = "stagnation"
PARTS = ("single", "shared", "misalign", "controllers")
SETTINGS = ("interference", "tabular_shared", "unreachable")

_THM3 = "Suk & Duan (arXiv 2510.08539), Thm 3 discussion (fixed eta stalls below J = 1; open)"
_THM1 = "Suk & Duan (arXiv 2510.08539), Thm 1 (learning driven by M; docs/theory.md §4-5)"
_DERIVED = "derived example (docs/theory.md §7): exact REINFORCE, 1 - J ~ 1/(eta c k)"
_BEYOND = "beyond the papers"

CRITERIA: dict[str, gapdyn.Criterion] = {
    "stagnation.single.tail_exponent": gapdyn.Criterion.inside(0.9, 1.1),
    "stagnation.single.fail_halves": gapdyn.Criterion.below(0.75),
    "stagnation.single.gradsum_tail_share": gapdyn.Criterion.below(0.05),
    "stagnation.single.M_tail_increment": gapdyn.Criterion.above(0.25),
    **{f"stagnation.plateau.{s}": gapdyn.Criterion.below(0.01) for s in SETTINGS},
    **{f"stagnation.optimum_below_one.{s}": gapdyn.Criterion.below(0.99) for s in SETTINGS},
    "stagnation.larger_eta_escapes": gapdyn.Criterion.above(0.0),
    "stagnation.orthogonal_no_learning": gapdyn.Criterion.inside(-0.05, 0.05),
    "stagnation.misaligned_follows_M": gapdyn.Criterion.above(0.5),
    "stagnation.adaptive_fewer_collapses": gapdyn.Criterion.above(0.0, alpha=0.05),
}
FORMS: dict[str, str] = {
    # consequences of exact REINFORCE's own ODE (1 - J ~ 1/(eta c k)): shown, never counted
    "stagnation.single.tail_exponent": "derived", "stagnation.single.fail_halves": "derived",
    "stagnation.single.gradsum_tail_share": "derived", "stagnation.single.M_tail_increment": "derived",
    **{f"stagnation.plateau.{s}": "existence" for s in SETTINGS},
    "stagnation.optimum_below_one.interference": "existence",
    "stagnation.optimum_below_one.tabular_shared": "derived",  # J* = 1/C analytically
    "stagnation.optimum_below_one.unreachable": "derived",  # J* = 1/C analytically
    "stagnation.larger_eta_escapes": "comparison",
    "stagnation.orthogonal_no_learning": "derived",  # dmu = 0 by construction
    "stagnation.misaligned_follows_M": "derived",  # dPhi = M to first order
    "stagnation.adaptive_fewer_collapses": "comparison",
}
"""The form of each claim's statement (gapdyn.FORMS)."""
CRITERION_TEXT = {
    "stagnation.single.tail_exponent": "no plateau: 1 - J ~ k^-b with b = 1 (interval inside [0.9, 1.1])",
    "stagnation.single.fail_halves": "J still improves: 1 - J halves from K/2 to K (ratio below 0.75)",
    "stagnation.single.gradsum_tail_share": "sum of eta ||grad J||^2 has converged: share added over [K/2, K] "
                                            "below 0.05",
    "stagnation.single.M_tail_increment": "M keeps growing (log 2 per doubling): M_K - M_{K/2} above 0.25",
    **{f"stagnation.plateau.{s}": "a fixed-eta plateau is the best reachable J*, not stagnation: "
                                  "J* - J_final below 0.01 (interval spans the J* bracket)" for s in SETTINGS},
    **{f"stagnation.optimum_below_one.{s}": "the plateau below 1 is unrealisability: J* below 0.99 "
                                            "(interval spans the J* bracket)" for s in SETTINGS},
    "stagnation.larger_eta_escapes": "a larger eta ends higher (escapes stalls), all shared instances: "
                                     "J_final(largest eta) - J_final(smallest eta) above 0",
    "stagnation.orthogonal_no_learning": "no alignment, no learning: J_K - J_0 at a = pi/2 (M = 0) inside "
                                         "[-0.05, 0.05]",
    "stagnation.misaligned_follows_M": "learning follows M: Spearman rank correlation across angles of "
                                       "logit J_K - logit J_0 with M_K above 0.5",
    "stagnation.adaptive_fewer_collapses": "the adaptive controller collapses less than a constant step: "
                                           "difference of collapse rates above 0, exact McNemar p < 0.05 (Holm)",
}


@dataclass(frozen=True)
class Config:
    """Experiment 4 settings."""

    mode: str = "quick"
    instances: tuple[int, ...] = gapdyn.DISCOVERY_SEEDS
    confirmation: tuple[int, ...] = ()
    single_etas: tuple[float, ...] = (1.0, 3.0)
    single_steps: int = 3000
    steps: int = 1500
    """long runs of the shared settings."""
    etas: tuple[float, ...] = (1.0, 10.0)
    """fixed step sizes of the shared settings (smallest and largest enter the escape claim)."""
    n_contexts: int = 4
    starts: int = 4
    """multi-start BFGS restarts for J*_lo."""
    angles_deg: tuple[float, ...] = (0.0, 45.0, 67.5, 90.0)
    misalign_eta: float = 0.5
    misalign_steps: int = 400
    controller_steps: int = 100
    controller_etas: tuple[float, ...] = (10.0, 1000.0)
    n_seeds: int = 4
    delta: float = 2.0
    bootstrap: int = 2000

    @classmethod
    def test(cls) -> Config:
        return cls(mode="test", instances=(0, 1, 2), single_steps=300, steps=200, n_contexts=3, starts=2,
                   misalign_steps=60, controller_steps=30, n_seeds=2, bootstrap=200)

    @classmethod
    def quick(cls) -> Config:
        return cls(mode="quick")

    @classmethod
    def full(cls) -> Config:
        return cls(mode="full", single_etas=(0.3, 1.0, 3.0), single_steps=20000, steps=20000, etas=(0.3, 1.0, 10.0),
                   n_contexts=8, starts=20, angles_deg=(0.0, 30.0, 60.0, 75.0, 85.0, 90.0), misalign_steps=5000,
                   controller_steps=400, controller_etas=(1.0, 10.0, 100.0, 1000.0, 10000.0), n_seeds=16,
                   confirmation=gapdyn.CONFIRMATION_SEEDS)


def cells(config: Config, instances=None) -> list[dict]:
    seeds = config.instances if instances is None else instances
    common = {k: (list(v) if isinstance(v, tuple) else v) for k, v in config.__dict__.items()
              if k not in ("mode", "instances", "confirmation", "bootstrap")}
    return [{"part": p, "instance": int(i), **common} for p in PARTS for i in seeds]


# ---- the bracket on J* ---------------------------------------------------------------------------------


def reachable_lower(bandit: ContextualBandit, *, starts: int, seed: int = 0) -> float:
    """A lower estimate of J* = sup_theta mean_x J_x(theta): the best of theta = 0 and ``starts`` BFGS ascents
    from random starts (grad J_x = J_x (1 - J_x) gap_x, Suk & Duan eq. for the Gradient Gap)."""
    rng = np.random.default_rng(seed)
    shape = bandit.zeros().shape

    def neg(th):
        th = th.reshape(shape)
        J = expit(bandit.log_odds(th))
        grad = (J * (1 - J))[:, None] * bandit.gap(th)
        g = np.stack([grad[bandit.param_map == p].sum(0) for p in range(shape[0])]) / bandit.n_contexts
        return -float(np.mean(J)), -g.ravel()

    best = -neg(np.zeros(shape).ravel())[0]
    for _ in range(int(starts)):
        res = minimize(neg, rng.normal(size=int(np.prod(shape))) * 2, jac=True, method="BFGS")
        best = max(best, -float(res.fun))
    return best


def _convex_weights(points: np.ndarray, target: np.ndarray, cost: np.ndarray) -> np.ndarray | None:
    """lambda >= 0 with sum lambda = 1 and points^T lambda = target minimising cost . lambda (None if none)."""
    n = points.shape[0]
    A = np.vstack([points.T, np.ones((1, n))])
    res = linprog(cost, A_eq=A, b_eq=np.append(target, 1.0), bounds=(0, None), method="highs")
    return res.x if res.status == 0 else None


def reachable_upper(bandit: ContextualBandit) -> float:
    """An upper bound on J* = sup_theta mean_x J_x(theta) (derived; docs/bandits_contextual.md).

    If phi_a = sum_j lambda_j phi_j (lambda >= 0, sum lambda = 1), then theta . phi_a = sum_j lambda_j theta . phi_j,
    and convexity of exp gives pi(a) <= sum_j lambda_j pi(j) for every theta (the softmax normalisers cancel).
    Every policy of the class therefore lies in the polytope {p in simplex: p_a <= sum_j lambda_aj p_j}, and
    max r . p over it (a linear programme) bounds sup J. Contexts with identical features share one p (one
    theta gives them the same policy); other contexts are relaxed independently (the per-context bound,
    averaged), which is loose when distinct contexts compete for one theta. One representation per correct
    arm: the convex combination of the other arms with the least weight on correct arms.
    """
    C = bandit.n_contexts
    groups: dict[tuple, list[int]] = {}
    for x in range(C):
        key = (bandit.param_map[x], bandit.features[x].tobytes())
        groups.setdefault(key, []).append(x)
    total = 0.0
    for members in groups.values():
        phi = bandit.features[members[0]]
        rbar = bandit.rewards[members].mean(axis=0)
        K = phi.shape[0]
        rows = []
        for a in np.flatnonzero(rbar > 0):
            others = np.delete(np.arange(K), a)
            lam = _convex_weights(phi[others], phi[a], rbar[others])
            if lam is not None:
                row = np.zeros(K)
                row[a] = 1.0
                row[others] -= lam
                rows.append(row)
        res = linprog(-rbar, A_ub=np.array(rows) if rows else None, b_ub=np.zeros(len(rows)) if rows else None,
                      A_eq=np.ones((1, K)), b_eq=[1.0], bounds=(0, None), method="highs")
        if res.status != 0:
            raise RuntimeError(f"the J* relaxation failed: {res.message}")
        total += len(members) * min(1.0, -float(res.fun))
    return total / C


def reachable_upper_2d(bandit: ContextualBandit, *, h: float = 0.002) -> float:
    """A tighter upper bound on J* for one log-linear context in d = 2 (derived; docs/bandits_contextual.md).

    With delta = min_{|u|=1} (max_a u.phi_a - max_{correct c} u.phi_c) > 0 (no correct arm is ever an argmax),
    J(theta) <= sum_c exp(theta.phi_c - max_a theta.phi_a) <= n_c exp(-|theta| delta), so outside the radius
    R = log(n_c / J_ref) / delta (J_ref = J at theta = 0) J stays below J_ref <= J*. Inside the box [-R, R]^2,
    |grad J| = J (1 - J) ||gap|| <= L = D / 4 (D the feature diameter; the gap is a difference of two hull
    points), so a square cell of side s with centre value J_c holds no J above J_c + L s / sqrt 2. Branch and
    bound: cells are quartered while J_c + L s / sqrt 2 exceeds best + L h / sqrt 2 (best: the largest centre
    value seen), down to side h; the bound is best + L h / sqrt 2. delta is evaluated on 20000 directions and
    lowered by its Lipschitz slack. Returns 1 when delta <= 0 (a correct arm can become the argmax).
    """
    if bandit.n_contexts != 1 or bandit.dim != 2:
        raise ValueError("bandit must have one context and d = 2")
    phi, r = bandit.features[0], bandit.rewards[0].astype(bool)
    ang = np.linspace(0, 2 * np.pi, 20000, endpoint=False)
    proj = np.stack([np.cos(ang), np.sin(ang)], axis=1) @ phi.T
    radius = float(np.linalg.norm(phi, axis=1).max())
    delta = float((proj.max(1) - proj[:, r].max(1)).min()) - 2 * radius * (np.pi / ang.size)
    if delta <= 0:
        return 1.0
    J_ref = float(bandit.success_rate(bandit.zeros())[0])
    R = max(float(np.log(r.sum() / J_ref)) / delta, h)
    L = float(np.max(np.linalg.norm(phi[:, None] - phi[None], axis=-1))) / 4

    def J(th):
        z = th @ phi.T
        e = np.exp(z - z.max(1, keepdims=True))
        return e[:, r].sum(1) / e.sum(1)

    side = 2 * R / 64
    c = np.arange(-R + side / 2, R, side)
    cells = np.stack(np.meshgrid(c, c), axis=-1).reshape(-1, 2)
    best, final = J_ref, L * h / np.sqrt(2)
    while True:
        Jc = J(cells)
        best = max(best, float(Jc.max()))
        keep = cells[Jc + L * side / np.sqrt(2) > best + final]
        if side <= h or not len(keep):
            break
        side /= 2
        off = side / 2 * np.array([[-1, -1], [-1, 1], [1, -1], [1, 1]])
        cells = (keep[:, None, :] + off[None]).reshape(-1, 2)
    return min(1.0, best + final)


def _interior_bandit(instance: int, K: int = 100, n_correct: int = 10) -> ContextualBandit:
    """d = 2 Gaussian features, the ``n_correct`` innermost non-hull points correct: never an argmax."""
    rng = np.random.default_rng(10_000 + instance)
    phi = rng.normal(size=(K, 2))
    hull = set(ConvexHull(phi).vertices.tolist())
    inner = np.array([a for a in np.argsort(np.linalg.norm(phi, axis=1)) if a not in hull])
    rew = np.zeros(K)
    rew[inner[:n_correct]] = 1.0
    return ContextualBandit(phi[None], rew[None], seed=instance)


def _tabular_shared(instance: int, C: int, K: int = 100) -> ContextualBandit:
    """One tabular softmax for C contexts with disjoint correct arms: J* = max_a #{x: a correct} / C."""
    rng = np.random.default_rng(300 + instance)
    perm = rng.permutation(K)
    rew = np.zeros((C, K))
    for c in range(C):
        rew[c, perm[c * (K // C): c * (K // C) + K // (2 * C)]] = 1.0
    return ContextualBandit(np.broadcast_to(np.eye(K), (C, K, K)).copy(), rew, shared=True, kind="tabular",
                            seed=300 + instance)


def shared_bandit(setting: str, instance: int, n_contexts: int) -> ContextualBandit:
    """The bandit of one shared-parameter setting and instance."""
    if setting == "interference":
        return make_bandit(n_contexts=n_contexts, shared=True, seed=200 + instance)
    if setting == "tabular_shared":
        return _tabular_shared(instance, n_contexts)
    if setting == "unreachable":
        return _interior_bandit(instance)
    raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")


# ---- parts ---------------------------------------------------------------------------------------------


def _tail_fit(steps: np.ndarray, fail: np.ndarray) -> tuple[float, float]:
    """(b, a) of log(1 - J) = log a - b log k over the second half of the run."""
    sel = (steps >= steps[-1] / 2) & (steps >= 1) & (fail > 0)
    if sel.sum() < 3:
        return np.nan, np.nan
    slope, icpt = np.polyfit(np.log(steps[sel]), np.log(fail[sel]), 1)
    return float(-slope), float(np.exp(icpt))


def _single(instance, single_etas, single_steps, **_) -> list[dict]:
    b = make_bandit(n_contexts=1, seed=100 + instance)
    tr = simulate(b, Dynamics(method="reinforce", steps=single_steps, record_every=1),
                  eta=np.asarray(single_etas, float))
    rows = []
    half = np.searchsorted(tr.steps, single_steps // 2)
    for r, eta in enumerate(single_etas):
        fail = expit(-tr.Phi[r, :, 0])
        # exact REINFORCE: u = grad J, so ||grad J||^2 = wnorm^2; S_k = sum_{j<k} eta ||grad J_j||^2
        S = np.concatenate([[0.0], np.cumsum(eta * tr.wnorm[r, :, 0] ** 2)])
        M = np.append(tr.M[r, :, 0], tr.M_final[r, 0])
        fail_end = float(tr.failure_final[r, 0])
        b_exp, coef = _tail_fit(tr.steps, fail)
        rows.append({"setting": "single", "method": "reinforce", "eta": float(eta), "J_final": float(tr.J_final[r, 0]),
                     "fail_10pct": float(fail[single_steps // 10]), "fail_half": float(fail[half]),
                     "fail_final": fail_end, "exponent": b_exp, "coef": coef,
                     "fail_ratio": fail_end / float(fail[half]),
                     "gradsum_total": float(S[-1]), "gradsum_tail_share": float((S[-1] - S[half]) / S[-1]),
                     "M_half": float(M[half]), "M_final": float(M[-1]), "M_tail": float(M[-1] - M[half]),
                     "steps": single_steps})
    return rows


def _shared(instance, steps, etas, n_contexts, starts, **_) -> list[dict]:
    rows = []
    for setting in SETTINGS:
        b = shared_bandit(setting, instance, n_contexts)
        lo, hi = reachable_lower(b, starts=starts, seed=instance), reachable_upper(b)
        if b.n_contexts == 1 and b.dim == 2:
            hi = min(hi, reachable_upper_2d(b))
        tr = simulate(b, Dynamics(method="grpo", steps=steps, record_every=max(1, steps // 100)),
                      eta=np.asarray(etas, float))
        for r, eta in enumerate(etas):
            Jbar = tr.J[r].mean(axis=1)
            rows.append({"setting": setting, "method": "grpo", "eta": float(eta),
                         "J_final": float(tr.J_final[r].mean()), "J_half": float(Jbar[len(Jbar) // 2]),
                         "J_min_ctx_final": float(tr.J_final[r].min()),
                         "collapsed": bool(gapdyn.is_collapsed(tr.J_min[r]).any()),
                         "J_star_multistart": lo, "J_star_hi": hi, "steps": steps})
    return rows


def misaligned_run(bandit: ContextualBandit, angles, *, eta: float, steps: int, seed: int) -> dict[str, np.ndarray]:
    """Unit steps w = cos(a) g_hat + sin(a) xi_k on a one-context bandit, one run per angle a (radians).

    xi_k: a fixed N(0, I) direction (from ``seed``) minus its component along the Gap at theta_k, normalised;
    Delta mu_k = <w_k, gap_k> = cos(a) ||gap_k||, M_K = sum_k eta [Delta mu_k]_+ (gapdyn.cumulative_alignment).
    Returns Phi, J and M, each [A, steps + 1] (M_k before step k, as in bandits.engine).
    """
    if bandit.n_contexts != 1:
        raise ValueError("bandit must have one context")
    a = np.asarray(angles, float).reshape(-1)
    A = a.size
    rep = ContextualBandit(np.repeat(bandit.features, A, 0), np.repeat(bandit.rewards, A, 0))
    z = np.random.default_rng(seed).normal(size=bandit.dim)
    theta = np.zeros((A, bandit.dim))
    Phi = np.empty((A, steps + 1))
    dmu = np.empty((A, steps))
    for k in range(steps + 1):
        Phi[:, k] = rep.log_odds(theta)
        if k == steps:
            break
        gap = rep.gap(theta)
        gnorm = np.linalg.norm(gap, axis=1, keepdims=True)
        ghat = gap / np.where(gnorm > 0, gnorm, 1.0)
        xi = z[None] - (ghat @ z)[:, None] * ghat
        xi /= np.linalg.norm(xi, axis=1, keepdims=True)
        w = np.cos(a)[:, None] * ghat + np.sin(a)[:, None] * xi
        dmu[:, k] = gapdyn.gap_alignment(w, gap)
        theta = theta + eta * w
    M = np.concatenate([np.zeros((A, 1)), np.asarray(gapdyn.cumulative_alignment(np.full(steps, eta), dmu))], axis=1)
    return {"Phi": Phi, "J": expit(Phi), "M": M}


def _misalign(instance, angles_deg, misalign_eta, misalign_steps, **_) -> list[dict]:
    b = make_bandit(n_contexts=1, seed=100 + instance)
    out = misaligned_run(b, np.deg2rad(angles_deg), eta=misalign_eta, steps=misalign_steps, seed=instance)
    h = misalign_steps // 2
    return [{"setting": "misalign", "angle_deg": float(ang), "eta": misalign_eta, "J0": float(out["J"][i, 0]),
             "J_half": float(out["J"][i, h]), "J_final": float(out["J"][i, -1]),
             "dPhi": float(out["Phi"][i, -1] - out["Phi"][i, 0]), "M_half": float(out["M"][i, h]),
             "M_final": float(out["M"][i, -1]), "steps": misalign_steps} for i, ang in enumerate(angles_deg)]


def _controllers(instance, controller_etas, controller_steps, n_seeds, delta, **_) -> list[dict]:
    b = make_bandit(n_contexts=1, seed=1000 + instance)
    E, S = np.meshgrid(np.asarray(controller_etas, float), np.arange(n_seeds), indexing="ij")
    rows = []
    for name, sch in (("constant", Schedule("constant")), ("adaptive", Schedule("adaptive", delta=delta))):
        tr = simulate(b, Dynamics(method="grpo", mode="sampled", steps=controller_steps, schedule=sch),
                      eta=E.ravel(), seed=S.ravel())
        t9 = steps_to(tr.J[:, :, 0], tr.steps, 0.9)
        for r in range(tr.J.shape[0]):
            rows.append({"setting": "controllers", "mode": "sampled", "schedule": name, "eta": float(E.ravel()[r]),
                         "seed": int(S.ravel()[r]), "J_final": float(tr.J_final[r, 0]),
                         "collapsed": bool(gapdyn.is_collapsed(tr.J_min[r, 0])), "steps_to_09": float(t9[r])})
    return rows


def run_cell(*, part, instance, **settings) -> pd.DataFrame:
    """Rows of one (part, instance) cell."""
    fn = {"single": _single, "shared": _shared, "misalign": _misalign, "controllers": _controllers}.get(part)
    if fn is None:
        raise ValueError(f"part must be one of {PARTS}, got {part!r}")
    return pd.DataFrame(fn(instance, **settings))


def trajectories(config: Config, *, instance: int = 0, etas=None) -> pd.DataFrame:
    """J over steps of sampled GRPO on the controllers' instance at constant eta and under the adaptive
    controller (same eta0, seeds), for plotting. Columns: schedule, eta, seed, step, J, M."""
    etas = tuple(float(e) for e in (config.controller_etas if etas is None else etas))
    b = make_bandit(n_contexts=1, seed=1000 + instance)
    E, S = np.meshgrid(np.asarray(etas), np.arange(config.n_seeds), indexing="ij")
    frames = []
    for name, sch in (("constant", Schedule("constant")),
                      (f"adaptive (delta = {config.delta:g})", Schedule("adaptive", delta=config.delta))):
        tr = simulate(b, Dynamics(method="grpo", mode="sampled", steps=config.controller_steps, schedule=sch),
                      eta=E.ravel(), seed=S.ravel())
        R, n = tr.J.shape[:2]
        frames.append(pd.DataFrame({"schedule": name, "eta": np.repeat(E.ravel(), n), "seed": np.repeat(S.ravel(), n),
                                    "step": np.tile(tr.steps, R), "J": tr.J[:, :, 0].ravel(),
                                    "M": tr.M[:, :, 0].ravel()}))
    return pd.concat(frames, ignore_index=True)


# ---- analysis ------------------------------------------------------------------------------------------


def plateau_table(results: pd.DataFrame) -> pd.DataFrame:
    """The shared settings' runs with the J* bracket: J_star_lo = max(multi-start, best run of the instance),
    J_star_hi, and the plateau interval [plateau_lo, plateau_hi] = [J*_lo - J_final, J*_hi - J_final]."""
    d = results[results["part"] == "shared"].copy()
    best = d.groupby(["setting", "instance"])["J_final"].transform("max")
    d["J_star_lo"] = np.maximum(d["J_star_multistart"], best)
    d["plateau_lo"] = d["J_star_lo"] - d["J_final"]
    d["plateau_hi"] = d["J_star_hi"] - d["J_final"]
    return d.reset_index(drop=True)


def _mean(x) -> float:
    return float(np.mean(x))


def _bracket(lo_vals, hi_vals, rng, n_resamples) -> gapdyn.Estimate:
    """Mean of a bracketed quantity over instances: estimate mean(lo), interval from the bootstrap of
    mean(lo) (lower end) and of mean(hi) (upper end)."""
    a = gapdyn.cluster_bootstrap(_mean, np.asarray(lo_vals, float), rng=rng, n_resamples=n_resamples)
    b = gapdyn.cluster_bootstrap(_mean, np.asarray(hi_vals, float), rng=rng, n_resamples=n_resamples)
    return gapdyn.Estimate(a.estimate, min(a.lo, b.lo), max(a.hi, b.hi), a.n, a.confidence,
                           "cluster bootstrap of mean(lo) and mean(hi): bracket and sampling")


def _spearman(x, y) -> float:
    rx, ry = pd.Series(x).rank().to_numpy(), pd.Series(y).rank().to_numpy()
    if np.ptp(rx) == 0 or np.ptp(ry) == 0:
        return np.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def analyse(results: pd.DataFrame, config: Config, *, block: str = "discovery") -> list[gapdyn.Claim]:
    rng = np.random.default_rng(0)
    B = config.bootstrap
    claims: list[gapdyn.Claim] = []

    def add(cid, est, *, source, statement, setting, statistic, **kw):
        claims.append(gapdyn.Claim.from_estimate(est, id=cid, source=source, statement=statement, setting=setting,
                                                 statistic=statistic, criterion_text=CRITERION_TEXT[cid],
                                                 criterion=CRITERIA[cid], block=block, form=FORMS[cid], **kw))

    n_inst = int(results["instance"].nunique())
    single = results[results["part"] == "single"]
    if len(single):
        per = single.groupby("instance")[["exponent", "fail_ratio", "gradsum_tail_share", "M_tail"]].mean()
        where = (f"one context, 100-arm log-linear (d=16), exact REINFORCE, etas {list(config.single_etas)}, "
                 f"K = {config.single_steps}, {n_inst} instances ({block})")
        for cid, col, src, stmt, stat in (
            ("stagnation.single.tail_exponent", "exponent", _DERIVED, "a fixed eta does not plateau in one "
             "context: 1 - J decays as k^-1", "tail exponent b of 1 - J ~ k^-b over [K/2, K]"),
            ("stagnation.single.fail_halves", "fail_ratio", _DERIVED, "J still improves at the end of the run",
             "(1 - J_K) / (1 - J_{K/2})"),
            ("stagnation.single.gradsum_tail_share", "gradsum_tail_share", _THM1 + "; " + _DERIVED,
             "the sum of squared gradient norms converges while J still improves",
             "share of sum_k eta ||grad J_k||^2 added over [K/2, K]"),
            ("stagnation.single.M_tail_increment", "M_tail", _THM1 + "; " + _DERIVED,
             "convergence judged by M: M keeps growing while the gradient-norm sum has converged",
             "M_K - M_{K/2}"),
        ):
            v = per[col].to_numpy(float)
            v = v[np.isfinite(v)]
            if v.size >= 2:
                add(cid, gapdyn.cluster_bootstrap(_mean, v, rng=rng, n_resamples=B), source=src, statement=stmt,
                    setting=where, statistic=f"mean over instances (mean over etas) of {stat}")
    plat = plateau_table(results)
    for s in SETTINGS:
        d = plat[plat["setting"] == s]
        if d["instance"].nunique() < 2:
            continue
        where = (f"{s}: exact GRPO, etas {list(config.etas)}, {config.steps} steps, C = "
                 f"{config.n_contexts if s != 'unreachable' else 1}, {d['instance'].nunique()} instances ({block}); "
                 f"J*_lo = max(multi-start BFGS x {config.starts}, best run), J*_hi = LP relaxation")
        per = d.groupby("instance")[["plateau_lo", "plateau_hi", "J_star_lo", "J_star_hi"]].mean()
        add(f"stagnation.plateau.{s}", _bracket(per["plateau_lo"], per["plateau_hi"], rng, B), source=_THM3,
            statement=f"{s}: a fixed-eta plateau below 1 sits at the best reachable J*",
            setting=where, statistic="mean over instances of J* - J_final, J* bracketed by [J*_lo, J*_hi]")
        add(f"stagnation.optimum_below_one.{s}", _bracket(per["J_star_lo"], per["J_star_hi"], rng, B),
            source=_BEYOND, statement=f"{s}: J = 1 is not reachable by the policy class (J* < 1)",
            setting=where, statistic="mean over instances of J*, bracketed by [J*_lo, J*_hi]")
    if len(plat):
        lo_eta, hi_eta = min(config.etas), max(config.etas)
        piv = plat.pivot_table(index=["setting", "instance"], columns="eta", values="J_final")
        if lo_eta < hi_eta and len(piv) >= 2:
            diff = (piv[hi_eta] - piv[lo_eta]).to_numpy(float)
            clusters = np.array([f"{s}/{i}" for s, i in piv.index])
            add("stagnation.larger_eta_escapes",
                gapdyn.cluster_bootstrap(_mean, diff, clusters=clusters, rng=rng, n_resamples=B), source=_BEYOND,
                statement="a larger fixed eta ends closer to J* (stalls at a small eta are escaped by a larger one)",
                setting=f"shared settings {list(SETTINGS)}, exact GRPO, eta {lo_eta:g} vs {hi_eta:g}, "
                        f"{config.steps} steps ({block})",
                statistic="mean over (setting, instance) of J_final(largest eta) - J_final(smallest eta)")
    mis = results[results["part"] == "misalign"]
    if len(mis):
        where = (f"one context, 100-arm log-linear (d=16), unit steps w = cos(a) g_hat + sin(a) xi, eta "
                 f"{config.misalign_eta:g}, {config.misalign_steps} steps, angles {list(config.angles_deg)} deg, "
                 f"{mis['instance'].nunique()} instances ({block})")
        orth = mis[np.isclose(mis["angle_deg"], 90.0)]
        if orth["instance"].nunique() >= 2:
            add("stagnation.orthogonal_no_learning",
                gapdyn.cluster_bootstrap(_mean, (orth["J_final"] - orth["J0"]).to_numpy(float), rng=rng,
                                         n_resamples=B),
                source=_THM1, statement="updates orthogonal to the Gap (M = 0) do not learn: J plateaus at J0",
                setting=where, statistic="mean over instances of J_K - J_0 at a = 90 deg")
        rho = mis.groupby("instance").apply(
            lambda g: _spearman(g["M_final"], g["dPhi"]),
            include_groups=False).to_numpy(float)
        rho = rho[np.isfinite(rho)]
        if rho.size >= 2:
            add("stagnation.misaligned_follows_M", gapdyn.cluster_bootstrap(_mean, rho, rng=rng, n_resamples=B),
                source=_THM1, statement="misaligned updates learn in proportion to their cumulative alignment M",
                setting=where, statistic="mean over instances of the Spearman correlation (over angles) of "
                                         "logit J_K - logit J_0 with M_K")
    ct = results[results["part"] == "controllers"]
    if len(ct):
        piv = ct.pivot_table(index=["instance", "eta", "seed"], columns="schedule", values="collapsed",
                             aggfunc="first").astype(float)
        if {"constant", "adaptive"} <= set(piv.columns) and piv.index.get_level_values(0).nunique() >= 2:
            x, y = piv["constant"].to_numpy(), piv["adaptive"].to_numpy()
            test = gapdyn.mcnemar_exact(x, y)
            est = gapdyn.cluster_bootstrap(_mean, x - y, clusters=piv.index.get_level_values(0).to_numpy(), rng=rng,
                                           n_resamples=B)
            add("stagnation.adaptive_fewer_collapses", est, source=_BEYOND + " (theory-driven step controller)",
                statement="the adaptive step controller removes collapses of a constant step",
                setting=f"sampled GRPO (G=8), eta0 {list(config.controller_etas)}, {config.controller_steps} steps, "
                        f"{config.n_seeds} seeds, delta = {config.delta:g}, common random numbers ({block})",
                statistic="P(collapse | constant) - P(collapse | adaptive), paired runs", p_value=test.p_value,
                p_adjusted=test.p_value)
    return claims


def run(config: Config, *, store=None, backend="joblib", n_jobs=-1, progress=True):
    """ExperimentResult of both blocks (discovery, and confirmation in full mode)."""
    return run_experiment(sys.modules[__name__], config, store=store, backend=backend, n_jobs=n_jobs,
                          progress=progress)
