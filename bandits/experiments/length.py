"""Experiment 2 `length`: the critical step eta* against the response length T (Suk & Duan, arXiv
2510.08539, Thm 3: the safe step shrinks ~ (1 - J)/T; dividing the update by |o| cancels one T).

Setting (docs/bandits_sequence.md): the token model with partial sharing of
:class:`bandits.partial.PartialSharingBandit`, phi_t(v) = sqrt(rho) phi(v) + sqrt(1 - rho) psi_t(v)
(V = 10 tokens, d = 4, token 0 correct, rule MAJ), one theta for all T positions, rho in
{0, 0.25, 0.5, 0.75, 1}. For every (instance, rho, T) theta0 = alpha u, u the unit Gap of that
problem at 0, alpha placed so that J(theta0) = J0 (two placements, J0 = 0.1 and 0.5). Dynamics:
sampled GRPO (G = 8) through :func:`bandits.sequence.simulate`; each (instance, seed) is one random
stream shared by every eta (common random numbers), so the outcome of each eta is deterministic and
eta* = gapdyn.find_eta_star (the smallest collapsing eta, terminal rule of gapdyn.bandit_outcome) is that
stream's critical step.

The law (form "law"): eta* ~ 1/T, tested as an equivalence: the slope b of log eta* on log T lies in
[-1.25, -0.75] (Criterion.equivalence, decided on the 90 % interval: two one-sided tests at 5 %).
Estimator: a censored-normal (Tobit) likelihood on log eta* with one offset per (instance, seed) series
(:func:`bandits.experiments._slopes.censored_within_slope`); eta* outside the scan is kept as censored,
not dropped: collapse already at eta_lo is eta* <= eta_lo, no collapse up to eta_hi is eta* > eta_hi.
Censoring, not a wider scan, because some streams never collapse at any eta (the correct token
dominates the update and large steps drive J to 1) and a wider range would not make their eta* finite.
A (instance, T) whose placement cannot reach J0 has no run at all (missing, counted by reason). A series
enters with a found eta* at one T at least and a start at >= 2 T. Interval: b +- t_{G-1} se, se the CR1
cluster sandwich over instances; it is used only where the cluster-robust t interval is valid at the
number of instances (gapdyn.evidence.coverage, method SLOPE_INTERVAL), else the claim is not measured.

With fixed length, the 1/|o| update at eta is the raw update at eta/T (the same stream), so
eta*_norm = T eta*_raw and the normalised slope is b + 1 by construction: an identity row (rho = 1),
not a test of the theorem. The 1/|o| twin is scanned on the raw grid times T, so the identity compares
the same trajectories.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np
import pandas as pd

import gapdyn
from gapdyn.evidence.claims import keyed_specs
from gapdyn.evidence.experiment import Experiment, claim_specs
from gapdyn.evidence.claims import EQUIVALENCE_CONFIDENCE

from ..partial import PartialSharingBandit
from ..sequence import SequenceDynamics, place_for_success_rate, simulate
from ._common import make_claim, run_experiment, run_stats
from ._slopes import EXACT, LEFT, RIGHT, censored_slope_estimate, within_slope_estimate

__all__ = ["NAME", "STATEMENTS", "CRITERIA", "FORMS", "SLOPE_INTERVAL", "RHOS", "J0S", "Config", "cells", "run_cell",
           "start", "analyse", "slope_claim_id", "identity_claim_id", "fit_points", "run"]

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


SLOPE_INTERVAL = "cr1_t_slope"
"""The measured interval method (docs/coverage.md) whose valid n gates the slope claims: the censored fit's
interval is its censored counterpart (the same sandwich and t_{G-1} quantile; equal when nothing is
censored)."""

# written from the theorem before any run: eta* ~ 1/T, i.e. slope -1, equivalence band +-0.25
STATEMENTS: dict[str, tuple[str, str]] = {
    **{_slope_id(r, j): (_SOURCE, f"eta* ~ 1/T at rho={r:g}, J0={j:g}: the slope of log eta* on log T lies in "
                                  "[-1.25, -0.75]") for r in RHOS for j in J0S},
    **{_norm_id(j): (_SOURCE + " (1/|o| cancels one T; fixed length: by construction)",
                     "identity: eta*_norm(T) = T eta*_raw(T) (fixed length, same stream), so the 1/|o| slope "
                     "exceeds the raw slope by exactly 1") for j in J0S},
}
CRITERIA: dict[str, gapdyn.Criterion] = {
    **{_slope_id(r, j): gapdyn.Criterion.equivalence(-1.25, -0.75) for r in RHOS for j in J0S},
    **{_norm_id(j): gapdyn.Criterion.identity(1.0, tol=0.02) for j in J0S},
}
FORMS: dict[str, str] = {
    **{_slope_id(r, j): "law" for r in RHOS for j in J0S},
    **{_norm_id(j): "identity" for j in J0S},
}
"""The form of each claim's statement (gapdyn.FORMS)."""


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
        return cls(mode="quick", instances=gapdyn.DISCOVERY_SEEDS[:10], confirmation=(), Ts=(1, 2, 4, 8), seeds=1,
                   steps=40, eta_lo=0.05, eta_hi=500.0, max_ratio=1.1, n_boot=1000)

    @classmethod
    def full(cls) -> "Config":
        """20 discovery and 100 confirmation instances per cell (the sequence kernels make 100 affordable)."""
        return cls(confirmation=tuple(range(1000, 1100)))

    def __post_init__(self):
        from gapdyn.cmdline import MODES

        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if not self.Ts or len(set(self.Ts)) != len(self.Ts) or any(int(T) != T or T < 1 for T in self.Ts):
            raise ValueError(f"Ts must be distinct integers >= 1, got {self.Ts!r}")
        if len(self.Ts) < 2:
            raise ValueError("Ts must hold at least two lengths (a slope needs two)")
        if self.seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {self.seeds!r}")
        if not 0 < self.eta_lo < self.eta_hi:
            raise ValueError(f"eta_lo and eta_hi must satisfy 0 < eta_lo < eta_hi, got {self.eta_lo}, {self.eta_hi}")
        SequenceDynamics(method=self.method, gradient=self.dynamics_mode, group_size=self.group_size, steps=self.steps)



