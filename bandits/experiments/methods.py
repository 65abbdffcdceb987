"""Experiment 6: gapdyn's methods at equal step size, and WAPO against others at a matched expected step.

GRPO vs Dr. GRPO vs WAPO vs REINFORCE vs RLOO vs NSR vs W-REINFORCE on single-context log-linear bandits
(K = 100, d = 16, 10 correct, theta0 = 0, G = 8). Every method's expected direction is scalar_m(J, G) x Gap
(gapdyn.expected_scalar), so the exact dynamics of two methods whose scalars are proportional are one map at
rescaled step sizes: exact RLOO, PSR, NSR = REINFORCE; exact Dr. GRPO at eta = REINFORCE at (1 - 1/G) eta;
exact W-REINFORCE at eta = REINFORCE at (1 + lam) eta. PSR's advantage is r_i, REINFORCE's (no baseline), so
for binary rewards PSR *is* REINFORCE, sampled runs included: it is run only for the identity row and left out
of every ranking and comparison but one (``matched_wapo_vs_psr``, whose id is kept; the runs are REINFORCE's).
These are identity rows (machinery). A run's outcome is gapdyn.bandit_outcome via
bandits.experiments._common.run_stats (collapsed: J < 1e-3 at every state of the last quarter).

Design.

- exact / sampled cells (method, instance): runs on the eta grid (sampled: n_seeds common seeds per eta):
  collapse, steps to J >= 0.9, entropy at steps 0, 10, 50 and the end.
- Rankings are inferences over methods (the unit is the method, not the instance): Spearman rho between the
  expected scalar at J0 and the method's outcome, one-sided exact permutation p over every assignment of the
  outcomes to the distinct methods (:func:`rank_permutation_test`), with its smallest attainable value. Exact
  dynamics have 5 distinct directions (reinforce, dr_grpo, w_reinforce, wapo, grpo: RLOO / NSR / PSR are
  REINFORCE's map), sampled ones 7 distinct estimators (PSR dropped). Interval: rho minus the 95 % and 5 %
  quantiles of its permutation distribution (clipped to [-1, 1]; its lower end is above 0 about when the
  one-sided p is below 0.05); a row whose smallest attainable p (ties in the outcome included) is not below
  0.05 is not measured ("too few methods to decide").
- matched cells (instance): WAPO at constant eta and each comparison method m at the per-step
  eta_m(k) = eta scalar_wapo(J_k, G) / scalar_m(J_k, G), so that eta_m(k) E[w_m](theta_k) = eta E[w_wapo](theta_k)
  at every state theta_k along the run (:func:`matched_runs`, the engine one step at a time; Dr. GRPO runs at
  eta (1 - J_k)). The expected update field is then WAPO's for every method; what differs is the noise (WAPO
  drops the negative samples), which separates "drops negatives" from "smaller step".
- Comparisons cluster by instance: d_i = P(collapse | WAPO) - P(collapse | other) per instance (mean over etas
  and seeds), a t interval over instances and a one-sided exact sign-flip permutation test of mean(d) < 0
  (:func:`sign_flip_p`); primaries (Holm over these only): ``wapo_vs_grpo`` (WAPO's claim at equal eta) and
  ``matched_wapo_vs_dr_grpo`` (dropping negatives at an equal expected step); every other test is exploratory.

Removed rows: none; every id is kept, with its statement where it survives. ``*_rank_*`` now test over
methods by exact permutation (were: cluster bootstrap over instances of a Spearman whose scalars are fixed
per method: zero-width intervals; PSR counted as a method beside REINFORCE). ``matched_*`` now match the
expected step at every state (were: at theta0 only, where WAPO's scalar later shrinks by (1 - J));
``wapo_vs_*`` and ``matched_*`` test per-instance differences (were: McNemar over (instance, eta, seed) rows
treated as independent). New identity rows: ``identity_psr_reinforce`` (sampled PSR = REINFORCE) and
``identity_matched_exact`` (exact Dr. GRPO at eta (1 - J_k) = exact WAPO at eta).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, replace

import numpy as np
import pandas as pd
from scipy.special import log_softmax
from scipy.stats import rankdata

import gapdyn
from gapdyn.evidence.claims import keyed_specs
from gapdyn.evidence.experiment import Experiment, claim_specs
from gapdyn.cmdline import MODES
from gapdyn import Criterion
from gapdyn.evidence.planner import plan_n, power_mean
from bandits.engine import Dynamics, simulate

from . import mechanisms as mech
from ._common import MEAN_INTERVAL, make_claim, mean_estimate, no_data, run_stats, steps_to

NAME = "methods"
EXACT_DISTINCT = ("reinforce", "dr_grpo", "w_reinforce", "wapo", "grpo")
"""Distinct exact directions (RLOO, PSR, NSR follow REINFORCE's map exactly)."""
SAMPLED_DISTINCT = ("reinforce", "rloo", "nsr", "dr_grpo", "w_reinforce", "wapo", "grpo")
"""Distinct sampled estimators (PSR is REINFORCE for binary rewards)."""
MATCHED = ("wapo", "dr_grpo", "psr", "grpo")
"""Methods run at WAPO's expected step along the trajectory (WAPO first)."""
PRIMARY = frozenset({"wapo_vs_grpo", "matched_wapo_vs_dr_grpo"})
"""The pre-declared primary comparisons (Holm over these only; docs/evidence.md §5)."""
ALPHA = 0.05
_J_CLIP = 1e-12  # J_k is clipped to [1e-12, 1 - 1e-12] where the scalars are evaluated (both vanish beyond)


@dataclass(frozen=True)
class Config:
    """Experiment 6 settings."""

    mode: str = "full"
    instances: tuple[int, ...] = gapdyn.DISCOVERY_SEEDS
    confirmation: tuple[int, ...] = ()
    methods: tuple[str, ...] = tuple(gapdyn.METHOD_NAMES)
    etas: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)
    steps: int = 500
    n_seeds: int = 16
    group_size: int = 8
    lam: float = 0.1
    matched_etas: tuple[float, ...] = (10.0, 30.0, 100.0, 300.0, 1000.0)
    """WAPO's constant eta in the matched cells (each other method runs at WAPO's expected step)."""
    matched_seeds: int = 32

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if not self.instances or set(self.instances) & set(self.confirmation):
            raise ValueError("instances must be non-empty and disjoint from confirmation")
        missing = {"reinforce", "rloo", "psr", "nsr", "dr_grpo", "w_reinforce", "wapo", "grpo"} - set(self.methods)
        if missing:
            raise ValueError(f"methods must include every method of the identities and comparisons, missing {missing}")
        if not self.matched_etas or any(not (math.isfinite(e) and e > 0) for e in self.matched_etas):
            raise ValueError(f"matched_etas must be non-empty and positive, got {self.matched_etas!r}")

    @classmethod
    def test(cls) -> Config:
        return cls(mode="test", instances=(0, 1, 2), etas=(1.0, 30.0, 1000.0), steps=40, n_seeds=3,
                   matched_etas=(30.0, 1000.0), matched_seeds=4)

    @classmethod
    def quick(cls) -> Config:
        return cls(mode="quick", instances=gapdyn.DISCOVERY_SEEDS[:8], etas=(0.3, 3.0, 30.0, 300.0), steps=150,
                   n_seeds=6, matched_etas=(30.0, 300.0, 1000.0), matched_seeds=12)

    @classmethod
    def full(cls) -> Config:
        return cls(mode="full", confirmation=tuple(range(1000, 1040)))  # 40: the mean interval covers from n = 40


