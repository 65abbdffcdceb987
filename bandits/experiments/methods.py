"""Experiment 6: gapdyn's methods at equal step size and at matched expected first step.

GRPO vs Dr. GRPO vs WAPO vs REINFORCE vs RLOO vs PSR / NSR vs W-REINFORCE on single-context log-linear bandits
(K = 100, d = 16, 10 correct, theta0 = 0, G = 8). Every method's expected direction is scalar(J, G) x Gap
(gapdyn.expected_scalar), so the exact dynamics of two methods whose scalars are proportional are the same
dynamics at rescaled step sizes: exact RLOO, PSR, NSR = REINFORCE; exact Dr. GRPO at eta = REINFORCE at
(1 - 1/G) eta; exact W-REINFORCE at eta = REINFORCE at (1 + lam) eta. These are identity rows (machinery).

- exact / sampled cells (method, instance): runs on the eta grid (sampled: n_seeds common seeds per eta):
  collapse (gapdyn.COLLAPSE_J within the horizon), steps to J >= 0.9, entropy at steps 0, 10, 50 and the end.
- matched cells (instance): WAPO, PSR, Dr. GRPO and GRPO sampled at eta_m = L / ||E[w_m](theta0)|| for step
  lengths L (bandits.experiments.mechanisms.matched_step_etas), on the same seeds: does WAPO's stability come
  from dropping negative samples or from its smaller expected step?
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

import gapdyn
from gapdyn import Criterion
from bandits.engine import Dynamics, simulate

from . import mechanisms as mech
from ._common import bootstrap, make_claim, no_data, run_experiment, steps_to

NAME = "methods"
MODES = ("test", "quick", "full")
MATCHED = ("wapo", "psr", "dr_grpo", "grpo")
"""Methods compared at matched expected first step (WAPO first)."""


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
    step_lengths: tuple[float, ...] = (1.0, 3.0, 10.0, 30.0, 100.0)
    """matched expected first-step lengths L = eta ||E[w](theta0)||."""
    matched_seeds: int = 32

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if not self.instances or set(self.instances) & set(self.confirmation):
            raise ValueError("instances must be non-empty and disjoint from confirmation")
        missing = {"reinforce", "rloo", "psr", "nsr", "dr_grpo", "w_reinforce", "wapo", "grpo"} - set(self.methods)
        if missing:
            raise ValueError(f"methods must include every method of the identities and comparisons, missing {missing}")

    @classmethod
    def test(cls) -> Config:
        return cls(mode="test", instances=(0, 1, 2), etas=(1.0, 30.0, 1000.0), steps=40, n_seeds=3,
                   step_lengths=(3.0, 30.0), matched_seeds=4)

    @classmethod
    def quick(cls) -> Config:
        return cls(mode="quick", instances=gapdyn.DISCOVERY_SEEDS[:8], etas=(0.3, 3.0, 30.0, 300.0), steps=150,
                   n_seeds=6, step_lengths=(3.0, 10.0, 30.0), matched_seeds=12)

    @classmethod
    def full(cls) -> Config:
        return cls(mode="full", confirmation=gapdyn.CONFIRMATION_SEEDS)


_WAPO = "WAPO (arXiv 2606.16154)"
_SD = "Suk & Duan (arXiv 2510.08539)"
STATEMENTS: dict[str, tuple[str, str]] = {
    "identity_baselines": ("derived: RLOO, PSR, NSR and REINFORCE share E[w] = J (1-J) Gap",
                           "exact RLOO, PSR and NSR runs equal exact REINFORCE runs (max |J_final difference|)"),
    "identity_dr_rescaled": ("derived (docs/equations.md): exact Dr. GRPO at eta = REINFORCE at (1-1/G) eta",
                             "exact Dr. GRPO at eta equals exact REINFORCE at (1 - 1/G) eta (max |J_final difference|)"),
    "identity_wr_rescaled": ("derived: exact W-REINFORCE at eta = REINFORCE at (1+lam) eta",
                             "exact W-REINFORCE at eta equals exact REINFORCE at (1 + lam) eta (max |J_final difference|)"),
    "exact_rank_collapse": (f"{_SD}, Thm 2 with E[w] = scalar x Gap", "exact dynamics at equal eta: methods with a "
                            "larger expected scalar at J0 collapse more (Spearman over methods > 0)"),
    "sampled_rank_collapse": (f"{_SD}, Thm 2 with E[w] = scalar x Gap", "sampled dynamics at equal eta: methods "
                              "with a larger expected scalar at J0 collapse more (Spearman over methods > 0)"),
    "sampled_rank_speed": (f"{_SD}, Thm 1 (J grows with M = sum eta dmu)", "sampled, smallest eta: methods with a "
                           "larger scalar reach J >= 0.9 sooner (Spearman(scalar, mean steps) < 0)"),
    "sampled_rank_entropy": (_SD + ", Thm 1 with E[w] = scalar x Gap", "sampled: entropy at step 50 falls most for "
                             "the largest scalar (Spearman(scalar, H50) < 0)"),
    "wapo_vs_grpo": (_WAPO, "at equal eta, sampled WAPO collapses less than GRPO (paired on seeds; exact McNemar)"),
    "wapo_vs_dr_grpo": (_WAPO, "at equal eta, sampled WAPO collapses less than Dr. GRPO (paired; exact McNemar)"),
    "matched_wapo_vs_dr_grpo": (_WAPO + "; beyond the papers", "at matched expected first step, sampled WAPO "
                                "collapses less than Dr. GRPO: dropping negative samples, not the smaller step"),
    "matched_wapo_vs_psr": (_WAPO + "; beyond the papers", "at matched expected first step, sampled WAPO collapses "
                            "less than PSR (both positive-only; WAPO centres on p_hat)"),
    "matched_wapo_vs_grpo": (_WAPO + "; beyond the papers", "at matched expected first step, sampled WAPO "
                             "collapses less than GRPO"),
}
CRITERIA: dict[str, Criterion] = {
    "identity_baselines": Criterion.identity(0.0, tol=1e-9),
    "identity_dr_rescaled": Criterion.identity(0.0, tol=1e-9),
    "identity_wr_rescaled": Criterion.identity(0.0, tol=1e-9),
    "exact_rank_collapse": Criterion.above(0.0),
    "sampled_rank_collapse": Criterion.above(0.0),
    "sampled_rank_speed": Criterion.below(0.0),
    "sampled_rank_entropy": Criterion.below(0.0),
    "wapo_vs_grpo": Criterion.below(0.0, alpha=0.05),
    "wapo_vs_dr_grpo": Criterion.below(0.0, alpha=0.05),
    "matched_wapo_vs_dr_grpo": Criterion.below(0.0, alpha=0.05),
    "matched_wapo_vs_psr": Criterion.below(0.0, alpha=0.05),
    "matched_wapo_vs_grpo": Criterion.below(0.0, alpha=0.05),
}
"""Identity tolerance 1e-9 on J_final: the runs are the same map; a rescaled eta only changes the rounding of
eta x scalar (measured deviations are ~1e-20)."""
FORMS: dict[str, str] = {
    "identity_baselines": "identity", "identity_dr_rescaled": "identity", "identity_wr_rescaled": "identity",
    "exact_rank_collapse": "comparison", "sampled_rank_collapse": "comparison", "sampled_rank_speed": "comparison",
    "sampled_rank_entropy": "comparison", "wapo_vs_grpo": "comparison", "wapo_vs_dr_grpo": "comparison",
    "matched_wapo_vs_dr_grpo": "comparison", "matched_wapo_vs_psr": "comparison", "matched_wapo_vs_grpo": "comparison",
}
"""The form of each claim's statement (gapdyn.FORMS)."""


