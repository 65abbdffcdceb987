"""Experiment 3 `success_rate`: the LOCAL critical step against the success rate J along trajectories
(Suk & Duan, arXiv 2510.08539, Thm 3: the safe step shrinks ~ (1 - J)/T, i.e. slope +1 of log eta
against log(1 - J)).

For each instance a run of exact GRPO (expected update, G = 8) at a small fixed eta starts from theta0
placed at J = J_start and is stopped at checkpoints: the first step at which J reaches each level of
``levels``. At every checkpoint theta_k three local thresholds are computed (MEASURES): the one-step sharp
threshold gapdyn.sharp_step_threshold (the largest eta with Phi(theta_k + e w) > Phi(theta_k) for all
e <= eta, docs/equations.md §3) for w = E[w_GRPO] = c_G(J) Gap and for w = Gap (log-odds ascent), and
eta* of exact GRPO restarted at theta_k over a short horizon (gapdyn.find_eta_star). The slope of
log eta_local on log(1 - J) is fitted within each trajectory (centred per instance) and its 95 %
interval is a cluster bootstrap over instances (:mod:`bandits.experiments._slopes`).

Two settings: T = 1, the single-context log-linear bandit of bandits.envs (K = 100 arms, d = 16, 10
correct; trajectory by bandits.engine.simulate) and T = 8, the partial-sharing token model of
bandits.partial (rho = 0.5, V = 10, d = 4, rule MAJ; trajectory by bandits.sequence.simulate).
An instance enters a fit with its checkpoints where the threshold is finite and > 0 when there are
at least three; the others are counted by reason. E[w_GRPO] = c_G(J) Gap, so its threshold is the
Gap's divided by c_G(J) exactly: an identity row per setting.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

import gapdyn

from ..engine import Dynamics
from ..engine import simulate as simulate_contextual
from ..envs import make_bandit, place_theta
from ..partial import PartialSharingBandit
from ..sequence import SequenceDynamics, place_for_success_rate
from ..sequence import simulate as simulate_sequence
from ._common import run_experiment, run_stats
from ._slopes import within_slope_estimate

__all__ = ["NAME", "CRITERIA", "SETTINGS", "MEASURES", "Config", "cells", "run_cell", "checkpoints", "analyse",
           "slope_claim_id", "fit_points", "run"]

NAME = "success_rate"
SETTINGS = ("T=1", "T=8")
"""T = 1: contextual log-linear bandit; T = 8: partial-sharing token model (rho = 0.5)."""
MEASURES = ("sharp_grpo", "sharp_gap", "restart_grpo")
"""Local thresholds at a checkpoint theta_k: the sharp one-step threshold along E[w_GRPO] and along the Gap
(gapdyn.sharp_step_threshold), and the critical step of exact GRPO restarted at theta_k over a short
horizon (gapdyn.find_eta_star; collapse as everywhere, J < gapdyn.COLLAPSE_J)."""
_SOURCE = "Suk & Duan (arXiv 2510.08539), Thm 3"


def _slope_id(setting: str, measure: str) -> str:
    return f"local_eta_vs_1-J/{setting}/{measure}"


def slope_claim_id(setting: str, measure: str) -> str:
    """Id of the claim on the slope of log eta_local on log(1 - J) for one (setting, measure)."""
    return _slope_id(setting, measure)


def _identity_id(setting: str) -> str:
    return f"grpo_threshold_times_cG_over_gap/{setting}"


# written from the theorem before any run: eta ~ (1 - J), slope +1 (stated tolerance 0.25)
CRITERIA: dict[str, gapdyn.Criterion] = {
    **{_slope_id(s, m): gapdyn.Criterion.contains(1.0, tol=0.25) for s in SETTINGS for m in MEASURES},
    **{_identity_id(s): gapdyn.Criterion.identity(0.0, tol=1e-3) for s in SETTINGS},
}
FORMS: dict[str, str] = {
    **{_slope_id(s, m): "bound" for s in SETTINGS for m in MEASURES},
    **{_identity_id(s): "identity" for s in SETTINGS},
}
"""The form of each claim's statement (gapdyn.FORMS)."""
_SLOPE_TEXT = "95 % interval of the slope of log eta_local on log(1 - J) contains +1 and lies in [0.75, 1.25]"
_ID_TEXT = "identity: eta_local(E[w_GRPO]) c_G(J) = eta_local(Gap); mean log ratio 0 +- 1e-3"


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
        if self.mode not in ("test", "quick", "full"):
            raise ValueError(f"mode must be 'test', 'quick' or 'full', got {self.mode!r}")
        lv = np.asarray(self.levels, float)
        if lv.size < 3 or np.any(np.diff(lv) <= 0) or lv[0] <= self.J_start or lv[-1] >= 1:
            raise ValueError(f"levels must be >= 3 increasing values in (J_start, 1), got {self.levels!r}")
        if not 0 < self.J_start < 1:
            raise ValueError(f"J_start must lie in (0, 1), got {self.J_start!r}")
        if not 0 < self.eta_frac < 1:
            raise ValueError(f"eta_frac must lie in (0, 1), got {self.eta_frac!r}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps!r}")


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
            self._dyn = lambda steps: Dynamics(method="grpo", mode="exact", group_size=G, steps=steps)
        elif setting == "T=8":
            self.env = PartialSharingBandit.random(T=8, rho=config_like["rho"], seed=instance)
            self.logodds = lambda th: float(self.env.log_odds(th))
            u = self.env.gap(np.zeros(self.env.d))
            self.theta0 = place_for_success_rate(self.env, u / np.linalg.norm(u), config_like["J_start"])
            self._dyn = lambda steps: SequenceDynamics(method="grpo", mode="exact", group_size=G, steps=steps)
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
        """What decides the outcome (gapdyn.run_outcome) of ``steps`` exact GRPO steps from theta, per eta."""
        if self.setting == "T=1":
            tr = simulate_contextual(self.bandit, self._dyn(steps), eta=etas, theta0=theta[None])
            return run_stats(tr, 0)
        dyn = SequenceDynamics(method="grpo", mode="exact", group_size=self.G, steps=steps)
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


