"""Experiment 4: stagnation at a fixed step size, judged against the best attainable J* and by M.

Suk & Duan (arXiv 2510.08539) discuss that a fixed eta stalls below J = 1 (Theorem 3 discussion: J_max ~
1 - c eta T; exact bound open) and that learning is driven by the cumulative alignment M = sum eta [Delta mu]_+
(Theorem 1), so that convergence must be judged by M rather than by gradient norms. Parts (one cell each per
instance):

- ``single``: one context (100-arm log-linear, d = 16), exact REINFORCE at fixed eta, every step recorded.
  Derived example (docs/theory.md §7, the same argument in this bandit): near J = 1,
  dPhi/dk ~ eta ||gap||^2 e^-Phi, so 1 - J ~ 1/(eta c k) (no plateau), M grows by log 2 per doubling of k,
  and S_k = sum eta ||grad J||^2 converges. Measured over the second half [K/2, K]: the tail exponent b of
  1 - J ~ k^-b, the share of S_K added there, M_K - M_{K/2} and (1 - J_K) / (1 - J_{K/2}).
- ``shared``: exact GRPO at fixed etas in :data:`STALL_SETTINGS`: ``interference`` (C log-linear contexts
  sharing theta), ``tabular_shared`` (one tabular softmax, disjoint correct arms, J* = 1/C), ``unreachable``
  (d = 2, correct arms strictly inside the feature hull, J* < 1) and ``realisable`` (one log-linear context,
  a correct arm on the hull, J* = 1). J* (:func:`best_attainable`) comes from BFGS on the exact J, never from
  the judged runs; :func:`reachable_upper` bounds it from above. Each run is labelled by :func:`stall_outcome`
  (a stall, J plateauing below J* with every context's J above 1e-3, apart from per-context collapse, a context
  at J -> 0) and each (setting, eta) is its own existence claim on the mean stall gap; etas are never averaged.
- ``misalign``: controlled misalignment on one context: unit steps w = cos(a) g_hat + sin(a) xi with xi a fixed
  random direction made orthogonal to the Gap at every step; M grows as eta cos(a) ||gap||. At a = pi/2
  (M = 0) learning stops by construction; across angles dPhi = M to first order (both derived).
- ``controllers``: sampled GRPO (G = 8) on fresh instances at large eta0: constant step vs the adaptive
  controller (``bandits.schedules``) on common random numbers (paired by instance, eta0 and seed).

Corrected here (earlier versions of this module):

- ``stagnation.plateau.<setting>`` took J*_lo = max(multi-start, best run of the instance), so the best eta's
  plateau was 0 by construction, averaged the plateau over etas, used the per-context LP bound (1 for
  interfering contexts, so the row could never hold) and counted runs whose contexts had collapsed to J = 0 as
  plateaus. Now: J* from the optimiser alone, one claim per (setting, eta), per-context collapse separated.
- ``stagnation.larger_eta_escapes``: the statistic was J_final(largest eta) - J_final(smallest eta) with the
  criterion "above 0" ("a larger eta escapes stalls"), the reverse of the paper's direction (J_max ~ 1 - c eta
  T falls as eta grows), so an estimate in the paper's direction (-0.025 [-0.044, -0.008]) read "does not
  hold". Now the statistic is J_final(smallest eta) - J_final(largest eta) and "above 0" is the paper's
  direction: the larger fixed eta ends lower.

Every claim is in :data:`STATEMENTS`, :data:`CRITERIA` and :data:`FORMS`, all fixed at import; intervals are
cluster bootstraps over instances unless stated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import linprog, minimize
from scipy.spatial import ConvexHull
from scipy.special import expit

import gapdyn
from gapdyn.evidence.claims import keyed_specs
from gapdyn.evidence.experiment import Experiment, claim_specs
from bandits.engine import Dynamics, simulate
from bandits.envs import ContextualBandit, make_bandit
from bandits.schedules import Schedule

from gapdyn.evidence.stats import NotMeasured

from ._common import mean_estimate, no_data, run_experiment, run_stats, steps_to

NAME = "stagnation"
PARTS = ("single", "shared", "misalign", "controllers")
SETTINGS = ("interference", "tabular_shared", "unreachable")
"""Settings of the optimum_below_one rows and of the eta comparison (J* < 1 possible)."""
STALL_SETTINGS = SETTINGS + ("realisable",)
"""Settings of the stall claims: the above and one log-linear context with J* = 1."""
STALL_ETAS = (0.3, 1.0, 10.0)
"""Fixed step sizes of the shared part; one stall claim per (setting, eta)."""
STALL_MARGIN = 1e-3
"""A gap J* - max J (last quarter) above this is a shortfall; the stall claims need their lower limit above it."""
STALL_PROGRESS = 0.1
"""A run stalls when its last quarter adds at most this share of the remaining gap: a gap shrinking as k^-b
gives (4/3)^b - 1, so b <= 0.33 counts as a stall (1 - J ~ 1/k gives 1/3: improving)."""
STALL_OUTCOMES = ("context_collapsed", "context_dipping", "at_optimum", "stalled", "improving")
"""Labels of :func:`stall_outcome`, in order of precedence."""

_THM3 = "Suk & Duan (arXiv 2510.08539), Thm 3 discussion (fixed eta stalls below J = 1; open)"
_THM1 = "Suk & Duan (arXiv 2510.08539), Thm 1 (learning driven by M; docs/theory.md §4-5)"
_DERIVED = "derived example (docs/theory.md §7): exact REINFORCE, 1 - J ~ 1/(eta c k)"
_BEYOND = "beyond the papers"
_J_STAR = {"interference": "J* from BFGS", "tabular_shared": "J* = 1/C", "unreachable": "J* < 1 (interior arms)",
           "realisable": "J* = 1 (a correct hull vertex)"}


def plateau_id(setting: str, eta: float) -> str:
    """Claim id of the stall claim of one (setting, eta)."""
    return f"stagnation.plateau.{setting}.eta={eta:g}"


_PLATEAU_IDS = {(s, e): plateau_id(s, e) for s in STALL_SETTINGS for e in STALL_ETAS}

STATEMENTS: dict[str, tuple[str, str]] = {
    "stagnation.single.tail_exponent": (_DERIVED, "a fixed eta does not plateau in one context: 1 - J decays as "
                                                  "k^-1"),
    "stagnation.single.fail_halves": (_DERIVED, "J still improves at the end of the run"),
    "stagnation.single.gradsum_tail_share": (_THM1 + "; " + _DERIVED, "the sum of squared gradient norms "
                                             "converges while J still improves"),
    "stagnation.single.M_tail_increment": (_THM1 + "; " + _DERIVED, "convergence judged by M: M keeps growing while "
                                           "the gradient-norm sum has converged"),
    **{cid: (_THM3, f"{s} ({_J_STAR[s]}), eta = {e:g}: a fixed eta stalls below the best attainable J* (J plateaus "
                    f"below J* with every context's J above 1e-3; per-context collapse is not a stall)")
       for (s, e), cid in _PLATEAU_IDS.items()},
    "stagnation.optimum_below_one.interference": (_BEYOND, "interference: J = 1 is not reachable by the policy class "
                                                           "(J* < 1)"),
    "stagnation.optimum_below_one.tabular_shared": (_BEYOND, "tabular_shared: J* = 1/C < 1 (closed form)"),
    "stagnation.optimum_below_one.unreachable": (_BEYOND, "unreachable: J* < 1 (correct arms never an argmax)"),
    "stagnation.larger_eta_escapes": (_THM3, "a larger fixed eta ends lower (J_max ~ 1 - c eta T falls with eta)"),
    "stagnation.orthogonal_no_learning": (_THM1, "updates orthogonal to the Gap (M = 0) do not learn: J plateaus at "
                                                 "J0"),
    "stagnation.misaligned_follows_M": (_THM1, "misaligned updates learn in proportion to their cumulative "
                                               "alignment M"),
    "stagnation.adaptive_fewer_collapses": (_BEYOND + " (theory-driven step controller)",
                                            "the adaptive step controller removes collapses of a constant step"),
}
"""(source, statement) of every claim."""
CRITERIA: dict[str, gapdyn.Criterion] = {
    "stagnation.single.tail_exponent": gapdyn.Criterion.inside(0.9, 1.1),
    "stagnation.single.fail_halves": gapdyn.Criterion.below(0.75),
    "stagnation.single.gradsum_tail_share": gapdyn.Criterion.below(0.05),
    "stagnation.single.M_tail_increment": gapdyn.Criterion.above(0.25),
    **{cid: gapdyn.Criterion.above(STALL_MARGIN) for cid in _PLATEAU_IDS.values()},
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
    **{cid: "existence" for cid in _PLATEAU_IDS.values()},
    "stagnation.optimum_below_one.interference": "existence",
    "stagnation.optimum_below_one.tabular_shared": "derived",  # J* = 1/C analytically
    "stagnation.optimum_below_one.unreachable": "derived",  # J* < 1 analytically (no correct arm is an argmax)
    "stagnation.larger_eta_escapes": "comparison",
    "stagnation.orthogonal_no_learning": "derived",  # dmu = 0 by construction
    "stagnation.misaligned_follows_M": "derived",  # dPhi = M to first order
    "stagnation.adaptive_fewer_collapses": "comparison",
}
"""The form of each claim's statement (gapdyn.FORMS)."""


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
    etas: tuple[float, ...] = STALL_ETAS
    """fixed step sizes of the shared settings (one stall claim each; smallest and largest enter the eta
    comparison); an eta of STALL_ETAS left out here leaves its claims unmeasured."""
    n_contexts: int = 4
    starts: int = 4
    """random starts of :func:`best_attainable` (besides theta = 0)."""
    angles_deg: tuple[float, ...] = (0.0, 45.0, 67.5, 90.0)
    misalign_eta: float = 0.5
    misalign_steps: int = 400
    controller_steps: int = 100
    controller_etas: tuple[float, ...] = (10.0, 1000.0)
    n_seeds: int = 4
    delta: float = gapdyn.SAFE_STEP_DELTA
    bootstrap: int = 2000

    @classmethod
    def test(cls) -> Config:
        return cls(mode="test", instances=(0, 1, 2), single_steps=300, steps=200, n_contexts=3, starts=0,
                   misalign_steps=60, controller_steps=30, n_seeds=2, bootstrap=200)

    @classmethod
    def quick(cls) -> Config:  # 8 instances, as the other quick experiments; J* by BFGS (most of a cell's time)
        return cls(mode="quick", instances=gapdyn.DISCOVERY_SEEDS[:8], starts=2)  # from 0 and 2 random starts

    @classmethod
    def full(cls) -> Config:
        return cls(mode="full", single_etas=(0.3, 1.0, 3.0), single_steps=20000, steps=20000,
                   n_contexts=8, starts=10, angles_deg=(0.0, 30.0, 60.0, 75.0, 85.0, 90.0), misalign_steps=5000,
                   controller_steps=400, controller_etas=(1.0, 10.0, 100.0, 1000.0, 10000.0), n_seeds=16,
                   confirmation=tuple(range(1000, 1040)))  # 40: the mean interval covers from n = 40