def cells(config: Config, instances=None) -> list[dict]:
    instances = config.instances if instances is None else instances
    d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()}
    common = {k: d[k] for k in ("etas", "steps", "n_seeds", "group_size", "lam")}
    out = [{"kind": s, "method": m, "instance": int(i), **common}
           for m in config.methods for s in ("exact", "sampled") for i in instances]
    out += [{"kind": "matched", "instance": int(i), "step_lengths": d["step_lengths"], "steps": config.steps,
             "n_seeds": config.matched_seeds, "group_size": config.group_size} for i in instances]
    return out


def _runs(bandit, dyn, etas, seeds) -> pd.DataFrame:
    E, S = np.meshgrid(np.asarray(etas, float), np.asarray(seeds), indexing="ij")
    tr = simulate(bandit, dyn, eta=E.ravel(), seed=S.ravel())
    H = tr.entropy[:, :, 0]
    at = lambda k: H[:, min(k, H.shape[1] - 1)]  # noqa: E731
    return pd.DataFrame({
        "eta": E.ravel(), "seed": S.ravel(), "J0": tr.J[:, 0, 0], "J_final": tr.J_final[:, 0],
        "J_min": tr.J_min[:, 0], "collapsed": gapdyn.is_collapsed(tr.J_min[:, 0]),
        "steps_to_09": steps_to(tr.J[:, :, 0], tr.steps, 0.9),
        "H0": at(0), "H10": at(10), "H50": at(50), "H_final": H[:, -1],
    })


