"""Experiment 1: the critical step size eta* per instance and the mechanisms of collapse.

Setting: single-context log-linear bandits (K = 100 arms, d = 16 Gaussian features, 10 correct arms), one per
instance seed, G = 8 (Suk & Duan, arXiv 2510.08539, §5). Each run's outcome is gapdyn.bandit_outcome over the
horizon ``steps`` (collapsed: J < gapdyn.COLLAPSE_J at every state of the last quarter, Thm 2's J -> 0; dipped:
below it at some state but not at the end; converged; undecided). eta* is the first collapsed eta (the smallest
scanned eta whose run is collapsed, a run that did collapse); eta_dip, the first whose run dips, beside it; eta*
at gapdyn.SENSITIVITY_J as a sensitivity check; eta_safe (no scanned eta below it collapses, with the scan's
resolution) and eta_50 (the smallest eta whose +-5 % log window is half collapsed) stored beside them. Under
exact expected updates J -> 0 is an excursion that ends (docs/evidence.md §6), so eta* is the eta whose excursion
outlasts the last quarter of ``steps``: a quantity of the horizon, stated with it.

- exact cells (instance, start, method): eta* by gapdyn.find_eta_star on ONE grid per instance (every method
  and start scanned on eta_grid(eta_lo, eta_hi, max_ratio), refined to rtol on the first island), the islands,
  the collapse measure per decade, the final J of every simulated eta; at theta0: J0, ||Gap||, the trap margin
  and the eta* predictors (bandits.experiments.mechanisms). Start 0 is theta0 = 0 (all methods); starts
  1..n_starts-1 are small random theta0 (GRPO only), for the trap test.
- sampled cells (instance): GRPO with one group per step, common seeds across etas and schedules (constant,
  adaptive, linesearch): collapse, steps to J >= 0.9.

The claims (CRITERIA, STATEMENTS) were written before any run; docs/bandits_contextual.md shows the tables.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

import gapdyn
from gapdyn.evidence.claims import keyed_specs
from gapdyn.evidence.experiment import Experiment, claim_specs
from gapdyn.cmdline import MODES
from gapdyn import COLLAPSE_J, Criterion
from bandits.engine import Dynamics, simulate

from . import mechanisms as mech
from ._common import (bootstrap, clustered_proportion, exists_on_some_instance, first_below, make_claim, no_data,
                      proportion, run_experiment, run_stats, steps_to)

NAME = "threshold"


CONFIRMATION = tuple(range(1000, 1040))
"""Full mode's confirmation block: 40 instances, the smallest n at which the mean claims' interval method
(the studentized cluster bootstrap) covers (docs/coverage.md); a smaller block leaves them not measured."""


@dataclass(frozen=True)
class Config:
    """Experiment 1 settings (see the module docstring)."""

    mode: str = "full"
    instances: tuple[int, ...] = gapdyn.DISCOVERY_SEEDS
    confirmation: tuple[int, ...] = ()
    n_arms: int = 100
    dim: int = 16
    n_correct: int = 10
    group_size: int = 8
    steps: int = 1000
    """exact updates per run (the horizon of collapse)."""
    eta_lo: float = 0.1
    eta_hi: float = 1e5
    max_ratio: float = 1.01
    rtol: float = 1e-3
    methods: tuple[str, ...] = ("grpo", "reinforce", "dr_grpo")
    n_starts: int = 4
    start_scale: float = 0.2
    n_seeds: int = 32
    sampled_steps: int = 500
    sampled_etas: tuple[float, ...] = tuple(float(e) for e in np.geomspace(1.0, 1e4, 13))
    schedules: tuple[str, ...] = ("constant", "adaptive", "linesearch")
    record_every: int = 1
    """sampled runs record J every this many steps (1: steps to J >= 0.9 resolve single steps)."""

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if not self.instances or set(self.instances) & set(self.confirmation):
            raise ValueError("instances must be non-empty and disjoint from confirmation")
        if self.methods[:1] != ("grpo",) or not {"reinforce", "dr_grpo"} <= set(self.methods):
            raise ValueError(f"methods must start with 'grpo' and include 'reinforce' and 'dr_grpo', got {self.methods}")
        if self.n_starts < 1 or self.n_seeds < 1:
            raise ValueError("n_starts and n_seeds must be >= 1")

    @classmethod
    def test(cls) -> Config:
        return cls(mode="test", instances=(0, 2, 5), steps=60, eta_lo=1.0, eta_hi=300.0, n_starts=2, n_seeds=4,
                   sampled_steps=40, sampled_etas=(3.0, 30.0, 300.0))

    @classmethod
    def quick(cls) -> Config:
        return cls(mode="quick", instances=gapdyn.DISCOVERY_SEEDS[:8], steps=200, eta_lo=1.0, eta_hi=1e4,
                   n_starts=3, n_seeds=8, sampled_steps=150, sampled_etas=(1.0, 10.0, 100.0, 1e3, 1e4))

    @classmethod
    def full(cls) -> Config:
        return cls(mode="full", confirmation=CONFIRMATION)


# ------------------------------------------------------------------------------------------------
# claims: written before any run (from the papers where they say something; else "beyond the papers")
# ------------------------------------------------------------------------------------------------

_SD = "Suk & Duan (arXiv 2510.08539)"
_BEYOND = "beyond the papers"
STATEMENTS: dict[str, tuple[str, str]] = {
    "finite_share": (f"{_SD}, Thm 2", "a step above a finite threshold eta* collapses J (existence): exact GRPO from "
                     "theta0 = 0 has a finite eta* (J < 1e-3 over the last quarter of the horizon) in the scanned range "
                     "on some instances: the share of instances with a finite eta* is above 0"),
    "sharpness": (f"{_SD}, Thm 2", "the transition is sharp: from a run that ends converged (J > 0.99) to collapse "
                  "within 5 % of eta (geometric mean over instances of eta* / largest converging eta below it)"),
    "reconverge": (f"{_SD}, Thm 2", "above eta* steps keep collapsing: the share of larger grid etas whose run ends "
                   "converged (J > 0.99) is below 5 % (mean over instances with a finite eta*)"),
    "ratio_reinforce_grpo": (f"{_SD}, eq. of E[w] = scalar x Gap", "expected directions differ only by a scalar, so "
                             "eta* scales inversely with it: (eta*_REINFORCE / eta*_GRPO) / (c_G(J0) / (J0 (1-J0))) "
                             "has geometric mean in [0.8, 1.25] (mean log10 in [log10 0.8, log10 1.25])"),
    "identity_dr_reinforce": ("derived (docs/equations.md): exact Dr. GRPO at eta = REINFORCE at (1-1/G) eta",
                              "eta*_DrGRPO / eta*_REINFORCE = (1 - 1/G)^-1 on every instance: the ratio divided by "
                              "(1 - 1/G)^-1 is 1 (worst instance shown)"),
    "dip_recovers": (_BEYOND, "a first dip below 1e-3 is not Thm 2's collapse: on some instances the first eta whose "
                     "run dips lies below eta* (the run dips and recovers within the horizon)"),
    "eta_star_over_dip": (_BEYOND, "how far the terminal threshold eta* lies above the first dip eta_dip: mean "
                          "log10(eta* / eta_dip) over instances with a finite eta* (>= 0 by definition)"),
    "thm1_conservative": (f"{_SD}, Thm 1", "Theorem 1's step condition is sufficient, so it lies below eta*: "
                          "mean log10(eta* / bound) > 0"),
    "gap_spearman": (f"{_SD}, Thm 2", "the threshold is set by the Gap's magnitude: Spearman rank correlation of "
                     "||Gap(theta0)|| with eta* is negative"),
    "sampled_collapse": (_BEYOND, "sampled GRPO (one group of G per step) collapses with positive probability at "
                         "the largest sampled eta"),
    "adaptive_collapse": (f"{_SD}, Thm 3 (safe step ~ (1-J)/T)", "the adaptive controller keeps P(collapse) of "
                          "sampled GRPO below 1 %"),
    "linesearch_collapse": (f"{_SD}, Thm 2 (Phi-monotone steps)", "the line-search controller keeps P(collapse) "
                            "of sampled GRPO below 1 %"),
    "adaptive_speed": (_BEYOND, "the adaptive controller is not slower: per instance, the restricted mean steps to "
                       "J >= 0.9 (censored at the horizon, every (eta, seed) pair) of the controller over the constant "
                       "step's has geometric mean below 1.25 over instances (mean log10 below log10 1.25)"),
    "linesearch_speed": (_BEYOND, "the line-search controller is not slower where it acts: the same ratio over the "
                         "pairs whose run differs from the constant step's (line search equals the constant step "
                         "until that step would lower Phi) has geometric mean below 1.25 (mean log10 below "
                         "log10 1.25)"),
    "trap_accuracy": (_BEYOND, "trap (argmax_a phi_a . Gap(theta0) is a wrong arm) decides whether exact GRPO has "
                      "a finite eta*: accuracy above 90 % over (instance, start) cases"),
    "trap_auc": (_BEYOND, "the trap margin (max wrong minus max correct phi_a . Gap(theta0)) ranks cases with a "
                 "finite eta* above those without: ROC AUC above 0.5"),
    "predictor_lookahead": (_BEYOND, "the two-step lookahead (smallest eta whose two exact steps from theta0 "
                            "collapse) is within 2x of eta* on at least 90 % of cases with a finite eta*"),
    "predictor_sharp": (_BEYOND, "the one-step line-search threshold at theta0 (gapdyn.sharp_step_threshold) is "
                        "within 2x of eta* on at least 90 % of cases with a finite eta*"),
}
CRITERIA: dict[str, Criterion] = {
    "finite_share": Criterion.above(0.0),
    "sharpness": Criterion.below(math.log10(1.05)),
    "reconverge": Criterion.below(0.05),
    "ratio_reinforce_grpo": Criterion.inside(math.log10(0.8), math.log10(1.25)),
    "identity_dr_reinforce": Criterion.identity(1.0, tol=1e-3),
    "dip_recovers": Criterion.above(0.0),
    "eta_star_over_dip": Criterion.above(0.0),
    "thm1_conservative": Criterion.above(0.0),
    "gap_spearman": Criterion.below(0.0),
    "sampled_collapse": Criterion.above(0.0),
    "adaptive_collapse": Criterion.below(0.01),
    "linesearch_collapse": Criterion.below(0.01),
    "adaptive_speed": Criterion.below(math.log10(1.25)),
    "linesearch_speed": Criterion.below(math.log10(1.25)),
    "trap_accuracy": Criterion.above(0.9),
    "trap_auc": Criterion.above(0.5),
    "predictor_lookahead": Criterion.above(0.9),
    "predictor_sharp": Criterion.above(0.9),
}
"""Criteria on each claim's 95 % interval. The identity's tolerance is the bisection tolerance: each eta* is
the upper end (a collapsed run) of a bracket of relative width rtol = 1e-3, so the ratio is exact to a factor
1 + rtol; the identity is stated for the configured G (the ratio is divided by (1 - 1/G)^-1), so no G appears in
a criterion."""
FORMS: dict[str, str] = {
    "finite_share": "existence", "sharpness": "law", "reconverge": "law", "ratio_reinforce_grpo": "law",
    "identity_dr_reinforce": "identity", "dip_recovers": "existence", "eta_star_over_dip": "derived",
    "thm1_conservative": "bound", "gap_spearman": "law",
    "sampled_collapse": "existence", "adaptive_collapse": "comparison", "linesearch_collapse": "comparison",
    "adaptive_speed": "comparison", "linesearch_speed": "comparison", "trap_accuracy": "law", "trap_auc": "law",
    "predictor_lookahead": "law", "predictor_sharp": "law",
}
"""The form of each claim's statement (gapdyn.FORMS)."""