KEYS = {cid: (("Suk & Duan", "Theorem 3"), "exploratory" if cid.startswith("eta_star_vs_T/") else "test")
        for cid in STATEMENTS}
"""Claim id -> (statement key, role) (gapdyn.evidence.claims.STATEMENTS, ROLES). The slope rows are exploratory: Thm 3's
step condition eta <= c (1 - J)/T is sufficient, a lower bound on eta*, not a law eta* ~ 1/T; the band
[-1.25, -0.75] is the project's, not the paper's; streams that never collapse enter as right-censored normal
values (a cure process, not censoring) and the censored fit's own coverage was never measured. Thm 3's bound is
tested in its form by its violations in bandits.experiments.success_rate (docs/evidence.md section 10)."""
SPECS = keyed_specs(claim_specs(STATEMENTS, CRITERIA, FORMS, primary=()), KEYS)
"""Every claim's frozen gapdyn.ClaimSpec (the tables above, verbatim), by claim id."""

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
    dyn = SequenceDynamics(method=method, gradient=dynamics_mode, group_size=group_size, steps=steps,
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

_CENSOR = {"found": EXACT, "collapsed_at_lo": LEFT, "none_in_range": RIGHT}
"""find_eta_star's status -> censoring code of log eta*: found inside (eta_lo, eta_hi]; collapsed_at_lo:
eta* <= eta_lo (left-censored there); none_in_range: eta* > eta_hi (right-censored there)."""


def _with_censoring(df: pd.DataFrame, config_like) -> pd.DataFrame:
    """Rows with a start (J0 reached) and their censored log eta*: ``log_eta`` and ``censor`` (EXACT, LEFT at
    log eta_lo, RIGHT at log eta_hi, in the raw units of the cell)."""
    ok = df[df["status"].isin(list(_CENSOR))]
    scale = np.where(ok["normalized"].astype(bool), ok["T"].to_numpy(float), 1.0)
    bound = np.where(ok["status"] == "collapsed_at_lo", config_like.eta_lo, config_like.eta_hi) * scale
    eta = np.where(ok["status"] == "found", ok["eta_star"].to_numpy(float), bound)
    return ok.assign(censor=ok["status"].map(_CENSOR).astype(int), log_eta=np.log(eta))


def _fit_rows(df: pd.DataFrame, config_like) -> pd.DataFrame:
    """The rows the censored fit keeps: series (instance, seed) with a found eta* at some T and a start at
    >= 2 distinct T (a series with no found eta* has an unbounded offset and no information on the slope)."""
    rows = _with_censoring(df, config_like)
    key = ["instance", "seed"]
    n_T = rows.groupby(key)["T"].transform("nunique")
    n_found = rows.groupby(key)["censor"].transform(lambda c: int((c == EXACT).sum()))
    return rows[(n_T >= 2) & (n_found >= 1)]


def fit_points(df: pd.DataFrame, config_like=None) -> pd.DataFrame:
    """The rows a slope claim fits (found and censored eta*), for the rows of one (rho, J0, normalized)
    group; ``config_like`` gives eta_lo, eta_hi (default: the full configuration's)."""
    return _fit_rows(df, Config() if config_like is None else config_like)


def _counts(df: pd.DataFrame, used: pd.DataFrame) -> str:
    c = df["status"].value_counts()
    series = df.groupby(["instance", "seed"]).ngroups
    n_used = used.groupby(["instance", "seed"]).ngroups
    by = ", ".join(f"{k} {int(c.get(k, 0))}" for k in ("found", "collapsed_at_lo", "none_in_range", "J0 unreachable"))
    kept = used["censor"].value_counts()
    return (f"{used['instance'].nunique()}/{df['instance'].nunique()} instances, {n_used}/{series} series kept; "
            f"(instance, seed, T) points: {by} of {len(df)}; fitted: {int(kept.get(EXACT, 0))} found, "
            f"{int(kept.get(LEFT, 0))} left-censored at eta_lo, {int(kept.get(RIGHT, 0))} right-censored at eta_hi")


def _not_measured(n: int) -> gapdyn.Estimate:
    """A 90 % estimate that could not be made from n instances (the claim is not measured; no number is
    shown)."""
    return gapdyn.evidence.stats.not_measured(-1.0, -1.0, n=max(int(n), 1), confidence=EQUIVALENCE_CONFIDENCE)


def _slope_estimate(used: pd.DataFrame) -> tuple[gapdyn.Estimate, str]:
    """(censored within-series slope with its 90 % CR1 t interval, "") when the interval is valid at the
    number of instances (gapdyn.evidence.coverage, the cluster-robust t interval's n), else (unmeasured, reason)."""
    from gapdyn.evidence.coverage import min_valid_n, valid_at

    n = int(used["instance"].nunique())
    if n < 2 or not valid_at(SLOPE_INTERVAL, n):
        m = min_valid_n(SLOPE_INTERVAL)
        return _not_measured(n), (f"too few instances for a valid interval (n = {n}; {SLOPE_INTERVAL} valid from "
                                   f"n = {m}, docs/coverage.md)")
    series = used.groupby(["instance", "seed"]).ngroup().to_numpy()
    try:
        est = censored_slope_estimate(np.log(used["T"].to_numpy(float)), used["log_eta"].to_numpy(),
                                      censor=used["censor"].to_numpy(), series=series,
                                      instance=used["instance"].to_numpy(), confidence=EQUIVALENCE_CONFIDENCE)
    except ValueError as exc:
        return _not_measured(n), f"censored fit: {exc}"
    return est, ""


def _planned_n(est: gapdyn.Estimate, crit: gapdyn.Criterion) -> int | None:
    """The n at which the equivalence test decides with probability 0.8 if the block's slope and its
    spread over instances (se sqrt(n)) were the truth (gapdyn.evidence.planner)."""
    from gapdyn.evidence.coverage import min_valid_n
    from gapdyn.evidence.planner import plan_n, power_equivalence

    from scipy.stats import t

    se = (est.hi - est.lo) / (2 * float(t.ppf((1 + est.confidence) / 2, est.n - 1)))
    sd = se * np.sqrt(est.n)
    if not sd > 0:
        return None
    floor = max(20, min_valid_n(SLOPE_INTERVAL) or 20)
    plan = plan_n(lambda n: power_equivalence(est.estimate, sd, n, lo=crit.lo, hi=crit.hi),
                  n_min=floor, n_max=400)
    return plan.n if plan.decidable else None


def analyse(results: pd.DataFrame, config: Config, *, block: str) -> list[gapdyn.Claim]:
    """One law claim per (rho, J0) and one identity row per J0 (see module doc)."""
    rng = np.random.default_rng([17, 0 if block == "discovery" else 1])
    res = results.assign(series=results.groupby(["instance", "seed"]).ngroup())
    claims = []
    horizon = (f"sampled {config.method}, G={config.group_size}" if config.dynamics_mode == "sampled"
               else f"exact {config.method}") + (f", horizon {config.steps} steps, collapse by the terminal rule "
                                                 f"(J < {gapdyn.COLLAPSE_J:g} over the last quarter)")
    for rho in RHOS:
        for J0 in J0S:
            cid = _slope_id(rho, J0)
            sub = res[(res["rho"] == rho) & (res["J0"] == J0) & ~res["normalized"].astype(bool)]
            used = _fit_rows(sub, config)
            setting = (f"partial sharing rho={rho:g}, V={config.V}, d={config.d}, {config.rule}, J0={J0:g}, "
                       f"T in {list(config.Ts)}, {horizon}; eta in [{config.eta_lo:g}, {config.eta_hi:g}], "
                       f"grid ratio {config.max_ratio:g}; {_counts(sub, used)}")
            est, reason = _slope_estimate(used)
            claim = make_claim(SPECS, cid, est, block=block, setting=setting,
                               statistic="censored (Tobit) within-series slope of log eta* on log T, fixed effect "
                                         "per (instance, seed), 90 % CR1 sandwich t interval over instances")
            if reason:
                claim = replace(claim, measured=False, reason=reason)
            else:
                claim = replace(claim, n_planned=_planned_n(est, CRITERIA[cid]))
            claims.append(claim)
    for J0 in J0S:
        sub = res[(res["rho"] == IDENTITY_RHO) & (res["J0"] == J0)]
        raw, nrm = (sub[sub["normalized"].astype(bool) == f] for f in (False, True))
        both = raw.merge(nrm, on=["instance", "seed", "T", "series"], suffixes=("_raw", "_norm"))
        both = both[(both["status_raw"] == "found") & (both["status_norm"] == "found")]
        n_T = both.groupby("series")["T"].transform("nunique")
        both = both[n_T >= 2]
        setting = (f"rho={IDENTITY_RHO:g}, J0={J0:g}, same streams as the raw claim; "
                   f"{both['series'].nunique()} series with both eta* at >= 2 T")
        statistic = "within-series slope of log(eta*_norm / eta*_raw) on log T"
        if both["instance"].nunique() >= 2:
            x = np.log(both["T"].to_numpy(float))
            d = np.log(both["eta_star_norm"].to_numpy()) - np.log(both["eta_star_raw"].to_numpy())
            est = within_slope_estimate(x, d, series=both["series"].to_numpy(), instance=both["instance"].to_numpy(),
                                        rng=rng, n_resamples=config.n_boot)
            claims.append(make_claim(SPECS, _norm_id(J0), est, block=block, setting=setting,
                                     statistic=statistic))
        else:
            est = gapdyn.evidence.stats.not_measured(1.0, 1.0)
            claims.append(replace(make_claim(SPECS, _norm_id(J0), est, block=block, setting=setting,
                                             statistic=statistic),
                                  measured=False, reason="fewer than 2 instances with both eta* at >= 2 T"))
    return claims


def run(config: Config, *, store=None, backend: str = "joblib", n_jobs: int = -1, progress: bool = True):
    """ExperimentResult through :func:`bandits.experiments._common.run_experiment` (resumable with a store)."""
    return run_experiment(EXPERIMENT, config, store=store, backend=backend, n_jobs=n_jobs,
                          progress=progress)


EXPERIMENT = Experiment(name=NAME, claims=SPECS, config=Config, cells=cells, run_cell=run_cell, analyse=analyse)
"""This experiment in the one protocol (gapdyn.evidence.experiment.Experiment)."""