def run_cell(*, kind, instance, steps, n_seeds, group_size, method=None, etas=None, lam=0.1,
             step_lengths=None) -> pd.DataFrame:
    """Rows of one cell: exact / sampled runs of one method, or the matched-step comparison."""
    b = mech.instance_bandit(instance)
    if kind == "matched":
        frames = []
        for m, e in mech.matched_step_etas(b, MATCHED, group_size, step_lengths).items():
            dyn = Dynamics(method=m, mode="sampled", steps=steps, group_size=group_size)
            df = _runs(b, dyn, e, np.arange(n_seeds))
            df.insert(0, "step_length", np.repeat(np.asarray(step_lengths, float), n_seeds))
            frames.append(df.assign(method=m))
        return pd.concat(frames, ignore_index=True)
    if kind not in ("exact", "sampled"):
        raise ValueError(f"kind must be 'exact', 'sampled' or 'matched', got {kind!r}")
    dyn = Dynamics(method=method, mode=kind, steps=steps, group_size=group_size, lam=lam)
    df = _runs(b, dyn, etas, np.arange(n_seeds) if kind == "sampled" else np.arange(1))
    scale = {"dr_grpo": 1 - 1 / group_size, "w_reinforce": 1 + lam}.get(method)
    if kind == "exact" and scale is not None:  # the identity's other side: REINFORCE at the rescaled eta
        ref = _runs(b, Dynamics(method="reinforce", mode="exact", steps=steps, group_size=group_size),
                    scale * np.asarray(etas, float), np.arange(1))
        df["J_final_rescaled_reinforce"] = ref["J_final"].to_numpy()
    return df


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


def _rank_statistic(method_idx, scalar, value) -> float:
    """Spearman over methods of (scalar, mean value per method) on rows (instance, method)."""
    k = int(method_idx.max()) + 1
    cnt = np.bincount(method_idx, minlength=k)
    if np.any(cnt == 0):
        return math.nan
    mean = np.bincount(method_idx, weights=value, minlength=k) / cnt
    sc = np.bincount(method_idx, weights=scalar, minlength=k) / cnt
    if np.unique(mean).size < 2:
        return math.nan
    return float(spearmanr(sc, mean).statistic)


def _rank_claim(R, value_col, seed, agg=np.mean):
    """Cluster bootstrap (instances) of Spearman(scalar at J0, per-method mean of value_col)."""
    per = R.groupby(["instance", "method"])[value_col].agg(agg).reset_index().dropna()
    if per.empty:
        return no_data(-1.0, 1.0), 0
    codes, names = pd.factorize(per["method"])
    J0 = float(np.clip(R["J0"].mean(), 1e-9, 1 - 1e-9))
    G = int(R["group_size"].iloc[0])
    sc = np.array([float(gapdyn.expected_scalar(m, J0, G)) for m in names])[codes]
    est = bootstrap(_rank_statistic, codes, sc, per[value_col].to_numpy(float), clusters=per["instance"].to_numpy(),
                    seed=seed, natural=(-1.0, 1.0))
    return est, len(names)


def _paired_claim(R, a, b, key, seed):
    """P(collapse | a) - P(collapse | b) on paired runs (common seeds): cluster bootstrap by instance, McNemar."""
    x = R[R["method"] == a].set_index(key)["collapsed"].astype(float)
    y = R[R["method"] == b].set_index(key)["collapsed"].astype(float).reindex(x.index)
    ok = y.notna().to_numpy()
    x, y = x[ok], y[ok]
    if len(x) < 2:
        return no_data(-1.0, 1.0), 1.0, 0
    test = gapdyn.mcnemar_exact(x.to_numpy(), y.to_numpy())
    est = bootstrap(lambda d: float(np.mean(d)), (x - y).to_numpy(), clusters=x.index.get_level_values("instance"),
                    seed=seed, natural=(-1.0, 1.0))
    return est, test.p_value, test.n


