"""Experiment 3 `success_rate`: Theorem 3's step condition along trajectories (Suk & Duan, arXiv
2510.08539, Thm 3: the safe step shrinks ~ (1 - J)/T).

Theorem 3's (1 - J)/T is a sufficient step condition (a bound, form "bound"): a step eta <= c (1 - J)/T
is safe. A local threshold that grows, or is infinite, as J -> 1 is consistent with it; a step inside the
condition that collapses is a violation. The paper states no constant c, so each trajectory sets its own:
c = C_FRAC T eta*(theta0) / (1 - J(theta0)), C_FRAC = 0.99: 1 % below the largest c its start state allows
(eta*(theta0) the critical step of exact GRPO restarted at theta0 over ``horizon`` steps, gapdyn.find_eta_star;
the top of the scan, eta_hi, when nothing collapses there, eta_lo when eta_lo already does).

For each instance a run of exact GRPO (expected update, G = 8) at a small fixed eta starts from theta0
placed at J = J_start and is stopped at checkpoints: the first step at which J reaches each level of
``levels``. Levels crossed on one step are one state: the states are the distinct checkpoint steps. At
every state theta_k: the bound step eta_k = c (1 - J_k)/T and the outcome (gapdyn.bandit_outcome, terminal
rule) of exact GRPO restarted at theta_k at eta_k over ``horizon`` steps, and eta*(theta_k) of the
restarted run (the smallest collapsing eta of the scan); the state violates the condition when some step
<= eta_k collapses (:func:`is_violation`: the run at eta_k collapsed, or eta*(theta_k) <= eta_k).
Conservativeness: eta*(theta_k) / eta_k where finite; no collapse in range is infinite, a state that
satisfies the condition by a margin the scan cannot see; and the one-step sharp thresholds
gapdyn.sharp_step_threshold along w = E[w_GRPO] = c_G(J) Gap and along w = Gap (the largest eta with
Phi(theta_k + e w) > Phi(theta_k) for all e <= eta, docs/equations.md §3), whose ratio is c_G(J) exactly:
an identity row per setting. The claim's statistic is the share of distinct states whose bound step
collapses, decided on its one-sided upper Clopper-Pearson limit (Criterion.below(0.05)); states of one
trajectory are counted as separate trials.

Two settings: T = 1, the single-context log-linear bandit of bandits.envs (K = 100 arms, d = 16, 10
correct; trajectory by bandits.engine.simulate) and T = 8, the partial-sharing token model of
bandits.partial (rho = 0.5, V = 10, d = 4, rule MAJ; trajectory by bandits.sequence.simulate).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np
import pandas as pd

import gapdyn
from gapdyn.evidence.claims import keyed_specs
from gapdyn.evidence.experiment import Experiment, claim_specs

from ..engine import Dynamics
from ..engine import simulate as simulate_contextual
from ..envs import make_bandit, place_theta
from ..partial import PartialSharingBandit
from ..sequence import SequenceDynamics, place_for_success_rate
from ..sequence import simulate as simulate_sequence
from ._common import make_claim, run_experiment, run_stats

__all__ = ["NAME", "STATEMENTS", "CRITERIA", "FORMS", "SETTINGS", "MEASURES", "C_FRAC", "Config", "cells",
           "run_cell", "checkpoints", "is_violation", "distinct_states", "violation_share", "analyse",
           "slope_claim_id", "fit_points", "run"]

NAME = "success_rate"
SETTINGS = ("T=1", "T=8")
"""T = 1: contextual log-linear bandit; T = 8: partial-sharing token model (rho = 0.5)."""
MEASURES = ("sharp_grpo", "sharp_gap", "restart_grpo")
"""Local thresholds at a checkpoint theta_k: the sharp one-step threshold along E[w_GRPO] and along the Gap
(gapdyn.sharp_step_threshold), and the critical step of exact GRPO restarted at theta_k over a short
horizon (gapdyn.find_eta_star; collapse by the terminal rule of gapdyn.bandit_outcome)."""
_SOURCE = "Suk & Duan (arXiv 2510.08539), Thm 3"


def _slope_id(setting: str, measure: str) -> str:
    return f"local_eta_vs_1-J/{setting}/{measure}"


def slope_claim_id(setting: str, measure: str) -> str:
    """Id of the claim on the local threshold ``measure`` in ``setting`` (only BOUND_MEASURE has one: the step
    condition tested by its violations; the sharp thresholds feed the identity rows)."""
    return _slope_id(setting, measure)


def _identity_id(setting: str) -> str:
    return f"grpo_threshold_times_cG_over_gap/{setting}"


C_FRAC = 0.99
"""c = C_FRAC x the largest c the trajectory's start state allows (module doc)."""
BOUND_MEASURE = "restart_grpo"
"""The measure whose collapse decides a violation (the restarted exact-GRPO run)."""
MAX_VIOLATION_SHARE = 0.05