_WAPO = "WAPO (arXiv 2606.16154)"
_SD = "Suk & Duan (arXiv 2510.08539)"
_MATCH = "at WAPO's expected step at every state (eta_m(k) = eta scalar_wapo(J_k) / scalar_m(J_k))"
STATEMENTS: dict[str, tuple[str, str]] = {
    "identity_baselines": ("derived: RLOO, PSR, NSR and REINFORCE share E[w] = J (1-J) Gap",
                           "exact RLOO, PSR and NSR runs equal exact REINFORCE runs (max |J_final difference|)"),
    "identity_dr_rescaled": ("derived (docs/equations.md): exact Dr. GRPO at eta = REINFORCE at (1-1/G) eta",
                             "exact Dr. GRPO at eta equals exact REINFORCE at (1 - 1/G) eta (max |J_final difference|)"),
    "identity_wr_rescaled": ("derived: exact W-REINFORCE at eta = REINFORCE at (1+lam) eta",
                             "exact W-REINFORCE at eta equals exact REINFORCE at (1 + lam) eta (max |J_final difference|)"),
    "identity_psr_reinforce": ("derived: PSR's advantage r_i is REINFORCE's for binary rewards",
                               "sampled PSR runs equal sampled REINFORCE runs on the same seeds (max |J_final "
                               "difference|)"),
    "identity_matched_exact": ("derived: E[w_wapo] = (1 - J) E[w_dr_grpo] (docs/equations.md §4)",
                               "exact Dr. GRPO at eta (1 - J_k) per step equals exact WAPO at eta (max |J_final "
                               "difference|): the matched design gives one expected update field"),
    "exact_rank_collapse": (f"{_SD}, Thm 2 with E[w] = scalar x Gap", "exact dynamics at equal eta: methods with a "
                            "larger expected scalar at J0 collapse more (Spearman over methods > 0)"),
    "sampled_rank_collapse": (f"{_SD}, Thm 2 with E[w] = scalar x Gap", "sampled dynamics at equal eta: methods "
                              "with a larger expected scalar at J0 collapse more (Spearman over methods > 0)"),
    "sampled_rank_speed": (f"{_SD}, Thm 1 (J grows with M = sum eta dmu)", "sampled, smallest eta: methods with a "
                           "larger scalar reach J >= 0.9 sooner (Spearman(scalar, mean steps) < 0)"),
    "sampled_rank_entropy": (_SD + ", Thm 1 with E[w] = scalar x Gap", "sampled: entropy at step 50 falls most for "
                             "the largest scalar (Spearman(scalar, H50) < 0)"),
    "wapo_vs_grpo": (_WAPO, "at equal eta, sampled WAPO collapses less than GRPO"),
    "wapo_vs_dr_grpo": (_WAPO, "at equal eta, sampled WAPO collapses less than Dr. GRPO"),
    "matched_wapo_vs_dr_grpo": (_WAPO + "; beyond the papers", f"{_MATCH}, sampled WAPO collapses less than Dr. "
                                "GRPO: dropping negative samples, not the smaller step"),
    "matched_wapo_vs_psr": (_WAPO + "; beyond the papers", f"{_MATCH}, sampled WAPO collapses less than PSR "
                            "(= REINFORCE for binary rewards; both use positive samples only, WAPO centres on p_hat)"),
    "matched_wapo_vs_grpo": (_WAPO + "; beyond the papers", f"{_MATCH}, sampled WAPO collapses less than GRPO"),
}
CRITERIA: dict[str, Criterion] = {
    "identity_baselines": Criterion.identity(0.0, tol=1e-9),
    "identity_dr_rescaled": Criterion.identity(0.0, tol=1e-9),
    "identity_wr_rescaled": Criterion.identity(0.0, tol=1e-9),
    "identity_psr_reinforce": Criterion.identity(0.0, tol=1e-9),
    "identity_matched_exact": Criterion.identity(0.0, tol=1e-6),
    "exact_rank_collapse": Criterion.above(0.0, alpha=ALPHA),
    "sampled_rank_collapse": Criterion.above(0.0, alpha=ALPHA),
    "sampled_rank_speed": Criterion.below(0.0, alpha=ALPHA),
    "sampled_rank_entropy": Criterion.below(0.0, alpha=ALPHA),
    "wapo_vs_grpo": Criterion.below(0.0, alpha=ALPHA),
    "wapo_vs_dr_grpo": Criterion.below(0.0, alpha=ALPHA),
    "matched_wapo_vs_dr_grpo": Criterion.below(0.0, alpha=ALPHA),
    "matched_wapo_vs_psr": Criterion.below(0.0, alpha=ALPHA),
    "matched_wapo_vs_grpo": Criterion.below(0.0, alpha=ALPHA),
}
"""Identity tolerance 1e-9 on J_final: the runs are the same map; a rescaled eta only changes the rounding of
eta x scalar (measured deviations are ~1e-20). The matched identity multiplies (1 - J_k) into eta instead of
into the scalar, one rounding per step: 1e-6."""
FORMS: dict[str, str] = {
    **{k: "identity" for k in CRITERIA if k.startswith("identity_")},
    **{k: "comparison" for k in CRITERIA if not k.startswith("identity_")},
}
"""The form of each claim's statement (gapdyn.FORMS)."""



