"""Stagnation on a realisable noisy setting: does a fixed eta stall below J* = 1 (J_max ~ 1 - c eta T)?

Suk & Duan (arXiv 2510.08539), Theorem 3 and its discussion: the critical step shrinks like (1 - J)/T, so a
fixed eta should stall at J_max ~ 1 - c eta T, strictly below 1 (the exact bound is open). The stall needs
what the exact, T = 1 settings of :mod:`bandits.experiments.stagnation` lack: sampled (noisy) updates and
responses of T > 1 tokens, on a problem whose best attainable J* is 1. This study is one existence search there.

Setting (:func:`realisable_bandit`): the shared-parameter token model of :mod:`bandits.sequence` (one
log-linear token policy p(v) ~ exp(phi(v) . theta) at every position; V = 10, d = 4, rule MAJ), with the
correct token 0 the token of largest feature norm, a vertex of the feature hull, so theta = alpha phi_0 drives
p(0), hence J, to 1 as alpha grows: J* = 1 by construction. theta0 = alpha0 phi_0 / |phi_0| with J(theta0) = J0.
Sampled updates (G = 8) of GRPO and REINFORCE (no baseline: an all-correct group still moves theta, so its noise
does not vanish as J -> 1) at fixed etas, T in :data:`LENGTHS`, several streams per instance (common random
numbers across etas).

A run's label is :func:`bandits.experiments.stagnation.stall_outcome` with J* = 1 (J < 1e-3 in the last quarter
first: collapse is not a stall): ``stalled`` when the best J of the last quarter stays more than 1e-3 below 1 and
adds at most 10 % of that gap to the best J before it (a plateau), ``at_optimum`` within 1e-3 of 1,
``improving`` otherwise. Its stall gap is 1 - max J over the last quarter if stalled, else 0.

Claims (criteria frozen at import, :data:`CRITERIA`):

- ``stagnation_noisy.stall.<method>.T=<T>.eta=<eta>`` (existence, one setting): the mean over instances of the
  stall gap is above 1e-3. The setting is the one :func:`choose_setting` picks from the discovery block (the
  most stalled; a rule fixed before that block ran); its id, hence the criteria hash, names it, so the choice
  is frozen before the confirmation block.
- ``stagnation_noisy.larger_eta_lower.<method>.T=<T>`` (comparison, one per method and T): the statement's
  direction, a larger fixed eta ends lower: the mean over instances of [1 - J_max(eta_hi)] - [1 - J_max(eta_lo)]
  (J_max: max J over the last quarter, averaged over streams) is above 0. Measured only when no run at either
  eta collapses or dips below 1e-3 in its last quarter (the comparison is about stalls, not collapse);
  otherwise not measured, with the count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

import gapdyn
from gapdyn.evidence.claims import keyed_specs
from gapdyn.evidence.experiment import Experiment, claim_specs
from gapdyn.evidence.stats import NotMeasured
from bandits.sequence import SequenceDynamics, SharedSequenceBandit, place_for_success_rate, simulate

from ._common import mean_estimate, no_data, run_experiment, run_stats
from .stagnation import STALL_MARGIN, stall_outcome

NAME = "stagnation_noisy"
METHODS = ("grpo", "reinforce")
LENGTHS = (2, 4, 8)
ETAS = (0.1, 0.3, 1.0, 3.0, 10.0)
ETA_LO, ETA_HI = 0.1, 1.0
"""The pair of fixed step sizes of the comparison rows (both in every full grid)."""
CHOSEN = ("reinforce", 8, 3.0)
"""(method, T, eta) of the existence row: :func:`choose_setting` on the discovery block (instances 0-19, the full
grid), written here before the confirmation block ran. No discovery run stalled; the tie-break (largest mean
1 - J_max) fell on a setting where that mean is carried by collapsed runs (docs/evidence.md section 10)."""
FEATURE_SEED = 50_000
"""Instance i's features come from numpy.random.default_rng(FEATURE_SEED + i)."""

