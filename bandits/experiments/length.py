"""Experiment 2 `length`: the critical step eta* versus response length T (Theorem 3's 1/T law).

Claim [paper, Suk & Duan Theorem 3, exact form open]: the critical step shrinks ~ (1 - J)/T with the
response length; dividing the update by |o| cancels one T. Tested in the token-level sequence
bandits of :mod:`bandits.sequence` (SIMULATIONS.md "Length T"):

- main: SHARED parameters (V tokens, feature dim d, one correct token), rule MAJ, sampled GRPO
  (G = 8), theta placed per T so that J0 is the same for every T, instances restricted to those whose
  T = 1 problem has a finite threshold (exact log-odds ascent collapses at some eta of the grid).
- the same with 1/|o| normalisation (fixed T: exactly eta/T, so the slope must rise by 1: a check);
- variable-length responses (an end token; T is the maximal length), with and without 1/|o|;
- exact log-odds ascent (w = grad Phi) for MAJ;
- negative controls: rule AC at fixed J0 (no 1/T law expected) and position-wise tabular logits
  (exact ascent: no threshold at all).

Critical eta (definition used here): on the geometric grid eta_k = eta_min 10^(k/per_decade), the
smallest eta_k with P(collapse) >= 0.5 over ``runs`` independent runs, collapse = J < collapse_J
(0.01) within ``steps`` steps (for the exact directions the "probability" is 0 or 1). Resolution:
a factor 10^(1/per_decade). inf when no grid eta collapses. The slope is gapdyn.loglog_slope of eta*
against T over the T with finite eta*.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from gapdyn import loglog_slope

from ..sequence import (
    SharedSequenceBandit,
    TabularSequenceBandit,
    critical_eta,
    place_for_success_rate,
    simulate,
)
from ..sweep import run_sweep

__all__ = ["Config", "SETTINGS", "cells", "run_cell", "eta_grid", "qualifying_instances", "critical_table", "analyse", "run"]

# setting -> (model, rule, direction, variable length, 1/|o| normalisation)
SETTINGS: dict[str, tuple[str, str, str, bool, bool]] = {
    "shared_MAJ_grpo": ("shared", "MAJ", "sampled", False, False),
    "shared_MAJ_grpo_norm": ("shared", "MAJ", "sampled", False, True),
    "var_MAJ_grpo": ("shared", "MAJ", "sampled", True, False),
    "var_MAJ_grpo_norm": ("shared", "MAJ", "sampled", True, True),
    "shared_MAJ_logodds": ("shared", "MAJ", "logodds", False, False),
    "shared_AC_grpo": ("shared", "AC", "sampled", False, False),
    "tabular_MAJ_logodds": ("tabular", "MAJ", "logodds", False, False),
    "tabular_AC_logodds": ("tabular", "AC", "logodds", False, False),
    "tabular_MAJ_grpo": ("tabular", "MAJ", "sampled", False, False),
}

QUICK_SETTINGS = tuple(s for s in SETTINGS if s != "tabular_MAJ_grpo")


@dataclass(frozen=True)
class Config:
    """Experiment 2 configuration (plain data; every random draw is seeded from it)."""

    mode: str = "quick"
    """"quick" (seconds, for the tests) or "full" (the CLI run reported in docs/bandits_sequence.md)."""
    Ts: tuple[int, ...] = (1, 2, 4, 8, 16)
    """Response lengths (maximal length for the variable-length settings)."""
    settings: tuple[str, ...] = tuple(SETTINGS)
    """Which settings of SETTINGS to run."""
    candidate_instances: tuple[int, ...] = tuple(range(12))
    """Instance seeds (token features) screened, in order, by :func:`qualifying_instances`."""
    n_instances: int = 2
    """How many qualifying instances to use."""
    V: int = 10
    """Vocabulary size (incl. the end token in the variable-length settings)."""
    d: int = 4
    """Feature dimension of the shared log-linear token policy."""
    J0: float = 0.2
    """Initial success rate, held fixed for every T by placing theta."""
    group_size: int = 8
    """G, responses per group."""
    method: str = "grpo"
    """gapdyn method for the sampled settings."""
    steps: int = 60
    """N: a run collapses if J < collapse_J within N steps."""
    runs: int = 16
    """Independent sampled runs per (setting, instance, T, eta)."""
    eta_min: float = 0.1
    eta_max: float = 300.0
    per_decade: int = 6
    """Grid points per decade (resolution 10^(1/per_decade))."""
    collapse_J: float = 0.01
    level: float = 0.5
    """eta* = smallest grid eta with P(collapse) >= level."""
    ac_split_T: int = 8
    """The AC control's slope is fitted over all T and over T >= ac_split_T ("flat for large T")."""
    tabular_sampled_max_T: int = 32
    """tabular_MAJ_grpo (reported, no claim) runs only for T <= this (its sampler is O(G T V) a run)."""
    filter_steps: int = 200
    """Steps of the T = 1 exact log-odds run used to screen instances."""
    seed: int = 0
    """Base seed of the sampled runs."""

    @classmethod
    def quick(cls) -> "Config":
        """Seconds: 2 instances, T = 1..16, 16 runs per eta, a 1/6-decade grid on [0.1, 300]."""
        return cls(mode="quick", settings=QUICK_SETTINGS, ac_split_T=4)

    @classmethod
    def full(cls) -> "Config":
        return cls(
            mode="full", Ts=(1, 2, 4, 8, 16, 32, 64), candidate_instances=tuple(range(40)), n_instances=5,
            steps=100, runs=32, eta_min=1e-2, eta_max=1e3, per_decade=8, filter_steps=300,
        )

    def __post_init__(self):
        if self.mode not in ("quick", "full"):
            raise ValueError(f"mode must be 'quick' or 'full', got {self.mode!r}")
        unknown = set(self.settings) - set(SETTINGS)
        if unknown:
            raise ValueError(f"settings must be among {sorted(SETTINGS)}, got unknown {sorted(unknown)}")
        if not self.Ts or any(int(T) < 1 for T in self.Ts) or len(set(self.Ts)) != len(self.Ts):
            raise ValueError(f"Ts must be distinct integers >= 1, got {self.Ts!r}")
        if not 0 < self.J0 < 1:
            raise ValueError(f"J0 must be in (0, 1), got {self.J0!r}")
        if not 0 < self.eta_min < self.eta_max:
            raise ValueError("need 0 < eta_min < eta_max")
        if self.n_instances < 1 or self.runs < 1 or self.steps < 1 or self.per_decade < 1:
            raise ValueError("n_instances, runs, steps and per_decade must be >= 1")