_WAPO_STABLE = ("WAPO", "stability")
KEYS = {
    **{k: (("Suk & Duan", "Gap direction"), "test") for k in STATEMENTS if k.startswith("identity_")},
    **{k: (("Suk & Duan", "Theorem 2"), "exploratory") for k in ("exact_rank_collapse", "sampled_rank_collapse")},
    **{k: (("Suk & Duan", "Theorem 1"), "exploratory") for k in ("sampled_rank_speed", "sampled_rank_entropy")},
    "wapo_vs_grpo": (_WAPO_STABLE, "test"), "wapo_vs_dr_grpo": (_WAPO_STABLE, "exploratory"),
    **{k: (_WAPO_STABLE, "exploratory") for k in ("matched_wapo_vs_dr_grpo", "matched_wapo_vs_psr",
                                                  "matched_wapo_vs_grpo")},
}
"""Claim id -> (statement key, role) (gapdyn.evidence.claims.STATEMENTS, ROLES): the tests that are not primary (unadjusted,
docs/evidence.md section 5) are exploratory: the rank rows (Suk & Duan's theorems through E[w] = scalar x Gap) and
wapo_vs_dr_grpo; the matched rows also go beyond WAPO (a matched step)."""
SPECS = keyed_specs(claim_specs(STATEMENTS, CRITERIA, FORMS, primary=PRIMARY), KEYS)
"""Every claim's frozen gapdyn.ClaimSpec (the tables above, verbatim), by claim id."""

def cells(config: Config, instances=None) -> list[dict]:
    instances = config.instances if instances is None else instances
    d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()}
    common = {k: d[k] for k in ("etas", "steps", "n_seeds", "group_size", "lam")}
    out = [{"kind": s, "method": m, "instance": int(i), **common}
           for m in config.methods for s in ("exact", "sampled") for i in instances]
    out += [{"kind": "matched", "instance": int(i), "etas": d["matched_etas"], "steps": config.steps,
             "n_seeds": config.matched_seeds, "group_size": config.group_size} for i in instances]
    return out


