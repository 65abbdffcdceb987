"""Tables that the figures draw, cut from the experiments' ExperimentResult rows (or from a Trajectory).

Each function selects and reshapes one experiment's ``results`` (or calls that experiment's own
functions, e.g. ``threshold.critical_steps``, ``stagnation.trajectories``); fits, seeds and sizes stay in
the experiments.
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
    "deciding_claims",
    "slope_text",
    "critical_vs_length",
    "length_slopes",
    "SUCCESS_RATE_SHOWN",
    "success_rate_view",
    "methods_view",
    "methods_summary",
    "stagnation_parts",
    "stagnation_trajectories",
    "logistic_fit_rows",
    "logistic_thm1_rows",
    "logistic_slopes",
    "taxonomy_table",
    "taxonomy_summary",
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
    const = results["schedule"].isna() | (results["schedule"] == "constant")  # grid rows carry no schedule
    ex = results[(results["kind"] == "exact") & (results["phase"] == "grid") & const]
    exact = ex.loc[:, ["instance", "method", "eta", "J_final"]].assign(row=lambda d: d["instance"].map(row))
    sp = results[(results["kind"] == "sampled") & (results["schedule"] == "constant")]
    collapsed = sp["collapsed"].astype(float) if "collapsed" in sp else (sp["J_final"] < gapdyn.COLLAPSE_J)
    sampled = (sp.assign(collapsed=collapsed.astype(float))
               .groupby(["instance", "eta"], as_index=False)["collapsed"].mean()
               .rename(columns={"collapsed": "p_collapse"}).assign(row=lambda d: d["instance"].map(row)))
    long = crit.melt(id_vars=["method", "instance", "row"], value_vars=[c for c in PREDICTORS if c in crit],
                     var_name="predictor", value_name="eta_pred")
    long["predictor"] = long["predictor"].map(PREDICTORS)
    return ThresholdViews(crit, exact, sampled, long)


def deciding_claims(result) -> tuple[str, dict]:
    """(block, {claim id: Claim}) of an ExperimentResult's deciding block: confirmation when it ran, else
    discovery (its rows are the ones to draw next to these claims)."""
    block = "confirmation" if result.block("confirmation") else "discovery"
    return block, {c.id: c for c in result.block(block)}


def slope_text(name: str, claim) -> tuple[float | None, str]:
    """(slope to draw or None, legend text) from a slope claim: 'name: slope b [lo, hi]' (the claim's
    estimate and interval), or why there is none."""
    if claim is None:
        return None, f"{name}: no claim"
    if claim.n < 2 or not claim.measured:
        return None, f"{name}: < 2 instances, no slope"
    lo, hi = claim.interval
    return float(claim.estimate), f"{name}: slope {claim.estimate:.2f} [{lo:.2f}, {hi:.2f}]"


def critical_vs_length(result) -> pd.DataFrame:
    """The ``length`` experiment's eta* that its slope claims fit (``length.fit_points``, deciding block),
    one row per (instance, seed, rho, J0, normalized, T), with ``label`` (rho, raw or 1/|o|) and
    ``eta_star_rel`` = eta* / eta*(smallest T) of the same series, so that series share one log-log plot."""
    length = _import("bandits.experiments.length", "the 'length' experiment")
    block, _ = deciding_claims(result)
    results = result.results
    _require_cols(results, ["status", "eta_star", "instance", "seed", "rho", "J0", "normalized", "T"],
                  "length results")
    res = results[results["block"] == block] if "block" in results else results
    res = res.assign(normalized=res["normalized"].astype(bool))
    by = ["instance", "seed", "rho", "J0", "normalized"]
    parts = [length.fit_points(g) for _, g in res.groupby(["rho", "J0", "normalized"])]
    crit = pd.concat(parts) if parts else res.iloc[0:0]
    crit = crit.assign(label=[_length_label(r, n) for r, n in zip(crit["rho"], crit["normalized"])])
    crit = crit.sort_values(by + ["T"]).reset_index(drop=True)
    crit["eta_star_rel"] = _relative_to_first(crit, by, "T", "eta_star")
    return crit


def _length_label(rho: float, normalized: bool) -> str:
    return f"rho = {rho:g}, {'1/|o|' if normalized else 'raw'}"


def length_slopes(result, J0: float, rhos, *, normalized: bool = False) -> dict:
    """{label: (slope or None, legend text)} of the ``length`` claims at J0 for each rho (raw updates); with
    ``normalized`` the 1/|o| line of each rho, its slope the raw claim plus the identity row's difference."""
    length = _import("bandits.experiments.length", "the 'length' experiment")
    _, claims = deciding_claims(result)
    out = {}
    for rho in rhos:
        out[_length_label(rho, False)] = slope_text(_length_label(rho, False),
                                                    claims.get(length.slope_claim_id(rho, J0)))
    if normalized:
        for rho in rhos:
            name = _length_label(rho, True)
            raw, ident = claims.get(length.slope_claim_id(rho, J0)), claims.get(length.identity_claim_id(J0))
            b, _ = slope_text(name, raw)
            if b is None or ident is None or not ident.measured or ident.n < 2:
                out[name] = (None, f"{name}: no identity row")
            else:
                out[name] = (b + ident.estimate, f"{name}: slope {b:.2f} + {ident.estimate:.2f} (identity row)")
    return out