def eta_grid(eta_min: float, eta_max: float, per_decade: int) -> np.ndarray:
    """eta_min 10^(k / per_decade), k = 0, 1, ... up to eta_max."""
    n = int(np.floor(np.log10(eta_max / eta_min) * per_decade + 1e-9)) + 1
    return eta_min * 10.0 ** (np.arange(n) / per_decade)


# ---------------------------------------------------------------------------------------------
# instances


def _shared_start(instance: int, T: int, rule: str, J0: float, V: int, d: int, variable: bool):
    """The environment and theta0 = alpha u with J(theta0) = J0; u = Gap of the T = 1 problem at 0."""
    env1 = SharedSequenceBandit.random(V=V, d=d, T=1, rule=rule, seed=instance, variable_length=variable)
    u = env1.gap(np.zeros(d))
    u = u / np.linalg.norm(u)
    env = env1.with_T(T)
    return env, place_for_success_rate(env, u, J0)


def _tabular_start(instance: int, T: int, rule: str, J0: float, V: int):
    """z0 = N(0,1) logits [T, V] (seeded by the instance) + alpha on the correct token, J(z0) = J0."""
    env = TabularSequenceBandit(V=V, T=T, rule=rule)
    base = np.random.default_rng([instance, T]).standard_normal((T, V))
    e_c = np.zeros((T, V))
    e_c[:, env.correct] = 1.0
    return env, place_for_success_rate(env, e_c, J0, base=base)


def _reachable(config: Config, inst: int) -> bool:
    """J0 can be placed at every T for every shared (rule, variable length) pair in config.settings."""
    pairs = {(SETTINGS[s][1], SETTINGS[s][3]) for s in config.settings if SETTINGS[s][0] == "shared"}
    try:
        for rule, variable in sorted(pairs):
            for T in config.Ts:
                _shared_start(inst, int(T), rule, config.J0, config.V, config.d, variable)
    except ValueError:
        return False
    return True