# ------------------------------------------------------------------------------------------------
# sweep
# ------------------------------------------------------------------------------------------------

_EXACT_KEYS = ("n_arms", "dim", "n_correct", "group_size", "steps", "eta_lo", "eta_hi", "max_ratio", "rtol",
               "start_scale")
_SAMPLED_KEYS = ("n_arms", "dim", "n_correct", "group_size", "n_seeds", "sampled_steps", "sampled_etas",
                 "schedules", "record_every")



_T1, _T2, _T3 = ("Suk & Duan", "Theorem 1"), ("Suk & Duan", "Theorem 2"), ("Suk & Duan", "Theorem 3")
KEYS = {
    "finite_share": (_T2, "test"), "sharpness": (_T2, "test"), "reconverge": (_T2, "test"),
    "ratio_reinforce_grpo": (("Suk & Duan", "Gap direction"), "exploratory"), "identity_dr_reinforce": (None, "test"),
    "thm1_conservative": (_T1, "exploratory"), "gap_spearman": (_T2, "test"),
    "adaptive_collapse": (_T3, "exploratory"), "linesearch_collapse": (_T2, "exploratory"),
    **{k: (None, "exploratory") for k in ("dip_recovers", "eta_star_over_dip", "sampled_collapse", "adaptive_speed",
                                          "linesearch_speed", "trap_accuracy", "trap_auc", "predictor_lookahead",
                                          "predictor_sharp")},
}
"""Claim id -> (statement key, role) (gapdyn.evidence.claims.STATEMENTS, ROLES). finite_share tests Thm 2's existence
statement since its re-freeze (REFROZEN); thm1_conservative takes Thm 1's step condition at theta0 only, while
the theorem's premise is the condition at every step of the run: exploratory; the eta* ratio rests on a scalar
that varies with J along a run, with the project's band: exploratory; the controllers go beyond the theorems
they build on."""
SPECS = keyed_specs(claim_specs(STATEMENTS, CRITERIA, FORMS, primary=()), KEYS)
"""Every claim's frozen gapdyn.ClaimSpec (the tables above, verbatim), by claim id."""