_SRC = "Suk & Duan (arXiv 2510.08539), Thm 3 discussion (a fixed eta stalls at J_max ~ 1 - c eta T; open)"
_WHERE = "realisable shared-token model (J* = 1 by construction), sampled updates, T > 1"


def stall_id(method: str, T: int, eta: float) -> str:
    """Claim id of the existence row of one setting."""
    return f"{NAME}.stall.{method}.T={int(T)}.eta={float(eta):g}"


def compare_id(method: str, T: int) -> str:
    """Claim id of the eta comparison of one (method, T)."""
    return f"{NAME}.larger_eta_lower.{method}.T={int(T)}"


_STALL = stall_id(*CHOSEN)
_COMPARE = {(m, T): compare_id(m, T) for m in METHODS for T in LENGTHS}

STATEMENTS: dict[str, tuple[str, str]] = {
    _STALL: (_SRC, f"{_WHERE}: {CHOSEN[0]} at the fixed eta = {CHOSEN[2]:g}, T = {CHOSEN[1]} stalls below J* = 1 "
                   "(J plateaus more than 1e-3 below 1 without collapse)"),
    **{cid: (_SRC, f"{_WHERE}: {m}, T = {T}: the larger fixed eta ({ETA_HI:g}) ends lower than the smaller "
                   f"({ETA_LO:g}) (J_max ~ 1 - c eta T falls with eta), runs without collapse")
       for (m, T), cid in _COMPARE.items()},
}
CRITERIA: dict[str, gapdyn.Criterion] = {
    _STALL: gapdyn.Criterion.above(STALL_MARGIN),
    **{cid: gapdyn.Criterion.above(0.0, alpha=0.05) for cid in _COMPARE.values()},
}
FORMS: dict[str, str] = {_STALL: "existence", **{cid: "comparison" for cid in _COMPARE.values()}}
KEYS = {cid: (("Suk & Duan", "stagnation"), "test") for cid in STATEMENTS}
"""Every row tests the stagnation statement in its own premise (noisy updates, T > 1, J* = 1)."""
SPECS = keyed_specs(claim_specs(STATEMENTS, CRITERIA, FORMS, primary=tuple(_COMPARE.values())), KEYS)
"""Every claim's frozen gapdyn.ClaimSpec; the comparisons are the primary family (Holm)."""


@dataclass(frozen=True)
class Config:
    """The search grid and sizes."""

    mode: str = "quick"
    instances: tuple[int, ...] = gapdyn.DISCOVERY_SEEDS
    confirmation: tuple[int, ...] = ()
    methods: tuple[str, ...] = METHODS
    lengths: tuple[int, ...] = LENGTHS
    etas: tuple[float, ...] = ETAS
    streams: int = 4
    steps: int = 4000
    group_size: int = 8
    J0: float = 0.5
    V: int = 10
    d: int = 4

    @classmethod
    def test(cls) -> Config:
        return cls(mode="test", instances=(0, 1), lengths=(2,), etas=(ETA_LO, ETA_HI), streams=2, steps=120)

    @classmethod
    def quick(cls) -> Config:
        return cls(mode="quick", instances=gapdyn.DISCOVERY_SEEDS[:8], steps=2000)

    @classmethod
    def full(cls) -> Config:
        return cls(mode="full", confirmation=tuple(range(1000, 1040)))  # 40: the mean interval covers from 40


def realisable_bandit(instance: int, T: int, *, V: int = 10, d: int = 4) -> SharedSequenceBandit:
    """Gaussian features [V, d] (default_rng(FEATURE_SEED + instance)) with the token of largest norm moved to
    index 0, the one correct token: for u = phi_0, u . phi_0 = |phi_0|^2 > u . phi_v for every other v (Cauchy-
    Schwarz, |phi_v| <= |phi_0|, phi_v != phi_0), so phi_0 is a hull vertex and J(alpha phi_0) -> 1: J* = 1."""
    phi = np.random.default_rng(FEATURE_SEED + int(instance)).standard_normal((V, d))
    top = int(np.argmax(np.linalg.norm(phi, axis=1)))
    phi[[0, top]] = phi[[top, 0]]
    return SharedSequenceBandit(phi, (0,), "MAJ", int(T))