# ------------------------------------------------------------------------------------------------
# the matched-step runs
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MatchedTrajectory:
    """R runs of one method at WAPO's expected step, one engine step at a time (states k = 0..T).

    J: [R, T+1] success rate at theta_k; eta: [R, T] the step size used at step k; wnorm: [R, T] ||u_k||;
    entropy: [R, T+1]; theta: [R, T+1, d] (only with keep_theta); J_final: [R, 1]; J_min, J_tail_min,
    J_tail_max: [R, 1] what decides the outcome (read by bandits.experiments._common.run_stats, context 0).
    """

    J: np.ndarray
    eta: np.ndarray
    wnorm: np.ndarray
    entropy: np.ndarray
    theta: np.ndarray | None
    J_final: np.ndarray
    J_min: np.ndarray
    J_tail_min: np.ndarray
    J_tail_max: np.ndarray


def matched_ratio(method: str, J, G: int) -> np.ndarray:
    """scalar_wapo(J, G) / scalar_m(J, G) (gapdyn.expected_scalar), J clipped to [1e-12, 1 - 1e-12].

    Dr. GRPO: 1 - J; REINFORCE / PSR: (1 - 1/G)(1 - J); GRPO: (1 - 1/G) J (1 - J)^2 / c_G(J); WAPO: 1.
    """
    Jc = np.clip(np.asarray(J, dtype=float), _J_CLIP, 1 - _J_CLIP)
    return gapdyn.expected_scalar("wapo", Jc, G) / gapdyn.expected_scalar(method, Jc, G)


def matched_runs(bandit, method: str, *, eta, seeds, steps: int, group_size: int, gradient: str = "sampled",
                 keep_theta: bool = False) -> MatchedTrajectory:
    """Runs of ``method`` at eta_m(k) = eta scalar_wapo(J_k) / scalar_m(J_k) (:func:`matched_ratio`).

    Then eta_m(k) E[w_m](theta_k) = eta E[w_wapo](theta_k) at every state the run visits (derived:
    E[w_m] = scalar_m(J) Gap, gapdyn.expected_scalar). The engine (bandits.engine.simulate) runs one step
    per call from theta_k; sampled step k of seed s draws its group from default_rng(s * 10**6 + k), so runs
    of different methods on one seed share their uniforms step by step (common random numbers).
    """
    if gradient not in ("exact", "sampled"):
        raise ValueError(f"gradient must be 'exact' or 'sampled', got {gradient!r}")
    if isinstance(steps, bool) or int(steps) != steps or not 1 <= steps < 10**6:
        raise ValueError(f"steps must be an integer in [1, 10**6), got {steps!r}")
    eta = np.asarray(eta, dtype=float)
    seeds = np.asarray(seeds, dtype=np.int64)
    if eta.ndim != 1 or eta.shape != seeds.shape or np.any(~np.isfinite(eta)) or np.any(eta <= 0):
        raise ValueError(f"eta must be positive and of the shape of seeds [R], got {eta.shape} and {seeds.shape}")
    dyn = Dynamics(method=method, gradient=gradient, steps=1, group_size=group_size)
    R, T = eta.size, int(steps)
    th = np.broadcast_to(bandit.zeros(), (R,) + bandit.zeros().shape).copy()
    J = np.empty((R, T + 1))
    H = np.empty((R, T + 1))
    eta_k, wn = np.empty((R, T)), np.empty((R, T))
    thetas = np.empty((R, T + 1, th.shape[-1])) if keep_theta else None
    J[:, 0] = bandit.success_rate(th[0])[0]  # every run starts at theta0 = 0
    for k in range(T):
        e = np.maximum(eta * matched_ratio(method, J[:, k], group_size), np.finfo(float).tiny)
        if keep_theta:
            thetas[:, k] = th[:, 0]
        tr = simulate(bandit, dyn, eta=e, seed=seeds * 10**6 + k, theta0=th)
        th = tr.theta_final
        J[:, k + 1] = np.clip(tr.J_final[:, 0], 0.0, 1.0)
        H[:, k] = tr.entropy[:, 0, 0]
        eta_k[:, k], wn[:, k] = e, tr.wnorm[:, 0, 0]
    if keep_theta:
        thetas[:, T] = th[:, 0]
    H[:, T] = [_entropy(bandit.logits(t)[0]) for t in th]
    stats = gapdyn.RunStats.from_trajectory(J)
    return MatchedTrajectory(J, eta_k, wn, H, thetas, J[:, -1:], stats.J_min[:, None], stats.J_tail_min[:, None],
                             stats.J_tail_max[:, None])