_OUTSIDE = ("stagnation.optimum_below_one.", "stagnation.adaptive_", "stagnation.plateau.",
            "stagnation.larger_eta_escapes")
KEYS = {cid: (None if cid.startswith(("stagnation.optimum_below_one.", "stagnation.adaptive_"))
                 else ("Suk & Duan", "stagnation"),
                 "exploratory" if cid.startswith(_OUTSIDE) else "test")
        for cid in STATEMENTS}
"""Claim id -> (statement key, role) (gapdyn.evidence.claims.STATEMENTS, ROLES): the interior optimum and the step
controller are beyond the papers. The stall rows and the eta comparison are exploratory: the stall of the
statement (J_max ~ 1 - c eta T) comes from noisy updates on responses of T > 1 tokens, and these settings run
exact GRPO with T = 1; interference's premise J* < 1 is not met (BFGS J* = 1 on every confirmation instance);
the comparison pools settings and runs with a collapsed context (docs/evidence.md section 10)."""
SPECS = keyed_specs(claim_specs(STATEMENTS, CRITERIA, FORMS, primary=()), KEYS)
"""Every claim's frozen gapdyn.ClaimSpec (the tables above, verbatim), by claim id."""

def cells(config: Config, instances=None) -> list[dict]:
    seeds = config.instances if instances is None else instances
    common = {k: (list(v) if isinstance(v, tuple) else v) for k, v in config.__dict__.items()
              if k not in ("mode", "instances", "confirmation", "bootstrap")}
    return [{"part": p, "instance": int(i), **common} for p in PARTS for i in seeds]


