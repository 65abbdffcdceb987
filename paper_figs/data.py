"""Where each figure's data comes from: cached sweep results, a fresh run, or gapdyn directly.

No science lives here: the bandit experiments (``bandits.experiments.<name>.run``) and the
tiny-Qwen trainer (``llm_probe``) produce the numbers; gapdyn's formulas are called, not re-written.
This module only chooses the configuration for a mode, reuses cached results (the sweep store
makes reruns free: completed cells are loaded, not recomputed) and tabulates gapdyn outputs.

Modes:
- ``"test"``: the smallest sizes (the test suite, seconds per experiment);
- ``"quick"``: the experiments' ``Config.quick()`` (CPU, minutes for everything);
- ``"full"``: ``Config.full()`` (the paper-scale sweeps; use a cluster).

When a package a figure needs is not built yet, :class:`NotAvailable` is raised with the reason,
and the figure is skipped with that message: data is never faked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import io
import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

import gapdyn

__all__ = [
    "MODES",
    "NotAvailable",
    "SourceFailed",
    "Sources",
    "BIN_DH_SIGN",
    "taxonomy_table",
    "taxonomy_summary",
    "taxonomy_verdict",
    "default_store",
    "LLMResults",
    "llm_demo_config",
    "llm_headline",
    "llm_verdict",
    "read_llm_results",
    "trajectory_frame",
    "final_frame",
    "critical_vs_length",
    "PREDICTORS",
    "ThresholdViews",
    "threshold_views",
    "success_rate_view",
    "success_rate_phase",
    "methods_view",
    "methods_summary",
    "stagnation_parts",
    "stagnation_trajectories",
    "logistic_fit_rows",
    "logistic_thm1_rows",
]

MODES = ("test", "quick", "full")

BIN_DH_SIGN: dict[str, int] = {"pos_peak": -1, "pos_valley": +1, "neg_peak": +1, "neg_valley": -1}
"""The sign of Delta H that each WAPO bin predicts (THEORY.md §4: sharpening, rising, rising, falling)."""


class NotAvailable(RuntimeError):
    """A figure's data source (an experiment module, the LLM trainer) is not available yet."""


class SourceFailed(NotAvailable):
    """A data source exists but raised while running (a bug or a bad configuration, not a gap)."""


def default_store() -> Path:
    """The sweep store: ``$GAPDYN_STORE`` or ``paper_figs/out/store``."""
    env = os.environ.get("GAPDYN_STORE")
    return Path(env) if env else Path(__file__).resolve().parent / "out" / "store"


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


# --------------------------------------------------------------------------------------------------
# Figure 5: the WAPO taxonomy, from gapdyn alone


