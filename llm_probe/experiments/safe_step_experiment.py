"""Experiment: the safe step controller (docs/theory.md, section 11) on the tiny Qwen, as claim records.

    gapdyn train safe-step --mode quick|full --out DIR

Arms: ``constant`` (the optimizer's own step) and ``safe`` (the same run with ``--safe-step``: each Adam step
scaled by the multiplier a of gapdyn.safe_step_multiplier). Every (method, lr, arm, seed) is one run of
:class:`llm_probe.Trainer` from one shared warm model, in ``DIR/runs/<method>_<arm>_lr<lr>_s<seed>/``; a run
with ``run.json`` is finished and skipped on a re-run, an interrupted one resumes from its checkpoint.

Claims (gapdyn.Claim; criteria frozen at import in :data:`CRITERIA`, hashed in :data:`CRITERIA_HASH` and
written to ``DIR/criteria.json`` before any run; ``DIR/claims.json`` and ``DIR/claims.md``):

- ``collapse_constant_<method>_lr<lr>``: at a collapse lr, most constant-step runs end collapsed (the premise,
  an existence row): Clopper-Pearson 95 % interval of P(ends collapsed) above 0.5.
- ``collapse_safe_<method>_lr<lr>`` (the primaries): with the controller, fewer than half end collapsed and fewer
  than without: Clopper-Pearson interval of P(ends collapsed | safe) below 0.5, and a one-sided Fisher exact test
  (safe fewer) against the constant arm with p < 0.05, Holm-adjusted over the primaries.
- ``final_reward_<method>_lr<lr>`` (exploratory): final reward (mean of the last ``tail`` steps) safe minus
  constant, paired by seed: paired bootstrap 95 % interval above 0 and one-sided Wilcoxon p < 0.05.
- ``not_slower_<method>_lr<lr>`` (at the safe lr): steps to reach the level L = (R0 + R_final) / 2, R0 the warm
  model's reward, R_final the constant arm's mean final reward: ratio of mean steps (safe /
  constant, paired by seed, bootstrap) with upper 95 % bound below 1.1 ("not slower than 10 %"); R0 is the
  mean over the constant arm's seeds of each run's baseline.json (the same warm model). Steps to level:
  first step at which the rolling mean reward over ``window`` steps reaches L; a run that never does counts
  the horizon (censored: it understates the slower arm's steps). Undefined, and reported as such, when
  R_final <= R0.

Collapse: what the run ends as (llm_probe.collapse.run_outcome: the last-25-step reward below 0.25 of the mean of
the first 10 steps; alerts are events, counted apart as "alerted"); a run stopped on numerical faults is ``failed``, left out
of the collapse counts and reported apart (pairs with a failed run are dropped). Wall times and the steps/wall
time to level of every arm are in ``DIR/summary.json``; nothing here is tuned to make a claim pass.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import gapdyn
from gapdyn.claims import ClaimSpec, Criterion
from gapdyn.experiment import Experiment
from gapdyn.io import atomic_write_json, atomic_write_text

from . import cell_folder as _cell_folder
from ..collapse import OUTCOME_WINDOW, SENSITIVITY_WINDOW, RunOutcome, run_outcome
from ..seeds import STUDY_SEED, derive_seed

__all__ = ["SafeStepExperiment", "MODES", "SPECS", "CRITERIA", "CRITERIA_HASH", "TEST_TEXT", "EXPERIMENT", "NAME",
           "run_experiment", "analyse", "analyse_rows", "cells", "run_cell", "row_outcome", "steps_to_level",
           "run_and_report"]

NAME = "llm_safe_step"

ARMS = ("constant", "safe")
SOURCE = "beyond the papers (safe step rule, docs/theory.md section 11)"
SPECS = {
    "collapse_constant": ClaimSpec(SOURCE, "at a collapse lr most constant-step runs end collapsed (the premise)",
                                   "existence", Criterion.above(0.5)),
    "collapse_safe": ClaimSpec(SOURCE, "with the safe step fewer than half of the runs at a collapse lr end "
                               "collapsed, and fewer than with the constant step", "comparison",
                               Criterion.below(0.5, alpha=0.05), primary=True),
    "final_reward": ClaimSpec(SOURCE, "at a collapse lr the safe step ends with a higher reward (paired by seed)",
                              "comparison", Criterion.above(0.0, alpha=0.05)),
    "not_slower": ClaimSpec(SOURCE, "at a safe lr the safe step reaches the reward level no more than 10 % later",
                            "comparison", Criterion.below(1.1)),
}
"""Claim family -> ClaimSpec, frozen at import (before any run); a claim's id is ``<family>@<method>_lr<lr>``."""
CRITERIA = SPECS
"""The same table under its older name."""
TEST_TEXT = {
    "collapse_constant": "P(ends collapsed), constant step, Clopper-Pearson 95 %",
    "collapse_safe": "P(ends collapsed), safe step, Clopper-Pearson 95 %; p: one-sided Fisher exact (safe fewer) "
                     "vs the constant arm, Holm over the primaries",
    "final_reward": "mean final reward, safe - constant, paired bootstrap 95 %; p: one-sided Wilcoxon (safe higher)",
    "not_slower": "mean steps to level, safe / constant, paired bootstrap 95 % upper bound",
}
"""How each family is measured; its criterion text is ``TEST_TEXT[family]: Criterion.describe()``."""
CRITERIA_HASH = gapdyn.criteria_hash({k: spec.criterion for k, spec in SPECS.items()})
"""gapdyn.criteria_hash of :data:`SPECS`, computed at import and stamped on every claim (= EXPERIMENT.criteria_hash)."""