# ---- J* and its upper bound ----------------------------------------------------------------------------


def best_attainable(bandit: ContextualBandit, *, starts: int, seed: int = 0) -> float:
    """J* estimated from below: the largest mean_x J_x(theta) that BFGS finds, independent of any judged run.

    From theta = 0 and ``starts`` random starts (N(0, s^2 I), s cycling 0.1, 0.5, 1), two ascents each: on mean J
    (grad J_x = J_x (1 - J_x) gap_x) and on mean log J (grad log J_x = (1 - J_x) gap_x, which keeps a context
    from being given up at J_x -> 0), the latter polished on mean J. Gap: the Gradient Gap, the gradient of
    logit J (Suk & Duan, arXiv 2510.08539). Every candidate is a policy of the class, so the result is <= J*;
    sup J = 1 is approached to BFGS's tolerance (J* - result ~ 1e-6 or less).
    """
    if isinstance(starts, bool) or not isinstance(starts, (int, np.integer)) or starts < 0:
        raise ValueError(f"starts must be an integer >= 0, got {starts!r}")
    rng = np.random.default_rng(seed)
    shape = bandit.zeros().shape
    blocks = [bandit.param_map == p for p in range(shape[0])]

    def parts(x):
        th = x.reshape(shape)
        Phi = bandit.log_odds(th)
        return Phi, expit(Phi), bandit.gap(th)

    def fold(per_context):  # d(mean over contexts) / d theta, block by block
        return (np.stack([per_context[m].sum(0) for m in blocks]) / bandit.n_contexts).ravel()

    def neg_J(x):
        _, J, gap = parts(x)
        return -float(J.mean()), -fold((J * (1 - J))[:, None] * gap)

    def neg_log_J(x):
        Phi, J, gap = parts(x)
        return float(np.logaddexp(0.0, -Phi).mean()), -fold((1 - J)[:, None] * gap)

    opts = {"gtol": 1e-10, "maxiter": 300}
    n = int(np.prod(shape))
    x0s = [np.zeros(n)] + [rng.normal(size=n) * s for s in np.resize([0.1, 0.5, 1.0], int(starts))]
    best = -neg_J(x0s[0])[0]
    for x0 in x0s:
        direct = minimize(neg_J, x0, jac=True, method="BFGS", options=opts).x
        via_log = minimize(neg_log_J, x0, jac=True, method="BFGS", options=opts).x
        via_log = minimize(neg_J, via_log, jac=True, method="BFGS", options=opts).x
        best = max(best, -neg_J(direct)[0], -neg_J(via_log)[0])
    return float(best)


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
    if setting == "realisable":
        return make_bandit(n_contexts=1, seed=400 + instance)
    raise ValueError(f"setting must be one of {STALL_SETTINGS}, got {setting!r}")