def cells(config: Config, instances=None) -> list[dict]:
    seeds = config.instances if instances is None else instances
    common = {k: (list(v) if isinstance(v, tuple) else v) for k, v in config.__dict__.items()
              if k not in ("mode", "instances", "confirmation", "methods", "lengths")}
    return [{"instance": int(i), "method": m, "T": int(T), **common}
            for i in seeds for m in config.methods for T in config.lengths]


def run_cell(*, instance, method, T, etas, streams, steps, group_size, J0, V, d) -> pd.DataFrame:
    """One row per (eta, stream) run of one (instance, method, T): its J_max (max J over the last quarter), the
    best J before it, the outcome of :func:`stall_outcome` against J* = 1 and the stall gap."""
    env = realisable_bandit(instance, T, V=V, d=d)
    u = env.features[0] / np.linalg.norm(env.features[0])
    theta0 = place_for_success_rate(env, u, J0)
    E, S = np.meshgrid(np.asarray(etas, float), np.arange(streams), indexing="ij")
    seeds = 1000 * int(instance) + S.ravel()
    tr = simulate(env, SequenceDynamics(method=method, gradient="sampled", group_size=group_size, steps=steps),
                  eta=E.ravel(), seed=seeds, theta0=theta0)
    tail0 = gapdyn.tail_start(steps)
    pre_max = np.clip(tr.J[:, :tail0].max(axis=1), 0.0, 1.0)  # states 0..tail0-1 (record_every = 1)
    stats = run_stats(tr)
    outcome, gap = stall_outcome(1.0, pre_max, stats, [stats])
    return pd.DataFrame({"eta": E.ravel(), "stream": S.ravel(), "seed": seeds, "J0": tr.J[:, 0],
                         "J_pre_max": pre_max, "J_max": stats.J_tail_max, "J_tail_min": stats.J_tail_min,
                         "J_final": tr.J_final, "outcome": outcome.astype(str), "gap": gap,
                         "stall_gap": np.where(outcome == "stalled", gap, 0.0),
                         "collapsed": gapdyn.is_collapsed(stats),
                         "dipped": stats.J_tail_min < gapdyn.COLLAPSE_J})


def setting_table(results: pd.DataFrame) -> pd.DataFrame:
    """Per (method, T, eta): instances, runs, share of runs stalled, mean stall gap (mean over instances of the
    per-instance mean), mean 1 - J_max, runs collapsed or dipping."""
    g = results.groupby(["method", "T", "eta"])
    per_inst = results.groupby(["method", "T", "eta", "instance"])[["stall_gap"]].mean()
    out = pd.DataFrame({
        "instances": g["instance"].nunique(), "runs": g.size(),
        "stalled_share": g["outcome"].apply(lambda o: float((o == "stalled").mean())),
        "mean_stall_gap": per_inst.groupby(level=[0, 1, 2])["stall_gap"].mean(),
        "mean_1_minus_Jmax": g["gap"].mean(),
        "collapsed_or_dipped": g.apply(lambda x: int((x["collapsed"] | x["dipped"]).sum()), include_groups=False),
    })
    return out.reset_index()


def choose_setting(results: pd.DataFrame) -> tuple[str, int, float]:
    """The setting of the existence row, from a discovery block: the (method, T, eta) with the largest mean
    stall gap; ties (e.g. none stalls) by the larger share of runs stalled, then the larger mean 1 - J_max (the
    run closest to a stall), then the smaller (method, T, eta) in sort order."""
    if results.empty:
        raise ValueError("results hold no runs to choose a setting from")
    t = setting_table(results)
    t = t.sort_values(["mean_stall_gap", "stalled_share", "mean_1_minus_Jmax", "method", "T", "eta"],
                      ascending=[False, False, False, True, True, True])
    r = t.iloc[0]
    return str(r["method"]), int(r["T"]), float(r["eta"])