def qualifying_instances(config: Config) -> tuple[list[int], dict[int, str]]:
    """(qualifying, why_not): instances in order until n_instances qualify; the reason for each rejected one.

    Filter: (1) exact log-odds ascent of the T = 1 problem (one correct token), started at J0,
    collapses (J < collapse_J within filter_steps) at some eta of the grid ("finite T = 1 threshold");
    (2) J0 is reachable along the placement line at every T for every shared setting (else eta* vs T
    cannot be measured at fixed J0: the correct token cannot get the mass MAJ at large T needs).
    """
    etas = eta_grid(config.eta_min, config.eta_max, config.per_decade)
    good, why_not = [], {}
    for inst in map(int, config.candidate_instances):
        try:
            env, th0 = _shared_start(inst, 1, "MAJ", config.J0, config.V, config.d, False)
        except ValueError:
            why_not[inst] = "J0 unreachable at T=1"
            continue
        out = simulate(env, np.tile(th0, (etas.size, 1)), etas, direction="logodds",
                       steps=config.filter_steps, collapse_J=config.collapse_J)
        if not out["collapsed"].any():
            why_not[inst] = "no T=1 threshold"
        elif not _reachable(config, inst):
            why_not[inst] = "J0 unreachable at some T"
        else:
            good.append(inst)
            if len(good) == config.n_instances:
                break
    return good, why_not


def cells(config: Config, instances: list[int] | None = None) -> list[dict]:
    """One cell per (setting, qualifying instance, T), with every parameter it needs (plain data)."""
    good = qualifying_instances(config)[0] if instances is None else instances
    keep = ("V", "d", "J0", "group_size", "method", "steps", "runs", "eta_min", "eta_max", "per_decade",
            "collapse_J", "seed")
    common = {k: v for k, v in asdict(config).items() if k in keep}
    return [
        {"setting": s, "instance": inst, "T": int(T), **common}
        for s in config.settings
        for inst in good
        for T in config.Ts
        if not (s == "tabular_MAJ_grpo" and T > config.tabular_sampled_max_T)
    ]


def run_cell(
    *, setting: str, instance: int, T: int, V: int, d: int, J0: float, group_size: int, method: str,
    steps: int, runs: int, eta_min: float, eta_max: float, per_decade: int, collapse_J: float, seed: int,
) -> pd.DataFrame:
    """P(collapse) on the eta grid for one (setting, instance, T): one row per eta."""
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {sorted(SETTINGS)}, got {setting!r}")
    model, rule, direction, variable, norm = SETTINGS[setting]
    etas = eta_grid(eta_min, eta_max, per_decade)
    meta = {"model": model, "rule": rule, "direction": direction, "variable_length": variable, "normalized": norm}
    try:
        if model == "shared":
            env, p0 = _shared_start(instance, T, rule, J0, V, d, variable)
        else:
            env, p0 = _tabular_start(instance, T, rule, J0, V)
    except ValueError:  # J0 not reachable along the placement line: recorded, excluded from the fits
        nan = np.full(etas.size, np.nan)
        return pd.DataFrame({"eta": etas, "collapse_prob": nan, "n_runs": 0, "J_final_mean": nan, "J0_exact": nan,
                             "mean_length0": nan, "reachable": False, **meta})
    ex0 = env.exact(p0)
    n = runs if direction == "sampled" else 1
    E = np.repeat(etas, n)
    # the same stream for a setting and its normalised twin (common random numbers)
    tag = zlib.crc32(setting.removesuffix("_norm").encode())
    rng = np.random.default_rng([seed, instance, T, tag])
    out = simulate(env, np.broadcast_to(p0, E.shape + p0.shape), E, direction=direction, method=method,
                   group_size=group_size, steps=steps, rng=rng, length_normalized=norm, collapse_J=collapse_J)
    col = out["collapsed"].reshape(etas.size, n)
    return pd.DataFrame({
        "eta": etas,
        "collapse_prob": col.mean(1),
        "n_runs": n,
        "J_final_mean": out["J_final"].reshape(etas.size, n).mean(1),
        "J0_exact": float(ex0["J"]),
        "mean_length0": float(ex0["mean_length"]),
        "reachable": True,
        **meta,
    })


# ---------------------------------------------------------------------------------------------
# analysis


def critical_table(results: pd.DataFrame, level: float = 0.5) -> pd.DataFrame:
    """eta* per (setting, instance, T), with mean |o| at theta0 and the largest collapse probability."""
    rows = []
    for (s, inst, T), g in results.groupby(["setting", "instance", "T"], sort=True):
        if "reachable" in g and not bool(g["reachable"].iloc[0]):
            continue  # J0 unreachable for this (instance, T): no eta*
        g = g.sort_values("eta")
        rows.append({
            "setting": s, "instance": inst, "T": T,
            "eta_star": critical_eta(g["eta"].to_numpy(), g["collapse_prob"].to_numpy(), level=level),
            "max_collapse_prob": float(g["collapse_prob"].max()),
            "mean_length0": float(g["mean_length0"].iloc[0]),
        })
    return pd.DataFrame(rows)