def taxonomy_table(
    n_tokens: int = 20000,
    *,
    vocab: int = 32,
    seed: int = 0,
    sigma_range: tuple[float, float] = (0.05, 8.0),
) -> pd.DataFrame:
    """First-order effects of one token update for random positions, one row per (position, sign of A).

    Logits z = sigma * N(0, I_V) with log sigma uniform over ``sigma_range`` (flat to peaked
    distributions); the token s is sampled from p = softmax(z), as in training. For A = +1 and
    A = -1 (eta = 1, weight 1) :func:`gapdyn.token_step_effects` gives Delta H, Delta p_s, the bin
    and the exact first-order sign of Delta H; ``bin_sign`` is the sign the bin predicts
    (:data:`BIN_DH_SIGN`), ``mispredicted`` marks tokens where the two differ.

    Columns: p_s, C, H, A, dH, dp_s, bin, sign_dH, bin_sign, mispredicted.
    """
    if int(n_tokens) < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    if int(vocab) < 2:
        raise ValueError(f"vocab must be >= 2, got {vocab}")
    lo, hi = sigma_range
    if not (0 < lo < hi):
        raise ValueError(f"sigma_range must satisfy 0 < low < high, got {sigma_range}")
    rng = np.random.default_rng(seed)
    n, V = int(n_tokens), int(vocab)
    sigma = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
    z = sigma[:, None] * rng.standard_normal((n, V))
    p = gapdyn.softmax(z)
    token = gapdyn.sample_group(p, 2, rng)[:, 0]
    H = gapdyn.token_entropy(gapdyn.log_softmax(z))
    frames = []
    for A in (1.0, -1.0):
        e = gapdyn.token_step_effects(z, token, A, 1.0)
        names = np.asarray(gapdyn.BIN_NAMES)[e.bin]
        bin_sign = np.array([BIN_DH_SIGN[b] for b in names])
        dp_s = np.take_along_axis(e.dp, token[:, None], axis=-1)[:, 0]
        frames.append(
            pd.DataFrame(
                {
                    "p_s": e.p_token,
                    "C": e.collision,
                    "H": H,
                    "A": A,
                    "dH": e.dH,
                    "dp_s": dp_s,
                    "bin": names,
                    "sign_dH": e.entropy_sign.astype(int),
                    "bin_sign": bin_sign,
                    "mispredicted": e.entropy_sign != bin_sign,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def taxonomy_summary(table: pd.DataFrame) -> dict[str, float]:
    """Headline numbers of the taxonomy table (A = +1 rows; A = -1 flips every sign alike).

    share_bin_correct: share of sampled tokens whose bin predicts the exact sign of Delta H;
    valley_mispredicted: count of valley tokens that disagree (THEORY.md: never);
    max_gap_of_misses: the largest p_s - C among misses (THEORY.md: misses sit just above p_s = C).
    """
    pos = table[table["A"] > 0]
    miss = pos[pos["mispredicted"]]
    valley = pos["bin"].str.endswith("valley")
    return {
        "n_tokens": int(len(pos)),
        "share_bin_correct": float(1.0 - pos["mispredicted"].mean()),
        "share_peak": float((~valley).mean()),
        "valley_mispredicted": int((pos["mispredicted"] & valley).sum()),
        "max_gap_of_misses": float((miss["p_s"] - miss["C"]).max()) if len(miss) else 0.0,
        "median_gap_of_misses": float((miss["p_s"] - miss["C"]).median()) if len(miss) else 0.0,
    }


def taxonomy_verdict(summary: dict) -> pd.DataFrame:
    """THEORY.md §4's taxonomy claims against :func:`taxonomy_summary` (same columns as ``analyse``).

    "~97%" is read as "at least 90% of sampled tokens"; "misses sit just above p_s = C" as "every miss
    has 0 <= p_s - C < 0.05".
    """
    share, vmiss, gap = summary["share_bin_correct"], summary["valley_mispredicted"], summary["max_gap_of_misses"]
    rows = [
        ("WAPO bin predicts the exact sign of dH for ~97% of sampled tokens", "random softmax positions, V=32",
         share, "~0.97 (>= 0.9)", "holds" if share >= 0.9 else "does not hold"),
        ("valley tokens never disagree with the exact sign of dH", "random softmax positions, V=32",
         vmiss, 0, "holds" if vmiss == 0 else "does not hold"),
        ("misses sit just above p_s = C", "random softmax positions, V=32",
         gap, "max(p_s - C) < 0.05", "holds" if gap < 0.05 else "does not hold"),
    ]
    return pd.DataFrame(rows, columns=["claim", "setting", "measured", "expected", "holds"])


# --------------------------------------------------------------------------------------------------
# Bandit experiments and the tiny-Qwen runs


def _import(module: str, why: str):
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise NotAvailable(f"{module} is not available yet ({exc}); needed for {why}") from exc


TEST_OVERRIDES: dict[str, dict[str, Any]] = {
    "threshold": {"n_instances": 4, "n_seeds": 4},
    "length": {"Ts": (1, 2, 4, 8), "n_instances": 1, "runs": 8, "per_decade": 4, "ac_split_T": 2},
}
"""Mode "test" shrinks an experiment's ``Config.quick()`` further with these fields (the tiny
reproduction must finish in about a minute on two shared cores); unknown fields are ignored."""


def experiment_config(module, mode: str, *, seed: int | None = None):
    """``Config.quick()`` / ``Config.full()`` of an experiment module; mode "test" asks for
    ``Config.test()`` when the module has one, else ``Config.quick()`` shrunk by :data:`TEST_OVERRIDES`.
    ``seed`` overrides a ``seed`` / ``seed0`` / ``base_seed`` field when the config has one."""
    cfg_cls = getattr(module, "Config", None)
    if cfg_cls is None:
        raise NotAvailable(f"{module.__name__} has no Config (experiment contract not implemented yet)")
    ctor = {"test": "test", "quick": "quick", "full": "full"}[mode]
    if not hasattr(cfg_cls, ctor):
        ctor = "quick"
    config = getattr(cfg_cls, ctor)()
    fields = {f.name for f in dataclasses.fields(config)} if dataclasses.is_dataclass(config) else set()
    if mode == "test" and ctor == "quick":
        name = module.__name__.rsplit(".", 1)[-1]
        over = {k: v for k, v in TEST_OVERRIDES.get(name, {}).items() if k in fields}
        if over:
            config = dataclasses.replace(config, **over)
    if seed is not None and fields:
        for name in ("seed", "seed0", "base_seed"):
            if name in fields:
                config = dataclasses.replace(config, **{name: seed})
                break
    return config


class Sources:
    """The data of one figure run, computed at most once per experiment (shared by all figures
    and by the reproduction report).

    Args:
      mode: "test", "quick" or "full" (see the module doc).
      store: the sweep store (cached cells are reused); default :func:`default_store`.
      llm_dir: where the tiny-Qwen runs write/read their outputs; default ``<store>/llm_probe/<mode>``.
      n_jobs: local processes for sweeps (1 = serial, the default: the machine is shared).
      seed: overrides the experiments' base seed when set.
      progress: show the sweeps' progress bars.
    """

    def __init__(self, mode: str = "quick", *, store=None, llm_dir=None, n_jobs: int = 1, seed: int | None = None,
                 progress: bool = False):
        self.mode = check_mode(mode)
        self.store = Path(store) if store is not None else default_store()
        self.llm_dir = Path(llm_dir) if llm_dir is not None else self.store / "llm_probe" / self.mode
        self.n_jobs = int(n_jobs)
        self.seed = seed
        self.progress = progress
        self._cache: dict[str, Any] = {}
        self.errors: dict[str, str] = {}

    # ---- gapdyn-only data
    def taxonomy(self) -> pd.DataFrame:
        if "taxonomy" not in self._cache:
            n = {"test": 4000, "quick": 40000, "full": 200000}[self.mode]
            self._cache["taxonomy"] = taxonomy_table(n, seed=0 if self.seed is None else self.seed)
        return self._cache["taxonomy"]

    # ---- bandit experiments
    def experiment(self, name: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(results, verdict) of ``bandits.experiments.<name>``, run once (store-cached)."""
        key = f"exp:{name}"
        if key in self._cache:
            return self._cache[key]
        if key in self.errors:
            raise (SourceFailed if "failed:" in self.errors[key] else NotAvailable)(self.errors[key])
        try:
            registry = _import("bandits.experiments", f"the '{name}' experiment")
            if name not in getattr(registry, "EXPERIMENTS", {}):
                raise NotAvailable(f"experiment {name!r} is not registered in bandits.experiments")
            module = _import(registry.EXPERIMENTS[name], f"the '{name}' experiment")
            if not hasattr(module, "run"):
                raise NotAvailable(f"{module.__name__} has no run() yet")
            config = experiment_config(module, self.mode, seed=self.seed)
            kw: dict[str, Any] = {"store": str(self.store), "progress": self.progress}
            params = inspect.signature(module.run).parameters
            if "backend" in params:
                kw["backend"] = "serial" if self.n_jobs == 1 else "joblib"
            if "n_jobs" in params:
                kw["n_jobs"] = self.n_jobs
            results, verdict = module.run(config, **{k: v for k, v in kw.items() if k in params or _has_varkw(params)})
        except NotAvailable as exc:
            self.errors[key] = str(exc)
            raise
        except Exception as exc:  # noqa: BLE001 - recorded once, reported by every figure that needs it
            self.errors[key] = f"bandits.experiments.{name}.run failed: {type(exc).__name__}: {exc}"
            raise SourceFailed(self.errors[key]) from exc
        self._cache[key] = (results, verdict)
        self._cache[f"config:{name}"] = config
        return self._cache[key]

    def config(self, name: str):
        """The config an experiment ran with (after :meth:`experiment`)."""
        return self._cache.get(f"config:{name}")

    # ---- tiny-Qwen runs
    def llm(self):
        """The tiny-Qwen GRPO-vs-WAPO demo's outputs (see :mod:`llm_probe`), run once, cached on disk."""
        key = "llm"
        if key in self._cache:
            return self._cache[key]
        if key in self.errors:
            raise (SourceFailed if "failed:" in self.errors[key] else NotAvailable)(self.errors[key])
        try:
            out = _load_llm(self.mode, self.llm_dir, seed=self.seed, progress=self.progress, n_jobs=self.n_jobs)
        except NotAvailable as exc:
            self.errors[key] = str(exc)
            raise
        except Exception as exc:  # noqa: BLE001
            self.errors[key] = f"llm_probe.demo failed: {type(exc).__name__}: {exc}"
            raise SourceFailed(self.errors[key]) from exc
        self._cache[key] = out
        return out


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


def _require_cols(df: pd.DataFrame, cols, what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise NotAvailable(f"{what} lack columns {missing} (the experiment's schema changed?)")


def _has_varkw(params) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class LLMResults(NamedTuple):
    """The tiny-Qwen demo's outputs (llm_probe.demo.run_demo), as tables.

    runs: one row per run (llm_probe.demo.RUN_COLUMNS); metrics: per-step metrics of every run
    (method, lr, seed, step, reward, entropy, entropy/pos_adv, entropy/neg_adv, taxonomy/<bin>, ...);
    probes: per (run, probe step, probe prompt) rows of probe_prompts.jsonl (J_hat, M, ...) with
    method, lr, seed; alerts: one row per alert (method, lr, seed, step, rule, value, threshold);
    summary: summary.json; out_dir: where they live.
    """

    runs: pd.DataFrame
    metrics: pd.DataFrame
    probes: pd.DataFrame
    alerts: pd.DataFrame
    summary: dict
    out_dir: Path


def llm_demo_config(mode: str, out_dir: Path, *, seed: int | None = None, n_jobs: int = 1):
    """The llm_probe.demo.DemoConfig of a mode: "test" = 2 methods x 2 lrs x 1 seed x 8 steps on a
    30-step warm-up (seconds); "quick" = 2 seeds x 60 steps (8 runs, about 3 CPU minutes); "full" = 5
    seeds x 300 steps and lr 5e-4 added (SIMULATIONS.md: the GRPO/WAPO contrast lives near 5e-4; use
    >= 5 seeds). Everything else is llm_probe's default; ``n_jobs`` parallel runs (joblib)."""
    demo = _import("llm_probe.demo", "the tiny-Qwen figure")
    base = 0 if seed is None else int(seed)
    sizes = {
        "test": dict(seeds=(base,), steps=8, prompts_per_step=4, group_size=4, probe_every=2, probe_prompts=4,
                     warmup_steps=30),
        "quick": dict(seeds=tuple(base + i for i in range(2)), steps=60),
        "full": dict(seeds=tuple(base + i for i in range(5)), steps=300, lrs=(3e-4, 5e-4, 1e-3)),
    }[mode]
    jobs = (os.cpu_count() or 1) if int(n_jobs) < 0 else max(1, int(n_jobs))
    return demo.DemoConfig(out_dir=str(out_dir), num_threads=1, n_jobs=jobs, **sizes)


def _load_llm(mode: str, out_dir: Path, *, seed: int | None, progress: bool, n_jobs: int = 1) -> LLMResults:
    """Reuse ``out_dir`` when it holds a finished demo run of the same configuration, else run it."""
    import json

    demo = _import("llm_probe.demo", "the tiny-Qwen figure")
    cfg = llm_demo_config(mode, out_dir, seed=seed, n_jobs=n_jobs)
    stamp = out_dir / "paper_figs_config.json"
    want = json.dumps({k: v for k, v in dataclasses.asdict(cfg).items() if k != "n_jobs"}, sort_keys=True,
                      default=str)
    done = stamp.exists() and stamp.read_text() == want and (out_dir / "runs.parquet").exists()
    if not done:
        out_dir.mkdir(parents=True, exist_ok=True)
        stamp.unlink(missing_ok=True)
        quiet = contextlib.redirect_stderr(io.StringIO()) if not progress else contextlib.nullcontext()
        with quiet:  # the demo's own tqdm bars (and transformers' loading bars) write to stderr
            demo.run_demo(cfg)
        stamp.write_text(want)
    return read_llm_results(out_dir)


def read_llm_results(out_dir) -> LLMResults:
    """Read a finished ``llm_probe.demo`` output folder into :class:`LLMResults`."""
    import json

    out_dir = Path(out_dir)
    if not (out_dir / "runs.parquet").exists():
        raise NotAvailable(f"no finished llm_probe demo in {out_dir} (runs.parquet missing)")
    runs = pd.read_parquet(out_dir / "runs.parquet")
    metrics = pd.read_parquet(out_dir / "metrics_all.parquet")
    probes, alerts = [], []
    for r in runs.itertuples(index=False):
        d = out_dir / f"{r.method}_lr{r.lr:g}_s{r.seed}"
        tag = {"method": r.method, "lr": float(r.lr), "seed": int(r.seed)}
        pp = d / "probe_prompts.jsonl"
        if pp.exists() and pp.stat().st_size:
            probes.append(pd.read_json(pp, lines=True).assign(**tag))
        al = d / "alerts.json"
        if al.exists():
            alerts += [{**tag, **a} for a in json.loads(al.read_text())]
    summary = json.loads((out_dir / "summary.json").read_text()) if (out_dir / "summary.json").exists() else {}
    return LLMResults(
        runs=runs,
        metrics=metrics,
        probes=pd.concat(probes, ignore_index=True) if probes else pd.DataFrame(
            columns=["step", "prompt_id", "J_hat", "M", "method", "lr", "seed"]),
        alerts=pd.DataFrame(alerts, columns=["method", "lr", "seed", "step", "rule", "value", "threshold"]),
        summary=summary,
        out_dir=out_dir,
    )


def llm_headline(res: LLMResults) -> dict:
    """Per (method, lr): runs, collapsed runs, mean reward over the first and last 25 steps."""
    out: dict[str, object] = {}
    for (m, lr), g in res.runs.groupby(["method", "lr"], sort=True):
        key = f"{m} lr={lr:g}"
        out[f"{key}: runs"] = int(len(g))
        out[f"{key}: collapsed"] = int(g["collapsed"].sum())
        out[f"{key}: reward first 25"] = float(g["reward_first25"].mean())
        out[f"{key}: reward last 25"] = float(g["reward_last25"].mean())
    collapsed = res.runs[res.runs["collapsed"].astype(bool)]
    out["collapsed runs"] = "; ".join(f"{r.method} lr={r.lr:g} seed={r.seed} ({r.collapse_rule}@{r.collapse_step})"
                                      for r in collapsed.itertuples()) or "none"
    return out


def llm_verdict(res: LLMResults) -> pd.DataFrame:
    """WAPO's stability claim on the tiny Qwen, per lr: WAPO collapses in fewer runs than GRPO, and ends
    with a higher mean reward (last 25 steps). Ties are reported as such ("n/a" when no run collapsed at
    that lr, "does not hold" when both collapse alike); with few seeds this is a smoke test."""
    rows = []
    for lr, g in res.runs.groupby("lr", sort=True):
        by = g.groupby("method")
        if not {"grpo", "wapo"} <= set(by.groups):
            continue
        col = by["collapsed"].sum()
        rew = by["reward_last25"].mean()
        n = int(by.size().min())
        setting = f"tiny Qwen, 2-digit addition, Adam lr={lr:g}, {n} seed(s), {int(g['steps_run'].max())} steps"
        signal = bool(g["reward_first25"].max() > 0)  # no reward at all: no gradient, nothing to compare
        cw, cg = int(col["wapo"]), int(col["grpo"])
        if not signal:
            h_col = h_rew = "not measured (no reward signal)"
        else:
            h_col = ("n/a (no run collapsed)" if cw == cg == 0 else "holds" if cw < cg
                     else f"does not hold ({'tie' if cw == cg else 'WAPO collapses more'})")
            h_rew = ("does not hold (both collapsed)" if cw == cg == n else
                     "holds" if rew["wapo"] > rew["grpo"] else "does not hold")
        rows.append(("WAPO collapses in fewer runs than GRPO", setting, f"wapo {cw}/{n}, grpo {cg}/{n}",
                     "wapo < grpo", h_col))
        rows.append(("WAPO ends higher than GRPO (mean reward, last 25 steps)", setting,
                     f"wapo {rew['wapo']:.3f}, grpo {rew['grpo']:.3f}", "wapo > grpo", h_rew))
    return pd.DataFrame(rows, columns=["claim", "setting", "measured", "expected", "holds"])