SUCCESS_RATE_SHOWN = {"sharp_grpo": "one step along E[w]", "restart_grpo": "restarted eta*"}
"""The success_rate measures drawn in figure 2 (d), with their legend names."""


def success_rate_view(result) -> tuple[pd.DataFrame, dict]:
    """(points, labels) of the ``success_rate`` experiment's local thresholds against 1 - J.

    points: the distinct states with a finite threshold (``success_rate.fit_points``, deciding block), one
    row per (setting, measure, instance, level) with ``series`` = "setting, measure name" and ``eta_rel`` =
    eta_local / eta_local(first checkpoint) of the same instance (descriptive: no line is fitted); labels:
    {series: (None, text)}: for the restarted eta* the bound claim (Theorem 3's step condition tested by its
    violations: share and verdict), else the number of states; or the status counts when a series has no
    finite threshold."""
    sr = _import("bandits.experiments.success_rate", "the 'success_rate' experiment")
    results = result.results
    _require_cols(results, ["setting", "measure", "instance", "level", "one_minus_J", "eta_local", "status"],
                  "success_rate results")
    block, claims = deciding_claims(result)
    res = results[results["block"] == block] if "block" in results else results
    parts, slopes = [], {}
    for setting in sr.SETTINGS:
        for measure, mname in SUCCESS_RATE_SHOWN.items():
            name = f"{setting.replace('=', ' = ')}, {mname}"
            d = res[(res["setting"] == setting) & (res["measure"] == measure)]
            used = sr.fit_points(d)
            if used.empty:
                why = ", ".join(f"{k}: {v}" for k, v in d["status"].value_counts().items()) or "no checkpoint"
                slopes[name] = (None, f"{name}: too few finite thresholds\n({why})")
                continue
            parts.append(used.assign(series=name))
            c = claims.get(sr.slope_claim_id(setting, measure)) if measure == sr.BOUND_MEASURE else None
            if c is None:
                slopes[name] = (None, f"{name}: {len(used)} states")
            elif not c.measured:
                slopes[name] = (None, f"{name}: bound not measured")
            else:
                slopes[name] = (None, f"{name}: bound violated in {c.estimate:.0%} of states ({c.verdict})")
    cols = ["series", "setting", "measure", "instance", "level", "one_minus_J", "eta_local"]
    pts = pd.concat(parts)[cols] if parts else pd.DataFrame(columns=cols)
    pts = pts.sort_values(["series", "instance", "level"]).reset_index(drop=True)
    pts["eta_rel"] = _relative_to_first(pts, ["series", "instance"], "level", "eta_local") if len(pts) else []
    return pts, slopes


def _relative_to_first(df: pd.DataFrame, by: list[str], x: str, y: str) -> pd.Series:
    """y / y(smallest x with a finite y) within each group of ``by`` (NaN when a group has none)."""

    def rel(g):
        g = g.sort_values(x)
        fin = g[np.isfinite(g[y])]
        return g[y] / (float(fin[y].iloc[0]) if len(fin) else np.nan)

    return df.groupby(by, group_keys=False)[[x, y]].apply(rel).reindex(df.index)


