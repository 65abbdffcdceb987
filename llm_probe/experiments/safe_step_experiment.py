"""Experiment: the safe step controller (docs/theory.md, section 11) on the tiny Qwen, as claim records.

    gapdyn train safe-step --mode quick|full --out DIR        # one process, resumable

Arms: ``constant`` (Adam's own step) and ``safe`` (the same run with ``--safe-step``: each Adam step scaled by the
multiplier a of gapdyn.safe_step_multiplier). Every run starts from the pinned warm checkpoint
(llm_probe.experiments.pinned.pinned_warm, warmed on the split addition task, so the task is
``SplitAddition(20)`` of the ablation, whose held-out pairs RL never samples) and keeps, per run folder
``DIR/runs/<method>_<arm>_lr<lr>_s<seed>/``: metrics.jsonl, eval.jsonl (held-out sampled accuracy and token
entropy every ``eval_every`` steps, llm_probe.experiments._study.heldout_eval) and done.json. Each run is a cell of
the one runner (_study.run_study over gapdyn.evidence.runner.run_cells): a folder with done.json is finished and read back,
an unfinished one restarts, a run claimed by another process (its lock) is skipped.

Two blocks. The pilot (discovery seeds) measures the effects; :func:`make_plan` turns them into the
confirmation size with gapdyn.evidence.planner (power 0.8 at alpha / number of primaries) under a CPU budget, written
once to ``DIR/plan.json``; the confirmation block (seeds 1000, 1001, ...) runs ``n = min(max(planned, 30),
affordable)`` seeds per lr (gapdyn.evidence.planner.confirmation_size). "Affordable" follows from the pilot's
measured CPU seconds, so a fresh study need not reproduce n; plan.json records them and n is re-derived from
it (:func:`plan_used`). Outputs (:func:`summarize`): runs.csv, survival.csv (alerted / recovered / ends
collapsed / failed per block, arm and lr), claims.json, claims.md; runs.csv and survival.csv carry the warm
checkpoint's sha256 (``warm_sha256``).

Claims (:data:`SPECS`, frozen at import, hashed in :data:`CRITERIA_HASH`, written to ``DIR/criteria.json``
before any run). Primaries (Holm over these two only, every test one-sided):

- ``fewer_collapses@<method>_lr<collapse lr>``: fewer runs end collapsed with the safe step than with the
  constant step: P(collapsed | constant) - P(collapsed | safe), Newcombe hybrid score interval
  (gapdyn.evidence.stats.newcombe_difference), p: one-sided Fisher exact.
- ``not_slower@<method>_lr<safe lr>``: the safe step reaches the reward level no more than 10 % later: mean steps to
  level, safe / constant, paired by seed; Fieller interval (:func:`fieller_paired_ratio`), p: one-sided t test
  of safe - 1.1 constant < 0.

Exploratory (p unadjusted): ``collapse_constant`` (the premise: most constant-step runs end collapsed,
Clopper-Pearson), ``final_reward`` and ``final_heldout`` (safe - constant at the collapse lr, paired bootstrap,
one-sided Wilcoxon).

Intervals whose coverage was measured (:data:`INTERVALS`, docs/coverage.md): a claim is measured only at an n
where gapdyn.evidence.coverage.valid_at finds its interval valid, else it is reported "not measured" with the reason (its
p, if any, stays in Holm). Measured: Fieller valid from 8 pairs (normal, lognormal and gamma-Poisson count pairs,
ratio 2/9), Newcombe from 10 runs per arm, Clopper-Pearson from 4; the percentile paired bootstrap of
``final_reward`` / ``final_heldout`` is valid at no tabulated n <= 50 (skewed paired differences; no paired-mean
interval there is valid at 16 either), so those rows, and the discovery block's ``fewer_collapses`` (8 runs per
arm), are not measured.

Outcome: llm_probe.collapse.reward_outcome with the held-out accuracies (a run ends collapsed when its last-25-step
reward is below 0.25 R0 and its final held-out accuracy below 0.25 of its initial one), recomputed from the
run's files by llm_probe.experiments.ablation.folder_outcome; alerts are events, counted apart; failed runs
(numerical faults) are reported apart and their pairs dropped. Steps to level: the first step whose rolling
mean reward over ``window`` steps reaches L = (R0 + R_peak) / 2, R0 the mean of the constant runs' first-10-step
rewards, R_peak the mean over constant runs of their largest rolling mean; a run that never does counts the
horizon (censored). Undefined, and reported as such, when R_peak <= R0.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import gapdyn
from gapdyn.evidence.claims import CONFIRMATION_SEEDS, Claim, ClaimSpec, Criterion, claims_markdown, holm_adjust_claims, keyed_specs
from gapdyn.evidence.experiment import STREAM_SEEDS, Experiment
from gapdyn.io import atomic_write_json
from gapdyn.evidence.planner import allocate, confirmation_size, plan_n, power_mean, power_two_proportions
from gapdyn.theory.safe_step import SAFE_STEP_C, SAFE_STEP_DELTA
from gapdyn.evidence.stats import fieller_paired_ratio  # re-exported: the interval of ``not_slower``

from . import _study
from ._study import (RESULT, AdditionBatch, ModePresets, SplitAddition, heldout_problems, one_sided_wilcoxon, plan_once, read_evals, read_metrics,
                     run_name, run_outcome_columns, start_run, survival_table, train_with_heldout_eval,
                     write_claims, write_table)
from ._study import run_study as run_folders
from ..seeds import STUDY_SEED, derive_seed

__all__ = ["SafeStepExperiment", "PRESETS", "SPECS", "CRITERIA", "CRITERIA_HASH", "TEST_TEXT", "EXPERIMENT", "NAME",
           "PRIMARIES", "run_study", "run_cell", "cell_name", "pair_cells", "load_runs", "summarize", "analyse", "analyse_rows", "cells",
           "run_cell", "steps_to_level", "fieller_paired_ratio", "one_sided_margin_t", "make_plan", "allocate",
           "survival", "run_and_report", "step_cost"]

NAME = "llm_safe_step"
ARMS = ("constant", "safe")
SOURCE = "beyond the papers (safe step rule, docs/theory.md section 11)"
MARGIN = 1.1
"""Non-inferiority margin of ``not_slower``: safe / constant steps to level below 1.1."""
SPECS = {
    "fewer_collapses": ClaimSpec(SOURCE, "at a collapse lr fewer runs end collapsed with the safe step than with "
                                 "the constant step", "comparison", Criterion.above(0.0, alpha=0.05), primary=True),
    "not_slower": ClaimSpec(SOURCE, "at a safe lr the safe step reaches the reward level no more than 10 % later",
                            "comparison", Criterion.below(MARGIN, alpha=0.05), primary=True),
    "collapse_constant": ClaimSpec(SOURCE, "at a collapse lr most constant-step runs end collapsed (the premise)",
                                   "existence", Criterion.above(0.5)),
    "final_reward": ClaimSpec(SOURCE, "at a collapse lr the safe step ends with a higher reward (paired by seed)",
                              "comparison", Criterion.above(0.0, alpha=0.05)),
    "final_heldout": ClaimSpec(SOURCE, "at a collapse lr the safe step ends with a higher held-out accuracy "
                               "(paired by seed)", "comparison", Criterion.above(0.0, alpha=0.05)),
}
SPECS = keyed_specs(SPECS, {k: (("beyond the papers", "safe step rule"), "premise" if k == "collapse_constant"
                                else "test" if SPECS[k].primary else "exploratory") for k in SPECS})
"""Claim family -> ClaimSpec, frozen at import (before any run); a claim's id is ``<family>@<method>_lr<lr>``. Each
names its statement key and role: collapse_constant checks the premise of the comparisons (runs do collapse); the
tests that are not primary (unadjusted) are exploratory."""
CRITERIA = {k: spec.criterion for k, spec in SPECS.items()}
"""Claim family -> Criterion (the specs' criteria: what :data:`CRITERIA_HASH` hashes)."""
PRIMARIES = tuple(k for k, v in SPECS.items() if v.primary)
"""The pre-declared primaries; the planner works at alpha / len(PRIMARIES)."""
TEST_TEXT = {
    "fewer_collapses": "P(ends collapsed | constant) - P(ends collapsed | safe), Newcombe hybrid score 95 %; "
                       "p: one-sided Fisher exact (safe fewer), Holm over the primaries",
    "not_slower": "mean steps to level, safe / constant (paired by seed), Fieller 95 %; p: one-sided t test of "
                  "safe - 1.1 constant < 0, Holm over the primaries",
    "collapse_constant": "P(ends collapsed), constant step, Clopper-Pearson 95 %",
    "final_reward": "mean final reward (last 25 steps), safe - constant, paired bootstrap 95 %; p: one-sided "
                    "Wilcoxon (safe higher), unadjusted",
    "final_heldout": "final held-out accuracy, safe - constant, paired bootstrap 95 %; p: one-sided Wilcoxon "
                     "(safe higher), unadjusted",
}
"""How each family is measured; its criterion text is ``TEST_TEXT[family]: Criterion.describe()``."""
CRITERIA_HASH = gapdyn.criteria_hash(CRITERIA)
"""gapdyn.criteria_hash of :data:`SPECS`, computed at import and stamped on every claim (= EXPERIMENT.criteria_hash)."""


@dataclass(frozen=True)
class SafeStepExperiment(AdditionBatch, ModePresets):
    """Grid, run settings and the sizing rule of the study (module docstring; test / quick / full: :data:`PRESETS`)."""

    mode: str = "full"
    """The size's name (test, quick, full)."""
    method: str = "grpo"
    collapse_lr: float = 5e-4
    """Adam lr where the constant step ends collapsed most (ablation and earlier safe-step runs)."""
    safe_lr: float = 3e-4
    """Adam lr where constant-step runs mostly survive (the ``not_slower`` claim)."""
    seeds: tuple[int, ...] = tuple(range(8))
    """The pilot (discovery) seeds; with ``replicate``, the seeds of a replication (any seeds)."""
    replicate: bool = False
    """Run both arms at both lrs on exactly ``seeds`` (``--seeds``, in every mode): no planned confirmation block;
    each run's block is that of its seed (below confirmation_start: discovery, else confirmation)."""
    confirmation_start: int = CONFIRMATION_SEEDS[0]
    """First confirmation seed (seeds confirmation_start, confirmation_start + 1, ...)."""
    n_floor: int = 30
    """Confirmation seeds per lr at least (before the budget cap)."""
    budget_cpu_s: float = 1200.0
    """CPU seconds the whole study may take (pilot included); caps the confirmation size."""
    power: float = 0.8
    alpha: float = 0.05
    steps: int = 100
    eval_every: int = 25
    eval_prompts: int = 64
    eval_samples: int = 4
    heldout_mod: int = 20
    warm: str = "tiny"
    """Pinned warm checkpoint (llm_probe.experiments.pinned); warmed on SplitAddition(20)."""
    init_from: str | None = None
    """A saved model every run starts from instead of the pinned one (tests, front-end checks)."""
    c: float = SAFE_STEP_C
    """The controller's fraction of the model-optimal step (default of the rule)."""
    delta: float = SAFE_STEP_DELTA
    """The controller's trust region (default of the rule)."""
    tail: int = 25
    window: int = 10
    n_resamples: int = 4000

    def __post_init__(self):
        if not self.replicate and (len(self.seeds) < 2 or any(s >= self.confirmation_start for s in self.seeds)):
            raise ValueError(f"seeds must hold >= 2 pilot seeds below confirmation_start, got {self.seeds}")
        if not self.seeds:
            raise ValueError("seeds must hold at least one seed")
        for name in ("steps", "prompts_per_step", "max_new_tokens", "eval_every", "eval_prompts", "eval_samples",
                     "tail", "window", "n_resamples", "n_floor"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.group_size < 2 or self.heldout_mod < 2:
            raise ValueError("group_size and heldout_mod must be >= 2")
        for lr in (self.collapse_lr, self.safe_lr):
            if not (isinstance(lr, float) and 0 < lr < math.inf):
                raise ValueError(f"learning rates must be finite floats > 0, got {lr!r}")
        if self.collapse_lr == self.safe_lr:
            raise ValueError("collapse_lr and safe_lr must differ")
        if not (self.budget_cpu_s > 0 and 0 < self.power < 1 and 0 < self.alpha < 1):
            raise ValueError("budget_cpu_s must be > 0, power and alpha in (0, 1)")
        if self.tail > self.steps or self.window > self.steps:
            raise ValueError(f"tail and window must be <= steps ({self.steps})")

    @property
    def lrs(self) -> tuple[float, float]:
        return (self.collapse_lr, self.safe_lr)

    @property
    def instances(self) -> tuple[int, ...]:
        """The pilot seeds (the protocol's discovery block)."""
        return tuple(self.seeds)


PRESETS = {
    "test": SafeStepExperiment(mode="test", seeds=(0, 1), n_floor=2, budget_cpu_s=30.0, steps=3, prompts_per_step=2,
                               group_size=4, eval_every=2, eval_prompts=4, eval_samples=2, tail=2, window=2,
                               n_resamples=200),
    "quick": SafeStepExperiment(mode="quick", seeds=(0, 1, 2), n_floor=3, budget_cpu_s=300.0, steps=40,
                                prompts_per_step=8, eval_every=20, eval_prompts=16, tail=10, window=5),
    "full": SafeStepExperiment(mode="full"),
}
"""test: machinery (seconds); quick: indicative; full: the claims' size (GRPO, collapse lr 5e-4, safe lr 3e-4,
100 steps, 8 pilot seeds, confirmation sized by the planner within 20 CPU-minutes)."""
SafeStepExperiment.PRESETS = PRESETS


# ---- runs ----------------------------------------------------------------------------------------------------
def cell_name(cell: dict) -> str:
    """A cell's run folder (under ``<study>/runs``): ``<method>_<arm>_lr<lr>_s<seed>`` (:func:`_study.run_name`)."""
    return run_name(cell["settings"]["method"], cell["arm"], lr=cell["lr"], seed=cell["seed"])


def warm_folder(exp) -> tuple[Path, str]:
    """(folder, sha256 of its model.safetensors): ``exp.init_from`` when given, else the pinned checkpoint."""
    from .pinned import file_sha256, pinned_warm

    d = Path(exp.init_from) if exp.init_from else pinned_warm(exp.warm)
    return d, file_sha256(d / "model.safetensors")


def run_cell(*, arm: str, lr: float, seed: int, settings: dict, out, warm_dir=None) -> dict:
    """Train one (arm, lr, seed) run with the run settings ``settings`` (:data:`RUN_SETTINGS`) into the run folder
    ``out`` from ``warm_dir`` (default :func:`warm_folder`); writes done.json last and returns it. The held-out
    evaluations (_study.heldout_eval on the same held-out problems for every run, own generators) run as
    Trainer.run's ``on_step`` hook; no checkpoint (an unfinished run restarts)."""
    import torch

    from ..config import TrainConfig
    from ..trainer import Trainer

    if set(settings) != set(RUN_SETTINGS):
        raise ValueError(f"settings must hold exactly {RUN_SETTINGS}, got {sorted(settings)}")
    exp = SimpleNamespace(**settings)
    warm_dir = warm_folder(exp)[0] if warm_dir is None else warm_dir
    d = start_run(out)
    torch.set_num_threads(1)
    task = SplitAddition(exp.heldout_mod)
    tc = TrainConfig(out_dir=str(d), method=exp.method, lr=lr, seed=seed, steps=exp.steps,
                     prompts_per_step=exp.prompts_per_step, group_size=exp.group_size,
                     max_new_tokens=exp.max_new_tokens, init_from=str(warm_dir), probe_every=0, probe_prompts=0,
                     num_threads=1, progress=False, device="cpu", safe_step=arm == "safe", safe_step_c=exp.c,
                     safe_step_delta=exp.delta)
    t0, c0 = time.perf_counter(), time.process_time()
    tr = Trainer(tc, task=task)
    eval_probs, = heldout_problems(task, exp.eval_prompts)
    evals, fault = train_with_heldout_eval(tr, d / "eval.jsonl", eval_probs, exp.eval_samples, exp.eval_every)
    rows = read_metrics(d)
    a = [r["safe/a"] for r in rows if "safe/a" in r]
    done = {"method": exp.method, "arm": arm, "lr": lr, "seed": seed, "steps_run": len(rows), "fault": fault,
            "a_mean": float(np.mean(a)) if a else 1.0, "wall_s": time.perf_counter() - t0,
            "cpu_s": time.process_time() - c0}
    atomic_write_json(d / "done.json", done, indent=1)
    return done


def run_row(d) -> dict:
    """One finished run folder as a row: done.json, the outcome columns recomputed from its files
    (_study.run_outcome_columns), reward_last25, heldout_acc_first / _final, the per-step rewards (``reward``, not
    written to runs.csv) and ``dir``."""
    from ..collapse import OUTCOME_WINDOW

    d = Path(d)
    r = json.loads((d / "done.json").read_text())
    rows = read_metrics(d)
    rew = [float(x.get("reward", np.nan)) for x in sorted(rows, key=lambda x: x["step"])]
    ev = sorted(read_evals(d), key=lambda e: e["step"])
    tail = np.array(rew[-OUTCOME_WINDOW:] or [np.nan])
    r.update(run_outcome_columns(d))
    r.update(reward_last25=float(np.nanmean(tail)) if np.isfinite(tail).any() else math.nan,
             heldout_acc_first=ev[0]["acc"] if ev else math.nan, heldout_acc_final=ev[-1]["acc"] if ev else math.nan,
             reward=rew, dir=str(d))
    return r


def load_runs(out):
    """One row per finished run under ``out/runs`` (:func:`run_row`), with its block ("discovery" below
    ``confirmation_start`` 1000, else "confirmation")."""
    df = _study.load_runs(out, run_row)
    if len(df):
        df["block"] = np.where(df.seed >= PRESETS["full"].confirmation_start, "confirmation", "discovery")
    return df


# ---- statistics ----------------------------------------------------------------------------------------------
def steps_to_level(reward, level: float, window: int) -> int | None:
    """First step k (0-based, k >= window - 1) whose rolling mean over the last ``window`` rewards is >= level;
    None if never."""
    r = np.asarray(reward, dtype=float)
    if r.size < window:
        return None
    roll = np.convolve(r, np.ones(window) / window, "valid")  # roll[j] = mean r[j .. j + window - 1]
    hit = np.nonzero(roll >= level)[0]
    return int(hit[0] + window - 1) if hit.size else None


def _pair_arrays(num, den):
    x, y = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if x.ndim != 1 or x.shape != y.shape or x.size < 2 or not np.all(np.isfinite(x) & np.isfinite(y)):
        raise ValueError(f"num and den must be finite 1-D arrays of one length >= 2, got shapes {x.shape}, {y.shape}")
    return x, y


def one_sided_margin_t(num, den, margin: float) -> float:
    """One-sided p of H1: mean(num) < margin mean(den), the paired t test of num - margin den (no spread: 0 when
    the mean difference is < 0, else 1)."""
    from scipy.stats import ttest_1samp

    x, y = _pair_arrays(num, den)
    dd = x - margin * y
    if np.ptp(dd) == 0:
        return 0.0 if dd[0] < 0 else 1.0
    return float(ttest_1samp(dd, 0.0, alternative="less").pvalue)


INTERVALS = {"fewer_collapses": "newcombe_difference", "not_slower": "fieller_paired_ratio",
             "collapse_constant": "clopper_pearson", "final_reward": "percentile_paired_mean",
             "final_heldout": "percentile_paired_mean"}
"""Each family's interval by its gapdyn.evidence.coverage method name: a claim is measured only at an n where
docs/coverage.md finds that interval valid (gapdyn.evidence.coverage.valid_at), else it is reported not measured."""


def _unmeasured_below_valid_n(family: str, n: int, what: str, estimate: float):
    """None when the interval of ``family`` is valid at n (gapdyn.evidence.coverage.valid_at); else a
    :func:`gapdyn.evidence.stats.not_measured` whose reason names docs/coverage.md (the claim is then not measured, as
    ablation.paired_mean)."""
    from gapdyn.evidence.coverage import too_few_reason, valid_at

    method = INTERVALS[family]
    if valid_at(method, n):
        return None
    return gapdyn.evidence.stats.not_measured(float(estimate), float(estimate), too_few_reason(method, n, what), n=n)


def _spec_fields(family: str) -> dict:
    spec = SPECS[family]
    return dict(source=spec.source, criterion=spec.criterion, form=spec.form, primary=spec.primary,
                statement=spec.statement, criterion_text=f"{TEST_TEXT[family]}: {spec.criterion_text}",
                key=spec.key, role=spec.role, criteria_hash=CRITERIA_HASH)


def _paired_interval(method: str, xs, xc, *, rng, n_resamples: int) -> gapdyn.Estimate:
    """The interval ``method`` (a gapdyn.evidence.coverage paired-difference method) for mean(xs - xc) over pairs."""
    from gapdyn.evidence.stats import paired_bootstrap_difference, studentized_cluster_bootstrap_mean

    if method == "percentile_paired_mean":
        return paired_bootstrap_difference(xs, xc, rng=rng, n_resamples=n_resamples)
    if method == "studentized_paired_mean":
        return studentized_cluster_bootstrap_mean(np.asarray(xs) - np.asarray(xc), rng=rng, n_resamples=n_resamples)
    raise ValueError(f"method must be a paired-difference interval of this study, got {method!r}")


def _paired(runs, lr: float):
    """Rows of (constant, safe) at lr paired by seed, pairs with a failed run left out (columns method, arm, lr,
    seed, failed)."""
    g = runs[(runs.lr == lr) & ~runs.failed.astype(bool)]
    c, s = g[g.arm == "constant"].set_index("seed"), g[g.arm == "safe"].set_index("seed")
    common = sorted(set(c.index) & set(s.index))
    return c.loc[common], s.loc[common]


def level_of(const_rewards, window: int) -> tuple[float, float, float]:
    """(R0, R_peak, L): R0 the mean over constant runs of their first-10-step reward, R_peak the mean of their
    largest ``window``-step rolling mean, L = (R0 + R_peak) / 2."""
    from ..collapse import OUTCOME_BASELINE_STEPS

    r0 = float(np.mean([np.nanmean(r[:OUTCOME_BASELINE_STEPS]) for r in const_rewards]))
    peak = float(np.mean([np.max(np.convolve(r, np.ones(window) / window, "valid")) for r in const_rewards]))
    return r0, peak, 0.5 * (r0 + peak)


def _steps(rewards, level, exp) -> np.ndarray:
    """Steps taken until the level (the horizon when never reached)."""
    return np.array([exp.steps if (k := steps_to_level(r, level, exp.window)) is None else k + 1 for r in rewards],
                    dtype=float)


def pilot_effects(exp, runs) -> dict:
    """What the planner needs from a block: collapse rates per arm at the collapse lr; the paired differences
    safe - 1.1 constant of the steps to level at the safe lr (mean, sd); measured on non-failed pairs."""
    c, s = _paired(runs, exp.collapse_lr)
    out = {"n_collapse": len(c), "p_constant": float(c.collapsed.mean()) if len(c) else math.nan,
           "p_safe": float(s.collapsed.mean()) if len(s) else math.nan}
    c, s = _paired(runs, exp.safe_lr)
    out["n_safe_lr"] = len(c)
    if len(c) >= 2:
        R0, peak, L = level_of(list(c.reward), exp.window)
        out.update(R0=R0, R_peak=peak, level=L)
        if peak > R0:
            dd = _steps(s.reward, L, exp) - MARGIN * _steps(c.reward, L, exp)
            out.update(d_mean=float(dd.mean()), d_sd=float(dd.std(ddof=1)))
    return out


def make_plan(exp, pilot, cpu_per_seed: dict, cpu_spent: float) -> dict:
    """Confirmation seeds per lr: planned n from the pilot (gapdyn.evidence.planner at alpha / len(PRIMARIES), power
    ``exp.power``): one-sided Fisher of the collapse rates (power_two_proportions) and the t test of safe - 1.1
    constant (power_mean at confidence 1 - 2 alpha / len(PRIMARIES): its one-sided half); used n =
    min(max(planned, n_floor), affordable), :func:`plan_used` of the returned plan (the CPU left of
    ``exp.budget_cpu_s`` at the measured ``cpu_per_seed``)."""
    a = exp.alpha / len(PRIMARIES)
    n_max = 500
    pc, ps = pilot.get("p_constant", math.nan), pilot.get("p_safe", math.nan)
    if math.isfinite(pc) and math.isfinite(ps) and pc > ps:
        pa = plan_n(lambda n: power_two_proportions(pc, ps, n, alpha=a), target=exp.power, n_min=2, n_max=n_max)
    else:
        pa = None
    dm, dsd = pilot.get("d_mean"), pilot.get("d_sd")
    if dm is not None and dm < 0 and dsd and dsd > 0:
        pb = plan_n(lambda n: power_mean(dm, dsd, n, value=0.0, confidence=1 - 2 * a), target=exp.power, n_min=2,
                    n_max=n_max)  # a two-sided interval at 1 - 2a: the one-sided test at a
    elif dm is not None and dm < 0:  # no spread in the pilot: any n decides
        pb = SimpleNamespace(n=2, power=1.0, decidable=True, reason="no spread in the pilot's differences")
    else:
        pb = None
    planned = {exp.collapse_lr: pa.n if pa else n_max, exp.safe_lr: pb.n if pb else n_max}
    plan = {"alpha_per_primary": a, "power_target": exp.power, "pilot": pilot,
            "planned": {f"{lr:g}": planned[lr] for lr in exp.lrs},
            "planned_reason": {f"{exp.collapse_lr:g}": pa.reason if pa else "pilot shows no effect: not decidable",
                               f"{exp.safe_lr:g}": pb.reason if pb else "pilot shows no effect: not decidable"},
            "n_floor": exp.n_floor, "used": None,
            "cpu_per_seed": {f"{lr:g}": cpu_per_seed[lr] for lr in exp.lrs}, "cpu_spent_pilot": cpu_spent,
            "budget_cpu_s": exp.budget_cpu_s}
    plan["used"] = plan_used(plan)
    return plan


def plan_used(plan: dict) -> dict:
    """Confirmation seeds per lr ({"<lr>": n}) as a function of what ``plan`` (plan.json) records: the planned n,
    the floor ``n_floor`` and the CPU budget left after the pilot (``budget_cpu_s`` - ``cpu_spent_pilot``) split
    over the lrs at the pilot's measured ``cpu_per_seed`` (gapdyn.evidence.planner.confirmation_size with a cost
    budget). The CPU seconds are measured, so a fresh study need not reproduce them; a recorded plan fixes the
    size."""
    used = confirmation_size(plan["planned"], n_min=plan["n_floor"], cost=plan["cpu_per_seed"],
                             budget=plan["budget_cpu_s"] - plan["cpu_spent_pilot"])
    return {lr: used[lr] for lr in plan["planned"]}


# ---- claims --------------------------------------------------------------------------------------------------
def analyse_rows(exp, runs, *, block: str = "discovery", n_planned: dict | None = None) -> tuple[list, dict]:
    """(claims, summary) of one block's rows (:func:`load_runs` columns) judged against the frozen :data:`SPECS`;
    Holm over the primaries only (gapdyn.holm_adjust_claims), the other tests unadjusted. n_planned: lr ->
    the planner's n (stamped on the claims at that lr)."""
    from gapdyn.evidence.stats import clopper_pearson_interval, fisher_exact_test, newcombe_difference

    rng = np.random.default_rng(derive_seed(STUDY_SEED, "claims_bootstrap"))
    n_planned = n_planned or {}
    m = exp.method
    setting = (f"tiny Qwen2, pinned warm checkpoint '{exp.warm}', split addition (held-out pairs), Adam, "
               f"B={exp.prompts_per_step}, G={exp.group_size}, {exp.steps} steps, c={exp.c:g}, delta={exp.delta:g}")
    claims, summary = [], {"block": block, "criteria_hash": CRITERIA_HASH}
    lr = exp.collapse_lr
    c, s = _paired(runs, lr)
    n = len(c)
    where = f"{setting}; {m}, lr={lr:g}, {n} seeds (failed pairs apart)"
    plan = n_planned.get(lr)
    if n >= 2:
        kc, ks = int(c.collapsed.sum()), int(s.collapsed.sum())
        p = fisher_exact_test([[kc, n - kc], [ks, n - ks]], alternative="greater").p_value
        est = (_unmeasured_below_valid_n("fewer_collapses", n, "runs per arm", (kc - ks) / n)
               or newcombe_difference(kc, n, ks, n))
        claims.append(Claim.from_estimate(est, id=f"fewer_collapses@{m}_lr{lr:g}",
                                          setting=where, p_value=p, p_adjusted=p, n_planned=plan,
                                          statistic="share ending collapsed, constant - safe",
                                          **_spec_fields("fewer_collapses")))
        est = _unmeasured_below_valid_n("collapse_constant", n, "runs", kc / n) or clopper_pearson_interval(kc, n)
        claims.append(Claim.from_estimate(est, id=f"collapse_constant@{m}_lr{lr:g}",
                                          setting=where, n_planned=plan, statistic="P(ends collapsed), constant",
                                          **_spec_fields("collapse_constant")))
        for fam, col, what in (("final_reward", "reward_last25", "last-25-step reward"),
                               ("final_heldout", "heldout_acc_final", "final held-out accuracy")):
            xs, xc = s[col].to_numpy(float), c[col].to_numpy(float)
            pw = one_sided_wilcoxon(xs, xc)
            est = (_unmeasured_below_valid_n(fam, n, "pairs", float(np.mean(xs - xc)))
                   or _paired_interval(INTERVALS[fam], xs, xc, rng=rng, n_resamples=exp.n_resamples))
            claims.append(Claim.from_estimate(
                est, id=f"{fam}@{m}_lr{lr:g}",
                setting=where, p_value=pw, p_adjusted=pw, n_planned=plan, statistic=f"{what}, safe - constant",
                **_spec_fields(fam)))
        summary["collapse_lr"] = {"lr": lr, "n": n, "collapsed_constant": kc, "collapsed_safe": ks,
                                  "fisher_p": p, "a_mean_safe": float(s.a_mean.mean())}
    lr = exp.safe_lr
    c, s = _paired(runs, lr)
    n = len(c)
    if n >= 2:
        R0, peak, L = level_of(list(c.reward), exp.window)
        g = {"lr": lr, "n": n, "R0": R0, "R_peak": peak, "level": L, "a_mean_safe": float(s.a_mean.mean())}
        if peak > R0:
            sc, ss = _steps(c.reward, L, exp), _steps(s.reward, L, exp)
            g.update(steps_constant=float(sc.mean()), steps_safe=float(ss.mean()),
                     reached_constant=int((sc < exp.steps).sum()), reached_safe=int((ss < exp.steps).sum()))
            where = f"{setting}; {m}, lr={lr:g}, {n} seeds; level {L:.3f} (R0 {R0:.3f}, R_peak {peak:.3f})"
            try:
                est = fieller_paired_ratio(ss, sc)
            except ValueError as exc:
                g["not_testable"] = str(exc)
            else:
                est = _unmeasured_below_valid_n("not_slower", n, "pairs", est.estimate) or est
                p = one_sided_margin_t(ss, sc, MARGIN)
                claims.append(Claim.from_estimate(est, id=f"not_slower@{m}_lr{lr:g}", setting=where, p_value=p,
                                                  p_adjusted=p, n_planned=n_planned.get(lr),
                                                  statistic="mean steps to level, safe / constant",
                                                  **_spec_fields("not_slower")))
        else:
            g["not_testable"] = f"R_peak {peak:.3f} <= R0 {R0:.3f}: no rise, no level between them"
        summary["safe_lr"] = g
    return [replace(x, block=block) for x in holm_adjust_claims(claims)], summary


def survival(runs):
    """Per (block, arm, lr): runs, alerted, recovered, ends collapsed, failed, collapse rate of the runs that did not
    fail with its Clopper-Pearson interval, the 10-step sensitivity count, reward and held-out accuracy at the end
    (_study.survival_table, once per (block, arm))."""
    import pandas as pd

    parts = []
    for (block, arm), g in runs.groupby(["block", "arm"], sort=True):
        t = survival_table(g.drop(columns=["arm"]))
        t.insert(0, "arm", arm)
        t.insert(0, "block", block)
        parts.append(t)
    return pd.concat(parts, ignore_index=True)


def summarize(exp, out, *, plan: dict | None = None, warm_sha256: str = "") -> list[Claim]:
    """runs.csv, survival.csv (both with ``warm_sha256``), claims.json, claims.md (per block, Holm within each) and
    summary.json in ``out``; returns the claims."""
    out = Path(out)
    runs = load_runs(out)
    if not len(runs):
        raise ValueError(f"no finished run under {out}/runs")
    runs["warm_sha256"] = warm_sha256
    write_table(out / "runs.csv", runs.drop(columns=["dir", "reward"]))
    surv = survival(runs)
    surv["warm_sha256"] = warm_sha256
    write_table(out / "survival.csv", surv)
    planned = {float(k): v for k, v in (plan or {}).get("planned", {}).items()}
    claims, summary = [], {}
    for block in ("discovery", "confirmation"):
        g = runs[runs.block == block]
        if len(g):
            cl, summary[block] = analyse_rows(exp, g, block=block,
                                              n_planned=planned if block == "confirmation" else None)
            claims += cl
    write_claims(out, claims, claims_markdown(claims) if claims else "(no claims)")
    atomic_write_json(out / "summary.json", summary, indent=1)
    return claims


# ---- the study -----------------------------------------------------------------------------------------------
def pair_cells(exp, seeds_by_lr: dict) -> list[dict]:
    """Both arms of every (lr, seed), seed by seed (a partial block leaves every lr with paired seeds), each cell
    with the run settings of :data:`RUN_SETTINGS`."""
    settings = {k: getattr(exp, k) for k in RUN_SETTINGS}
    return [{"arm": arm, "lr": lr, "seed": int(s), "settings": settings}
            for s in sorted({s for v in seeds_by_lr.values() for s in v}) for lr in exp.lrs
            if s in seeds_by_lr.get(lr, ()) for arm in ARMS]


def _pairs(exp, out, warm_dir, seeds_by_lr: dict, progress: bool) -> None:
    """:func:`pair_cells` through the runner (_study.run_study: finished runs read back, a lock per run)."""
    run_folders(pair_cells(exp, seeds_by_lr), out, name=cell_name, progress=progress,
                describe=lambda r: f"cpu {r['cpu_s']:.0f} s, wall {r['wall_s']:.0f} s",
                run=lambda c, d: run_cell(**c, out=d, warm_dir=warm_dir))


def run_study(exp: SafeStepExperiment, out, *, progress: bool = True) -> dict:
    """Pilot, plan (``out/plan.json``, made once), confirmation; returns the plan. Resumable: finished runs are
    read back, the plan is read back when it exists. ``exp.replicate``: only the pairs of ``exp.seeds`` (no plan,
    no confirmation block; returns None)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "experiment.json", asdict(exp), indent=1)
    atomic_write_json(out / "criteria.json", {"criteria_hash": CRITERIA_HASH, "primaries": list(PRIMARIES),
                                              "criteria": {k: v.criterion.to_dict() for k, v in SPECS.items()}},
                      indent=1)  # the frozen criteria, before any run
    warm_dir, sha = warm_folder(exp)
    _pairs(exp, out, warm_dir, {lr: exp.seeds for lr in exp.lrs}, progress)
    if exp.replicate:
        return None

    def make() -> dict:
        runs = load_runs(out)
        pilot = runs[runs.block == "discovery"]
        cost = {lr: float(pilot[pilot.lr == lr].groupby("seed").cpu_s.sum().mean()) for lr in exp.lrs}
        return {**make_plan(exp, pilot_effects(exp, pilot), cost, float(pilot.cpu_s.sum())), "warm_sha256": sha}

    plan = plan_once(out / "plan.json", make)
    if progress:
        print(json.dumps({k: plan[k] for k in ("planned", "used", "cpu_per_seed", "cpu_spent_pilot")}), flush=True)
    used = plan_used(plan)  # the recorded inputs' size (equal to plan["used"], which make_plan wrote with it)
    seeds = {lr: tuple(range(exp.confirmation_start, exp.confirmation_start + used[f"{lr:g}"])) for lr in exp.lrs}
    _pairs(exp, out, warm_dir, seeds, progress)
    return plan


def run_and_report(exp: SafeStepExperiment, out, *, n_jobs: int = 1, analyse_only: bool = False, cost_steps: int = 0,
                   progress: bool = True) -> None:
    """``gapdyn train safe-step`` (the command line is llm_probe.cli's): the study into ``out`` (or, with
    ``analyse_only``, the claims of the finished runs there), then :func:`summarize`'s files, printed; with
    ``cost_steps`` > 0 only :func:`step_cost` (``out``/step_cost.json). One process (n_jobs must be 1)."""
    if n_jobs != 1:
        raise ValueError(f"n_jobs must be 1 (the study's CPU budget is measured in one process), got {n_jobs}")
    out = Path(out)
    if cost_steps:
        cost = step_cost(exp, warm_folder(exp)[0], out, steps=cost_steps)
        atomic_write_json(out / "step_cost.json", cost, indent=1)
        print(json.dumps(cost))
        return
    t0, c0 = time.perf_counter(), time.process_time()
    if analyse_only:
        plan = json.loads((out / "plan.json").read_text()) if (out / "plan.json").exists() else None
    else:
        plan = run_study(exp, out, progress=progress)
    claims = summarize(exp, out, plan=plan, warm_sha256=warm_folder(exp)[1])
    print(claims_markdown(claims) if claims else "(no claims)")
    if plan:
        print(f"planned n per lr {plan['planned']}, used {plan['used']}")
    print(f"this call: wall {time.perf_counter() - t0:.0f} s, cpu {time.process_time() - c0:.0f} s")


def step_cost(exp: SafeStepExperiment, warm_dir, out, *, steps: int = 20, lr: float | None = None) -> dict:
    """Time per train step without and with the safe step, interleaved (A B A B ...) so that machine load drifts
    hit both arms alike: two Trainers from the same warm model and seed, ``steps`` steps each, at ``lr``
    (default: the safe lr). Returns per-arm median seconds and the median of the per-pair ratios."""
    from ..config import TrainConfig
    from ..trainer import Trainer

    lr = exp.safe_lr if lr is None else lr
    trainers = {arm: Trainer(TrainConfig(
        out_dir=str(Path(out) / f"cost_{arm}"), method=exp.method, lr=lr, seed=0, steps=steps,
        prompts_per_step=exp.prompts_per_step, group_size=exp.group_size, init_from=str(warm_dir), probe_every=0,
        probe_prompts=0, num_threads=1, progress=False, device="cpu", safe_step=arm == "safe",
        safe_step_c=exp.c, safe_step_delta=exp.delta), task=SplitAddition(exp.heldout_mod)) for arm in ARMS}
    times = {arm: [] for arm in ARMS}
    for _ in range(steps):
        for arm in ARMS:
            t0 = time.perf_counter()
            trainers[arm].train_step()
            times[arm].append(time.perf_counter() - t0)
    ratio = np.array(times["safe"]) / np.array(times["constant"])
    return {"method": exp.method, "lr": lr, "steps": steps, "B": exp.prompts_per_step, "G": exp.group_size,
            "median_s_constant": float(np.median(times["constant"])), "median_s_safe": float(np.median(times["safe"])),
            "median_ratio": float(np.median(ratio)), "ratio_q25_q75": [float(np.quantile(ratio, 0.25)),
                                                                         float(np.quantile(ratio, 0.75))]}


# ---- the one experiment protocol (gapdyn.evidence.experiment) ---------------------------------------------------------
RUN_SETTINGS = ("method", "steps", "prompts_per_step", "group_size", "max_new_tokens", "eval_every", "eval_prompts",
                "eval_samples", "heldout_mod", "warm", "init_from", "c", "delta")
"""The settings one run depends on (the rest of a SafeStepExperiment is the grid, the sizing and the analysis)."""


def cells(config: SafeStepExperiment, instances=None) -> list[dict]:
    """One cell per (arm, lr, seed) in :func:`run_study`'s order (instances: the seeds; :func:`pair_cells`)."""
    seeds = config.seeds if instances is None else tuple(instances)
    return pair_cells(config, {lr: seeds for lr in config.lrs})


def analyse(results, config: SafeStepExperiment, *, block: str = "discovery") -> list:
    """The claims of a block from its runs' rows (:func:`run_row` of each run folder; ``reward`` a list or its
    JSON), by :func:`analyse_rows`."""
    if not len(results):
        return []
    runs = results.assign(reward=[json.loads(r) if isinstance(r, str) else r for r in results["reward"]])
    return analyse_rows(config, runs, block=block)[0]


EXPERIMENT = Experiment(name=NAME, claims=SPECS, config=SafeStepExperiment, cells=cells, run_cell=run_cell,
                        analyse=analyse, command="gapdyn train safe-step --mode full",
                        seed_field="seeds", seed_meaning=STREAM_SEEDS, cell_name=cell_name, result_file=RESULT)
"""This experiment in the one protocol (gapdyn.evidence.experiment.Experiment); its cells are run folders (:func:`_pairs`)."""