def _slopes(crit: pd.DataFrame, setting: str, x: str = "T", T_min: int = 1, T_max: int | None = None) -> list[float]:
    out = []
    for _, g in crit[crit["setting"] == setting].groupby("instance"):
        g = g[(g["T"] >= T_min) & (g["T"] <= (T_max or np.inf)) & np.isfinite(g["eta_star"])]
        if len(g) >= 3 and g[x].nunique() >= 3:
            out.append(loglog_slope(g[x].to_numpy(float), g["eta_star"].to_numpy()).slope)
        else:
            out.append(np.nan)
    return out


def _fmt(vals) -> str:
    v = np.asarray(vals, float)
    f = v[np.isfinite(v)]
    if f.size == 0:
        return "n/a"
    return f"median {np.median(f):+.2f} (range {f.min():+.2f}..{f.max():+.2f}; {f.size}/{v.size} instances)"


def _verdict(vals, lo, hi) -> str:
    v = np.asarray(vals, float)
    f = v[np.isfinite(v)]
    if f.size == 0:
        return "does not hold"
    inside = (f >= lo) & (f <= hi)
    if inside.all() and f.size == v.size:
        return "holds"
    if lo <= np.median(f) <= hi:
        return f"holds only in {int(inside.sum())} of {v.size} instances"
    return "does not hold"


def analyse(results: pd.DataFrame, config: Config) -> pd.DataFrame:
    """The verdict table: claim, setting, measured, expected, holds (see module doc)."""
    crit = critical_table(results, config.level)
    res = np.log10(10 ** (1 / config.per_decade))
    have = set(crit["setting"])
    rows = []

    def add(claim, setting, measured, expected, holds):
        rows.append({"claim": claim, "setting": setting, "measured": measured, "expected": expected, "holds": holds})

    T_span = f"T={min(config.Ts)}..{max(config.Ts)}"
    if "shared_MAJ_grpo" in have:
        sl = _slopes(crit, "shared_MAJ_grpo")
        add("eta* ~ 1/T (Thm 3)", f"shared, MAJ, sampled GRPO, J0={config.J0}, {T_span}", _fmt(sl),
            "slope in [-1.25, -0.8] (SIMULATIONS: -0.91..-1.09)", _verdict(sl, -1.25, -0.8))
        if max(config.Ts) > 16 and sum(T <= 16 for T in config.Ts) >= 3:
            lo_T = _slopes(crit, "shared_MAJ_grpo", T_max=16)
            hi_T = _slopes(crit, "shared_MAJ_grpo", T_min=8)
            add("eta* ~ 1/T (Thm 3), short responses", "same, T <= 16", _fmt(lo_T),
                "slope in [-1.25, -0.8]", _verdict(lo_T, -1.25, -0.8))
            add("eta* ~ 1/T (Thm 3), long responses", "same, T >= 8", _fmt(hi_T),
                "slope in [-1.25, -0.8]", _verdict(hi_T, -1.25, -0.8))
    if {"shared_MAJ_grpo", "shared_MAJ_grpo_norm"} <= have:
        d = np.array(_slopes(crit, "shared_MAJ_grpo_norm")) - np.array(_slopes(crit, "shared_MAJ_grpo"))
        tol = 2 * res / np.log10(max(config.Ts) / min(config.Ts)) + 0.05
        add("fixed T: 1/|o| = eta/T, slope + 1", "shared, MAJ, sampled GRPO, with vs without 1/|o|", _fmt(d),
            f"difference 1 +- {tol:.2f} (grid resolution)", _verdict(d, 1 - tol, 1 + tol))
    for s, label in (("var_MAJ_grpo", "without"), ("var_MAJ_grpo_norm", "with")):
        if s in have:
            slT = _slopes(crit, s)
            slL = _slopes(crit, s, x="mean_length0")
            lens = crit[(crit["setting"] == s)].groupby("T")["mean_length0"].median()
            exp_lo, exp_hi = (-1.25, -0.8) if label == "without" else (-0.25, 0.25)
            add(f"variable length, {label} 1/|o|: eta* vs E|o|", f"end token, MAJ, sampled GRPO, T_max {T_span}; "
                f"E|o| at theta0 {lens.min():.1f}..{lens.max():.1f}; slope vs T_max {_fmt(slT)}",
                _fmt(slL), f"slope vs E|o| in [{exp_lo}, {exp_hi}] (Thm 3{', one T cancelled' if label == 'with' else ''})",
                _verdict(slL, exp_lo, exp_hi))
    if "shared_MAJ_logodds" in have:
        sl = _slopes(crit, "shared_MAJ_logodds")
        add("exact log-odds ascent: eta* ~ 1/T", f"shared, MAJ, w = grad Phi, {T_span}", _fmt(sl),
            "slope in [-0.95, -0.7] (SIMULATIONS: -0.79..-0.83)", _verdict(sl, -0.95, -0.7))
    if "shared_AC_grpo" in have:
        split = config.ac_split_T
        sl = _slopes(crit, "shared_AC_grpo")
        big = _slopes(crit, "shared_AC_grpo", T_min=split)
        add("negative control: AC at fixed J0", f"shared, AC, sampled GRPO, {T_span}", _fmt(sl),
            "slope about -0.5: in [-0.75, -0.25] (SIMULATIONS: -0.4..-0.6)", _verdict(sl, -0.75, -0.25))
        add(f"negative control: AC at fixed J0, T >= {split}", "shared, AC, sampled GRPO", _fmt(big),
            "flat: slope in [-0.3, 0.3] (SIMULATIONS: about -0.1 for T >= 8)", _verdict(big, -0.3, 0.3))
    for s in ("tabular_MAJ_logodds", "tabular_AC_logodds"):
        if s in have:
            c = crit[crit["setting"] == s]
            n_thr = int(np.isfinite(c["eta_star"]).sum())
            add("negative control: position-wise tabular has no threshold", f"{s}: exact log-odds ascent, {T_span}, "
                f"eta up to {config.eta_max:g}", f"max P(collapse) {c['max_collapse_prob'].max():.2f}; "
                f"finite eta* in {n_thr}/{len(c)} (instance, T)", "no collapse at any eta", n_thr == 0)
    if "tabular_MAJ_grpo" in have:
        c = crit[crit["setting"] == "tabular_MAJ_grpo"]
        n_thr = int(np.isfinite(c["eta_star"]).sum())
        Tt = sorted(c["T"].unique())
        add("position-wise tabular under sampling (reported, no claim)",
            f"tabular, MAJ, sampled GRPO, T={Tt[0]}..{Tt[-1]}; eta* (instance, T): "
            + (", ".join(f"{e:.3g} ({i}, {t})" for i, t, e in c.loc[np.isfinite(c['eta_star']),
                         ['instance', 'T', 'eta_star']].itertuples(index=False)) or "none"),
            f"finite eta* in {n_thr}/{len(c)} (instance, T); max P(collapse) {c['max_collapse_prob'].max():.2f}",
            "no prior (the 'no threshold' argument is for exact ascent)", "n/a")
    return pd.DataFrame(rows, columns=["claim", "setting", "measured", "expected", "holds"])