REFROZEN: dict[str, tuple[Criterion, str, str]] = {
    "finite_share": (Criterion.above(0.9), "e8d46ea114116e4c", (
        "the first criterion (share of instances with a finite eta* above 0.9) asked for near-universality over a "
        "finite scan, which Thm 2 does not state; Thm 2 states that a threshold exists, and the existence form "
        "(docs/evidence.md section 7) is an interval that excludes 0. Re-frozen after the run under the first "
        "criterion (6 of 20 and 15 of 40 instances with a finite eta*), so the rows of that run were withdrawn and "
        "a run of the same seeds is not blind to it (docs/evidence.md section 10)")),
}
"""Claim id -> (superseded criterion, criteria hash of the study while it held, why it was re-frozen). A re-freeze
is a new criterion written before the run that decides it, never a change made to pass; the claim id stays."""
EARLIER_CRITERIA_HASHES: tuple[str, ...] = tuple(sorted({h for _, h, _ in REFROZEN.values()}))
"""Hashes of this study's criteria before a re-freeze: committed rows stamped with one were decided under a
criterion that still holds for them (tests/test_claims_keys.py checks each row's own criterion is the current one)."""

def cells(config: Config, instances=None) -> list[dict]:
    """Exact cells (instance, start, method) and one sampled cell per instance, as plain dicts."""
    instances = config.instances if instances is None else instances
    d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()}
    ex = {k: d[k] for k in _EXACT_KEYS}
    sa = {k: d[k] for k in _SAMPLED_KEYS}
    out = []
    for i in instances:
        for s in range(config.n_starts):
            for m in config.methods if s == 0 else ("grpo",):
                out.append({"kind": "exact", "instance": int(i), "start": s, "method": m, **ex})
        out.append({"kind": "sampled", "instance": int(i), **sa})
    return out