def _entropy(z) -> float:
    """-sum_a pi_a log pi_a (nats) of the softmax of logits z."""
    logp = log_softmax(z)
    return float(-np.sum(np.exp(logp) * logp))


def _frame(tr, etas, seeds) -> pd.DataFrame:
    """One row per run: outcome (gapdyn.bandit_outcome via run_stats), steps to 0.9, entropies."""
    st = run_stats(tr, 0)
    outcome = gapdyn.bandit_outcome(st)
    J, H = tr.J if tr.J.ndim == 2 else tr.J[:, :, 0], tr.entropy if tr.entropy.ndim == 2 else tr.entropy[:, :, 0]
    at = lambda k: H[:, min(k, H.shape[1] - 1)]  # noqa: E731
    return pd.DataFrame({
        "eta": etas, "seed": seeds, "J0": J[:, 0], "J_final": tr.J_final[:, 0],
        "J_min": st.J_min, "outcome": outcome, "collapsed": outcome == "collapsed",
        "steps_to_09": steps_to(J, np.arange(J.shape[1]), 0.9),
        "H0": at(0), "H10": at(10), "H50": at(50), "H_final": H[:, -1],
    })


def _runs(bandit, dyn, etas, seeds) -> pd.DataFrame:
    E, S = np.meshgrid(np.asarray(etas, float), np.asarray(seeds), indexing="ij")
    tr = simulate(bandit, dyn, eta=E.ravel(), seed=S.ravel())
    return _frame(tr, E.ravel(), S.ravel())


def run_cell(*, kind, instance, steps, n_seeds, group_size, method=None, etas=None, lam=0.1) -> pd.DataFrame:
    """Rows of one cell: exact / sampled runs of one method, or the matched-step runs of MATCHED."""
    b = mech.instance_bandit(instance)
    if kind == "matched":
        E, S = (a.ravel() for a in np.meshgrid(np.asarray(etas, float), np.arange(n_seeds), indexing="ij"))
        frames = []
        for m in MATCHED:
            tr = matched_runs(b, m, eta=E, seeds=S, steps=steps, group_size=group_size)
            frames.append(_frame(tr, E, S).assign(method=m))
        # the identity's other side: exact Dr. GRPO at eta (1 - J_k) against exact WAPO at eta (one seed)
        e1 = np.asarray(etas, float)
        dr = matched_runs(b, "dr_grpo", eta=e1, seeds=np.zeros(e1.size, np.int64), steps=steps,
                          group_size=group_size, gradient="exact")
        wa = simulate(b, Dynamics(method="wapo", gradient="exact", steps=steps, group_size=group_size), eta=e1)
        ident = pd.DataFrame({"eta": e1, "method": "exact_identity", "J_final": dr.J[:, -1],
                              "J_final_wapo_exact": wa.J_final[:, 0]})
        return pd.concat(frames + [ident], ignore_index=True)
    if kind not in ("exact", "sampled"):
        raise ValueError(f"kind must be 'exact', 'sampled' or 'matched', got {kind!r}")
    dyn = Dynamics(method=method, gradient=kind, steps=steps, group_size=group_size, lam=lam)
    df = _runs(b, dyn, etas, np.arange(n_seeds) if kind == "sampled" else np.arange(1))
    scale = {"dr_grpo": 1 - 1 / group_size, "w_reinforce": 1 + lam}.get(method)
    if kind == "exact" and scale is not None:  # the identity's other side: REINFORCE at the rescaled eta
        ref = _runs(b, Dynamics(method="reinforce", gradient="exact", steps=steps, group_size=group_size),
                    scale * np.asarray(etas, float), np.arange(1))
        df["J_final_rescaled_reinforce"] = ref["J_final"].to_numpy()
    return df


# ------------------------------------------------------------------------------------------------
# statistics: inference over methods, paired tests clustered by instance
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankTest:
    """Spearman rho of (x, y) over k units, its one-sided exact permutation p and what the test can reach.

    p: share of the k! assignments of y to the units with rho >= observed ("greater") or <= ("less");
    p_min: the smallest p any assignment of these y values could give; null_lo, null_hi: the 5 % and 95 %
    quantiles of rho under the permutation null.
    """

    rho: float
    p: float
    p_min: float
    k: int
    null_lo: float
    null_hi: float


def _spearman_rows(rx: np.ndarray, ry: np.ndarray) -> np.ndarray:
    """Pearson correlation of the rank vector rx with every row of ry [n, k] (= Spearman with average ranks)."""
    a = rx - rx.mean()
    b = ry - ry.mean(axis=-1, keepdims=True)
    return (b @ a) / (np.sqrt(np.sum(b * b, axis=-1)) * np.sqrt(a @ a))