def stall_outcome(J_star, J_pre_max, mean: gapdyn.RunStats,
                  contexts: Sequence[gapdyn.RunStats]) -> tuple[np.ndarray, np.ndarray]:
    """(outcome, gap) of each run against the best attainable J* (labels :data:`STALL_OUTCOMES`).

    J is the mean over contexts; gap = J* - max J over the last quarter (gapdyn.tail_start), progress = max J
    over the last quarter - ``J_pre_max`` (max J before it). In order of precedence:
    ``context_collapsed``: some context's gapdyn.bandit_outcome is collapsed (J < 1e-3 over the whole last quarter:
    per-context collapse, not stagnation); ``context_dipping``: some context's J < 1e-3 in the last quarter;
    ``at_optimum``: gap <= STALL_MARGIN; ``stalled``: progress <= STALL_PROGRESS x gap (J plateaus below J*);
    ``improving``: otherwise. ``mean`` and each of ``contexts`` are RunStats of the same runs.
    """
    if not isinstance(mean, gapdyn.RunStats):
        raise ValueError(f"mean must be a gapdyn.RunStats, got {type(mean).__name__}")
    if not contexts or not all(isinstance(c, gapdyn.RunStats) and c.shape == mean.shape for c in contexts):
        raise ValueError(f"contexts must be a non-empty sequence of gapdyn.RunStats of shape {mean.shape}")
    J_star = np.broadcast_to(np.asarray(J_star, float), mean.shape)
    pre = np.broadcast_to(np.asarray(J_pre_max, float), mean.shape)
    for name, v in (("J_star", J_star), ("J_pre_max", pre)):
        if not np.all((v >= 0) & (v <= 1)):
            raise ValueError(f"{name} must hold success rates in [0, 1]")
    gap = J_star - mean.J_tail_max
    progress = mean.J_tail_max - pre
    collapsed = np.any([gapdyn.bandit_outcome(c) == "collapsed" for c in contexts], axis=0)
    dipping = np.any([c.J_tail_min < gapdyn.COLLAPSE_J for c in contexts], axis=0)
    out = np.where(progress <= STALL_PROGRESS * gap, "stalled", "improving").astype(object)
    out[gap <= STALL_MARGIN] = "at_optimum"
    out[dipping] = "context_dipping"
    out[collapsed] = "context_collapsed"
    return out, gap


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
    for setting in STALL_SETTINGS:
        b = shared_bandit(setting, instance, n_contexts)
        J_star, hi = best_attainable(b, starts=starts, seed=instance), reachable_upper(b)
        if b.n_contexts == 1 and b.dim == 2:
            hi = min(hi, reachable_upper_2d(b))
        tr = simulate(b, Dynamics(method="grpo", steps=steps, record_every=max(1, steps // 100)),
                      eta=np.asarray(etas, float))
        Jbar = tr.J.mean(axis=2)
        pre_max = Jbar[:, tr.steps < gapdyn.tail_start(steps)].max(axis=1)
        mean = run_stats(tr)
        ctx = [run_stats(tr, context=c) for c in range(b.n_contexts)]
        outcome, gap = stall_outcome(min(J_star, 1.0), np.clip(pre_max, 0.0, 1.0), mean, ctx)
        for r, eta in enumerate(etas):
            rows.append({"setting": setting, "method": "grpo", "eta": float(eta),
                         "J_final": float(tr.J_final[r].mean()), "J_half": float(Jbar[r, Jbar.shape[1] // 2]),
                         "J_tail_max": float(mean.J_tail_max[r]), "J_pre_max": float(pre_max[r]),
                         "J_min_ctx_final": float(tr.J_final[r].min()),
                         "J_min_ctx_tail": float(min(c.J_tail_min[r] for c in ctx)),
                         "n_ctx_collapsed": int(sum(gapdyn.is_collapsed(c)[r] for c in ctx)),
                         "outcome": str(outcome[r]), "gap": float(gap[r]),
                         "stall_gap": float(gap[r]) if outcome[r] == "stalled" else 0.0,
                         "J_star": J_star, "J_star_hi": hi, "steps": steps})
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
        tr = simulate(b, Dynamics(method="grpo", gradient="sampled", steps=controller_steps, schedule=sch),
                      eta=E.ravel(), seed=S.ravel())
        t9 = steps_to(tr.J[:, :, 0], tr.steps, 0.9)
        collapsed = gapdyn.is_collapsed(run_stats(tr, context=0))  # terminal rule (docs/evidence.md §6)
        for r in range(tr.J.shape[0]):
            rows.append({"setting": "controllers", "mode": "sampled", "schedule": name, "eta": float(E.ravel()[r]),
                         "seed": int(S.ravel()[r]), "J_final": float(tr.J_final[r, 0]),
                         "collapsed": bool(collapsed[r]), "steps_to_09": float(t9[r])})
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
        tr = simulate(b, Dynamics(method="grpo", gradient="sampled", steps=config.controller_steps, schedule=sch),
                      eta=E.ravel(), seed=S.ravel())
        R, n = tr.J.shape[:2]
        frames.append(pd.DataFrame({"schedule": name, "eta": np.repeat(E.ravel(), n), "seed": np.repeat(S.ravel(), n),
                                    "step": np.tile(tr.steps, R), "J": tr.J[:, :, 0].ravel(),
                                    "M": tr.M[:, :, 0].ravel()}))
    return pd.concat(frames, ignore_index=True)


# ---- analysis ------------------------------------------------------------------------------------------


def plateau_table(results: pd.DataFrame) -> pd.DataFrame:
    """The shared part's runs with J_star_lo = J* (:func:`best_attainable`, never a judged run), J_star_hi
    (:func:`reachable_upper`) and [plateau_lo, plateau_hi] = [J*_lo - J_final, J*_hi - J_final]; each run's
    ``outcome``, ``gap`` and ``stall_gap`` (:func:`stall_outcome`) as run."""
    d = results[results["part"] == "shared"].copy()
    d["J_star_lo"] = d["J_star"]
    d["plateau_lo"] = d["J_star_lo"] - d["J_final"]
    d["plateau_hi"] = d["J_star_hi"] - d["J_final"]
    return d.reset_index(drop=True)


def _mean(x) -> float:
    return float(np.mean(x))


def _bracket(lo_vals, hi_vals, rng, n_resamples) -> gapdyn.Estimate:
    """Mean of a bracketed quantity over instances: estimate mean(lo), interval from the bootstrap of
    mean(lo) (lower end) and of mean(hi) (upper end)."""
    seed = int(rng.integers(2**31))
    a = mean_estimate(np.asarray(lo_vals, float), seed=seed, natural=(0.0, 1.0))
    b = mean_estimate(np.asarray(hi_vals, float), seed=seed, natural=(0.0, 1.0))
    if isinstance(a, NotMeasured) or isinstance(b, NotMeasured):
        return a if isinstance(a, NotMeasured) else b
    return gapdyn.Estimate(a.estimate, min(a.lo, b.lo), max(a.hi, b.hi), a.n, a.confidence,
                           "studentized cluster bootstrap of mean(lo) and mean(hi): bracket and sampling")


def _spearman(x, y) -> float:
    rx, ry = pd.Series(x).rank().to_numpy(), pd.Series(y).rank().to_numpy()
    if np.ptp(rx) == 0 or np.ptp(ry) == 0:
        return np.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def _outcome_counts(outcomes: pd.Series) -> str:
    counts = outcomes.value_counts()
    return ", ".join(f"{k} {int(counts[k])}" for k in STALL_OUTCOMES if k in counts)


def analyse(results: pd.DataFrame, config: Config, *, block: str = "discovery") -> list[gapdyn.Claim]:
    """Every claim of :data:`CRITERIA` for one block; a claim without the data to measure it is not measured
    (and says why)."""
    rng = np.random.default_rng(0)
    B = config.bootstrap
    claims: list[gapdyn.Claim] = []

    def add(cid, est, *, setting, statistic, reason="", **kw):
        spec = SPECS[cid]
        if isinstance(est, NotMeasured):
            kw["reason"] = reason or est.reason or "fewer than 2 instances in this block"
        elif reason:
            kw["reason"] = reason
        claims.append(gapdyn.Claim.from_estimate(est, id=cid, source=spec.source, statement=spec.statement,
                                                 setting=setting, statistic=statistic,
                                                 criterion_text=spec.criterion_text, criterion=spec.criterion,
                                                 block=block, form=spec.form, key=spec.key, role=spec.role,
                                                 **kw))

    def boot(values, natural, clusters=None) -> gapdyn.Estimate:
        v = np.asarray(values, float)
        keep = np.isfinite(v)
        labels = np.arange(v.size) if clusters is None else np.asarray(clusters)
        if keep.sum() < 2 or np.unique(labels[keep]).size < 2:
            return no_data(*natural)
        return mean_estimate(v[keep], labels[keep], seed=int(rng.integers(2**31)), natural=natural)

    single = results[results["part"] == "single"] if "part" in results else results.iloc[:0]
    where = (f"one context, 100-arm log-linear (d=16), exact REINFORCE, etas {list(config.single_etas)}, "
             f"K = {config.single_steps}, {single['instance'].nunique() if len(single) else 0} instances ({block})")
    for cid, col, stat in (
        ("stagnation.single.tail_exponent", "exponent", "tail exponent b of 1 - J ~ k^-b over [K/2, K]"),
        ("stagnation.single.fail_halves", "fail_ratio", "(1 - J_K) / (1 - J_{K/2})"),
        ("stagnation.single.gradsum_tail_share", "gradsum_tail_share",
         "share of sum_k eta ||grad J_k||^2 added over [K/2, K]"),
        ("stagnation.single.M_tail_increment", "M_tail", "M_K - M_{K/2}"),
    ):
        per = single.groupby("instance")[col].mean() if len(single) else pd.Series(dtype=float)
        add(cid, boot(per.to_numpy(float), (0.0, 2.0)), setting=where,
            statistic=f"mean over instances (mean over etas) of {stat}")

    plat = plateau_table(results) if "part" in results else pd.DataFrame(columns=["setting", "eta", "instance"])
    for (s, e), cid in _PLATEAU_IDS.items():
        d = plat[(plat["setting"] == s) & np.isclose(plat["eta"].astype(float), e)]
        C = config.n_contexts if s in ("interference", "tabular_shared") else 1
        n = d["instance"].nunique()
        where = (f"{s} ({_J_STAR[s]}), exact GRPO, eta = {e:g}, {config.steps} steps, C = {C}, {n} instances "
                 f"({block}); J* from BFGS on the exact J (theta = 0 and {config.starts} random starts)")
        if n:
            where += (f", mean J* {d['J_star'].mean():.4g}, mean J*_hi {d['J_star_hi'].mean():.4g}; outcomes: "
                      f"{_outcome_counts(d['outcome'])}")
        per = d.groupby("instance")["stall_gap"].mean()  # one run per (instance, eta)
        add(cid, boot(per.to_numpy(float), (0.0, 1.0)), setting=where,
            reason="" if n else f"eta = {e:g} is not in this run's grid {list(config.etas)}",
            statistic="mean over instances of the stall gap: J* - max J over the last quarter for a stalled run "
                      "(plateau below J*, every context's J above 1e-3), 0 for any other outcome")

    for s in SETTINGS:
        d = plat[plat["setting"] == s]
        per = d.groupby("instance")[["J_star_lo", "J_star_hi"]].first()
        where = (f"{s}: {per.shape[0]} instances ({block}); J*_lo = BFGS on the exact J (theta = 0 and "
                 f"{config.starts} random starts), J*_hi = LP relaxation" + (" and 2-d branch and bound"
                                                                          if s == "unreachable" else ""))
        est = _bracket(per["J_star_lo"], per["J_star_hi"], rng, B) if per.shape[0] >= 2 else no_data(0.0, 1.0)
        add(f"stagnation.optimum_below_one.{s}", est, setting=where,
            statistic="mean over instances of J*, bracketed by [J*_lo, J*_hi]")

    lo_eta, hi_eta = min(config.etas), max(config.etas)
    d = plat[plat["setting"].isin(SETTINGS)]
    diff, clusters, where = np.array([]), np.array([]), f"no shared runs ({block})"
    if len(d) and lo_eta < hi_eta:
        piv = d.pivot_table(index=["setting", "instance"], columns="eta", values="J_final")
        diff = (piv[lo_eta] - piv[hi_eta]).to_numpy(float)
        clusters = np.array([f"{s}/{i}" for s, i in piv.index])
        big = d[np.isclose(d["eta"], hi_eta)]
        where = (f"shared settings {list(SETTINGS)}, exact GRPO, eta {lo_eta:g} vs {hi_eta:g}, {config.steps} steps "
                 f"({block}); runs with a collapsed context: {int((big['n_ctx_collapsed'] > 0).sum())} of {len(big)} "
                 f"at eta {hi_eta:g}, {int((d[np.isclose(d['eta'], lo_eta)]['n_ctx_collapsed'] > 0).sum())} at "
                 f"eta {lo_eta:g}")
    add("stagnation.larger_eta_escapes", boot(diff, (-1.0, 1.0), clusters), setting=where,
        reason="" if lo_eta < hi_eta else "one eta only: nothing to compare",
        statistic="mean over (setting, instance) of J_final(smallest eta) - J_final(largest eta)")

    mis = results[results["part"] == "misalign"] if "part" in results else results.iloc[:0]
    where = (f"one context, 100-arm log-linear (d=16), unit steps w = cos(a) g_hat + sin(a) xi, eta "
             f"{config.misalign_eta:g}, {config.misalign_steps} steps, angles {list(config.angles_deg)} deg, "
             f"{mis['instance'].nunique() if len(mis) else 0} instances ({block})")
    orth = mis[np.isclose(mis["angle_deg"], 90.0)] if len(mis) else mis
    add("stagnation.orthogonal_no_learning", boot((orth["J_final"] - orth["J0"]).to_numpy(float), (-1.0, 1.0)),
        setting=where, statistic="mean over instances of J_K - J_0 at a = 90 deg")
    rho = (mis.groupby("instance").apply(lambda g: _spearman(g["M_final"], g["dPhi"]), include_groups=False)
           .to_numpy(float) if len(mis) else np.array([]))
    add("stagnation.misaligned_follows_M", boot(rho, (-1.0, 1.0)), setting=where,
        statistic="mean over instances of the Spearman correlation (over angles) of logit J_K - logit J_0 with M_K")

    ct = results[results["part"] == "controllers"] if "part" in results else results.iloc[:0]
    where = (f"sampled GRPO (G=8), eta0 {list(config.controller_etas)}, {config.controller_steps} steps, "
             f"{config.n_seeds} seeds, delta = {config.delta:g}, common random numbers ({block}); collapse: J < 1e-3 "
             f"over the last quarter (gapdyn.bandit_outcome)")
    est, p = no_data(-1.0, 1.0), None
    if len(ct):
        piv = ct.pivot_table(index=["instance", "eta", "seed"], columns="schedule", values="collapsed",
                             aggfunc="first").astype(float)
        if {"constant", "adaptive"} <= set(piv.columns) and piv.index.get_level_values(0).nunique() >= 2:
            x, y = piv["constant"].to_numpy(), piv["adaptive"].to_numpy()
            inst = piv.index.get_level_values(0).to_numpy()
            # runs are nested in instances: the test's units are instances (exact sign test on the sign of each
            # instance's mean paired difference, two-sided), not the pooled runs
            dm = pd.Series(x - y).groupby(inst).mean().to_numpy()
            p = gapdyn.mcnemar_exact((dm > 0).astype(float), (dm < 0).astype(float)).p_value
            est = mean_estimate(x - y, inst, seed=int(rng.integers(2**31)), natural=(-1.0, 1.0))
    add("stagnation.adaptive_fewer_collapses", est, setting=where, p_value=p, p_adjusted=p,
        statistic="P(collapse | constant) - P(collapse | adaptive), paired runs, mean over instances "
                  "(studentized cluster bootstrap); p: exact two-sided sign test over instances")
    return claims


def run(config: Config, *, store=None, backend="joblib", n_jobs=-1, progress=True):
    """ExperimentResult of both blocks (discovery, and confirmation in full mode)."""
    return run_experiment(EXPERIMENT, config, store=store, backend=backend, n_jobs=n_jobs,
                          progress=progress)


EXPERIMENT = Experiment(name=NAME, claims=SPECS, config=Config, cells=cells, run_cell=run_cell, analyse=analyse)
"""This experiment in the one protocol (gapdyn.evidence.experiment.Experiment)."""
