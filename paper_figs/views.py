"""Tables that the figures draw, cut from the bandit experiments' tidy results (or from a Trajectory).

Each function selects and reshapes one experiment's ``run`` output (or calls that experiment's own
analysis helpers, e.g. ``threshold.critical_steps``); the science stays in ``bandits``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

import gapdyn

from ._common import _import, _require_cols

__all__ = [
    "trajectory_frame",
    "final_frame",
    "PREDICTORS",
    "ThresholdViews",
    "threshold_views",
    "critical_vs_length",
    "success_rate_view",
    "success_rate_phase",
    "methods_view",
    "methods_summary",
    "stagnation_parts",
    "stagnation_trajectories",
    "logistic_fit_rows",
    "logistic_thm1_rows",
]


def trajectory_frame(traj, etas=None, seeds=None, *, context: int = 0) -> pd.DataFrame:
    """A ``bandits.engine.Trajectory`` as a tidy table: one row per (run, recorded step) of one context.

    Columns: run, eta, seed, step, J, Phi, M, dmu, entropy (etas/seeds per run default to the
    trajectory's eta0 of block 0 / its seeds)."""
    R, n = traj.J.shape[:2]
    eta = np.asarray(traj.eta0[:, 0] if etas is None else etas, float).reshape(R)
    seed = np.asarray(traj.seed if seeds is None else seeds).reshape(R)
    steps = np.asarray(traj.steps)
    return pd.DataFrame({
        "run": np.repeat(np.arange(R), n),
        "eta": np.repeat(eta, n),
        "seed": np.repeat(seed, n),
        "step": np.tile(steps, R),
        **{k: getattr(traj, k)[:, :, context].ravel() for k in ("J", "Phi", "M", "dmu", "entropy")},
    })


def final_frame(traj, etas=None, seeds=None, *, context: int = 0) -> pd.DataFrame:
    """One row per run: eta, seed, J_final, J_min, M_final of one context."""
    R = traj.J_final.shape[0]
    return pd.DataFrame({
        "eta": np.asarray(traj.eta0[:, 0] if etas is None else etas, float).reshape(R),
        "seed": np.asarray(traj.seed if seeds is None else seeds).reshape(R),
        "J_final": traj.J_final[:, context],
        "J_min": traj.J_min[:, context],
        "M_final": traj.M_final[:, context],
    })


PREDICTORS: dict[str, str] = {
    "eta_star": "measured eta*",
    "pred_sharp": "one-step sharp threshold",
    "pred_local": "local curvature threshold",
    "pred_thm1": "Theorem 1 step bound",
    "monotone_edge": "Phi-monotone edge",
}
"""Columns of ``threshold.critical_steps`` drawn as threshold markers, and their legend names."""


class ThresholdViews(NamedTuple):
    """Tables of the ``threshold`` experiment for figure 1 (rows = instances ordered by eta*, then J0).

    critical: threshold.critical_steps(results) + ``row``; exact: final J of the constant-step exact
    runs (instance, method, eta, J_final, row); sampled: P(collapse) of sampled GRPO with constant
    steps per (instance, eta, row); predictors: long table (method, row, predictor, eta_pred).
    """

    critical: pd.DataFrame
    exact: pd.DataFrame
    sampled: pd.DataFrame
    predictors: pd.DataFrame


def threshold_views(results: pd.DataFrame) -> ThresholdViews:
    """Split the ``threshold`` experiment's tidy results into the tables figure 1 draws."""
    mod = _import("bandits.experiments.threshold", "figure 1")
    crit = mod.critical_steps(results)
    order = (crit[crit["method"] == "grpo"].assign(fin=lambda d: np.isfinite(d["eta_star"]))
             .sort_values(["fin", "eta_star", "J0"], ascending=[False, True, True])["instance"].tolist())
    order += [i for i in sorted(crit["instance"].unique()) if i not in order]
    row = {inst: k for k, inst in enumerate(order)}
    crit = crit.assign(row=crit["instance"].map(row))
    ex = results[(results["kind"] == "exact") & (results["phase"] == "grid") & (results["schedule"] == "constant")]
    exact = ex.loc[:, ["instance", "method", "eta", "J_final"]].assign(row=lambda d: d["instance"].map(row))
    sp = results[(results["kind"] == "sampled") & (results["schedule"] == "constant")]
    sampled = (sp.assign(collapsed=(sp["J_final"] < mod.COLLAPSE_J).astype(float))
               .groupby(["instance", "eta"], as_index=False)["collapsed"].mean()
               .rename(columns={"collapsed": "p_collapse"}).assign(row=lambda d: d["instance"].map(row)))
    long = crit.melt(id_vars=["method", "instance", "row"], value_vars=[c for c in PREDICTORS if c in crit],
                     var_name="predictor", value_name="eta_pred")
    long["predictor"] = long["predictor"].map(PREDICTORS)
    return ThresholdViews(crit, exact, sampled, long)


def critical_vs_length(results: pd.DataFrame, config) -> pd.DataFrame:
    """eta* per (setting, instance, T) from the ``length`` experiment (its own ``critical_table``), plus
    ``eta_star_rel`` = eta* / eta*(smallest T with a finite eta*) of the same (setting, instance), so
    that instances with different scales can share one log-log plot."""
    mod = _import("bandits.experiments.length", "figure 2")
    crit = mod.critical_table(results, getattr(config, "level", 0.5))
    crit = crit.sort_values(["setting", "instance", "T"]).reset_index(drop=True)

    def rel(g):
        fin = g[np.isfinite(g["eta_star"])]
        ref = float(fin["eta_star"].iloc[0]) if len(fin) else np.nan
        return g["eta_star"] / ref

    crit["eta_star_rel"] = crit.groupby(["setting", "instance"], group_keys=False)[["eta_star", "T"]].apply(rel)
    return crit


def _relative_to_first(df: pd.DataFrame, by: list[str], x: str, y: str) -> pd.Series:
    """y / y(smallest x with a finite y) within each group of ``by`` (NaN when a group has none)."""

    def rel(g):
        g = g.sort_values(x)
        fin = g[np.isfinite(g[y])]
        return g[y] / (float(fin[y].iloc[0]) if len(fin) else np.nan)

    return df.groupby(by, group_keys=False)[[x, y]].apply(rel).reindex(df.index)


def success_rate_view(results: pd.DataFrame, verdict: pd.DataFrame | None = None) -> pd.DataFrame:
    """eta* against 1 - J0 from the ``success_rate`` experiment, one row per (series, instance, J0).

    series: "exact GRPO eta*" (kind exact_star) and "sampled GRPO onset" (kind sampled_onset);
    eta_star_rel = eta* / eta*(smallest J0 with a finite eta*) of the same instance and series."""
    _require_cols(results, ["kind", "instance", "J0", "eta"], "success_rate results")
    names = {"exact_star": "exact GRPO eta*", "sampled_onset": "sampled GRPO onset"}
    d = results[results["kind"].isin(list(names))].loc[:, ["kind", "instance", "J0", "eta"]].copy()
    d["series"] = d["kind"].map(names)
    d = d.rename(columns={"eta": "eta_star"}).reset_index(drop=True)
    d["one_minus_J"] = 1.0 - d["J0"]
    d["eta_star_rel"] = _relative_to_first(d, ["series", "instance"], "J0", "eta_star")
    return d


def success_rate_phase(results: pd.DataFrame, verdict: pd.DataFrame | None = None):
    """(grid, curves) from the ``success_rate`` experiment for a phase diagram over (eta, J0).

    grid: final J of exact GRPO per (instance, J0, eta) (plot the mean over instances);
    curves: per J0, the median over instances of the finite measured eta* ("measured eta* (median)")
    and gapdyn.predicted_critical_step's (1 - J) law anchored at the smallest J0's median ("(1 - J) law")."""
    _require_cols(results, ["kind", "instance", "J0", "eta", "J_final"], "success_rate results")
    grid = results[results["kind"] == "exact_grid"].loc[:, ["instance", "J0", "eta", "J_final"]]
    star = results[(results["kind"] == "exact_star") & np.isfinite(results["eta"])]
    med = star.groupby("J0")["eta"].median().sort_index()
    rows = [{"curve": "measured eta* (median)", "J0": j, "eta_star": e} for j, e in med.items()]
    if len(med):
        pred = gapdyn.predicted_critical_step(float(med.iloc[0]), 1.0, med.index.to_numpy(float),
                                              J_ref=float(med.index[0]))
        rows += [{"curve": "(1 - J) law (Thm 3)", "J0": j, "eta_star": float(e)} for j, e in zip(med.index, pred)]
    return grid, pd.DataFrame(rows, columns=["curve", "J0", "eta_star"])


def methods_view(results: pd.DataFrame) -> pd.DataFrame:
    """Per (sampling, method, eta) of the ``methods`` experiment: P_collapse, mean final J, share of runs
    reaching J >= 0.9 and the median steps to it (over the runs that reach it)."""
    _require_cols(results, ["sampling", "method", "eta", "collapsed", "J_final", "steps_to_09"], "methods results")
    R = results.assign(collapsed=results["collapsed"].astype(float))

    def med(x):
        x = x[np.isfinite(x)]
        return float(np.median(x)) if len(x) else np.nan

    g = R.groupby(["sampling", "method", "eta"], sort=False)
    return pd.DataFrame({
        "P_collapse": g["collapsed"].mean(),
        "J_final": g["J_final"].mean(),
        "share_reaching_09": g["steps_to_09"].apply(lambda x: float(np.isfinite(x).mean())),
        "median_steps_to_09": g["steps_to_09"].apply(med),
    }).reset_index()


def methods_summary(results: pd.DataFrame) -> pd.DataFrame:
    """The ``methods`` experiment's own per-method summary (P_collapse, scalar_at_J0, entropies)."""
    mod = _import("bandits.experiments.methods", "figure 6")
    return mod.summary(results)


def stagnation_parts(results: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The ``stagnation`` experiment's rows split by part (single, interference, tabular_shared,
    unreachable, adam, controllers); the failure rate of the long runs in long form as ``fail_curve``
    (part, method, mode, optimizer, eta, seed, instance, step, fail) at the three recorded points
    k = K/10, K/2, K."""
    _require_cols(results, ["part"], "stagnation results")
    out = {p: g.reset_index(drop=True) for p, g in results.groupby("part")}
    long = results[results["part"] != "controllers"]
    if len(long) and {"fail_10pct", "fail_half", "fail_final", "steps"} <= set(long.columns):
        K = long["steps"].astype(float)
        pts = []
        for col, frac in (("fail_10pct", 0.1), ("fail_half", 0.5), ("fail_final", 1.0)):
            pts.append(long.assign(step=np.floor(K * frac), fail=long[col]))
        out["fail_curve"] = pd.concat(pts, ignore_index=True)
    return out


def stagnation_trajectories(config, *, instance: int = 0, etas=None, steps: int | None = None,
                            n_seeds: int | None = None, delta: float = 2.0) -> pd.DataFrame:
    """J over steps of sampled GRPO on the ``stagnation`` experiment's controller instance
    (``make_bandit(n_contexts=1, seed=1000 + instance)``, as its ``controllers`` part) at fixed eta and
    under the adaptive controller (trust region ``delta``) started from the same eta0, via
    ``bandits.run_grid``. The stagnation results keep only summaries; these curves show the dynamics
    behind them. Columns: schedule, eta, seed, step, J, M."""
    bandits = _import("bandits", "figure 3's trajectories")
    if etas is None:  # the long runs' fixed etas and the controllers' eta0 grid
        etas = sorted(set(getattr(config, "etas", ())) | set(getattr(config, "controller_etas", (10.0, 1000.0))))
    etas = tuple(float(e) for e in etas)
    steps = int(steps or getattr(config, "controller_steps", 100))
    n_seeds = int(n_seeds or getattr(config, "n_seeds", 4))
    b = bandits.make_bandit(n_contexts=1, seed=1000 + instance)
    frames = []
    for name, sched in (("constant", bandits.Schedule("constant")),
                        (f"adaptive (delta = {delta:g})", bandits.Schedule("adaptive", delta=delta))):
        dyn = bandits.Dynamics(method="grpo", mode="sampled", steps=steps, schedule=sched)
        tr, E, S = bandits.run_grid(b, dyn, etas=etas, seeds=np.arange(n_seeds))
        frames.append(trajectory_frame(tr, E, S).assign(schedule=name))
    return pd.concat(frames, ignore_index=True)


def logistic_fit_rows(results: pd.DataFrame) -> pd.DataFrame:
    """The (M, J) pairs of the ``logistic`` experiment's fit part from non-collapsed runs."""
    _require_cols(results, ["part", "method", "sampling", "M", "J", "J0", "collapsed"], "logistic results")
    fit = results[(results["part"] == "fit")]
    return fit[~fit["collapsed"].astype(bool)].reset_index(drop=True)


def logistic_thm1_rows(results: pd.DataFrame) -> pd.DataFrame:
    """The ``logistic`` experiment's Theorem-1 part: per run factor, meets, above_bound, worst_violation."""
    _require_cols(results, ["part"], "logistic results")
    return results[results["part"] == "thm1"].reset_index(drop=True)