def analyse(results: pd.DataFrame, config: Config, *, block: str = "discovery") -> list[gapdyn.Claim]:
    """The existence row at :data:`CHOSEN` and the eta comparisons, from one block's rows."""
    rng = np.random.default_rng(0)
    claims: list[gapdyn.Claim] = []

    def add(cid, est, *, setting, statistic, reason="", **kw):
        spec = SPECS[cid]
        if isinstance(est, NotMeasured) or reason:
            kw["reason"] = reason or est.reason
        claims.append(gapdyn.Claim.from_estimate(est, id=cid, source=spec.source, statement=spec.statement,
                                                 setting=setting, statistic=statistic,
                                                 criterion_text=spec.criterion_text, criterion=spec.criterion,
                                                 block=block, form=spec.form, key=spec.key, role=spec.role,
                                                 primary=spec.primary, **kw))

    grid = (f"V = {config.V}, d = {config.d}, rule MAJ, G = {config.group_size}, J0 = {config.J0:g}, "
            f"{config.steps} steps, {config.streams} streams per instance ({block})")
    m, T, eta = CHOSEN
    d = results[(results["method"] == m) & (results["T"] == T) & np.isclose(results["eta"], eta)]
    n = d["instance"].nunique()
    where = f"{m}, T = {T}, eta = {eta:g}; {grid}; {n} instances"
    if n:
        counts = d["outcome"].value_counts()
        where += "; runs: " + ", ".join(f"{k} {int(v)}" for k, v in counts.items())
    per = d.groupby("instance")["stall_gap"].mean()
    est = mean_estimate(per.to_numpy(float), seed=int(rng.integers(2**31)), natural=(0.0, 1.0)) if n else \
        no_data(0.0, 1.0, f"setting {CHOSEN} not in this run's grid")
    add(_STALL, est, setting=where,
        statistic="mean over instances of the stall gap (1 - max J over the last quarter for a stalled run, "
                  "0 otherwise; mean over streams)")

    for (m, T), cid in _COMPARE.items():
        d = results[(results["method"] == m) & (results["T"] == T)
                    & (np.isclose(results["eta"], ETA_LO) | np.isclose(results["eta"], ETA_HI))]
        bad = int((d["collapsed"] | d["dipped"]).sum())
        where = f"{m}, T = {T}, eta {ETA_LO:g} vs {ETA_HI:g}; {grid}; runs collapsed or dipping: {bad} of {len(d)}"
        est, p, reason = no_data(-1.0, 1.0), None, ""
        piv = d.pivot_table(index="instance", columns="eta", values="gap", aggfunc="mean") if len(d) else None
        if piv is None or piv.shape[1] < 2:
            reason = f"etas {ETA_LO:g} and {ETA_HI:g} not both in this run's grid"
        elif bad:
            reason = f"premise not met: {bad} runs collapse or dip below 1e-3 (a comparison of stalls, not collapse)"
        else:
            diff = (piv[ETA_HI] - piv[ETA_LO]).to_numpy(float)
            est = mean_estimate(diff, seed=int(rng.integers(2**31)), natural=(-1.0, 1.0))
            p = gapdyn.mcnemar_exact((diff > 0).astype(float), (diff < 0).astype(float)).p_value
        add(cid, est, setting=where, reason=reason, p_value=p, p_adjusted=p,
            statistic="mean over instances of (1 - J_max) at the larger eta minus at the smaller (J_max: max J "
                      "over the last quarter, mean over streams; common random numbers); p: exact two-sided sign "
                      "test over instances")
    return claims


def run(config: Config, *, store=None, backend="joblib", n_jobs=-1, progress=True):
    """ExperimentResult of both blocks (discovery, and confirmation in full mode)."""
    return run_experiment(EXPERIMENT, config, store=store, backend=backend, n_jobs=n_jobs, progress=progress)


EXPERIMENT = Experiment(name=NAME, claims=SPECS, config=Config, cells=cells, run_cell=run_cell, analyse=analyse)
"""This study in the one protocol (gapdyn.evidence.experiment.Experiment)."""