def analyse(results: pd.DataFrame, config: Config, *, block: str = "discovery") -> list:
    mod = sys.modules[__name__]
    seed = 2024 if block == "discovery" else 4202
    n_inst = results["instance"].nunique()
    where = f"K=100, d=16, theta0 = 0, G={config.group_size}, horizon {config.steps}, {n_inst} instances ({block})"
    claims = []

    def add(cid, est, setting, statistic, p_value=None):
        claims.append(make_claim(mod, cid, est, block=block, setting=setting, statistic=statistic, p_value=p_value))

    ex = results[results["kind"] == "exact"]
    ref = ex[ex["method"] == "reinforce"].set_index(["instance", "eta"])["J_final"]
    dev = [np.abs(ex[ex["method"] == m].set_index(["instance", "eta"])["J_final"] - ref).max()
           for m in ("rloo", "psr", "nsr")]
    dev = float(np.nanmax(dev))
    n_ex = len(ref)
    add("identity_baselines", gapdyn.Estimate(dev, 0.0, dev, max(n_ex, 1), 0.95, "max over runs"),
        where + f", exact, etas {list(config.etas)}", f"max |J_final(m) - J_final(reinforce)| over m, instance, eta "
        f"({n_ex} runs each)")
    for cid, m in (("identity_dr_rescaled", "dr_grpo"), ("identity_wr_rescaled", "w_reinforce")):
        r = ex[ex["method"] == m]
        d = float(np.abs(r["J_final"] - r["J_final_rescaled_reinforce"]).max())
        add(cid, gapdyn.Estimate(d, 0.0, d, max(len(r), 1), 0.95, "max over runs"),
            where + f", exact, etas {list(config.etas)}", f"max |J_final difference| over {len(r)} (instance, eta) runs")

    eq = results[results["kind"].isin(["exact", "sampled"])].copy()
    eq["collapsed"] = eq["collapsed"].astype(float)
    for cid, kind in (("exact_rank_collapse", "exact"), ("sampled_rank_collapse", "sampled")):
        est, k = _rank_claim(eq[eq["kind"] == kind], "collapsed", seed)
        add(cid, est, where + f", {kind}, etas {list(config.etas)}",
            f"Spearman over {k} methods of (scalar at J0, P(collapse)) (cluster bootstrap by instance)")
    sp = eq[eq["kind"] == "sampled"]
    small = sp[sp["eta"] == sp["eta"].min()]
    small = small[np.isfinite(small["steps_to_09"])]
    est, k = _rank_claim(small, "steps_to_09", seed)
    add("sampled_rank_speed", est, where + f", sampled, eta = {min(config.etas):g}, runs reaching 0.9",
        f"Spearman over {k} methods of (scalar at J0, mean steps to J >= 0.9) (cluster bootstrap)")
    est, k = _rank_claim(sp, "H50", seed)
    add("sampled_rank_entropy", est, where + f", sampled, etas {list(config.etas)}",
        f"Spearman over {k} methods of (scalar at J0, entropy at step 50) (cluster bootstrap)")

    for other in ("grpo", "dr_grpo"):
        est, p, n = _paired_claim(sp, "wapo", other, ["instance", "eta", "seed"], seed)
        add(f"wapo_vs_{other}", est, where + f", sampled, {config.n_seeds} common seeds per eta",
            f"P(collapse) WAPO - {other} (cluster bootstrap; exact McNemar on {n} discordant pairs)", p_value=p)
    mt = results[results["kind"] == "matched"].copy()
    mt["collapsed"] = mt["collapsed"].astype(float)
    for other in ("dr_grpo", "psr", "grpo"):
        est, p, n = _paired_claim(mt, "wapo", other, ["instance", "step_length", "seed"], seed)
        add(f"matched_wapo_vs_{other}", est,
            where + f", sampled, eta ||E[w](theta0)|| in {list(config.step_lengths)}, {config.matched_seeds} seeds",
            f"P(collapse) WAPO - {other} at matched step (cluster bootstrap; exact McNemar on {n} discordant pairs)",
            p_value=p)
    return claims


def run(config: Config, *, store=None, backend="joblib", n_jobs=-1, progress=True):
    """ExperimentResult of both blocks through bandits.sweep.run_sweep (resumable with ``store``)."""
    return run_experiment(sys.modules[__name__], config, store=store, backend=backend, n_jobs=n_jobs,
                          progress=progress)
