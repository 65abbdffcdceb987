"""Experiment 3: the critical step eta* against the initial success rate J0 (Suk & Duan Thm 3's (1 - J)
factor; gapdyn.predicted_critical_step with T = 1).

For each instance (single-context log-linear bandit, K = 100, d = 16, 10 correct arms) theta0 is placed on
a ray (bandits.envs.place_theta) so that J(theta0) = J0 for several J0. Exact GRPO: eta* = the first
collapsing eta of a geometric grid, refined by bisection. Sampled GRPO: the onset eta_s = the first grid
eta where some of n_seeds runs collapses, and P(collapse) at each eta. The (1 - J) law predicts
log eta* = log(1 - J0) + const, i.e. a slope of 1 against log(1 - J0).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

import gapdyn
from bandits.engine import Dynamics, simulate
from bandits.envs import make_bandit, place_theta

from ._common import COLLAPSE_J, first_collapse, fmt_range, refine_threshold, run_experiment, verdict, verdict_table

NAME = "success_rate"


@dataclass(frozen=True)
class Config:
    """Experiment 3 settings."""

    mode: str = "full"
    instances: tuple[int, ...] = tuple(range(20))
    """make_bandit seeds (one context each)."""
    J0s: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.85)
    n_arms: int = 100
    dim: int = 16
    n_correct: int = 10
    method: str = "grpo"
    group_size: int = 8
    steps: int = 1500
    eta_min: float = 0.1
    eta_max: float = 1e5
    n_grid: int = 49
    refine_rounds: int = 2
    n_seeds: int = 24
    sampled_steps: int = 300
    n_sampled_grid: int = 25

    @classmethod
    def quick(cls) -> "Config":
        return cls(mode="quick", instances=(5, 6, 13), J0s=(0.05, 0.2, 0.5), steps=300, eta_min=1.0, eta_max=1e4,
                   n_grid=17, refine_rounds=1, n_seeds=6, sampled_steps=100, n_sampled_grid=9)  # fmt: skip

    @classmethod
    def full(cls) -> "Config":
        return cls()


def cells(config: Config) -> list[dict]:
    common = {k: v for k, v in asdict(config).items() if k not in ("mode", "instances", "J0s")}
    return [{"instance": i, "J0": J0, **common} for i in config.instances for J0 in config.J0s]


def run_cell(
    *, instance, J0, n_arms, dim, n_correct, method, group_size, steps, eta_min, eta_max, n_grid, refine_rounds,
    n_seeds, sampled_steps, n_sampled_grid,
) -> pd.DataFrame:  # fmt: skip
    bandit = make_bandit(n_contexts=1, n_arms=n_arms, dim=dim, n_correct=n_correct, seed=instance)
    theta0 = place_theta(bandit, J0)
    etas = np.geomspace(eta_min, eta_max, n_grid)
    dyn = Dynamics(method=method, mode="exact", group_size=group_size, steps=steps, record_every=steps)
    Jf = simulate(bandit, dyn, eta=etas, theta0=theta0).J_final[:, 0]
    i = first_collapse(Jf)
    rows = [{"kind": "exact_grid", "eta": e, "J_final": j} for e, j in zip(etas, Jf)]
    if i > 0:
        lo, hi, jlo, jhi = refine_threshold(bandit, dyn, etas[i - 1], etas[i], theta0=theta0, rounds=refine_rounds)
        rows.append({"kind": "exact_star", "eta": float(np.sqrt(lo * hi)), "J_final": jhi})
    else:
        rows.append({"kind": "exact_star", "eta": np.inf if i < 0 else etas[0], "J_final": np.nan})
    s_etas = np.geomspace(eta_min, eta_max, n_sampled_grid)
    E, S = np.meshgrid(s_etas, np.arange(n_seeds), indexing="ij")
    sdyn = Dynamics(method=method, mode="sampled", group_size=group_size, steps=sampled_steps, record_every=sampled_steps)
    Js = simulate(bandit, sdyn, eta=E.ravel(), seed=S.ravel(), theta0=theta0).J_final[:, 0]
    pcol = (Js < COLLAPSE_J).reshape(E.shape).mean(axis=1)
    rows += [{"kind": "sampled_pcollapse", "eta": e, "J_final": p} for e, p in zip(s_etas, pcol)]
    onset = s_etas[np.argmax(pcol > 0)] if (pcol > 0).any() else np.inf
    rows.append({"kind": "sampled_onset", "eta": onset, "J_final": np.nan})
    df = pd.DataFrame(rows)
    df["J0_measured"] = float(bandit.success_rate(theta0)[0])
    return df


def _slopes(tab: pd.DataFrame) -> tuple[np.ndarray, float, float, int]:
    """Per-instance slopes of log eta* vs log(1 - J0) (>= 3 finite points) and a pooled within-instance fit."""
    per, xs, ys = [], [], []
    for _, g in tab.groupby("instance"):
        g = g[np.isfinite(g["eta"])]
        if len(g) >= 3:
            fit = gapdyn.loglog_slope(1 - g["J0"].to_numpy(), g["eta"].to_numpy())
            per.append(fit.slope)
        if len(g) >= 2:
            x, y = np.log(1 - g["J0"].to_numpy()), np.log(g["eta"].to_numpy())
            xs.append(x - x.mean())
            ys.append(y - y.mean())
    if not xs:
        return np.array(per), np.nan, np.nan, 0
    x, y = np.concatenate(xs), np.concatenate(ys)
    slope = float(np.sum(x * y) / np.sum(x * x)) if np.sum(x * x) > 0 else np.nan
    resid = y - slope * x
    se = float(np.sqrt(np.sum(resid**2) / max(len(x) - len(xs) - 1, 1) / np.sum(x * x))) if np.sum(x * x) > 0 else np.nan
    return np.array(per), slope, se, len(x)


def analyse(results: pd.DataFrame, config: Config) -> pd.DataFrame:
    rows = []
    for kind, label in (("exact_star", "exact GRPO eta*"), ("sampled_onset", "sampled GRPO onset eta_s")):
        tab = results[results["kind"] == kind][["instance", "J0", "eta"]]
        finite = np.isfinite(tab["eta"])
        share = tab.assign(f=finite).groupby("J0")["f"].mean()
        rows.append(verdict(
            f"{label}: share of instances with a finite critical step, by J0", f"{len(config.instances)} instances",
            "; ".join(f"J0={j:g}: {v:.2f}" for j, v in share.items()), "(1-J) law presumes one exists",
            "holds" if share.min() == 1 else "holds only in some instances",
        ))  # fmt: skip
        per, slope, se, n = _slopes(tab)
        rows.append(verdict(
            f"{label} scales like (1 - J0): slope of log eta* vs log(1 - J0)",
            f"J0 in {list(config.J0s)}; pooled within-instance fit, n={n} points",
            f"pooled slope {slope:.2f} +- {se:.2f}; per instance {fmt_range(per)}", "1 (gapdyn.predicted_critical_step)",
            "inconclusive (too few finite points)" if not np.isfinite(se) or se > 0.3 or n < 6
            else ("holds" if abs(slope - 1) < max(2 * se, 0.25) else "does not hold"),
        ))  # fmt: skip
        # measured / predicted with the reference at each instance's smallest finite J0
        ratios = []
        for _, g in tab[finite].groupby("instance"):
            g = g.sort_values("J0")
            if len(g) >= 2:
                pred = gapdyn.predicted_critical_step(g["eta"].iloc[0], 1.0, g["J0"].to_numpy(), J_ref=g["J0"].iloc[0])
                ratios.append(g["eta"].to_numpy()[1:] / pred[1:])
        ratios = np.concatenate(ratios) if ratios else np.array([])
        rows.append(verdict(
            f"{label}: measured / predicted_critical_step (reference = smallest J0 of the instance)", "",
            f"{fmt_range(ratios)}", "1", "holds" if ratios.size and np.all(np.abs(np.log(ratios)) < np.log(2)) else "does not hold",
        ))  # fmt: skip
    return verdict_table(rows)


def run(config: Config, *, store=None, backend="joblib", n_jobs=-1, progress=True):
    """(results, verdict) through bandits.sweep.run_sweep."""
    import sys

    return run_experiment(sys.modules[__name__], config, store=store, backend=backend, n_jobs=n_jobs, progress=progress)