# written from the theorem before any run: steps inside c (1 - J)/T never collapse
STATEMENTS: dict[str, tuple[str, str]] = {
    **{_slope_id(s, BOUND_MEASURE): (
        _SOURCE, f"({s}) a sufficient step condition: from every state of the trajectory, exact GRPO at eta <= "
                 f"c (1 - J)/T does not collapse within the restart horizon (c = {C_FRAC:g} T eta*(theta0) / "
                 "(1 - J(theta0)): the largest c the start allows, less 1 %)") for s in SETTINGS},
    **{_identity_id(s): (_SOURCE + " (E[w] = c_G(J) Gap: by construction)",
                         f"({s}) identity: the GRPO direction's one-step threshold is the Gap's divided by c_G(J)")
       for s in SETTINGS},
}
CRITERIA: dict[str, gapdyn.Criterion] = {
    **{_slope_id(s, BOUND_MEASURE): gapdyn.Criterion.below(MAX_VIOLATION_SHARE) for s in SETTINGS},
    **{_identity_id(s): gapdyn.Criterion.identity(0.0, tol=1e-3) for s in SETTINGS},
}
FORMS: dict[str, str] = {
    **{_slope_id(s, BOUND_MEASURE): "bound" for s in SETTINGS},
    **{_identity_id(s): "identity" for s in SETTINGS},
}
"""The form of each claim's statement (gapdyn.FORMS)."""


@dataclass(frozen=True)
class Config:
    """Experiment 3 configuration."""

    mode: str = "full"
    instances: tuple[int, ...] = gapdyn.DISCOVERY_SEEDS
    confirmation: tuple[int, ...] = gapdyn.CONFIRMATION_SEEDS
    levels: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
    """Checkpoints: first step with J >= level."""
    J_start: float = 0.05
    group_size: int = 8
    eta_frac: float = 0.05
    """The run's eta = eta_frac x min(the GRPO direction's local threshold at theta0, eta_cap)."""
    eta_cap: float = 20.0
    max_steps: int = 4000
    """Steps allowed to pass all levels (levels not reached are counted)."""
    rho: float = 0.5
    """Feature sharing of the T = 8 token model."""
    horizon: int = 20
    """Steps of the restarted run (restart_grpo)."""
    eta_lo: float = 1e-2
    eta_hi: float = 1e4
    max_ratio: float = 1.01
    """find_eta_star's scan of the restarted run."""
    n_boot: int = 2000

    @classmethod
    def test(cls) -> "Config":
        return cls(mode="test", instances=(0, 1, 2), confirmation=(), levels=(0.1, 0.3, 0.5, 0.7), eta_frac=0.2,
                   max_steps=300, horizon=5, max_ratio=1.3, n_boot=200)

    @classmethod
    def quick(cls) -> "Config":
        return cls(mode="quick", instances=gapdyn.DISCOVERY_SEEDS[:8], confirmation=(),
                   levels=(0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9), eta_frac=0.1, max_steps=1500, horizon=20,
                   max_ratio=1.05, n_boot=1000)

    @classmethod
    def full(cls) -> "Config":
        return cls()

    def __post_init__(self):
        from gapdyn.cmdline import MODES

        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        lv = np.asarray(self.levels, float)
        if lv.size < 3 or np.any(np.diff(lv) <= 0) or lv[0] <= self.J_start or lv[-1] >= 1:
            raise ValueError(f"levels must be >= 3 increasing values in (J_start, 1), got {self.levels!r}")
        if not 0 < self.J_start < 1:
            raise ValueError(f"J_start must lie in (0, 1), got {self.J_start!r}")
        if not 0 < self.eta_frac < 1:
            raise ValueError(f"eta_frac must lie in (0, 1), got {self.eta_frac!r}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps!r}")