def run_cell(*, kind: str, **cell) -> pd.DataFrame:
    """One cell's rows: exact (grid rows + one summary row) or sampled (one row per run)."""
    if kind == "exact":
        return _exact_cell(**cell)
    if kind == "sampled":
        return _sampled_cell(**cell)
    raise ValueError(f"kind must be 'exact' or 'sampled', got {kind!r}")


def _exact_cell(*, instance, start, method, n_arms, dim, n_correct, group_size, steps, eta_lo, eta_hi, max_ratio,
                rtol, start_scale) -> pd.DataFrame:
    bandit = mech.instance_bandit(instance, n_arms=n_arms, dim=dim, n_correct=n_correct)
    th0 = mech.start_theta(bandit, start, scale=start_scale)
    dyn = Dynamics(method=method, gradient="exact", group_size=group_size, steps=steps, record_every=steps)
    res, etas, J_final = mech.search_eta_star(bandit, dyn, th0, eta_lo=eta_lo, eta_hi=eta_hi, max_ratio=max_ratio,
                                              rtol=rtol)
    J_grid = J_final[np.searchsorted(etas, res.grid)]
    summary = {
        "phase": "summary", "status": res.status, "eta_star": res.eta_star, "bracket_lo": res.bracket[0],
        "bracket_hi": res.bracket[1], "eta_star_loose": res.eta_star_loose, "n_islands": res.n_islands,
        "dip_status": res.dip_status, "eta_dip": res.eta_dip, "bracket_dip_lo": res.bracket_dip[0],
        "bracket_dip_hi": res.bracket_dip[1], "dip_recover_share": res.dip_recover_share,
        "eta_safe": res.eta_safe, "safe_resolution": res.safe_resolution, "eta_50": res.eta_50,
        "eta_50_status": res.eta_50_status, "eta_50_lo": res.eta_50_window[0], "eta_50_hi": res.eta_50_window[1],
        "islands": json.dumps([list(i) for i in res.islands]),
        "per_decade": json.dumps([list(r) for r in res.collapse_per_decade]),
        "width": mech.transition_width(res, etas, J_final),
        "reconverge": res.reconverge_share,
        "gap_norm": mech.gap_norm(bandit, th0), "trap_margin": mech.trap_margin(bandit, th0),
        "n_evaluations": res.n_evaluations, "horizon": steps,
        **mech.one_step_predictors(bandit, method, group_size, th0),
        **mech.lookahead_eta(bandit, method, group_size, th0, res.grid),
    }
    grid = pd.DataFrame({"phase": "grid", "eta": res.grid, "base": res.base, "J_min": res.J_min,
                         "J_tail_max": res.J_tail_max, "outcome": res.outcomes.astype(str), "J_final": J_grid})
    return pd.concat([grid, pd.DataFrame([summary])], ignore_index=True)