def _spec_fields(family: str) -> dict:
    spec = SPECS[family]
    return dict(source=spec.source, criterion=spec.criterion, form=spec.form, primary=spec.primary,
                criterion_text=f"{TEST_TEXT[family]}: {spec.criterion_text}", criteria_hash=CRITERIA_HASH)


def row_outcome(row: dict, *, window: int = OUTCOME_WINDOW) -> RunOutcome:
    """The run outcome (llm_probe.collapse.run_outcome) of a run.json row: its per-step rewards, alerts (step,
    rule) and fault. Rows written before alerts were stored carry only ``collapsed`` (any alert) and
    ``collapse_step`` (the first alert): that alert is taken as the run's one alert event."""
    if not isinstance(row, dict) or "reward" not in row:
        raise ValueError("row must be a run.json row with a 'reward' list")
    if "alerts" in row:
        alerts = row["alerts"]
    else:
        alerts = [{"step": max(int(row.get("collapse_step", 0)), 0), "rule": "alert"}] if row.get("collapsed") else []
    rewards = [np.nan if v is None else v for v in row["reward"]] or [np.nan]
    return run_outcome(rewards, alerts=alerts, fault=bool(row.get("fault")), window=window)


@dataclass(frozen=True)
class SafeStepExperiment:
    """Grid and settings of the experiment (see the module docstring)."""

    mode: str = "full"
    """The size's name (test, quick, full)."""
    methods: tuple[str, ...] = ("grpo", "wapo")
    collapse_lrs: tuple[float, ...] = (1e-3, 5e-4)
    """Adam learning rates where most constant-step runs collapse."""
    safe_lr: float = 3e-4
    """A learning rate where constant-step runs learn (the 'not slower' claim)."""
    seeds: tuple[int, ...] = tuple(range(10))
    steps: int = 150
    prompts_per_step: int = 16
    group_size: int = 8
    warmup_steps: int = 400
    warm_seed: int = 0
    init_from: str | None = None
    """A saved model every run starts from (no warm-up); None: the cached warm model (llm_probe.warmup.warm_model)."""
    c: float = 1.0
    """The controller's fraction of the model-optimal step (default of the rule)."""
    delta: float = 2.0
    """The controller's trust region (default of the rule)."""
    tail: int = 25
    """Final reward: mean over the last ``tail`` steps."""
    window: int = 10
    """Steps to level: rolling mean over this many steps."""
    num_threads: int = 1
    n_resamples: int = 4000

    def __post_init__(self):
        if not self.methods or not self.collapse_lrs or len(self.seeds) < 1:
            raise ValueError("methods, collapse_lrs and seeds must be non-empty")
        for name in ("steps", "prompts_per_step", "tail", "window", "num_threads", "n_resamples"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2, got {self.group_size}")
        for lr in (*self.collapse_lrs, self.safe_lr):
            if not (isinstance(lr, float) and 0 < lr < float("inf")):
                raise ValueError(f"learning rates must be finite floats > 0, got {lr!r}")
        if self.tail > self.steps or self.window > self.steps:
            raise ValueError(f"tail and window must be <= steps ({self.steps})")

    @property
    def instances(self) -> tuple[int, ...]:
        """The seeds: one block (the protocol's discovery block)."""
        return tuple(self.seeds)

    @classmethod
    def test(cls) -> SafeStepExperiment:
        return MODES["test"]

    @classmethod
    def quick(cls) -> SafeStepExperiment:
        return MODES["quick"]

    @classmethod
    def full(cls) -> SafeStepExperiment:
        return MODES["full"]


MODES = {
    "test": SafeStepExperiment(mode="test", methods=("grpo",), collapse_lrs=(1e-3,), seeds=(0, 1), steps=3,
                               prompts_per_step=2, group_size=4, warmup_steps=5, tail=2, window=2, n_resamples=200),
    "quick": SafeStepExperiment(mode="quick", methods=("grpo",), collapse_lrs=(1e-3,), seeds=(0, 1, 2), steps=40,
                                prompts_per_step=8, tail=10, window=5),
    "full": SafeStepExperiment(mode="full"),
}


def run_dir(out: Path, method: str, arm: str, lr: float, seed: int) -> Path:
    return Path(out) / "runs" / f"{method}_{arm}_lr{lr:g}_s{seed}"


def _one_run(exp: SafeStepExperiment, out: Path, warm_dir: str, method: str, arm: str, lr: float, seed: int) -> dict:
    """Run (or skip, when finished) one (method, arm, lr, seed); returns its run.json row. ``exp``: anything with
    the run settings of :data:`RUN_SETTINGS` (a SafeStepExperiment)."""
    import pandas as pd

    from ..config import TrainConfig
    from ..trainer import FaultError, Trainer

    d = run_dir(out, method, arm, lr, seed)
    done = d / "run.json"
    if done.exists():
        return json.loads(done.read_text())
    tc = TrainConfig(out_dir=str(d), method=method, lr=lr, seed=seed, steps=exp.steps,
                     prompts_per_step=exp.prompts_per_step, group_size=exp.group_size, init_from=warm_dir,
                     probe_every=0, probe_prompts=0, num_threads=exp.num_threads, progress=False, device="cpu",
                     checkpoint_every=10, resume=True, safe_step=arm == "safe", safe_step_c=exp.c,
                     safe_step_delta=exp.delta)
    t0 = time.perf_counter()
    tr = Trainer(tc)
    try:
        tr.run()
        fault = None
    except FaultError as exc:  # stopped on numerical faults: the run is "failed", reported apart
        fault = str(exc)
        tr.finish()
    wall = time.perf_counter() - t0
    df = pd.read_parquet(d / "metrics.parquet")
    alerts = [{"step": int(a.step), "rule": a.rule} for a in tr.detector.alerts]
    if "reward" not in df:
        df["reward"] = np.nan
    if "step_time" not in df:
        df["step_time"] = 0.0
    row = {"method": method, "arm": arm, "lr": lr, "seed": seed, "steps_run": int(len(df)), "alerts": alerts,
           "fault": fault, "reward": [None if np.isnan(v) else float(v) for v in df["reward"].astype(float)],
           "step_time": df["step_time"].fillna(0.0).tolist(),
           "a_mean": float(df["safe/a"].mean()) if "safe/a" in df else 1.0, "wall_s": wall,
           "R0": float(json.loads((d / "baseline.json").read_text())["reward"])}
    out_ = row_outcome(row)
    row.update({"outcome": out_.label,
                f"outcome_w{SENSITIVITY_WINDOW}": row_outcome(row, window=SENSITIVITY_WINDOW).label,
                "alerted": out_.alerted, "collapsed": out_.collapsed,
                "collapse_step": -1 if out_.onset is None else out_.onset})
    atomic_write_json(done, row)
    return row


def run_experiment(exp: SafeStepExperiment, out, *, progress: bool = True, n_jobs: int = 1) -> list[dict]:
    """Every run of the grid (finished ones are read back, not re-run); returns their rows. Order: seed by seed
    over every (method, lr) with both arms, so a partial run leaves every group with the same paired seeds."""
    from .demo import prepare_warm_model

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "experiment.json", asdict(exp), indent=1)
    frozen = {"criteria_hash": CRITERIA_HASH, "criteria": {k: v.criterion.to_dict() for k, v in SPECS.items()}}
    atomic_write_json(out / "criteria.json", frozen, indent=1)  # the frozen criteria and hash, before any run
    warm_dir = exp.init_from or prepare_warm_model(seed=exp.warm_seed, steps=exp.warmup_steps,
                                                   num_threads=exp.num_threads)[0]
    jobs = [(c["method"], c["arm"], c["lr"], c["seed"]) for c in cells(exp)]
    if n_jobs != 1:
        from joblib import Parallel, delayed

        return list(Parallel(n_jobs=n_jobs, verbose=10 if progress else 0)(
            delayed(_one_run)(exp, out, str(warm_dir), m, arm, lr, s) for m, arm, lr, s in jobs))
    rows = []
    for i, (m, arm, lr, s) in enumerate(jobs):
        t0 = time.perf_counter()
        row = _one_run(exp, out, str(warm_dir), m, arm, lr, s)
        rows.append(row)
        if progress:
            print(f"[safe-step {i + 1}/{len(jobs)}] {m} {arm} lr={lr:g} seed={s}: outcome={row['outcome']} "
                  f"final={np.mean(row['reward'][-exp.tail:]):.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return rows


def step_cost(exp: SafeStepExperiment, warm_dir, out, *, steps: int = 20, lr: float | None = None) -> dict:
    """Time per train step without and with the safe step, interleaved (A B A B ...) so that machine load drifts
    hit both arms alike: two Trainers from the same warm model and seed, ``steps`` steps each, at ``lr``
    (default: the safe lr). Returns per-arm median seconds and the median of the per-pair ratios."""
    from ..config import TrainConfig
    from ..trainer import Trainer

    lr = exp.safe_lr if lr is None else lr
    trainers = {arm: Trainer(TrainConfig(
        out_dir=str(Path(out) / f"cost_{arm}"), method=exp.methods[0], lr=lr, seed=0, steps=steps,
        prompts_per_step=exp.prompts_per_step, group_size=exp.group_size, init_from=str(warm_dir), probe_every=0,
        probe_prompts=0, num_threads=exp.num_threads, progress=False, device="cpu", safe_step=arm == "safe",
        safe_step_c=exp.c, safe_step_delta=exp.delta)) for arm in ARMS}
    times = {arm: [] for arm in ARMS}
    for _ in range(steps):
        for arm in ARMS:
            t0 = time.perf_counter()
            trainers[arm].train_step()
            times[arm].append(time.perf_counter() - t0)
    ratio = np.array(times["safe"]) / np.array(times["constant"])
    return {"method": exp.methods[0], "lr": lr, "steps": steps, "B": exp.prompts_per_step, "G": exp.group_size,
            "median_s_constant": float(np.median(times["constant"])), "median_s_safe": float(np.median(times["safe"])),
            "median_ratio": float(np.median(ratio)), "ratio_q25_q75": [float(np.quantile(ratio, 0.25)),
                                                                         float(np.quantile(ratio, 0.75))]}


def steps_to_level(reward, level: float, window: int) -> int | None:
    """First step k (0-based, k >= window - 1) whose rolling mean over the last ``window`` rewards is >= level;
    None if never."""
    r = np.asarray(reward, dtype=float)
    if r.size < window:
        return None
    roll = np.convolve(r, np.ones(window) / window, "valid")  # roll[j] = mean r[j .. j + window - 1]
    hit = np.nonzero(roll >= level)[0]
    return int(hit[0] + window - 1) if hit.size else None


def _paired(rows, method, lr):
    """(constant rows, safe rows) of (method, lr) paired by seed; seeds where either run failed are left out."""
    by = {(r["arm"], r["seed"]): r for r in rows if r["method"] == method and r["lr"] == lr}
    seeds = sorted(s for (a, s) in by if a == "constant" and ("safe", s) in by
                   and "failed" not in (by[("constant", s)]["outcome"], by[("safe", s)]["outcome"]))
    return [by[("constant", s)] for s in seeds], [by[("safe", s)] for s in seeds]


def _counts(runs) -> dict:
    labels = [r["outcome"] for r in runs]
    return {"n": len(runs), "alerted": sum(r["alerted"] for r in runs), "recovered": labels.count("recovered"),
            "collapsed": labels.count("collapsed"), "failed": labels.count("failed"),
            f"collapsed_w{SENSITIVITY_WINDOW}": sum(r["outcome_sens"] == "collapsed" for r in runs)}


def analyse_rows(exp: SafeStepExperiment, rows: list[dict], *, block: str = "discovery") -> tuple[list, dict]:
    """(claims, summary) from the run rows, judged against the frozen :data:`SPECS` (module docstring).

    Each row's outcome is recomputed here (:func:`row_outcome`); collapse rows count runs that end collapsed,
    failed runs apart; Holm over the primaries (gapdyn.holm_adjust_claims), the other tests unadjusted."""
    rng = np.random.default_rng(derive_seed(STUDY_SEED, "claims_bootstrap"))
    rows = [{**r, "outcome": (o := row_outcome(r)).label, "alerted": o.alerted,
             "outcome_sens": row_outcome(r, window=SENSITIVITY_WINDOW).label} for r in rows]
    claims, summary = [], {"groups": [], "criteria_hash": CRITERIA_HASH}
    final = {id(r): float(np.nanmean(np.array(r["reward"][-exp.tail:], dtype=float))) for r in rows
             if r["outcome"] != "failed"}
    setting = (f"tiny Qwen2 (warm, {exp.warmup_steps} supervised steps), Adam, B={exp.prompts_per_step}, "
               f"G={exp.group_size}, {exp.steps} steps, c={exp.c:g}, delta={exp.delta:g}")
    for m in exp.methods:
        every = [r for r in rows if r["method"] == m and r["lr"] == exp.safe_lr]
        const, safe = _paired(rows, m, exp.safe_lr)
        n = len(const)
        level = None
        if n:
            fc = np.array([final[id(r)] for r in const])
            R_final = float(fc.mean())
            baseline_reward = float(np.mean([r["R0"] for r in const]))  # the warm model's reward, per-seed samples
            level = 0.5 * (baseline_reward + R_final)
            g = {"method": m, "lr": exp.safe_lr, "n": n, "R0": baseline_reward, "R_final_constant": R_final, "level": level,
                 "final_constant": fc.tolist(), "final_safe": [final[id(r)] for r in safe],
                 **{f"{k}_{arm}": v for arm in ARMS for k, v in _counts([r for r in every if r["arm"] == arm]).items()}}
            if R_final > baseline_reward:
                st = _time_stats(const, safe, exp, level)
                g.update(st)
                if n >= 2:
                    ratio = gapdyn.bootstrap_ratio(np.array(st["steps_safe"], float), np.array(st["steps_constant"], float),
                                                   rng=rng, n_resamples=exp.n_resamples)
                    claims.append(gapdyn.Claim.from_estimate(
                        ratio, id=f"not_slower@{m}_lr{exp.safe_lr:g}",
                        setting=f"{setting}; {m}, lr={exp.safe_lr:g}, {n} seeds; level {level:.3f}",
                        statement=SPECS["not_slower"].statement,
                        statistic="mean steps to level, safe / constant (paired bootstrap)", **_spec_fields("not_slower")))
            else:
                g["not_testable"] = (f"constant-step final reward {R_final:.3f} <= R0 {baseline_reward:.3f}: no rise, "
                                     "so no level between start and end")
                g.update(_time_stats(const, safe, exp))
                level = None
            summary["groups"].append(g)
        for lr in exp.collapse_lrs:
            every = [r for r in rows if r["method"] == m and r["lr"] == lr]
            const, safe = _paired(rows, m, lr)
            n = len(const)
            if n == 0:
                continue
            kc, ks = sum(r["outcome"] == "collapsed" for r in const), sum(r["outcome"] == "collapsed" for r in safe)
            cp_c, cp_s = gapdyn.clopper_pearson_interval(kc, n), gapdyn.clopper_pearson_interval(ks, n)
            fisher = gapdyn.fisher_exact_test(np.array([[ks, n - ks], [kc, n - kc]]), alternative="less")
            where = f"{setting}; {m}, lr={lr:g}, {n} seeds (failed runs apart)"
            claims.append(gapdyn.Claim.from_estimate(
                cp_c, id=f"collapse_constant@{m}_lr{lr:g}", setting=where,
                statement=SPECS["collapse_constant"].statement,
                statistic="P(ends collapsed), constant step (Clopper-Pearson)", **_spec_fields("collapse_constant")))
            claims.append(gapdyn.Claim.from_estimate(
                cp_s, id=f"collapse_safe@{m}_lr{lr:g}", setting=where, p_value=fisher.p_value,
                p_adjusted=fisher.p_value, statement=SPECS["collapse_safe"].statement,
                statistic="P(ends collapsed), safe step (Clopper-Pearson); p: one-sided Fisher exact vs constant",
                **_spec_fields("collapse_safe")))
            fc, fs = np.array([final[id(r)] for r in const]), np.array([final[id(r)] for r in safe])
            if n >= 2:
                from .ablation import one_sided_wilcoxon

                diff = gapdyn.paired_bootstrap_difference(fs, fc, rng=rng, n_resamples=exp.n_resamples)
                p = one_sided_wilcoxon(fs, fc)
                claims.append(gapdyn.Claim.from_estimate(
                    diff, id=f"final_reward@{m}_lr{lr:g}", setting=where, p_value=p, p_adjusted=p,
                    statement=SPECS["final_reward"].statement,
                    statistic=f"mean final reward (last {exp.tail} steps), safe - constant (paired bootstrap)",
                    **_spec_fields("final_reward")))
            summary["groups"].append({
                "method": m, "lr": lr, "n": n, "collapsed_constant": kc, "collapsed_safe": ks,
                **{f"{k}_{arm}": v for arm in ARMS for k, v in _counts([r for r in every if r["arm"] == arm]).items()
                   if k != "collapsed"},
                "cp_constant": [cp_c.lo, cp_c.hi], "cp_safe": [cp_s.lo, cp_s.hi], "fisher_p_one_sided": fisher.p_value,
                "final_constant": fc.tolist(), "final_safe": fs.tolist(),
                **_time_stats(const, safe, exp, level), "level": level})
    return [replace(c, block=block) for c in gapdyn.holm_adjust_claims(claims)], summary


def _time_stats(const, safe, exp, level=None) -> dict:
    """Steps and wall time (sum of step times) to the level per arm (horizon when never reached), wall per run."""
    out = {"wall_constant": [r["wall_s"] for r in const], "wall_safe": [r["wall_s"] for r in safe],
           "step_time_constant": float(np.mean([np.mean(r["step_time"]) for r in const])),
           "step_time_safe": float(np.mean([np.mean(r["step_time"]) for r in safe])),
           "a_mean_safe": float(np.mean([r["a_mean"] for r in safe]))}
    if level is None:
        return out
    for arm, runs in (("constant", const), ("safe", safe)):
        k = [steps_to_level(r["reward"], level, exp.window) for r in runs]
        out[f"reached_{arm}"] = sum(v is not None for v in k)
        out[f"steps_{arm}"] = [exp.steps if v is None else v + 1 for v in k]  # steps taken until reaching it
        out[f"wall_to_level_{arm}"] = [float(np.sum(r["step_time"][:s])) for r, s in zip(runs, out[f"steps_{arm}"])]
    return out


def run_and_report(exp: SafeStepExperiment, out, *, n_jobs: int = 1, analyse_only: bool = False, cost_steps: int = 0,
                   progress: bool = True) -> None:
    """``gapdyn train safe-step`` (the command line is llm_probe.cli's): the runs of ``exp`` into ``out`` (or, with
    ``analyse_only``, the finished ones already there), then claims.json, claims.md and summary.json, printed;
    with ``cost_steps`` > 0 only :func:`step_cost` (``out``/step_cost.json), no runs."""
    out = Path(out)
    if cost_steps:
        from .demo import prepare_warm_model

        warm_dir = exp.init_from or prepare_warm_model(seed=exp.warm_seed, steps=exp.warmup_steps,
                                                       num_threads=exp.num_threads)[0]
        cost = step_cost(exp, warm_dir, out, steps=cost_steps)
        atomic_write_json(out / "step_cost.json", cost, indent=1)
        print(json.dumps(cost))
        return
    t0 = time.perf_counter()
    if analyse_only:
        rows = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/run.json"))]
    else:
        rows = run_experiment(exp, out, progress=progress, n_jobs=n_jobs)
    claims, summary = analyse_rows(exp, rows)
    summary["wall_s_this_call"] = time.perf_counter() - t0
    atomic_write_text(out / "claims.json", gapdyn.claims_to_json(claims))
    atomic_write_text(out / "claims.md", gapdyn.claims_markdown(claims) if claims else "(no claims)\n")
    atomic_write_json(out / "summary.json", summary, indent=1)
    print(gapdyn.claims_markdown(claims) if claims else "(no claims)")
    for g in summary["groups"]:
        print(json.dumps({k: v for k, v in g.items() if not isinstance(v, list)}))


# ---- the one experiment protocol (gapdyn.experiment) ---------------------------------------------------------
RUN_SETTINGS = ("steps", "prompts_per_step", "group_size", "warmup_steps", "warm_seed", "init_from", "c", "delta",
                "num_threads")
"""The settings one run depends on (the rest of a SafeStepExperiment is the grid and the analysis)."""


def cells(config: SafeStepExperiment, instances=None) -> list[dict]:
    """One cell per (method, arm, lr, seed) in :func:`run_experiment`'s order (instances: the seeds), each with
    the run settings of :data:`RUN_SETTINGS`."""
    seeds = config.seeds if instances is None else tuple(instances)
    settings = {k: getattr(config, k) for k in RUN_SETTINGS}
    return [{"method": m, "arm": arm, "lr": lr, "seed": int(s), "settings": settings} for s in seeds
            for m in config.methods for lr in (*config.collapse_lrs, config.safe_lr) for arm in ARMS]


def cell_folder(settings: dict, root=None) -> Path:
    """This study's folder of one run's settings (:func:`llm_probe.experiments.cell_folder`)."""
    return _cell_folder(NAME, settings, root)


def run_cell(*, method: str, arm: str, lr: float, seed: int, settings: dict, root=None):
    """One run (:func:`_one_run`, skipped when finished) from the cached warm model, in
    ``cell_folder(settings)/runs/<method>_<arm>_lr<lr>_s<seed>``; one row: method, arm, lr, seed, outcome,
    collapsed, alerted, fault and ``run_json`` (the whole run.json row, for :func:`analyse`)."""
    import pandas as pd

    from ..model import TinyQwenSpec
    from ..tasks import AdditionTask
    from ..warmup import warm_model

    if set(settings) != set(RUN_SETTINGS):
        raise ValueError(f"settings must hold exactly {RUN_SETTINGS}, got {sorted(settings)}")
    run = SimpleNamespace(**settings)
    warm = run.init_from or warm_model(TinyQwenSpec(), AdditionTask(), steps=run.warmup_steps, seed=run.warm_seed,
                                       num_threads=run.num_threads, root=root)
    row = _one_run(run, cell_folder(settings, root), str(warm), method, arm, lr, seed)
    return pd.DataFrame([{"method": method, "arm": arm, "lr": lr, "seed": seed, "outcome": row["outcome"],
                          "collapsed": bool(row["collapsed"]), "alerted": bool(row["alerted"]),
                          "fault": row["fault"] or "", "run_json": json.dumps(row)}])


def analyse(results, config: SafeStepExperiment, *, block: str = "discovery") -> list:
    """The claims of a block from its rows (:func:`run_cell`'s ``run_json``), by :func:`analyse_rows`."""
    rows = [json.loads(r) for r in results["run_json"]] if len(results) else []
    return analyse_rows(config, rows, block=block)[0] if rows else []


EXPERIMENT = Experiment(name=NAME, claims=SPECS, config=SafeStepExperiment, cells=cells, run_cell=run_cell,
                        analyse=analyse, command="gapdyn train safe-step --mode full")
"""This experiment in the one protocol (gapdyn.experiment.Experiment)."""