KEYS = {cid: (("Suk & Duan", "Theorem 3"), "test") for cid in STATEMENTS}
"""Claim id -> (statement key, role) (gapdyn.evidence.claims.STATEMENTS, ROLES)."""
SPECS = keyed_specs(claim_specs(STATEMENTS, CRITERIA, FORMS, primary=()), KEYS)
"""Every claim's frozen gapdyn.ClaimSpec (the tables above, verbatim), by claim id."""

def cells(config: Config, instances) -> list[dict]:
    common = {k: v for k, v in asdict(config).items() if k not in ("mode", "instances", "confirmation", "n_boot")}
    common["levels"] = list(config.levels)
    return [{"setting": s, "instance": int(i), **common} for i in instances for s in SETTINGS]


# ---------------------------------------------------------------------------------------------
# one instance: the problem, its dynamics, the checkpoints


class _Problem:
    """theta -> (J, 1 - J, Gap), Phi as a function, and a runner theta, eta, steps -> (J path, theta)."""

    def __init__(self, setting: str, instance: int, config_like: dict):
        G = config_like["group_size"]
        if setting == "T=1":
            self.bandit = make_bandit(n_contexts=1, n_arms=100, dim=16, n_correct=10, seed=instance)
            phi, r = self.bandit.features[0], self.bandit.rewards[0]
            self.logodds = gapdyn.loglinear_logodds_fn(phi, r)
            self.theta0 = place_theta(self.bandit, config_like["J_start"])[0]
            self._dyn = lambda steps: Dynamics(method="grpo", gradient="exact", group_size=G, steps=steps)
        elif setting == "T=8":
            self.env = PartialSharingBandit.random(T=8, rho=config_like["rho"], seed=instance)
            self.logodds = lambda th: float(self.env.log_odds(th))
            u = self.env.gap(np.zeros(self.env.d))
            self.theta0 = place_for_success_rate(self.env, u / np.linalg.norm(u), config_like["J_start"])
            self._dyn = lambda steps: SequenceDynamics(method="grpo", gradient="exact", group_size=G, steps=steps)
        else:
            raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
        self.setting, self.G = setting, G

    def state(self, theta) -> tuple[float, float, np.ndarray]:
        """(J, 1 - J, Gap) at theta, 1 - J from the failure mass."""
        if self.setting == "T=1":
            phi, r = self.bandit.features[0], self.bandit.rewards[0]
            probs = gapdyn.loglinear_probs(phi, theta)
            gap = gapdyn.gradient_gap(probs, r, gapdyn.loglinear_scores(phi, theta))
            return float(probs @ r), float(probs @ (1 - r)), gap
        ex = self.env.exact(theta)
        return float(ex["J"]), float(ex["Jbar"]), ex["gap"]

    def run(self, theta, eta: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """(J at steps 0..steps, theta after ``steps`` updates) of exact GRPO at eta."""
        if self.setting == "T=1":
            tr = simulate_contextual(self.bandit, self._dyn(steps), eta=eta, theta0=theta[None])
            return np.append(tr.J[0, :, 0], tr.J_final[0, 0]), tr.theta_final[0, 0]
        tr = simulate_sequence(self.env, self._dyn(steps), eta=eta, theta0=theta)
        return np.append(tr.J[0], tr.J_final[0]), tr.theta_final[0]

    def run_stats(self, theta, etas, steps: int) -> gapdyn.RunStats:
        """What decides the outcome (gapdyn.bandit_outcome) of ``steps`` exact GRPO steps from theta, per eta."""
        if self.setting == "T=1":
            tr = simulate_contextual(self.bandit, self._dyn(steps), eta=etas, theta0=theta[None])
            return run_stats(tr, 0)
        dyn = SequenceDynamics(method="grpo", gradient="exact", group_size=self.G, steps=steps)
        return run_stats(simulate_sequence(self.env, dyn, eta=etas, theta0=theta))

    def threshold(self, theta, w) -> float:
        return gapdyn.sharp_step_threshold(self.logodds, theta, w, eta_min=1e-6, eta_max=1e8, rtol=1e-7)


def checkpoints(problem: _Problem, eta: float, levels, max_steps: int) -> list[tuple[float, int, np.ndarray]]:
    """[(level, step, theta)] at the first step with J >= level along the run (levels not reached omitted).

    The run is deterministic (exact dynamics), so it is replayed in segments that stop at each checkpoint.
    """
    path, _ = problem.run(problem.theta0, eta, max_steps)
    out, theta, at = [], problem.theta0, 0
    for level in levels:
        hit = np.flatnonzero(path >= level)
        if hit.size == 0:
            break
        k = int(hit[0])
        if k > at:
            _, theta = problem.run(theta, eta, k - at)
            at = k
        out.append((float(level), k, theta.copy()))
    return out


def _anchor(res: gapdyn.EtaStar, eta_lo: float, eta_hi: float) -> float:
    """eta*(theta0) for c: the found value, eta_lo when eta_lo already collapses, eta_hi when nothing does."""
    return {"found": res.eta_star, "collapsed_at_lo": eta_lo}.get(res.status, eta_hi)


def is_violation(status: str, eta_star: float, eta_bound: float, outcome: str, eta_lo: float) -> bool:
    """Some step eta <= eta_bound collapses: the restarted run at eta_bound collapsed, or the scan's smallest
    collapsing eta (eta*) is <= eta_bound (``collapsed_at_lo``: eta_lo collapses, a violation when
    eta_lo <= eta_bound). The scan's resolution (collapsing islands narrower than its grid) is the method's."""
    if outcome == "collapsed":
        return True
    if status == "found":
        return bool(eta_star <= eta_bound)
    return status == "collapsed_at_lo" and eta_lo <= eta_bound


def run_cell(*, setting: str, instance: int, levels, J_start: float, group_size: int, eta_frac: float,
             eta_cap: float, max_steps: int, rho: float, horizon: int, eta_lo: float, eta_hi: float,
             max_ratio: float) -> pd.DataFrame:
    """One row per (checkpoint, measure) of one instance's trajectory: the local thresholds, and for
    BOUND_MEASURE the bound step eta_bound = C_FRAC eta*(theta0) (1 - J)/(1 - J(theta0)) (= c (1 - J)/T) with
    the outcome of the restarted run at it (``outcome``, ``violated``)."""
    cfg = {"group_size": group_size, "J_start": J_start, "rho": rho}
    blank = {"level": np.nan, "step": -1, "measure": "", "eta_local": np.nan, "eta_bound": np.nan,
             "outcome": "", "violated": False, "anchor": np.nan, "anchor_status": ""}
    try:
        prob = _Problem(setting, instance, cfg)
    except ValueError as exc:
        return pd.DataFrame([{**blank, "status": f"no start: {exc}"[:80], "J": np.nan, "one_minus_J": np.nan,
                              "scalar": np.nan, "eta_run": np.nan}])
    J0, Jb0, gap0 = prob.state(prob.theta0)
    c0 = float(gapdyn.expected_scalar("grpo", J0, group_size))
    eta_run = eta_frac * min(prob.threshold(prob.theta0, c0 * gap0), eta_cap)
    if not eta_run > 0:
        return pd.DataFrame([{**blank, "status": "not ascent at theta0", "J": J0, "one_minus_J": Jb0,
                              "scalar": c0, "eta_run": np.nan}])
    res0 = gapdyn.find_eta_star(lambda e: prob.run_stats(prob.theta0, e, horizon), eta_lo, eta_hi, max_ratio=max_ratio)
    anchor = _anchor(res0, eta_lo, eta_hi)
    rows = []
    for level, k, theta in checkpoints(prob, eta_run, levels, max_steps):
        J, Jb, gap = prob.state(theta)
        c = float(gapdyn.expected_scalar("grpo", J, group_size))
        base = {**blank, "level": level, "step": k, "J": J, "one_minus_J": Jb, "scalar": c, "eta_run": eta_run,
                "anchor": anchor, "anchor_status": res0.status}
        for measure, w in (("sharp_grpo", c * gap), ("sharp_gap", gap)):
            eta = prob.threshold(theta, w)
            status = "ok" if np.isfinite(eta) and eta > 0 else ("no crossing in range" if eta > 0 else "not ascent")
            rows.append({**base, "status": status, "measure": measure, "eta_local": eta})
        eta_bound = C_FRAC * anchor * Jb / Jb0
        outcome = str(gapdyn.bandit_outcome(prob.run_stats(theta, np.array([eta_bound]), horizon))[0])
        res = gapdyn.find_eta_star(lambda e, th=theta: prob.run_stats(th, e, horizon), eta_lo, eta_hi,
                                   max_ratio=max_ratio)
        rows.append({**base, "status": "ok" if res.status == "found" else res.status, "measure": BOUND_MEASURE,
                     "eta_local": res.eta_star, "eta_bound": eta_bound, "outcome": outcome,
                     "violated": is_violation(res.status, res.eta_star, eta_bound, outcome, eta_lo)})
    if not rows:
        rows.append({**blank, "status": "no level reached", "J": J0, "one_minus_J": Jb0, "scalar": c0,
                     "eta_run": eta_run, "anchor": anchor, "anchor_status": res0.status})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# analysis


def distinct_states(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct state (instance, checkpoint step; per block and setting where the rows have them):
    levels crossed on the same step are one state (the first level's row is kept)."""
    key = [c for c in ("block", "setting") if c in rows.columns] + ["instance", "step"]
    return rows.sort_values(key + ["level"]).drop_duplicates(key, keep="first")


def violation_share(rows: pd.DataFrame) -> tuple[int, int]:
    """(violating states, distinct states) of BOUND_MEASURE rows: a state violates when the restarted run at
    its bound step collapsed."""
    st = distinct_states(rows[(rows["measure"] == BOUND_MEASURE) & (rows["step"] >= 0)])
    return int(st["violated"].astype(bool).sum()), len(st)


def fit_points(results: pd.DataFrame) -> pd.DataFrame:
    """The distinct states with a finite local threshold, for the rows of one (setting, measure)."""
    return distinct_states(results[(results["status"] == "ok") & (results["step"] >= 0)])


def _conservativeness(states: pd.DataFrame) -> tuple[float | None, str]:
    """(median of eta*(theta_k) / eta_k over states with a finite eta*, text with the range and the number of
    states with no collapse in range, i.e. an infinite ratio)."""
    r = (states["eta_local"] / states["eta_bound"]).to_numpy(float)
    fin = r[np.isfinite(r)]
    inf = int(np.sum(~np.isfinite(r)))
    if fin.size == 0:
        return None, f"no finite eta*(theta_k) ({inf} states with no collapse in range)"
    return float(np.median(fin)), (f"eta*(theta_k) / bound step: median {np.median(fin):.3g}, range "
                                   f"[{fin.min():.3g}, {fin.max():.3g}] over {fin.size} states; {inf} states with no "
                                   "collapse in range (infinite)")


def _planned_n(k: int, n: int) -> int | None:
    """The n of states at which the upper limit decides with probability 0.8 if k/n were the truth
    (gapdyn.evidence.planner.power_proportion, one-sided)."""
    from gapdyn.evidence.planner import plan_n, power_proportion

    plan = plan_n(lambda m: power_proportion(k / n, m, value=MAX_VIOLATION_SHARE, one_sided=True), n_min=20,
                  n_max=2000)
    return plan.n if plan.decidable else None


def analyse(results: pd.DataFrame, config: Config, *, block: str) -> list[gapdyn.Claim]:
    """One bound claim per setting (violations of the step condition) and one identity row per setting."""
    from gapdyn.evidence.coverage import min_valid_n, valid_at
    from gapdyn.evidence.stats import clopper_pearson_upper

    rng = np.random.default_rng([29, 0 if block == "discovery" else 1])
    claims = []
    for setting in SETTINGS:
        sub = results[results["setting"] == setting]
        n_inst = sub["instance"].nunique()
        label = "contextual log-linear bandit, K=100, d=16, 10 correct" if setting == "T=1" else (
            f"partial-sharing token model, T=8, rho={config.rho:g}, V=10, d=4, MAJ")
        rows = sub[sub["measure"] == BOUND_MEASURE]
        states = distinct_states(rows[rows["step"] >= 0])
        k, n = violation_share(rows)
        cons, cons_text = _conservativeness(states)
        anchors = sub.drop_duplicates("instance")["anchor_status"].value_counts().to_dict()
        by_anchor = "; ".join(f"{a}: {int(g['violated'].astype(bool).sum())}/{len(g)}"
                              for a, g in states.groupby("anchor_status"))
        lost = sub[sub["measure"] == ""]["status"].value_counts().to_dict()
        setting_text = (f"{label}; exact GRPO run from J={config.J_start:g} at eta = {config.eta_frac:g} x "
                        f"min(the one-step threshold at theta0, {config.eta_cap:g}), <= {config.max_steps} steps; "
                        f"checkpoints at J >= {list(config.levels)}: {n} distinct states ({len(rows)} checkpoints) "
                        f"of {states['instance'].nunique()}/{n_inst} instances"
                        + (f" (no checkpoint: {lost})" if lost else "")
                        + f"; restart horizon {config.horizon} steps, collapse by the terminal rule; eta*(theta0) "
                          f"in [{config.eta_lo:g}, {config.eta_hi:g}] ({anchors}); violations {k}/{n} (by eta*(theta0) "
                          f"status: {by_anchor}); {cons_text}")
        cid = _slope_id(setting, BOUND_MEASURE)
        statistic = ("share of distinct states whose bound step eta = c (1 - J)/T collapses (restarted exact GRPO), "
                     "one-sided upper Clopper-Pearson limit")
        if n == 0 or not valid_at("clopper_pearson_upper", n):
            m = min_valid_n("clopper_pearson_upper")
            reason = ("no state reached" if n == 0 else
                      f"too few states for a valid interval (n = {n}; clopper_pearson_upper valid from n = {m})")
            est = gapdyn.evidence.stats.not_measured(0.0, 1.0, estimate=0.0)
            claims.append(replace(make_claim(SPECS, cid, est, block=block, setting=setting_text, statistic=statistic),
                                  measured=False, reason=reason))
        else:
            est = clopper_pearson_upper(k, n)
            claims.append(replace(make_claim(SPECS, cid, est, block=block, setting=setting_text, statistic=statistic),
                                  conservativeness=cons, n_planned=_planned_n(k, n)))
        g = distinct_states(sub[(sub["measure"] == "sharp_grpo") & (sub["status"] == "ok")])
        h = distinct_states(sub[(sub["measure"] == "sharp_gap") & (sub["status"] == "ok")])
        both = g.merge(h, on=["instance", "step"], suffixes=("_grpo", "_gap"))
        id_setting = (f"{label}; the distinct states of the bound claim ({len(both)} with both one-step thresholds "
                      "finite; where one is infinite so is the other)")
        statistic = "mean log(eta_grpo c_G(J) / eta_gap) over states with both thresholds finite"
        if both["instance"].nunique() >= 2:
            lr = np.log(both["eta_local_grpo"] * both["scalar_grpo"] / both["eta_local_gap"]).to_numpy()
            est = gapdyn.cluster_bootstrap(np.mean, lr, clusters=both["instance"].to_numpy(), rng=rng,
                                           n_resamples=config.n_boot)
            claims.append(make_claim(SPECS, _identity_id(setting), est, block=block, setting=id_setting,
                                     statistic=statistic))
        else:
            est = gapdyn.evidence.stats.not_measured(0.0, 0.0)
            claims.append(replace(make_claim(SPECS, _identity_id(setting), est, block=block, setting=id_setting,
                                             statistic=statistic), measured=False,
                                  reason=f"fewer than 2 instances with both one-step thresholds finite "
                                         f"({both['instance'].nunique()})"))
    return claims


def run(config: Config, *, store=None, backend: str = "joblib", n_jobs: int = -1, progress: bool = True):
    """ExperimentResult through :func:`bandits.experiments._common.run_experiment` (resumable with a store)."""
    return run_experiment(EXPERIMENT, config, store=store, backend=backend, n_jobs=n_jobs,
                          progress=progress)


EXPERIMENT = Experiment(name=NAME, claims=SPECS, config=Config, cells=cells, run_cell=run_cell, analyse=analyse)
"""This experiment in the one protocol (gapdyn.evidence.experiment.Experiment)."""