def _sampled_cell(*, instance, n_arms, dim, n_correct, group_size, n_seeds, sampled_steps, sampled_etas, schedules,
                  record_every) -> pd.DataFrame:
    bandit = mech.instance_bandit(instance, n_arms=n_arms, dim=dim, n_correct=n_correct)
    E, S = np.meshgrid(np.asarray(sampled_etas, float), np.arange(n_seeds), indexing="ij")
    frames = []
    for sched in schedules:
        dyn = Dynamics(method="grpo", gradient="sampled", group_size=group_size, steps=sampled_steps, schedule=sched,
                       record_every=record_every)
        tr = simulate(bandit, dyn, eta=E.ravel(), seed=S.ravel())
        stats = run_stats(tr, 0)
        outcome = gapdyn.bandit_outcome(stats)
        frames.append(pd.DataFrame({
            "phase": "sampled", "schedule": sched, "eta": E.ravel(), "seed": S.ravel(),
            "J_final": tr.J_final[:, 0], "J_min": tr.J_min[:, 0], "J_tail_max": stats.J_tail_max,
            "outcome": outcome.astype(str), "collapsed": outcome == "collapsed",
            "steps_to_09": steps_to(tr.J[:, :, 0], tr.steps, 0.9),
            "collapse_step": first_below(tr.J[:, :, 0], tr.steps, COLLAPSE_J),
        }))
    return pd.concat(frames, ignore_index=True)


# ------------------------------------------------------------------------------------------------
# analysis
# ------------------------------------------------------------------------------------------------


def critical_steps(results: pd.DataFrame, start: int | None = 0) -> pd.DataFrame:
    """One row per exact (instance, method) at ``start`` (None: every start): the summary row, eta* = inf
    when none is in range; ``finite`` marks a finite eta*."""
    s = results[results["phase"] == "summary"].copy()
    if start is not None:
        s = s[s["start"] == start]
    s["finite"] = s["status"] != "none_in_range"
    s.loc[~s["finite"], "eta_star"] = np.inf
    cols = [c for c in s.columns if not c.startswith(("J_min", "J_final", "seed", "schedule", "collapsed"))]
    return s[cols].sort_values(["instance", "start", "method"]).reset_index(drop=True)


def collapse_curve(results: pd.DataFrame, schedule: str = "constant") -> pd.DataFrame:
    """Sampled GRPO: P(collapse) per eta over all instances and seeds, with Wilson 95 % intervals."""
    sp = results[(results["phase"] == "sampled") & (results["schedule"] == schedule)]
    rows = []
    for eta, g in sp.groupby("eta"):
        est = gapdyn.wilson_interval(int(g["collapsed"].astype(bool).sum()), len(g))
        rows.append({"eta": eta, "p_collapse": est.estimate, "lo": est.lo, "hi": est.hi, "n": est.n})
    return pd.DataFrame(rows, columns=["eta", "p_collapse", "lo", "hi", "n"])


def eta_star_of(results: pd.DataFrame, instance: int, method: str, start: int = 0):
    """Rebuild the gapdyn.EtaStar of one exact cell from its stored rows (for gapdyn.check_eta_star_ratio)."""
    r = results[(results["instance"] == instance) & (results["method"] == method) & (results["start"] == start)]
    s, g = r[r["phase"] == "summary"].iloc[0], r[r["phase"] == "grid"].sort_values("eta")
    grid, mj = g["eta"].to_numpy(float), g["J_min"].to_numpy(float)
    return gapdyn.EtaStar(
        status=s["status"], eta_star=float(s["eta_star"]), bracket=(float(s["bracket_lo"]), float(s["bracket_hi"])),
        dip_status=s["dip_status"], eta_dip=float(s["eta_dip"]),
        bracket_dip=(float(s["bracket_dip_lo"]), float(s["bracket_dip_hi"])),
        dip_recover_share=float(s["dip_recover_share"]),
        islands=tuple(tuple(i) for i in json.loads(s["islands"])),
        collapse_per_decade=tuple(tuple(i) for i in json.loads(s["per_decade"])),
        eta_star_loose=float(s["eta_star_loose"]), bracket_loose=(math.nan, math.nan), threshold=COLLAPSE_J,
        loose_threshold=gapdyn.SENSITIVITY_J, max_ratio=float(s["max_ratio"]), rtol=float(s["rtol"]), grid=grid,
        outcomes=g["outcome"].to_numpy(object), J_min=mj, J_tail_max=g["J_tail_max"].to_numpy(float),
        n_evaluations=int(s["n_evaluations"]), reconverge_share=float(s["reconverge"]),
        **({} if "eta_safe" not in s.index else dict(  # rows stored before eta_safe / eta_50 / base were kept
            eta_safe=float(s["eta_safe"]), safe_resolution=float(s["safe_resolution"]), eta_50=float(s["eta_50"]),
            eta_50_status=str(s["eta_50_status"]), eta_50_window=(float(s["eta_50_lo"]), float(s["eta_50_hi"])),
            base=g["base"].to_numpy(bool))),
    )