def run_cell(*, setting: str, instance: int, levels, J_start: float, group_size: int, eta_frac: float,
             eta_cap: float, max_steps: int, rho: float, horizon: int, eta_lo: float, eta_hi: float,
             max_ratio: float) -> pd.DataFrame:
    """Local thresholds at the checkpoints of one instance's trajectory: one row per (checkpoint, measure)."""
    cfg = {"group_size": group_size, "J_start": J_start, "rho": rho}
    try:
        prob = _Problem(setting, instance, cfg)
    except ValueError as exc:
        return pd.DataFrame([{"status": f"no start: {exc}"[:80], "level": np.nan, "step": -1, "J": np.nan,
                              "one_minus_J": np.nan, "measure": "", "eta_local": np.nan, "scalar": np.nan,
                              "eta_run": np.nan}])
    J0, Jb0, gap0 = prob.state(prob.theta0)
    c0 = float(gapdyn.expected_scalar("grpo", J0, group_size))
    eta_run = eta_frac * min(prob.threshold(prob.theta0, c0 * gap0), eta_cap)
    if not eta_run > 0:
        return pd.DataFrame([{"status": "not ascent at theta0", "level": np.nan, "step": -1, "J": J0,
                              "one_minus_J": Jb0, "measure": "", "eta_local": np.nan, "scalar": c0,
                              "eta_run": np.nan}])
    rows = []
    for level, k, theta in checkpoints(prob, eta_run, levels, max_steps):
        J, Jb, gap = prob.state(theta)
        c = float(gapdyn.expected_scalar("grpo", J, group_size))
        for measure, w in (("sharp_grpo", c * gap), ("sharp_gap", gap)):
            eta = prob.threshold(theta, w)
            status = "ok" if np.isfinite(eta) and eta > 0 else ("no crossing in range" if eta > 0 else "not ascent")
            rows.append({"status": status, "level": level, "step": k, "J": J, "one_minus_J": Jb,
                         "measure": measure, "eta_local": eta, "scalar": c, "eta_run": eta_run})
        res = gapdyn.find_eta_star(lambda e, th=theta: prob.run_stats(th, e, horizon), eta_lo, eta_hi, max_ratio=max_ratio)
        rows.append({"status": "ok" if res.status == "found" else res.status, "level": level, "step": k, "J": J,
                     "one_minus_J": Jb, "measure": "restart_grpo", "eta_local": res.eta_star, "scalar": c,
                     "eta_run": eta_run})
    if not rows:
        rows.append({"status": "no level reached", "level": np.nan, "step": -1, "J": J0, "one_minus_J": Jb0,
                     "measure": "", "eta_local": np.nan, "scalar": c0, "eta_run": eta_run})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# analysis


def _usable(df: pd.DataFrame) -> pd.DataFrame:
    ok = df[(df["status"] == "ok")]
    n = ok.groupby("instance")["level"].transform("nunique")
    return ok[n >= 3]