def run(config: Config, *, store=None, backend: str = "joblib", n_jobs: int = -1, progress: bool = True):
    """(results, verdict) via bandits.sweep.run_sweep (name ``length-<mode>``, resumable with a store)."""
    good, why_not = qualifying_instances(config)
    results = run_sweep(run_cell, cells(config, good), name=f"length-{config.mode}", store=store,
                        backend=backend, n_jobs=n_jobs, progress=progress)
    verdict = analyse(results, config)
    bad = results.loc[~results["reachable"].astype(bool), ["setting", "instance", "T"]].drop_duplicates()
    if len(bad):
        verdict.loc[len(verdict)] = {
            "claim": "cells where J0 is not reachable along the placement line (excluded from the fits)",
            "setting": "theta0 = alpha u, u = T=1 Gap at 0", "holds": "n/a", "expected": "none",
            "measured": "; ".join(f"{s} inst {i} T={t}" for s, i, t in bad.itertuples(index=False)),
        }
    filt = {"claim": "instances with a finite T=1 threshold (filter)", "setting": "exact log-odds ascent, T=1, J0",
            "measured": f"used {good}; rejected: "
            f"{sum(v.startswith('no') for v in why_not.values())} without a T=1 threshold, "
            f"{sum(v.endswith('T=1') for v in why_not.values())} with J0 unreachable at T=1, "
            f"{sum(v.endswith('some T') for v in why_not.values())} with a T=1 threshold but J0 unreachable at "
            f"some T ({sorted(k for k, v in why_not.items() if v.endswith('some T'))})",
            "expected": "a share (SIMULATIONS: 6/20 in the 100-arm bandit); not every instance has one", "holds": "n/a"}
    verdict = pd.concat([pd.DataFrame([filt]), verdict], ignore_index=True)
    return results, verdict