def _geo_mean(x) -> float:
    return float(np.exp(np.mean(np.log(x))))


def _spearman(x, y) -> float:
    if np.unique(x).size < 2 or np.unique(y).size < 2:
        return math.nan
    return float(spearmanr(x, y).statistic)


def _within_2x(pred, eta) -> np.ndarray:
    r = np.asarray(pred, float) / np.asarray(eta, float)
    return np.isfinite(r) & (r >= 0.5) & (r <= 2.0)


def analyse(results: pd.DataFrame, config: Config, *, block: str = "discovery") -> list:
    """The claims of one block (its rows only)."""
    G = config.group_size
    cs = critical_steps(results, start=None)
    n_inst = cs["instance"].nunique()
    where = (f"K={config.n_arms}, d={config.dim}, {config.n_correct} correct, G={G}, exact, horizon {config.steps}, "
             f"eta in [{config.eta_lo:g}, {config.eta_hi:g}] ({(config.max_ratio - 1):.0%} grid, rtol {config.rtol:g}), "
             f"{n_inst} instances ({block})")
    seed = 12345 if block == "discovery" else 54321
    claims = []

    def add(cid, est, setting, statistic, p_value=None):
        claims.append(make_claim(SPECS, cid, est, block=block, setting=setting, statistic=statistic, p_value=p_value))

    g0 = cs[(cs["method"] == "grpo") & (cs["start"] == 0)].set_index("instance")
    fin0 = g0[g0["finite"]]
    add("finite_share", proportion(int(g0["finite"].sum()), len(g0)), where + ", theta0 = 0",
        "share of instances with a finite eta* (Clopper-Pearson)")
    add("sharpness", bootstrap(np.mean, np.log10(fin0["width"].to_numpy()), seed=seed, natural=(0.0, 1.0)),
        where + ", theta0 = 0", f"mean log10 of the width eta* / largest converging eta (studentized cluster "
        f"bootstrap; n = {len(fin0)})")
    dips = g0[g0["dip_status"] != "none_in_range"]
    early = (dips["eta_dip"] < dips["bracket_lo"]) | ~dips["finite"]
    add("dip_recovers", proportion(int(early.sum()), len(dips)), where + ", theta0 = 0",
        f"share of instances whose first dipping eta lies below eta* (or with no eta* in range) among the {len(dips)} "
        "with a dip (Clopper-Pearson)")
    both_d = fin0[fin0["dip_status"] != "none_in_range"]
    ratio_d = np.log10(both_d["eta_star"] / both_d["eta_dip"]).to_numpy()
    add("eta_star_over_dip", bootstrap(np.mean, ratio_d, seed=seed, natural=(0.0, 10.0)), where + ", theta0 = 0",
        f"mean log10(eta* / eta_dip) (bootstrap; n = {ratio_d.size}; median eta*/eta_dip "
        f"{(float(np.median(10 ** ratio_d)) if ratio_d.size else math.nan):.3g})")
    rec = fin0["reconverge"].dropna().to_numpy()
    add("reconverge", bootstrap(np.mean, rec, seed=seed, natural=(0.0, 1.0)), where + ", theta0 = 0",
        f"mean share of grid etas above eta* ending with J > 0.99 (bootstrap; n = {rec.size})")

    # method ratios (theta0 = 0)
    piv = cs[cs["start"] == 0].pivot(index="instance", columns="method", values="eta_star")
    J0 = g0["J0"].reindex(piv.index).to_numpy()
    both = np.isfinite(piv["reinforce"]) & np.isfinite(piv["grpo"])
    Jb = np.clip(J0[both.to_numpy()], 1e-12, 1 - 1e-12)
    pred = gapdyn.expected_scalar("grpo", Jb, G) / gapdyn.expected_scalar("reinforce", Jb, G) if Jb.size else Jb
    rel = (piv["reinforce"] / piv["grpo"])[both].to_numpy() / pred
    add("ratio_reinforce_grpo", bootstrap(np.mean, np.log10(rel), seed=seed, natural=(-3.0, 3.0)),
        where + ", theta0 = 0", f"mean log10 of measured / scalar-predicted ratio (studentized cluster bootstrap; "
        f"n = {rel.size} instances with both finite; geometric mean {_geo_mean(rel) if rel.size else math.nan:.4g})")
    est, text = _identity(results, piv, config)
    add("identity_dr_reinforce", est, where + ", theta0 = 0", text)

    bound = np.log10(fin0["eta_star"] / fin0["pred_thm1"]).to_numpy()
    add("thm1_conservative", bootstrap(np.mean, bound, seed=seed, natural=(-10.0, 10.0)), where + ", theta0 = 0",
        f"mean log10(eta* / Theorem 1 bound) (bootstrap; n = {bound.size})")

    gall = cs[cs["method"] == "grpo"]
    fin = gall[gall["finite"]]
    add("gap_spearman", bootstrap(_spearman, fin["gap_norm"].to_numpy(), fin["eta_star"].to_numpy(),
                                  clusters=fin["instance"].to_numpy(), seed=seed, natural=(-1.0, 1.0)),
        where + f", {config.n_starts} starts per instance",
        f"Spearman(||Gap(theta0)||, eta*) over {len(fin)} (instance, start) cases (cluster bootstrap by instance)")

    trap = gall["trap_margin"].to_numpy() > 0
    finite = gall["finite"].to_numpy()
    add("trap_accuracy", clustered_proportion(trap == finite, gall["instance"]),
        where + f", {config.n_starts} starts per instance",
        f"accuracy of 'trap => finite eta*' over {len(gall)} (instance, start) cases nested in instances "
        "(Clopper-Pearson bounds over instances)")
    if finite.any() and (~finite).any():
        auc = gapdyn.roc_auc(gall["trap_margin"][finite], gall["trap_margin"][~finite])
        auc = no_data(0.0, 1.0, f"no interval method with measured coverage for an ROC AUC over cases nested in "
                                f"instances (Hanley-McNeil treats the {len(gall)} cases as independent; AUC "
                                f"{auc.estimate:.3f})")
        txt = f"ROC AUC of the trap margin ({int(finite.sum())} finite vs {int((~finite).sum())} none)"
    else:
        auc, txt = no_data(0.0, 1.0, "ROC AUC undefined: every case in one class"), "ROC AUC of the trap margin"
    add("trap_auc", auc, where + f", {config.n_starts} starts per instance", txt)
    for cid, col in (("predictor_lookahead", "pred_2col"), ("predictor_sharp", "pred_sharp")):
        ok = _within_2x(fin[col], fin["eta_star"])
        add(cid, clustered_proportion(np.asarray(ok, bool), fin["instance"]),
            where + f", {config.n_starts} starts per instance",
            f"share of the {len(fin)} cases with {col} / eta* in [0.5, 2] (cases nested in instances: "
            "Clopper-Pearson bounds over instances)")
    _sampled_claims(results, config, block, seed, add)
    return claims