def fit_points(results: pd.DataFrame) -> pd.DataFrame:
    """The checkpoints a slope claim fits, for the rows of one (setting, measure)."""
    return _usable(results)


def analyse(results: pd.DataFrame, config: Config, *, block: str) -> list[gapdyn.Claim]:
    """One slope claim per (setting, measure) and one identity row per setting."""
    rng = np.random.default_rng([29, 0 if block == "discovery" else 1])
    claims = []
    for setting in SETTINGS:
        sub = results[results["setting"] == setting]
        n_inst = sub["instance"].nunique()
        label = "contextual log-linear bandit, K=100, d=16, 10 correct" if setting == "T=1" else (
            f"partial-sharing token model, T=8, rho={config.rho:g}, V=10, d=4, MAJ")
        for measure in MEASURES:
            d = sub[sub["measure"] == measure]
            used = _usable(d)
            no_rows = sub.groupby("instance")["measure"].apply(lambda s: (s == "").all())
            why = d["status"].value_counts().to_dict()
            why.update({k: v for k, v in sub[sub["instance"].isin(no_rows[no_rows].index)]["status"]
                        .value_counts().items()})
            setting_text = (f"{label}; exact GRPO run from J={config.J_start:g} at eta = {config.eta_frac:g} x "
                            f"min(the local threshold at theta0, {config.eta_cap:g}), <= {config.max_steps} steps; "
                            f"checkpoints at J >= "
                            f"{list(config.levels)}; {used['instance'].nunique()}/{n_inst} instances with >= 3 "
                            f"finite thresholds; point status counts {why}")
            common = dict(id=_slope_id(setting, measure), source=_SOURCE,
                          statement="the local critical step scales like (1 - J): slope +1 of log eta on log(1 - J)",
                          setting=setting_text, criterion_text=_SLOPE_TEXT,
                          criterion=CRITERIA[_slope_id(setting, measure)], block=block,
                          form=FORMS[_slope_id(setting, measure)])
            if used["instance"].nunique() >= 2:
                est = within_slope_estimate(np.log(used["one_minus_J"].to_numpy()),
                                            np.log(used["eta_local"].to_numpy()),
                                            series=used["instance"].to_numpy(), instance=used["instance"].to_numpy(),
                                            rng=rng, n_resamples=config.n_boot)
                claims.append(gapdyn.Claim.from_estimate(
                    est, statistic=f"within-trajectory OLS slope of log eta_local ({measure}) on log(1 - J), "
                                   "cluster bootstrap over instances", **common))
            else:
                claims.append(gapdyn.Claim(**common, estimate=0.0, interval=(0.0, 0.0), n=1,
                                           statistic=f"within-trajectory OLS slope of log eta_local ({measure}) on "
                                                     "log(1 - J)", measured=False,
                                           reason="fewer than 2 usable instances: no interval"))
        g = sub[(sub["measure"] == "sharp_grpo") & (sub["status"] == "ok")]
        h = sub[(sub["measure"] == "sharp_gap") & (sub["status"] == "ok")]
        both = g.merge(h, on=["instance", "level"], suffixes=("_grpo", "_gap"))
        common = dict(id=_identity_id(setting), source=_SOURCE + " (E[w] = c_G(J) Gap: by construction)",
                      statement="the GRPO direction's local threshold is the Gap's divided by c_G(J)",
                      setting=f"{label}; the checkpoints of the slope claims ({len(both)} with both finite)",
                      criterion_text=_ID_TEXT, criterion=CRITERIA[_identity_id(setting)], block=block)
        if both["instance"].nunique() >= 2:
            lr = np.log(both["eta_local_grpo"] * both["scalar_grpo"] / both["eta_local_gap"]).to_numpy()
            est = gapdyn.cluster_bootstrap(np.mean, lr, clusters=both["instance"].to_numpy(), rng=rng,
                                           n_resamples=config.n_boot)
            claims.append(gapdyn.Claim.from_estimate(est, statistic="mean log(eta_grpo c_G(J) / eta_gap)", **common))
        else:
            claims.append(gapdyn.Claim(**common, estimate=1.0, interval=(1.0, 1.0), n=1,
                                       statistic="mean log(eta_grpo c_G(J) / eta_gap)", measured=False,
                                       reason="fewer than 2 instances"))
    return claims


def run(config: Config, *, store=None, backend: str = "joblib", n_jobs: int = -1, progress: bool = True):
    """ExperimentResult through :func:`bandits.experiments._common.run_experiment` (resumable with a store)."""
    return run_experiment(sys.modules[__name__], config, store=store, backend=backend, n_jobs=n_jobs,
                          progress=progress)
