"""Experiment 2 `length`: the critical step eta* against the response length T (Suk & Duan, arXiv
2510.08539, Thm 3: the safe step shrinks ~ (1 - J)/T; dividing the update by |o| cancels one T).

Setting (docs/bandits_sequence.md): the token model with partial sharing of
:class:`bandits.partial.PartialSharingBandit`, phi_t(v) = sqrt(rho) phi(v) + sqrt(1 - rho) psi_t(v)
(V = 10 tokens, d = 4, token 0 correct, rule MAJ), one theta for all T positions, rho in
{0, 0.25, 0.5, 0.75, 1}. For every (instance, rho, T) theta0 = alpha u, u the unit Gap of that
problem at 0, alpha placed so that J(theta0) = J0 (two placements, J0 = 0.1 and 0.5). Dynamics:
sampled GRPO (G = 8) through :func:`bandits.sequence.simulate`; each (instance, seed) is one random
stream shared by every eta (common random numbers), so J_min(eta) is deterministic and
eta* = gapdyn.find_eta_star (collapse: J < gapdyn.COLLAPSE_J within ``steps``) is that stream's
first collapsing step size.

Estimator: the slope b of log eta* on log T within (instance, seed) series (each series centred,
pooled least squares); 95 % interval by a cluster bootstrap over instances (gapdyn.cluster_bootstrap).
A series enters with its found eta* when at least two T have one; every (instance, seed, T) that
has none is counted by reason (J0 not reachable by the placement, no collapse in [eta_lo, eta_hi],
collapse already at eta_lo). With fixed length, the 1/|o| update at eta is the raw update at eta/T
(the same stream), so eta*_norm = T eta*_raw and the normalised slope is b + 1 by construction: an
identity row (rho = 1), not a test of the theorem. The 1/|o| twin is scanned on the raw grid times T,
so the identity compares the same trajectories (on a common grid, an island one scan steps over and
the other hits would break it at the grid's resolution, not the code).
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

import gapdyn

from ..partial import PartialSharingBandit
from ..sequence import SequenceDynamics, place_for_success_rate, simulate
from ._common import run_experiment, run_stats
from ._slopes import within_slope_estimate

__all__ = ["NAME", "CRITERIA", "RHOS", "J0S", "Config", "cells", "run_cell", "start", "analyse",
           "slope_claim_id", "identity_claim_id", "fit_points", "run"]

NAME = "length"
RHOS = (0.0, 0.25, 0.5, 0.75, 1.0)
"""Feature sharing across positions."""
J0S = (0.1, 0.5)
"""The two theta0 placements (initial success rate)."""
IDENTITY_RHO = 1.0
"""The sharing at which the 1/|o| identity row is measured."""
_SOURCE = "Suk & Duan (arXiv 2510.08539), Thm 3"


def _slope_id(rho: float, J0: float) -> str:
    return f"eta_star_vs_T/rho={rho:g}/J0={J0:g}"


def _norm_id(J0: float) -> str:
    return f"normalised_slope_minus_raw/rho={IDENTITY_RHO:g}/J0={J0:g}"


def slope_claim_id(rho: float, J0: float) -> str:
    """Id of the claim on the raw slope of log eta* on log T at (rho, J0)."""
    return _slope_id(rho, J0)


def identity_claim_id(J0: float) -> str:
    """Id of the identity row (1/|o| slope minus raw slope) at J0."""
    return _norm_id(J0)


# written from the theorem before any run: eta* ~ 1/T, i.e. slope -1 (stated tolerance 0.25)
CRITERIA: dict[str, gapdyn.Criterion] = {
    **{_slope_id(r, j): gapdyn.Criterion.contains(-1.0, tol=0.25) for r in RHOS for j in J0S},
    **{_norm_id(j): gapdyn.Criterion.identity(1.0, tol=0.02) for j in J0S},
}
FORMS: dict[str, str] = {
    **{_slope_id(r, j): "law" for r in RHOS for j in J0S},
    **{_norm_id(j): "identity" for j in J0S},
}
"""The form of each claim's statement (gapdyn.FORMS)."""
_SLOPE_TEXT = "95 % interval of the slope of log eta* on log T contains -1 and lies in [-1.25, -0.75]"
_NORM_TEXT = "identity: eta*_norm(T) = T eta*_raw(T) (fixed length, same stream), slope difference 1 +- 0.02"