def _identity(results, piv, config):
    """(estimate, statistic) of eta*_Dr / eta*_REINF: the worst instance, gapdyn.check_eta_star_ratio's message."""
    expected = (1 - 1 / config.group_size) ** -1
    ratios, notes = [], []
    for inst in piv.index:
        r_fin, d_fin = np.isfinite(piv.loc[inst, "reinforce"]), np.isfinite(piv.loc[inst, "dr_grpo"])
        if not (r_fin or d_fin):
            continue
        if r_fin and not d_fin and piv.loc[inst, "reinforce"] * expected * (1 + config.rtol) > config.eta_hi:
            continue  # Dr. GRPO's threshold lies beyond the range
        if r_fin != d_fin:
            ratios.append(0.0)
            notes.append(f"instance {inst}: eta* found for {'reinforce' if r_fin else 'dr_grpo'} only")
            continue
        chk = gapdyn.check_eta_star_ratio(eta_star_of(results, inst, "dr_grpo"),
                                          eta_star_of(results, inst, "reinforce"), expected)
        ratios.append(chk.ratio)
        if not chk.holds:
            notes.append(f"instance {inst}: {chk.message}")
    if not ratios:
        return no_data(0.0, 2.0), "no instance with a finite eta*"
    ratios = np.asarray(ratios) / expected
    worst = float(ratios[np.argmax(np.abs(ratios - 1.0))])
    est = gapdyn.Estimate(worst, float(ratios.min()), float(ratios.max()), int(ratios.size), 0.95, "range over instances")
    text = (f"ratio / (1 - 1/G)^-1 = ratio / {expected:.6g} (G = {config.group_size}) on the worst of {ratios.size} "
            "instances (interval: min-max over instances)")
    return est, text + ("; " + "; ".join(notes) if notes else "")