def _methods_sampling(results: pd.DataFrame) -> pd.DataFrame:
    """The ``methods`` rows at equal eta with a ``sampling`` column (exact / sampled; the experiment calls
    it ``kind`` and adds matched-step rows, which the equal-eta panels leave out)."""
    if "sampling" in results or "kind" not in results:
        return results
    return results[results["kind"].isin(["exact", "sampled"])].rename(columns={"kind": "sampling"})


def methods_view(results: pd.DataFrame) -> pd.DataFrame:
    """Per (sampling, method, eta) of the ``methods`` experiment: P_collapse, mean final J, share of runs
    reaching J >= 0.9 and the median steps to it (over the runs that reach it)."""
    results = _methods_sampling(results)
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
    out = mod.summary(results)
    return out.rename(columns={"kind": "sampling"}) if "sampling" not in out else out


def stagnation_parts(results: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The ``stagnation`` experiment's rows split by part (single, shared, misalign, controllers), the shared
    settings with their J* bracket as ``plateau`` (stagnation.plateau_table), and the failure rate of the
    single-context runs in long form as ``fail_curve`` (method, eta, instance, exponent, coef, step, fail) at
    the recorded points k = K/10, K/2, K."""
    _require_cols(results, ["part"], "stagnation results")
    mod = _import("bandits.experiments.stagnation", "figure 3")
    out = {p: g.reset_index(drop=True) for p, g in results.groupby("part")}
    if "shared" in out:
        out["plateau"] = mod.plateau_table(results)
    single = out.get("single")
    if single is not None and {"fail_10pct", "fail_half", "fail_final", "steps"} <= set(single.columns):
        K = single["steps"].astype(float)
        pts = [single.assign(step=np.floor(K * frac), fail=single[col])
               for col, frac in (("fail_10pct", 0.1), ("fail_half", 0.5), ("fail_final", 1.0))]
        out["fail_curve"] = pd.concat(pts, ignore_index=True)
    return out


def stagnation_trajectories(config, *, instance: int = 0) -> pd.DataFrame:
    """J over steps of sampled GRPO at constant eta and under the adaptive controller, from the
    ``stagnation`` experiment's own :func:`trajectories` (its controller instance, eta0 grid and seeds)."""
    return _import("bandits.experiments.stagnation", "figure 3").trajectories(config, instance=instance)


def logistic_fit_rows(results: pd.DataFrame) -> pd.DataFrame:
    """The (M, J) pairs of the ``logistic`` experiment's fit part from non-collapsed runs."""
    _require_cols(results, ["part", "method", "sampling", "M", "J", "J0", "collapsed"], "logistic results")
    return _import("bandits.experiments.logistic", "figure 4").fit_rows(results)


def logistic_slopes(results: pd.DataFrame) -> pd.DataFrame:
    """The ``logistic`` experiment's per-instance fits of the sampled runs (its ``instance_slopes``)."""
    return _import("bandits.experiments.logistic", "figure 4").instance_slopes(results)


def logistic_thm1_rows(results: pd.DataFrame) -> pd.DataFrame:
    """The ``logistic`` experiment's Theorem-1 part: per run factor, meets, above_bound, worst_violation."""
    _require_cols(results, ["part"], "logistic results")
    return results[results["part"] == "thm1"].reset_index(drop=True)


def taxonomy_table(n_tokens: int = 20000, **kwargs) -> pd.DataFrame:
    """``bandits.experiments.taxonomy.taxonomy_table`` (one row per sampled token and sign of A)."""
    return _import("bandits.experiments.taxonomy", "the taxonomy table").taxonomy_table(n_tokens, **kwargs)


def taxonomy_summary(table: pd.DataFrame) -> dict:
    """``bandits.experiments.taxonomy.summary``: descriptive counts of a taxonomy table."""
    return _import("bandits.experiments.taxonomy", "the taxonomy table").summary(table)