@dataclass(frozen=True)
class Config:
    """Experiment 2 configuration (plain data; every random draw is seeded from it)."""

    mode: str = "full"
    instances: tuple[int, ...] = gapdyn.DISCOVERY_SEEDS
    """Feature seeds of the discovery block."""
    confirmation: tuple[int, ...] = gapdyn.CONFIRMATION_SEEDS
    """Feature seeds of the confirmation block (full mode)."""
    Ts: tuple[int, ...] = (1, 2, 4, 8, 16)
    seeds: int = 2
    """Random streams per instance (seeds 0..seeds-1)."""
    V: int = 10
    d: int = 4
    rule: str = "MAJ"
    method: str = "grpo"
    dynamics_mode: str = "sampled"
    group_size: int = 8
    steps: int = 100
    """Horizon: collapse = J < gapdyn.COLLAPSE_J within this many steps."""
    eta_lo: float = 1e-2
    eta_hi: float = 1e3
    max_ratio: float = 1.01
    """Largest ratio of neighbouring etas of find_eta_star's scan."""
    n_boot: int = 2000

    @classmethod
    def test(cls) -> "Config":
        return cls(mode="test", instances=(0, 1), confirmation=(), Ts=(1, 2, 4), seeds=1, steps=20,
                   eta_lo=0.1, eta_hi=100.0, max_ratio=1.3, n_boot=200)

    @classmethod
    def quick(cls) -> "Config":
        return cls(mode="quick", instances=gapdyn.DISCOVERY_SEEDS[:8], confirmation=(), Ts=(1, 2, 4, 8), seeds=1,
                   steps=40, eta_lo=0.05, eta_hi=500.0, max_ratio=1.1, n_boot=1000)

    @classmethod
    def full(cls) -> "Config":
        return cls()

    def __post_init__(self):
        if self.mode not in ("test", "quick", "full"):
            raise ValueError(f"mode must be 'test', 'quick' or 'full', got {self.mode!r}")
        if not self.Ts or len(set(self.Ts)) != len(self.Ts) or any(int(T) != T or T < 1 for T in self.Ts):
            raise ValueError(f"Ts must be distinct integers >= 1, got {self.Ts!r}")
        if len(self.Ts) < 2:
            raise ValueError("Ts must hold at least two lengths (a slope needs two)")
        if self.seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {self.seeds!r}")
        if not 0 < self.eta_lo < self.eta_hi:
            raise ValueError(f"eta_lo and eta_hi must satisfy 0 < eta_lo < eta_hi, got {self.eta_lo}, {self.eta_hi}")
        SequenceDynamics(method=self.method, mode=self.dynamics_mode, group_size=self.group_size, steps=self.steps)


def cells(config: Config, instances) -> list[dict]:
    """One cell per (instance, rho, J0, T, normalised); the 1/|o| twin only at rho = IDENTITY_RHO."""
    keep = ("V", "d", "rule", "method", "dynamics_mode", "group_size", "steps", "eta_lo", "eta_hi", "max_ratio",
            "seeds")
    common = {k: v for k, v in asdict(config).items() if k in keep}
    out = []
    for inst in instances:
        for rho in RHOS:
            for J0 in J0S:
                for T in config.Ts:
                    for norm in (False, True) if rho == IDENTITY_RHO else (False,):
                        out.append({"instance": int(inst), "rho": float(rho), "J0": float(J0), "T": int(T),
                                    "normalized": norm, **common})
    return out