def rank_permutation_test(x, y, *, alternative: str = "greater") -> RankTest:
    """Exact permutation test of Spearman's rho between x and y over k <= 9 units (every one of the k! orders).

    H0: y is exchangeable over the units. rho uses average ranks (ties); p counts assignments with
    rho >= observed - 1e-12 (greater) or <= observed + 1e-12 (less), the observed one included.
    """
    if alternative not in ("greater", "less"):
        raise ValueError(f"alternative must be 'greater' or 'less', got {alternative!r}")
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.ndim != 1 or x.shape != y.shape or not 3 <= x.size <= 9 or not np.all(np.isfinite(x) & np.isfinite(y)):
        raise ValueError(f"x and y must be finite 1-D arrays of one length in [3, 9], got {x.shape}, {y.shape}")
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        raise ValueError("x and y must each take at least two distinct values")
    rx, ry = rankdata(x), rankdata(y)
    perms = np.array(list(itertools.permutations(range(x.size))))
    null = _spearman_rows(rx, ry[perms])
    rho = float(_spearman_rows(rx, ry[None])[0])
    sgn = 1.0 if alternative == "greater" else -1.0
    s, s0 = sgn * null, sgn * rho
    p = float(np.mean(s >= s0 - 1e-12))
    p_min = float(np.mean(s >= s.max() - 1e-12))
    lo, hi = np.quantile(null, [0.05, 0.95])
    return RankTest(rho, p, p_min, int(x.size), float(lo), float(hi))


def sign_flip_p(d) -> float:
    """One-sided exact sign-flip permutation p of mean(d) < 0 over paired units (zeros dropped).

    H0: each unit's difference is symmetric about 0; p = share of the 2^n sign vectors s with
    sum(s |d|) <= sum(d) (the observed one included), enumerated for n <= 22 nonzero d; above that, a Monte Carlo
    permutation p = (1 + #{b : sum(s_b |d|) <= sum(d)}) / (1 + B) over B = 200 000 random sign vectors
    (default_rng(0); a valid p-value, Monte Carlo SE <= 0.0011). No nonzero d gives p = 1.
    """
    d = np.asarray(d, dtype=float)
    if d.ndim != 1 or not np.all(np.isfinite(d)):
        raise ValueError(f"d must be a finite 1-D array, got shape {d.shape}")
    a = np.abs(d[d != 0])
    n = a.size
    if n == 0:
        return 1.0
    obs = float(d.sum()) + 1e-12 * float(a.sum())
    if n > 22:
        rng, B, count = np.random.default_rng(0), 200_000, 0
        for start in range(0, B, 20_000):
            signs = 1 - 2 * rng.integers(0, 2, size=(min(20_000, B - start), n))
            count += int(np.sum(signs @ a <= obs))
        return (1 + count) / (1 + B)
    count, chunk = 0, 1 << min(n, 16)
    bits = (np.arange(chunk)[:, None] >> np.arange(min(n, 16))) & 1  # [chunk, n_lo]
    lo_sums = (1 - 2 * bits) @ a[:min(n, 16)]
    for hi in range(1 << max(n - 16, 0)):
        hb = (hi >> np.arange(max(n - 16, 0))) & 1
        count += int(np.sum(lo_sums + (1 - 2 * hb) @ a[16:] <= obs))
    return count / float(1 << n)


def instance_differences(R: pd.DataFrame, a: str, b: str, key: list[str]) -> pd.Series:
    """Per instance: mean over paired runs (same ``key``) of collapsed(a) - collapsed(b)."""
    x = R[R["method"] == a].set_index(key)["collapsed"].astype(float)
    y = R[R["method"] == b].set_index(key)["collapsed"].astype(float).reindex(x.index)
    diff = (x - y)[y.notna().to_numpy()]
    return diff.groupby(level="instance").mean()


def _paired_claim(R, a, b, key):
    """(Estimate of mean_i d_i over instances, one-sided sign-flip p, n instances, reason).

    The interval is the studentized cluster bootstrap where it covers at this n (docs/coverage.md; below it the
    claim is not measured: "too few instances for a valid interval").

    reason is non-empty (the claim is then not measured) with fewer than two instances, or when every instance
    gives the same difference (no spread over instances for an interval)."""
    d = instance_differences(R, a, b, key)
    if len(d) < 2:
        return no_data(-1.0, 1.0), 1.0, len(d), "fewer than two instances with paired runs"
    if np.ptp(d.to_numpy()) == 0:
        v = float(d.iloc[0])
        return (gapdyn.Estimate(v, v, v, len(d), 0.95, "no spread"), sign_flip_p(d.to_numpy()), len(d),
                f"every instance gives the same difference ({v:g}; {a} and {b} collapse on the same runs when 0): "
                "no spread over instances for an interval")
    est = mean_estimate(d.to_numpy(), seed=len(d), natural=(-1.0, 1.0))
    reason = est.reason if isinstance(est, gapdyn.evidence.stats.NotMeasured) else ""
    return est, sign_flip_p(d.to_numpy()), len(d), reason