def _sampled_claims(results, config, block, seed, add) -> None:
    """Sampled GRPO and the controllers: claims passed to ``add``."""
    sp = results[results["phase"] == "sampled"].copy()
    sp["collapsed"] = sp["collapsed"].astype(bool)
    setting = (f"sampled GRPO, G={config.group_size}, horizon {config.sampled_steps}, {config.n_seeds} seeds x "
               f"{len(config.sampled_etas)} etas in [{min(config.sampled_etas):g}, {max(config.sampled_etas):g}], "
               f"{sp['instance'].nunique()} instances ({block})")
    const = sp[sp["schedule"] == "constant"]
    top = const[const["eta"] == const["eta"].max()]
    add("sampled_collapse", exists_on_some_instance(top["collapsed"], top["instance"]), setting,
        f"P(collapse) at eta = {const['eta'].max():g} on the instance with the most collapsed runs "
        "(Clopper-Pearson over its seeds, Bonferroni over the instances)")
    for s in ("adaptive", "linesearch"):
        g = sp[sp["schedule"] == s]
        add(f"{s}_collapse", clustered_proportion(g["collapsed"], g["instance"]), setting + f", {s} schedule",
            "P(collapse) of a run on a random instance (runs nested in instances: Clopper-Pearson bounds over "
            "instances with none / every run collapsed)")
        ratios, n_pairs = restricted_speed(const, g, config.sampled_steps, differing_only=(s == "linesearch"))
        add(f"{s}_speed", bootstrap(np.mean, ratios.to_numpy(), seed=seed, natural=(-3.0, 3.0)),
            setting + f", {s} vs constant, paired on (instance, eta, seed)",
            f"mean over {ratios.size} instances of log10(restricted mean steps to 0.9, {s} / constant), steps "
            f"censored at {config.sampled_steps}, over {n_pairs} pairs"
            + (" whose runs differ" if s == "linesearch" else " (all)") + " (studentized cluster bootstrap)")


_RUN_SUMMARY = ("J_final", "J_min", "steps_to_09", "collapse_step")
"""Columns of a sampled run that tell two runs of one stream apart (equal on all: the same trajectory)."""


def restricted_speed(const: pd.DataFrame, ctl: pd.DataFrame, horizon: int, *,
                     differing_only: bool) -> tuple[pd.Series, int]:
    """(log10 ratio per instance, pairs used): per instance, the restricted mean of min(steps to J >= 0.9, horizon)
    over its (eta, seed) pairs, controller over constant step (a run that never reaches 0.9 counts the horizon,
    so every pair enters, none is selected on its outcome). ``differing_only``: only pairs whose two runs differ
    in some _RUN_SUMMARY column; an instance without such a pair has no ratio."""
    key = ["instance", "eta", "seed"]
    both = const.merge(ctl, on=key, suffixes=("_c", "_x"), validate="one_to_one")
    if differing_only:
        same = np.ones(len(both), bool)
        for col in _RUN_SUMMARY:
            a, b = both[f"{col}_c"].to_numpy(float), both[f"{col}_x"].to_numpy(float)
            same &= (a == b) | (np.isnan(a) & np.isnan(b))
        both = both[~same]
    t_c = np.minimum(both["steps_to_09_c"].to_numpy(float), horizon)
    t_x = np.minimum(both["steps_to_09_x"].to_numpy(float), horizon)
    per = pd.DataFrame({"instance": both["instance"].to_numpy(), "c": t_c, "x": t_x}).groupby("instance").mean()
    per = per[(per["c"] > 0) & (per["x"] > 0)]  # a run at J >= 0.9 from its start has no speed to compare
    return np.log10(per["x"] / per["c"]), int(len(both))


def run(config: Config, *, store=None, backend="joblib", n_jobs=-1, progress=True):
    """ExperimentResult of both blocks through gapdyn.evidence.sweep.run_sweep (resumable with ``store``)."""
    return run_experiment(EXPERIMENT, config, store=store, backend=backend, n_jobs=n_jobs,
                          progress=progress)


EXPERIMENT = Experiment(name=NAME, claims=SPECS, config=Config, cells=cells, run_cell=run_cell, analyse=analyse)
"""This experiment in the one protocol (gapdyn.evidence.experiment.Experiment)."""