def start(instance: int, rho: float, T: int, J0: float, *, V: int = 10, d: int = 4, rule: str = "MAJ"):
    """(env, theta0): theta0 = alpha u with u the unit Gap of the problem at 0 and J(theta0) = J0 (ValueError if
    J0 is not reachable along u)."""
    env = PartialSharingBandit.random(T=T, rho=rho, V=V, d=d, rule=rule, seed=instance)
    u = env.gap(np.zeros(d))
    norm = float(np.linalg.norm(u))
    if not norm > 0:
        raise ValueError("the Gap vanishes at theta = 0: no placement direction")
    return env, place_for_success_rate(env, u / norm, J0)


def run_cell(
    *, instance: int, rho: float, J0: float, T: int, normalized: bool, V: int, d: int, rule: str, method: str,
    dynamics_mode: str, group_size: int, steps: int, eta_lo: float, eta_hi: float, max_ratio: float, seeds: int,
) -> pd.DataFrame:
    """eta* (gapdyn.find_eta_star on [eta_lo, eta_hi], x T for the 1/|o| twin) of each stream 0..seeds-1: one
    row per seed."""
    dyn = SequenceDynamics(method=method, mode=dynamics_mode, group_size=group_size, steps=steps,
                           length_normalized=bool(normalized))
    try:
        env, theta0 = start(instance, rho, T, J0, V=V, d=d, rule=rule)
        J0_exact = float(env.success_rate(theta0))
    except ValueError:
        return pd.DataFrame({"seed": np.arange(seeds), "status": "J0 unreachable", "eta_star": np.nan,
                             "eta_star_loose": np.nan, "n_islands": 0, "J0_exact": np.nan})
    # the 1/|o| twin scans the raw grid times T: its eta*/T is then read off the same points as the raw eta*
    scale = float(T) if normalized else 1.0
    rows = []
    for s in range(seeds):
        res = gapdyn.find_eta_star(lambda e, s=s: run_stats(simulate(env, dyn, eta=e, seed=s, theta0=theta0)),
                                   scale * eta_lo, scale * eta_hi, max_ratio=max_ratio)
        rows.append({"seed": s, "status": res.status, "eta_star": res.eta_star, "eta_star_loose": res.eta_star_loose,
                     "n_islands": res.n_islands, "J0_exact": J0_exact})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# analysis