def _planned(d: pd.Series) -> int | None:
    """Instances at which the t interval of the per-instance differences decides with power 0.8, taking this
    block's mean and sd as the truth (gapdyn.evidence.planner.power_mean against 0); None without spread."""
    x = d.to_numpy(float)
    if x.size < 2 or np.ptp(x) == 0:
        return None
    from gapdyn.evidence.coverage import min_valid_n

    floor = max(20, min_valid_n(MEAN_INTERVAL) or 20)
    return plan_n(lambda n: power_mean(float(x.mean()), float(x.std(ddof=1)), n, value=0.0), n_min=floor).n


def _per_method(R: pd.DataFrame, col: str, methods) -> pd.Series:
    """Mean of ``col`` per method (over instances, etas, seeds) for the listed methods present."""
    m = R[R["method"].isin(methods)].groupby("method")[col].mean()
    return m.reindex([x for x in methods if x in m.index]).dropna()


# ------------------------------------------------------------------------------------------------
# analysis
# ------------------------------------------------------------------------------------------------


def summary(results: pd.DataFrame) -> pd.DataFrame:
    """Per (kind, method) over equal-eta runs: P(collapse), median steps to 0.9, entropies, scalar at J0."""
    R = results[results["kind"].isin(["exact", "sampled"])].copy()
    R["collapsed"] = R["collapsed"].astype(bool)
    g = R.groupby(["kind", "method"])
    out = pd.DataFrame({
        "P_collapse": g["collapsed"].mean(),
        "median_steps_to_09": g["steps_to_09"].apply(
            lambda s: float(np.median(s[np.isfinite(s)])) if np.isfinite(s).any() else np.inf),
        "share_reaching_09": g["steps_to_09"].apply(lambda s: float(np.isfinite(s).mean())),
        "H0": g["H0"].mean(), "H10": g["H10"].mean(), "H50": g["H50"].mean(), "H_final": g["H_final"].mean(),
    }).reset_index()
    J0 = float(np.clip(R["J0"].mean(), 1e-9, 1 - 1e-9))
    G = int(R["group_size"].iloc[0])
    out["scalar_at_J0"] = [float(gapdyn.expected_scalar(m, J0, G)) for m in out["method"]]
    return out