def _fit_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Found eta* of the series (instance, seed) with found eta* at >= 2 distinct T."""
    ok = df[df["status"] == "found"]
    n_T = ok.groupby(["instance", "seed"])["T"].transform("nunique")
    return ok[n_T >= 2]


def fit_points(df: pd.DataFrame) -> pd.DataFrame:
    """The rows a slope claim fits, for the rows of one (rho, J0, normalized) group."""
    return _fit_rows(df)


def _counts(df: pd.DataFrame, used: pd.DataFrame) -> str:
    c = df["status"].value_counts()
    series = df.groupby(["instance", "seed"]).ngroups
    n_used = used.groupby(["instance", "seed"]).ngroups
    reasons = ", ".join(f"{k}: {v}" for k, v in c.items() if k != "found")
    return (f"{used['instance'].nunique()}/{df['instance'].nunique()} instances, {n_used}/{series} series used; "
            f"(instance, seed, T) points found {int(c.get('found', 0))}/{len(df)}" + (f"; not found: {reasons}"
                                                                                     if reasons else ""))


def _placeholder(reason: str) -> dict:
    """Not enough instances for an interval: the claim is not measured (shown as such, with the reason)."""
    return {"estimate": 0.0, "interval": (0.0, 0.0), "n": 1, "statistic": "within-series OLS slope of log eta* on log T",
            "measured": False, "reason": reason}


def analyse(results: pd.DataFrame, config: Config, *, block: str) -> list[gapdyn.Claim]:
    """One slope claim per (rho, J0) and one identity row per J0 (see module doc)."""
    rng = np.random.default_rng([17, 0 if block == "discovery" else 1])
    res = results.assign(series=results.groupby(["instance", "seed"]).ngroup())
    claims = []
    horizon = (f"sampled {config.method}, G={config.group_size}" if config.dynamics_mode == "sampled"
               else f"exact {config.method}") + f", horizon {config.steps} steps, collapse J < {gapdyn.COLLAPSE_J:g}"
    for rho in RHOS:
        for J0 in J0S:
            sub = res[(res["rho"] == rho) & (res["J0"] == J0) & ~res["normalized"].astype(bool)]
            used = _fit_rows(sub)
            setting = (f"partial sharing rho={rho:g}, V={config.V}, d={config.d}, {config.rule}, J0={J0:g}, "
                       f"T in {list(config.Ts)}, {horizon}; eta in [{config.eta_lo:g}, {config.eta_hi:g}], "
                       f"grid ratio {config.max_ratio:g}; {_counts(sub, used)}")
            common = dict(id=_slope_id(rho, J0), source=_SOURCE, statement="eta* ~ 1/T: slope -1 of log eta* on log T",
                          setting=setting, criterion_text=_SLOPE_TEXT, criterion=CRITERIA[_slope_id(rho, J0)],
                          block=block, form=FORMS[_slope_id(rho, J0)])
            if used["instance"].nunique() >= 2:
                est = within_slope_estimate(np.log(used["T"].to_numpy(float)), np.log(used["eta_star"].to_numpy()),
                                            series=used["series"].to_numpy(), instance=used["instance"].to_numpy(),
                                            rng=rng, n_resamples=config.n_boot)
                claims.append(gapdyn.Claim.from_estimate(
                    est, statistic="within-series OLS slope of log eta* on log T, cluster bootstrap over instances",
                    **common))
            else:
                claims.append(gapdyn.Claim(**common, **_placeholder(
                    f"fewer than 2 instances with eta* at >= 2 T ({used['instance'].nunique()}): no interval")))
    for J0 in J0S:
        sub = res[(res["rho"] == IDENTITY_RHO) & (res["J0"] == J0)]
        raw, nrm = (sub[sub["normalized"].astype(bool) == f] for f in (False, True))
        both = raw.merge(nrm, on=["instance", "seed", "T", "series"], suffixes=("_raw", "_norm"))
        both = both[(both["status_raw"] == "found") & (both["status_norm"] == "found")]
        n_T = both.groupby("series")["T"].transform("nunique")
        both = both[n_T >= 2]
        common = dict(id=_norm_id(J0), source=_SOURCE + " (1/|o| cancels one T; fixed length: by construction)",
                      statement="fixed length: the 1/|o| slope exceeds the raw slope by exactly 1",
                      setting=f"rho={IDENTITY_RHO:g}, J0={J0:g}, same streams as the raw claim; "
                              f"{both['series'].nunique()} series with both eta* at >= 2 T",
                      criterion_text=_NORM_TEXT, criterion=CRITERIA[_norm_id(J0)], block=block)
        if both["instance"].nunique() >= 2:
            x = np.log(both["T"].to_numpy(float))
            d = np.log(both["eta_star_norm"].to_numpy()) - np.log(both["eta_star_raw"].to_numpy())
            est = within_slope_estimate(x, d, series=both["series"].to_numpy(), instance=both["instance"].to_numpy(),
                                        rng=rng, n_resamples=config.n_boot)
            claims.append(gapdyn.Claim.from_estimate(
                est, statistic="within-series slope of log(eta*_norm / eta*_raw) on log T", **common))
        else:
            claims.append(gapdyn.Claim(**common, estimate=0.0, interval=(0.0, 0.0), n=1,
                                       statistic="within-series slope of log(eta*_norm / eta*_raw) on log T",
                                       measured=False, reason="no series with both eta* at >= 2 T"))
    return claims


def run(config: Config, *, store=None, backend: str = "joblib", n_jobs: int = -1, progress: bool = True):
    """ExperimentResult through :func:`bandits.experiments._common.run_experiment` (resumable with a store)."""
    return run_experiment(sys.modules[__name__], config, store=store, backend=backend, n_jobs=n_jobs,
                          progress=progress)