def analyse(results: pd.DataFrame, config: Config, *, block: str = "discovery") -> list:
    n_inst = results["instance"].nunique()
    G = config.group_size
    where = f"K=100, d=16, theta0 = 0, G={G}, horizon {config.steps}, {n_inst} instances ({block})"
    claims = []

    def add(cid, est, setting, statistic, p_value=None, reason="", n_planned=None):
        c = make_claim(SPECS, cid, est, block=block, setting=setting, statistic=statistic, p_value=p_value)
        if reason:
            c = replace(c, measured=False, reason=reason)
        claims.append(replace(c, primary=cid in PRIMARY, n_planned=n_planned))

    def max_dev(a, b, n):
        d = float(np.nanmax(np.abs(np.asarray(a, float) - np.asarray(b, float)))) if n else math.nan
        if not math.isfinite(d):
            return gapdyn.evidence.stats.not_measured(0.0, 0.0), "no runs to compare"
        return gapdyn.Estimate(d, 0.0, d, n, 0.95, "max over runs"), ""

    ex = results[results["kind"] == "exact"]
    ref = ex[ex["method"] == "reinforce"].set_index(["instance", "eta"])["J_final"]
    devs = [(ex[ex["method"] == m].set_index(["instance", "eta"])["J_final"] - ref).abs().max()
            for m in ("rloo", "psr", "nsr")]
    est, why = max_dev([max(devs)], [0.0], len(ref))
    add("identity_baselines", est, where + f", exact, etas {list(config.etas)}",
        f"max |J_final(m) - J_final(reinforce)| over m, instance, eta ({len(ref)} runs each)", reason=why)
    for cid, m in (("identity_dr_rescaled", "dr_grpo"), ("identity_wr_rescaled", "w_reinforce")):
        r = ex[ex["method"] == m]
        est, why = max_dev(r["J_final"], r["J_final_rescaled_reinforce"], len(r))
        add(cid, est, where + f", exact, etas {list(config.etas)}",
            f"max |J_final difference| over {len(r)} (instance, eta) runs", reason=why)
    sp = results[results["kind"] == "sampled"].copy()
    sp["collapsed"] = sp["collapsed"].astype(float)
    key = ["instance", "eta", "seed"]
    psr = sp[sp["method"] == "psr"].set_index(key)["J_final"]
    rf = sp[sp["method"] == "reinforce"].set_index(key)["J_final"].reindex(psr.index)
    est, why = max_dev(psr, rf, len(psr))
    add("identity_psr_reinforce", est, where + f", sampled, {config.n_seeds} common seeds per eta",
        f"max |J_final(psr) - J_final(reinforce)| over {len(psr)} (instance, eta, seed) runs", reason=why)
    mt = results[results["kind"] == "matched"].copy()
    idr = mt[mt["method"] == "exact_identity"]
    est, why = max_dev(idr["J_final"], idr["J_final_wapo_exact"], len(idr))
    add("identity_matched_exact", est, where + f", exact, eta in {list(config.matched_etas)}",
        f"max |J_final difference| over {len(idr)} (instance, eta) runs", reason=why)

    ex = ex.assign(collapsed=ex["collapsed"].astype(float))
    small = sp[sp["eta"] == sp["eta"].min()].copy()
    small["steps_to_09"] = np.minimum(small["steps_to_09"], config.steps)  # never reached: censored at the horizon
    J0 = float(np.clip(pd.concat([ex["J0"], sp["J0"]]).mean(), 1e-9, 1 - 1e-9))
    rank_rows = (
        ("exact_rank_collapse", ex, "collapsed", EXACT_DISTINCT, "greater", f"exact, etas {list(config.etas)}",
         "P(collapse)"),
        ("sampled_rank_collapse", sp, "collapsed", SAMPLED_DISTINCT, "greater", f"sampled, etas {list(config.etas)}",
         "P(collapse)"),
        ("sampled_rank_speed", small, "steps_to_09", SAMPLED_DISTINCT, "less",
         f"sampled, eta = {min(config.etas):g}", f"mean steps to J >= 0.9 (never: {config.steps})"),
        ("sampled_rank_entropy", sp, "H50", SAMPLED_DISTINCT, "less", f"sampled, etas {list(config.etas)}",
         "mean entropy at step 50"),
    )
    for cid, R, col, units, alt, setting, what in rank_rows:
        per = _per_method(R, col, units)
        sc = np.array([float(gapdyn.expected_scalar(m, J0, G)) for m in per.index])
        stat = f"Spearman over {len(per)} methods ({', '.join(per.index)}) of (scalar at J0, {what})"
        if len(per) < 3 or np.ptp(sc) == 0 or np.ptp(per.to_numpy()) == 0:
            add(cid, no_data(-1.0, 1.0), where + ", " + setting, stat,
                reason="too few methods, or an outcome equal for every method: no rank correlation to test")
            continue
        t = rank_permutation_test(sc, per.to_numpy(), alternative=alt)
        est = gapdyn.Estimate(t.rho, max(-1.0, t.rho - t.null_hi), min(1.0, t.rho - t.null_lo), t.k, 0.90,
                              "rho minus the 95 / 5 % quantiles of its exact permutation distribution")
        stat += (f"; one-sided exact permutation p over {math.factorial(t.k)} orders = {t.p:.3g} (smallest "
                 f"attainable {t.p_min:.3g}); interval: rho minus the null's 95 / 5 % quantiles (one-sided 95 % "
                 f"each side); unit: method")
        reason = ("no interval method with measured coverage for a Spearman over methods (the band is the "
                  "permutation null's quantiles; docs/coverage.md)" + ("" if t.p_min < ALPHA else
                  f"; too few methods to decide ({t.k} methods, ties in the outcome included: smallest "
                  f"attainable p = {t.p_min:.3g} >= {ALPHA:g})"))
        add(cid, est, where + ", " + setting, stat, p_value=t.p, reason=reason)

    def paired(cid, R, other, key, setting):
        est, p, n, reason = _paired_claim(R, "wapo", other, key)
        label = "primary" if cid in PRIMARY else "exploratory"
        add(cid, est, where + ", " + setting,
            f"mean over {n} instances of P(collapse | WAPO) - P(collapse | {other}) per instance (studentized cluster "
            f"bootstrap over instances; one-sided exact sign-flip permutation p; {label})", p_value=p, reason=reason,
            n_planned=_planned(instance_differences(R, "wapo", other, key)))

    for other in ("grpo", "dr_grpo"):
        paired(f"wapo_vs_{other}", sp, other, key, f"sampled, etas {list(config.etas)}, {config.n_seeds} common seeds")
    mt = mt[mt["method"] != "exact_identity"].assign(collapsed=lambda f: f["collapsed"].astype(float))
    for other in ("dr_grpo", "psr", "grpo"):
        paired(f"matched_wapo_vs_{other}", mt, other, key,
               f"sampled, WAPO eta in {list(config.matched_etas)}, {config.matched_seeds} common seeds, other "
               f"method at eta scalar_wapo(J_k) / scalar_{other}(J_k)")
    return claims


def run(config: Config, *, store=None, backend="joblib", n_jobs=-1, progress=True):
    """ExperimentResult of both blocks through gapdyn.evidence.sweep.run_sweep (resumable with ``store``)."""
    from ._common import run_experiment

    return run_experiment(EXPERIMENT, config, store=store, backend=backend, n_jobs=n_jobs,
                          progress=progress)


EXPERIMENT = Experiment(name=NAME, claims=SPECS, config=Config, cells=cells, run_cell=run_cell, analyse=analyse)
"""This experiment in the one protocol (gapdyn.evidence.experiment.Experiment)."""
