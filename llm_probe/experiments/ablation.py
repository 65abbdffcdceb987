"""Method ablation on the tiny Qwen: survival, reward, entropy at matched accuracy, held-out pass@k, as gapdyn Claims.

    gapdyn train ablation --mode quick --out runs/ablation     # or --mode test | full; --study warning

One run folder per (method, lr, seed) under ``<out>/runs/``, each a cell of the one runner
(llm_probe.experiments._study.run_study over gapdyn.evidence.runner.run_cells): a folder with ``done.json`` is read back, so
a killed study resumes where it stopped (an unfinished run restarts from its first step), and several processes
may share one study folder (a lock per run). Every run starts from one
shared warm model (llm_probe.warmup.warm_model: ``./gapdyn_out/warm/<key>/``, or ``init_from``) trained on the
split addition task, whose held-out problems
(:class:`SplitAddition`: one pair (a, b) in ``heldout_mod``) RL training never samples.

Per run: metrics.jsonl (trainer rows, with the ``warn/*`` statistics of llm_probe.warning), eval.jsonl (held-out
sampled accuracy and token entropy every ``eval_every`` steps), passk.json (held-out pass@k, k <= n, the unbiased
estimator of Chen et al. 2021, arXiv 2107.03374, Eq. 1, with n samples per prompt), done.json (the run's summary).
Each run ends with an outcome (llm_probe.collapse.reward_outcome, recomputed from the run's files by
:func:`folder_outcome`): ``collapsed`` (the last-25-step reward below 0.25 R0 and the final held-out accuracy below
0.25 of its initial value), ``recovered`` (the alert rule fired, not collapsed), ``healthy`` or ``failed`` (stopped
on numerical faults: reported apart, never pooled with collapses). Alerts are events with their steps, not
collapses.

``summarize`` writes runs.csv, survival.csv (alerted / recovered / ends collapsed / failed per arm, a
Clopper-Pearson interval on the collapse rate of the runs that did not fail) and claims.json / claims.md: the
claims of :data:`SPECS`, frozen before any run; the pre-declared primaries (WAPO vs GRPO collapse and final
reward) are Holm-adjusted among themselves, every other row is exploratory (unadjusted); every test is one-sided.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np

from gapdyn.evidence.claims import (CONFIRMATION_SEEDS, Claim, ClaimSpec, Criterion, claims_markdown,
                           criteria_hash, holm_adjust_claims, keyed_specs)
from gapdyn.evidence.experiment import STREAM_SEEDS, Experiment
from gapdyn.evidence.coverage import MEAN_INTERVAL
from gapdyn.io import atomic_write_json
from gapdyn.evidence.stats import (
    Estimate,
    NotMeasured,
    not_measured,
    fisher_exact_test,
    newcombe_difference,
)

from . import _study
from ._study import (CONFIRMATION_START, RESULT, AdditionBatch, ModePresets, SplitAddition, block_of, folder_outcome, heldout_eval,
                     heldout_problems, one_sided_wilcoxon, outcome_columns, outcome_from_rows, plan_once, read_evals,
                     read_metrics, run_name, run_outcome_columns, start_run, survival_table, train_with_heldout_eval,
                     warm_sha256, write_claims, write_table)
from ._study import run_study as run_folders
from ..collapse import OUTCOME_WINDOW, SENSITIVITY_WINDOW
from ..config import WARMUP_BATCH, WARMUP_LR, WARMUP_STEPS
from ..seeds import STUDY_SEED, derive_seed

__all__ = ["StudyConfig", "CONFIGS", "SplitAddition", "pass_at_k", "run_study", "cell_name", "summarize",
           "SPECS", "CRITERIA", "CRITERIA_HASH", "EXPERIMENT", "NAME", "cells", "run_cell", "analyse", "run_row", "TEST_TEXT", "wapo_grpo_claims", "block_of", "folder_outcome",
           "outcome_from_rows", "read_evals", "survival_table", "one_sided_wilcoxon", "plan_seeds",
           "run_confirmation", "train_with_heldout_eval", "relabel_under_other_bits", "PRIMARY_METHODS", "CONFIRMATION_START", "N_MIN", "N_MAX", "WIDE_N"]


NAME = "llm_ablation"


@dataclass(frozen=True)
class StudyConfig(AdditionBatch, ModePresets):
    """One ablation study: the grid (methods x lrs x seeds) and each run's settings (test / quick / full:
    :data:`CONFIGS`)."""

    methods: tuple = ("grpo", "dr_grpo", "wapo", "psr", "nsr", "dapo")
    num_iterations: tuple = (("dapo", 4),)  # (method, mu): optimizer steps per sampled batch; others take 1
    lrs: tuple = (3e-4, 4e-4, 5e-4)
    seeds: tuple = tuple(range(10))
    steps: int = 150
    probe_every: int = 5  # gap probes and the after-step warn/* statistics
    warmup_steps: int = WARMUP_STEPS
    eval_every: int = 10  # held-out accuracy / entropy cadence (steps)
    eval_prompts: int = 64
    eval_samples: int = 4
    passk_prompts: int = 32
    passk_n: int = 64  # samples per held-out prompt for pass@k (k <= passk_n)
    heldout_mod: int = 20  # one (a, b) pair in heldout_mod is held out
    small_model: bool = False  # the tests' 2-layer model (test mode only)
    optimizer: str = "adam"
    init_from: str | None = None  # a saved model to start every run from (no warm-up); None: pinned or cached
    pinned: str | None = None  # a pinned warm checkpoint (llm_probe.experiments.pinned: "tiny", "wide") to start from
    other_seeds: int | None = None  # methods outside PRIMARY_METHODS run only the first other_seeds seeds (None: all)
    other_lrs: tuple | None = None  # ... and only these lrs (None: all)
    torch_threads: int = 1  # per run; another count changes the low bits (the check of :func:`relabel_under_other_bits`)
    mode: str = ""  # the size's name (test, quick, full) for the protocol's configure

    def __post_init__(self):
        for n in ("steps", "prompts_per_step", "max_new_tokens", "eval_every", "eval_prompts", "eval_samples",
                  "passk_prompts", "passk_n"):
            if int(getattr(self, n)) < 1:
                raise ValueError(f"{n} must be >= 1, got {getattr(self, n)}")
        if self.group_size < 2 or self.heldout_mod < 2:
            raise ValueError("group_size and heldout_mod must be >= 2")
        for m, mu in self.num_iterations:
            if isinstance(mu, bool) or int(mu) != mu or mu < 1:
                raise ValueError(f"num_iterations of {m!r} must be an integer >= 1, got {mu!r}")
        if not self.methods or not self.lrs or not self.seeds:
            raise ValueError("methods, lrs and seeds must each hold at least one value")
        if self.other_seeds is not None and (isinstance(self.other_seeds, bool) or int(self.other_seeds) < 1):
            raise ValueError(f"other_seeds must be None or an integer >= 1, got {self.other_seeds!r}")
        if self.pinned is not None and self.small_model:
            raise ValueError("pinned and small_model exclude each other (a pinned checkpoint has its own shape)")

    @property
    def instances(self) -> tuple[int, ...]:
        """The seeds when they are discovery seeds (:func:`block_of`), else none."""
        return tuple(self.seeds) if block_of(self.seeds) == "discovery" else ()

    @property
    def confirmation(self) -> tuple[int, ...]:
        """The seeds when they are confirmation seeds (full and warning), else none."""
        return tuple(self.seeds) if block_of(self.seeds) == "confirmation" else ()


PRIMARY_METHODS = ("grpo", "wapo")
"""The arms of the pre-declared primaries (WAPO vs GRPO); the other methods feed exploratory rows only."""
N_MIN, N_MAX = 40, 40
"""Confirmation seeds per primary arm: the planned n (:func:`plan_seeds`) clipped to [N_MIN, N_MAX]. N_MIN = 40: the
paired-mean interval is valid from n = 40 (:data:`MEAN_INTERVAL`, docs/coverage.md; the study's first floor of 30
is below it); N_MAX is what the loop allowed in about an hour on a shared 2-core machine (``gapdyn train ablation
--mode full``: 240 primary-arm runs plus 30 others); a primary whose planned n is larger is reported as not
decidable at the feasible n."""
WIDE_N = 20
"""Confirmation seeds per primary arm of the wide-model study (fewer than N_MIN, for time; its reward row is then
not measured)."""
_EDGE = dict(lrs=(3e-4, 4e-4, 5e-4), steps=100, probe_every=5, pinned="tiny")
CONFIGS = {
    "test": StudyConfig(mode="test", methods=("grpo", "wapo", "dapo"), lrs=(5e-4,), seeds=(0, 1), steps=3, prompts_per_step=4,
                        group_size=4, probe_every=1, warmup_steps=5, eval_every=2, eval_prompts=4, eval_samples=2,
                        passk_prompts=3, passk_n=4, small_model=True),
    "quick": StudyConfig(mode="quick", lrs=(3e-4, 5e-4), seeds=(0, 1, 2), steps=40, eval_every=10, eval_prompts=32,
                         passk_prompts=16, passk_n=64),
    "pilot": StudyConfig(mode="full", methods=PRIMARY_METHODS, seeds=tuple(range(10)), **_EDGE),
    "full": StudyConfig(mode="full", methods=("grpo", "wapo", "psr", "nsr", "dapo"), other_seeds=10, other_lrs=(4e-4,),
                        seeds=tuple(range(CONFIRMATION_START, CONFIRMATION_START + N_MIN)), **_EDGE),
    "wide-pilot": StudyConfig(mode="full", methods=PRIMARY_METHODS, seeds=tuple(range(4)),
                              **{**_EDGE, "pinned": "wide", "lrs": (4e-4,)}),
    "wide": StudyConfig(mode="full", methods=PRIMARY_METHODS, seeds=tuple(range(CONFIRMATION_START, CONFIRMATION_START + WIDE_N)),
                        **{**_EDGE, "pinned": "wide", "lrs": (4e-4,)}),
    "warning": StudyConfig(mode="full", methods=("grpo", "wapo"), lrs=(3e-4, 4e-4, 5e-4), seeds=CONFIRMATION_SEEDS[:10], steps=100,
                           probe_every=1, eval_every=25, passk_prompts=8, passk_n=8),
    "warning-quick": StudyConfig(mode="quick", methods=("grpo", "wapo"), lrs=(3e-4, 4e-4, 5e-4), seeds=(0, 1, 2), steps=40,
                                 probe_every=1, eval_every=20, eval_prompts=16, passk_prompts=4, passk_n=8),
}
"""test: machinery (seconds); quick: indicative (one lr below, one inside the stability window). The decided study is
``pilot`` then ``full`` (:func:`run_confirmation`, ``gapdyn train ablation --mode full``): the pilot block (discovery seeds
0-9, GRPO and WAPO at the three edge lrs) sizes the confirmation block by power (:func:`plan_seeds`), which runs
n = min(max(planned, N_MIN), N_MAX) confirmation seeds (>= CONFIRMATION_START) per primary arm and the first 10 of them
for PSR, NSR and DAPO at lr 4e-4 (exploratory rows), every run from the pinned warm checkpoint ``tiny``
(llm_probe.experiments.pinned) and probed every 5 steps (the warn/* statistics and the headroom meter the
early-warning benchmark reads). ``wide-pilot`` / ``wide``: the primaries again on the 4x wider pinned model at lr 4e-4 (20
confirmation seeds per arm: fewer, for time). warning / warning-quick: the older every-step-probed study. DAPO takes
mu = 4 optimizer steps per sampled batch (its recipe reuses each rollout batch for several updates, Yu et al. 2025,
arXiv 2503.14476), so its importance ratios leave 1 and clip-higher (0.2 / 0.28) binds; every other arm is on-policy
(mu = 1, ratio 1, clips inactive)."""
StudyConfig.PRESETS = CONFIGS


# ---- pass@k --------------------------------------------------------------------------------------------------
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from c correct of n samples: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, Eq. 1)."""
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or int(v) != v or v < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
    if not (1 <= k <= n) or c > n:
        raise ValueError(f"need 1 <= k <= n and c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


# ---- one run -------------------------------------------------------------------------------------------------
def cell_name(cell: dict) -> str:
    """A cell's run folder (under ``<study>/runs``): ``<method>_lr<lr>_s<seed>`` (:func:`_study.run_name`)."""
    return run_name(cell["method"], lr=cell["lr"], seed=cell["seed"])


def warm_spec(cfg: StudyConfig):
    """The shape of the study's tiny Qwen: the tests' 2-layer model when ``small_model``, else the default."""
    from ..model import TinyQwenSpec

    return TinyQwenSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8) if cfg.small_model else TinyQwenSpec()


def prepare_warm(cfg: StudyConfig, root=None) -> Path:
    """The shared warm model: ``cfg.init_from`` when given, else the pinned checkpoint ``cfg.pinned``
    (llm_probe.experiments.pinned, its sha256 checked), else the one cached by llm_probe.warmup.warm_model (warmed
    up on the split task's training pairs, under ``root``: default ./gapdyn_out)."""
    from ..warmup import warm_model

    if cfg.init_from:
        return Path(cfg.init_from)
    if cfg.pinned:
        from .pinned import pinned_warm

        return pinned_warm(cfg.pinned)
    return warm_model(warm_spec(cfg), SplitAddition(cfg.heldout_mod), steps=cfg.warmup_steps,
                      batch_size=WARMUP_BATCH, lr=WARMUP_LR, seed=0, root=root, progress=False)


def run_cell(*, method: str, lr: float, seed: int, study: dict, out, warm_dir=None) -> dict:
    """Train one (method, lr, seed) run with the run settings ``study`` (:func:`cells`) into the run folder ``out``
    from ``warm_dir`` (default :func:`prepare_warm`); writes done.json last and returns it.

    The loop is :meth:`Trainer.run`'s, with the held-out evaluations as its ``on_step`` hook; no checkpoint."""
    from ..config import TrainConfig
    from ..trainer import Trainer

    cfg = _study_config(study, method, lr, seed)
    warm_dir = prepare_warm(cfg) if warm_dir is None else warm_dir
    d = start_run(out, ("metrics.jsonl", "eval.jsonl", "probe_prompts.jsonl"))
    mu = dict(cfg.num_iterations).get(method, 1)
    task = SplitAddition(cfg.heldout_mod)
    tc = TrainConfig(out_dir=str(d), method=method, lr=lr, seed=seed, steps=cfg.steps,
                     prompts_per_step=cfg.prompts_per_step, group_size=cfg.group_size,
                     max_new_tokens=cfg.max_new_tokens, num_iterations=mu, optimizer=cfg.optimizer,
                     init_from=str(warm_dir),
                     probe_every=cfg.probe_every, probe_prompts=0, num_threads=cfg.torch_threads, progress=False,
                     device="cpu")
    t0 = time.perf_counter()
    tr = Trainer(tc, task=task)
    eval_probs, passk_probs = heldout_problems(task, cfg.eval_prompts, cfg.passk_prompts)  # the same for every run
    evals, fault = train_with_heldout_eval(tr, d / "eval.jsonl", eval_probs, cfg.eval_samples, cfg.eval_every)
    H0, R0 = tr.detector.baseline()
    _, _, correct = heldout_eval(tr, passk_probs, cfg.passk_n, seed=derive_seed(STUDY_SEED, "heldout_passk"))
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= cfg.passk_n]
    passk = {str(k): float(np.mean([pass_at_k(cfg.passk_n, int(c), k) for c in correct])) for k in ks}
    atomic_write_json(d / "passk.json", {"n": cfg.passk_n, "correct": correct.tolist(), "pass_at_k": passk})
    rows = read_metrics(d)
    rewards = np.array([r.get("reward", np.nan) for r in rows], dtype=float)
    alerts = [asdict(a) for a in tr.detector.alerts]
    tail = rewards[-min(OUTCOME_WINDOW, len(rewards)):] if len(rewards) else np.array([np.nan])
    clip = np.array([r.get("clip_ratio/region_mean", np.nan) for r in rows], dtype=float)
    summary = {"method": method, "lr": lr, "seed": seed, "num_iterations": mu, "steps_run": len(rows), "H0": H0,
               "R0": R0, "clip_region_mean": float(np.nanmean(clip)) if np.isfinite(clip).any() else float("nan"),
               "fault": fault, "alerts": alerts,
               "reward_last25": float(np.nanmean(tail)) if np.isfinite(tail).any() else float("nan"),
               "heldout_acc_final": evals[-1]["acc"],
               "heldout_entropy_final": evals[-1]["entropy"], "passk": passk,
               "warm_sha256": warm_sha256(warm_dir), "wall_s": time.perf_counter() - t0}
    summary.update(outcome_columns(*(outcome_from_rows(rows, summary, evals, window=w)
                                      for w in (OUTCOME_WINDOW, SENSITIVITY_WINDOW))))
    atomic_write_json(d / "done.json", summary, indent=1)
    return summary


def relabel_under_other_bits(study, out, *, methods=PRIMARY_METHODS, lrs=(4e-4, 5e-4), seeds=range(1000, 1006),
                             torch_threads: int = 2) -> list[dict]:
    """Rerun finished runs of ``study`` (a folder of :func:`run_confirmation`) with ``torch_threads`` torch threads
    into ``out`` (a reduction over another number of threads adds in another order: other low bits, as on another
    machine or torch build) and compare each run's outcome label with the committed one. Returns one row per run:
    method, lr, seed, committed, rerun (labels), first_reward_difference (the first step whose sampled reward
    differs, None if none); written to ``out/relabel.json``."""
    study, out = Path(study), Path(out)
    saved_at = next((study / f"study-{b}.json" for b in ("confirmation", "discovery")
                     if (study / f"study-{b}.json").exists()), None)
    if saved_at is None:
        raise ValueError(f"study must be a study folder of run_study (with study-<block>.json), got {study}")
    saved = json.loads(saved_at.read_text())
    tup = lambda v: tuple(tup(x) for x in v) if isinstance(v, list) else v  # noqa: E731  (JSON lists -> tuples)
    cfg = StudyConfig(**{**{k: tup(v) for k, v in saved.items()}, "torch_threads": int(torch_threads)})
    cfg = replace(cfg, methods=tuple(methods), lrs=tuple(lrs), seeds=tuple(int(s) for s in seeds))
    warm = prepare_warm(cfg)
    rerun = {cell_name(c): c for c in cells(cfg)}
    run_folders(list(rerun.values()), out, name=cell_name, describe=_describe, progress=False,
                run=lambda c, d: run_cell(**c, out=d, warm_dir=warm))
    rows = []
    for c in rerun.values():
        a, b = study / "runs" / cell_name(c), out / "runs" / cell_name(c)
        ra, rb = ([x["reward"] for x in read_metrics(f)] for f in (a, b))
        first = next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), None)
        rows.append({"method": c["method"], "lr": c["lr"], "seed": c["seed"], "committed": folder_outcome(a).label,
                     "rerun": folder_outcome(b).label, "first_reward_difference": first})
    atomic_write_json(out / "relabel.json", {"torch_threads": int(torch_threads), "rows": rows}, indent=1)
    return rows


def run_study(cfg: StudyConfig, out, *, n_jobs: int = 1, progress: bool = True, root=None) -> list[dict]:
    """Every cell of ``cfg`` (:func:`cells`) through the runner (:func:`_study.run_study`: finished runs read back,
    a lock per run, ``n_jobs`` processes); the run summaries. root: where the warm model is cached
    (:func:`prepare_warm`)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / f"study-{block_of(cfg.seeds)}.json", asdict(cfg), indent=1)
    warm = prepare_warm(cfg, root)
    return run_folders(cells(cfg), out, name=cell_name, describe=_describe, n_jobs=n_jobs, progress=progress,
                       run=lambda c, d: run_cell(**c, out=d, warm_dir=warm))


def _describe(r: dict) -> str:
    return f"outcome={r['outcome']} reward_last25={r['reward_last25']:.3f} wall={r['wall_s']:.0f}s"


# ---- claims --------------------------------------------------------------------------------------------------
WAPO_SRC = "WAPO (arXiv 2606.16154)"
BEYOND = "beyond the papers"
SPECS = {
    "llm.wapo_fewer_collapses": ClaimSpec(WAPO_SRC, "WAPO ends collapsed less often than GRPO at equal lr",
                                          "comparison", Criterion.above(0.0, alpha=0.05), primary=True),
    "llm.wapo_higher_reward": ClaimSpec(WAPO_SRC, "WAPO's final reward exceeds GRPO's at equal lr (paired by seed)",
                                        "comparison", Criterion.above(0.0, alpha=0.05), primary=True),
    "llm.wapo_entropy_at_matched_accuracy": ClaimSpec(
        f"{BEYOND} (WAPO's taxonomy, arXiv 2606.16154: winners-only updates drop the negative-advantage cells)",
        "At matched held-out accuracy WAPO keeps more token entropy than GRPO", "comparison",
        Criterion.above(0.0, alpha=0.05)),
    "llm.dapo_entropy_at_matched_accuracy": ClaimSpec(
        "Yu et al. 2025 (arXiv 2503.14476), clip-higher against entropy collapse",
        "At matched held-out accuracy DAPO (clip-higher, several updates per batch) keeps more token entropy than GRPO",
        "comparison", Criterion.above(0.0, alpha=0.05)),
    "llm.wapo_passk_not_lower": ClaimSpec(f"{BEYOND} (WAPO, arXiv 2606.16154, keeps the Gap direction)",
                                          "WAPO's held-out pass@k at the largest k is not below GRPO's", "comparison",
                                          Criterion.above(-0.02)),
    "llm.nsr_passk_above_psr": ClaimSpec("Zhu et al. 2025 (arXiv 2506.01347)",
                                         "NSR keeps a higher held-out pass@k at large k than PSR", "comparison",
                                         Criterion.above(0.0, alpha=0.05)),
    "llm.entropy_follows_cov": ClaimSpec("Cui et al. 2025 (arXiv 2505.22617), softmax entropy dynamics",
                                         "Entropy change follows -eta Cov(log pi, A) in sign under Adam, tokens "
                                         "pooled across states (a transfer row: the paper's setting is tested by "
                                         "llm_probe.experiments.entropy_lemma)", "law",
                                         Criterion.above(0.0)),
}
SPECS = keyed_specs(SPECS, {
    "llm.wapo_fewer_collapses": (("WAPO", "stability"), "test"),
    "llm.wapo_higher_reward": (("WAPO", "stability"), "test"),
    "llm.wapo_entropy_at_matched_accuracy": (("WAPO", "token taxonomy"), "exploratory"),
    "llm.dapo_entropy_at_matched_accuracy": (("Yu et al.", "clip-higher"), "exploratory"),
    "llm.wapo_passk_not_lower": (("WAPO", "stability"), "exploratory"),
    "llm.nsr_passk_above_psr": (("Zhu et al.", "NSR vs PSR"), "exploratory"),
    "llm.entropy_follows_cov": (("Cui et al.", "Theorems 1-2"), "test")})
# (statement key, role) per claim: the tests that are not primary (unadjusted) are exploratory
"""claim id -> ClaimSpec (source, statement, form, Criterion, primary), frozen at import, before any run. The
primaries, WAPO vs GRPO collapse and final reward at every lr of the study, are Holm-adjusted among themselves;
the other rows are exploratory (p unadjusted)."""
CRITERIA = {cid: spec.criterion for cid, spec in SPECS.items()}
"""claim id -> Criterion (the specs' criteria: what :data:`CRITERIA_HASH` hashes)."""
TEST_TEXT = {
    "llm.wapo_fewer_collapses": "share of runs ending collapsed (llm_probe.collapse.run_outcome; failed runs apart), "
                                "GRPO - WAPO, Newcombe hybrid score interval; p: one-sided Fisher exact (GRPO more)",
    "llm.wapo_higher_reward": "mean paired difference of the last-25-step reward, WAPO - GRPO (failed pairs apart), "
                              "studentized bootstrap interval (paired_mean); p: one-sided Wilcoxon signed-rank (WAPO "
                              "higher)",
    "llm.wapo_entropy_at_matched_accuracy": "mean paired entropy difference (WAPO - GRPO) at the first evaluation "
                                            "where both reach the pair's common accuracy; p: one-sided Wilcoxon",
    "llm.dapo_entropy_at_matched_accuracy": "mean paired entropy difference (DAPO - GRPO) at the first evaluation "
                                            "where both reach the pair's common accuracy; p: one-sided Wilcoxon",
    "llm.wapo_passk_not_lower": "mean paired pass@k_max difference (WAPO - GRPO), studentized bootstrap interval "
                                "(paired_mean; non-inferiority margin 0.02)",
    "llm.nsr_passk_above_psr": "mean paired pass@k_max difference (NSR - PSR); p: one-sided Wilcoxon",
    "llm.entropy_follows_cov": "slope of dH (same completions) on -lr * Cov(log pi(y_t), A) over probe steps, "
                               "run-cluster bootstrap interval",
}
"""What each claim measures and how it is tested; its criterion text is ``TEST_TEXT[id]: Criterion.describe()``."""
CRITERIA_HASH = criteria_hash(CRITERIA)
"""Stamped on every claim of a study (gapdyn.criteria_hash), computed at import (= EXPERIMENT.criteria_hash)."""


def load_runs(out) -> "object":
    """One row per finished run (done.json), passk columns expanded; the outcome columns (:func:`outcome_columns`)
    recomputed from the run's files by the current rule (:func:`folder_outcome`), whatever done.json stored."""
    return _study.load_runs(out, run_row)


def run_row(d) -> dict:
    """The row of one finished run folder (:func:`load_runs`): done.json, passk expanded, no alerts, the outcome
    columns recomputed from its files, and ``dir``."""
    d = Path(d)
    r = json.loads((d / "done.json").read_text())
    for k, v in r.pop("passk").items():
        r[f"pass@{k}"] = v
    r.pop("alerts", None)
    r.update(run_outcome_columns(d))
    r["dir"] = str(d)
    return r


def _paired(runs, a: str, b: str, col: str, lr: float):
    """Values of ``col`` for methods a and b at lr, paired by seed; failed runs (a ``failed`` column) left out."""
    if "failed" in runs:
        runs = runs[~runs["failed"].astype(bool)]
    A = runs[(runs.method == a) & (runs.lr == lr)].set_index("seed")[col]
    B = runs[(runs.method == b) & (runs.lr == lr)].set_index("seed")[col]
    common = sorted(set(A.index) & set(B.index))
    return A.loc[common].to_numpy(float), B.loc[common].to_numpy(float)


def entropy_at_matched_accuracy(ev_a: list, ev_b: list) -> tuple[float, float] | None:
    """Entropy of each run at its first evaluation after step 0 that reaches the pair's common accuracy
    min(max acc_a, max acc_b) (maxima over the evaluations after step 0: both runs share the step-0 policy)."""
    ev_a, ev_b = [e for e in ev_a if e["step"] > 0], [e for e in ev_b if e["step"] > 0]
    if not ev_a or not ev_b:
        return None
    level = min(max(e["acc"] for e in ev_a), max(e["acc"] for e in ev_b))
    ha = next(e["entropy"] for e in ev_a if e["acc"] >= level)
    hb = next(e["entropy"] for e in ev_b if e["acc"] >= level)
    return ha, hb


def _matched_entropies(runs, a: str, b: str, lr: float) -> tuple[np.ndarray, np.ndarray]:
    """Per seed with both runs: (entropy of a, entropy of b) at the pair's matched held-out accuracy (failed runs,
    a ``failed`` column, left out)."""
    if "failed" in runs:
        runs = runs[~runs["failed"].astype(bool)]
    ha, hb = [], []
    for s in sorted(set(runs[(runs.method == a) & (runs.lr == lr)].seed)):
        da = runs[(runs.method == a) & (runs.lr == lr) & (runs.seed == s)].dir
        db = runs[(runs.method == b) & (runs.lr == lr) & (runs.seed == s)].dir
        if len(da) and len(db):
            r = entropy_at_matched_accuracy(read_evals(da.iloc[0]), read_evals(db.iloc[0]))
            if r:
                ha.append(r[0])
                hb.append(r[1])
    return np.array(ha), np.array(hb)


def _claim(cid, setting, statistic, est: Estimate, p=None, n=None, lr=None) -> Claim:
    """The Claim of SPECS[cid] from an Estimate; a :class:`gapdyn.evidence.stats.NotMeasured` (:func:`paired_mean`) gives
    a claim that is not measured, with its reason."""
    spec = SPECS[cid]
    unmeasured = isinstance(est, NotMeasured)
    return Claim(id=cid if lr is None else f"{cid}@lr{lr:g}", source=spec.source, statement=spec.statement,
                 setting=setting, statistic=statistic, estimate=est.estimate, interval=(est.lo, est.hi),
                 n=n or est.n, criterion_text=f"{TEST_TEXT[cid]}: {spec.criterion_text}", criterion=spec.criterion,
                 p_value=p, p_adjusted=p,  # p_adjusted: Holm over the primaries, set later
                 form=spec.form, primary=spec.primary, key=spec.key, role=spec.role, measured=not unmeasured,
                 reason=est.reason if unmeasured else "")


"""The interval of every paired-mean row (gapdyn.evidence.stats.studentized_cluster_bootstrap_mean, one cluster per seed
pair); used only at an n where docs/coverage.md measured it valid (gapdyn.evidence.coverage.valid_at: from n = 40)."""


def paired_mean(d, *, rng, n_boot: int) -> Estimate:
    """Mean of the paired differences ``d`` with the studentized bootstrap interval where it is valid at n = len(d)
    (:data:`MEAN_INTERVAL`), else :func:`gapdyn.evidence.stats.not_measured` with the reason (the claim is then not measured, as every
    row of the evidence machinery below its interval's valid n, docs/evidence.md); no spread: not measured either."""
    from gapdyn.evidence.coverage import too_few_reason, valid_at
    from gapdyn.evidence.stats import studentized_cluster_bootstrap_mean

    d = np.asarray(d, dtype=float)
    m, n = float(d.mean()), int(d.size)
    if not valid_at(MEAN_INTERVAL, n):
        return not_measured(m, m, too_few_reason(MEAN_INTERVAL, n, "pairs"), n=n)
    est = studentized_cluster_bootstrap_mean(d, rng=rng, n_resamples=n_boot)
    if not all(map(math.isfinite, (est.lo, est.hi))):
        return not_measured(m, m, f"no interval: the {n} paired differences have no spread", n=n)
    return est


def _diff_claim(cid, setting, statistic, x, y, rng, n_boot, lr, test=True):
    if len(x) < 2:
        return None
    est = paired_mean(np.asarray(x, dtype=float) - np.asarray(y, dtype=float), rng=rng, n_boot=n_boot)
    p = one_sided_wilcoxon(x, y) if test else None
    return _claim(cid, setting, statistic, est, p=p, lr=lr)


def wapo_grpo_claims(runs, lr: float, *, rng, n_boot: int = 2000) -> list[Claim]:
    """llm.wapo_fewer_collapses and llm.wapo_higher_reward at one lr, runs paired by seed (columns method, lr,
    seed, collapsed: the run ends collapsed, reward_last25; with a ``failed`` column, pairs with a failed run are
    left out): the difference GRPO - WAPO in the share ending collapsed (Newcombe's hybrid score interval,
    gapdyn.evidence.stats.newcombe_difference, coverage in docs/coverage.md; one-sided Fisher exact test) and the mean paired last-25-step reward difference WAPO - GRPO (:func:`paired_mean`;
    one-sided Wilcoxon). Both are primaries; Holm is left to the
    caller (:func:`holm_adjust_claims` over the primaries); fewer than 2 pairs: no claim."""
    tag = f"lr={lr:g}, seeds paired"
    claims = []
    g, w = _paired(runs, "grpo", "wapo", "collapsed", lr)
    if len(g) >= 2:
        kg, kw = int(g.sum()), int(w.sum())
        est = newcombe_difference(kg, len(g), kw, len(w))
        p = fisher_exact_test([[kg, len(g) - kg], [kw, len(w) - kw]], alternative="greater").p_value
        claims.append(_claim("llm.wapo_fewer_collapses", tag, "share of runs ending collapsed, GRPO - WAPO", est, p=p, lr=lr))
    w_r, g_r = _paired(runs, "wapo", "grpo", "reward_last25", lr)
    c = _diff_claim("llm.wapo_higher_reward", tag, "reward_last25 WAPO - GRPO", w_r, g_r, rng, n_boot, lr)
    return claims + ([c] if c else [])


# ---- seeds sized by power ------------------------------------------------------------------------------------
def plan_seeds(runs, *, n_min: int = N_MIN, n_max: int = N_MAX, alpha: float = 0.05, target: float = 0.8) -> dict:
    """Confirmation seeds per primary arm from a pilot block's runs (gapdyn.evidence.planner), for 80 % power per primary.

    Each primary of :data:`SPECS` at each lr is planned at Bonferroni level alpha / m (m = the number of primaries:
    Holm's first step, so the plan holds under Holm): the collapse row with the one-sided Fisher test at the pilot's
    two rates (gapdyn.evidence.planner.power_two_proportions), the reward row with the noncentral-t power of the paired mean
    difference at the pilot's mean and sd (gapdyn.evidence.planner.power_mean, two-sided confidence 1 - 2 alpha / m).
    Returns {"n": the seeds per arm = min(max(largest planned n, n_min), n_max) (gapdyn.evidence.planner.
    confirmation_size; a primary not decidable within n_max asks n_max), "rows": one dict per primary
    (id, effect, planned n, power, decidable within n_max, reason)}. A primary whose pilot effect is 0 or of the
    wrong sign has no n that decides "holds": it is reported as not decidable."""
    from gapdyn.evidence.planner import confirmation_size, plan_n, power_mean, power_two_proportions

    if not (isinstance(n_min, int) and isinstance(n_max, int) and 2 <= n_min <= n_max):
        raise ValueError(f"need integers 2 <= n_min <= n_max, got {n_min!r}, {n_max!r}")
    lrs = sorted(set(runs.lr))
    m = 2 * len(lrs)
    a = alpha / m
    rows = []
    for lr in lrs:
        g, w = _paired(runs, "grpo", "wapo", "collapsed", lr)
        pg, pw = (float(g.mean()), float(w.mean())) if len(g) else (math.nan, math.nan)
        if len(g) and pg > pw:
            pl = plan_n(lambda n: power_two_proportions(pg, pw, n, alpha=a), target=target, n_min=2, n_max=n_max)
            rows.append(dict(id=f"llm.wapo_fewer_collapses@lr{lr:g}", effect=pg - pw, n=pl.n, power=pl.power,
                             decidable=pl.decidable, reason=f"pilot rates GRPO {pg:.2f}, WAPO {pw:.2f}: {pl.reason}"))
        else:
            rows.append(dict(id=f"llm.wapo_fewer_collapses@lr{lr:g}", effect=pg - pw, n=None, power=math.nan,
                             decidable=False, reason=f"pilot rates GRPO {pg:.2f}, WAPO {pw:.2f}: no n decides it"))
        wr, gr = _paired(runs, "wapo", "grpo", "reward_last25", lr)
        d = wr - gr
        mu, sd = (float(d.mean()), float(d.std(ddof=1))) if len(d) >= 2 else (math.nan, math.nan)
        rid = f"llm.wapo_higher_reward@lr{lr:g}"
        if len(d) >= 2 and sd > 0 and mu != 0:
            pl = plan_n(lambda n: power_mean(mu, sd, n, confidence=1 - 2 * a), target=target, n_min=2, n_max=n_max)
            why = "" if mu > 0 else " (negative: decides 'does not hold')"
            rows.append(dict(id=rid, effect=mu, n=pl.n, power=pl.power, decidable=pl.decidable,
                             reason=f"pilot mean {mu:+.3f}, sd {sd:.3f}{why}: {pl.reason}"))
        else:
            rows.append(dict(id=rid, effect=mu, n=None, power=math.nan, decidable=False,
                             reason=f"pilot mean {mu}, sd {sd}: no n decides it"))
    # a primary the budget does not decide asks the budget (its planned n is reported in its row)
    n = confirmation_size({r["id"]: r["n"] if r["decidable"] else math.inf for r in rows}, n_min=n_min, n_max=n_max)
    return {"n": int(n), "n_min": n_min, "n_max": n_max, "alpha_per_primary": a, "target_power": target,
            "rows": rows}


def study_claims(out=None, runs=None, *, n_boot: int = 2000, seed: int = 0, block: str | None = None) -> list[Claim]:
    """The SPECS claims on a finished (or partial) study (its folder ``out``, or its rows ``runs`` whose ``dir``
    columns name the run folders); Holm over the primaries, the rest exploratory. block: default
    :func:`block_of` the seeds."""
    if out is None and runs is None:
        raise ValueError("give out (a study folder) or runs (its rows)")
    runs = load_runs(out) if runs is None else runs
    rng = np.random.default_rng(seed)
    claims = []
    methods = set(runs.method) if len(runs) else set()
    kmax = max((int(c.split("@")[1]) for c in runs.columns if c.startswith("pass@")), default=None)
    for lr in sorted(set(runs.lr)) if len(runs) else []:
        tag = f"lr={lr:g}, seeds paired"
        if {"grpo", "wapo"} <= methods:
            claims += wapo_grpo_claims(runs, lr, rng=rng, n_boot=n_boot)
            hw, hg = _matched_entropies(runs, "wapo", "grpo", lr)
            c = _diff_claim("llm.wapo_entropy_at_matched_accuracy", tag, "entropy WAPO - GRPO at matched held-out accuracy",
                            hw, hg, rng, n_boot, lr)
            claims += [c] if c else []
            if kmax:
                w_p, g_p = _paired(runs, "wapo", "grpo", f"pass@{kmax}", lr)
                c = _diff_claim("llm.wapo_passk_not_lower", tag, f"held-out pass@{kmax} WAPO - GRPO", w_p, g_p, rng,
                                n_boot, lr, test=False)
                claims += [c] if c else []
        if {"grpo", "dapo"} <= methods:
            hd, hg = _matched_entropies(runs, "dapo", "grpo", lr)
            c = _diff_claim("llm.dapo_entropy_at_matched_accuracy", tag, "entropy DAPO - GRPO at matched held-out accuracy",
                            hd, hg, rng, n_boot, lr)
            claims += [c] if c else []
        if {"psr", "nsr"} <= methods and kmax:
            n_p, p_p = _paired(runs, "nsr", "psr", f"pass@{kmax}", lr)
            c = _diff_claim("llm.nsr_passk_above_psr", tag, f"held-out pass@{kmax} NSR - PSR", n_p, p_p, rng, n_boot, lr)
            claims += [c] if c else []
    if len(runs):
        from .early_warning import load_study_steps
        from .entropy import mechanism_fit

        fit = mechanism_fit(load_study_steps(list(runs["dir"]) if out is None else out), rng=rng,
                            n_resamples=n_boot).get("all")
        if fit is not None and all(map(math.isfinite, (fit.estimate, fit.lo, fit.hi))):
            claims.append(_claim("llm.entropy_follows_cov", f"all arms, {fit.n} runs, probe steps",
                                 "OLS slope of dH_same on -lr*Cov(log pi, A)", fit))
    if block is None:
        block = block_of(runs.seed) if len(runs) else "discovery"
    return holm_adjust_claims([replace(c, block=block, criteria_hash=CRITERIA_HASH) for c in claims])


CLAIM_COLUMNS = ("id", "source", "setting", "statistic", "estimate", "lo", "hi", "n", "p_adjusted", "criterion",
                 "verdict")


def summarize(out, *, model: str = "") -> list[Claim]:
    """runs.csv, survival.csv (with the warm checkpoint's sha256 and each run's block), claims.json, claims.md in
    ``out``; each block (discovery: seeds below CONFIRMATION_START, confirmation: the rest) judged on its own runs,
    Holm over its primaries; a confirmation block sized by ``out/plan.json`` (:func:`run_confirmation`) carries the
    planned n on its primaries. model: a pinned shape name other than the default (e.g. "wide") put into every
    claim id (``<id>@wide_lr4e-04``) and setting, so the two sizes' rows stay apart. Returns the claims."""
    import pandas as pd

    out = Path(out)
    runs = load_runs(out)
    if not len(runs):
        raise ValueError(f"no finished run under {out}/runs")
    runs["block"] = [block_of([s]) for s in runs.seed]
    write_table(out / "runs.csv", runs.drop(columns=["dir"]))
    surv = pd.concat([survival_table(g).assign(block=b) for b, g in runs.groupby("block", sort=True)], ignore_index=True)
    write_table(out / "survival.csv", surv)
    plan = json.loads((out / "plan.json").read_text()) if (out / "plan.json").exists() else None
    planned = {r["id"]: r["n"] for r in plan["rows"] if r["decidable"]} if plan else {}  # else: plan.json says why
    claims = []
    for b, g in runs.groupby("block", sort=True):
        cl = study_claims(runs=g.drop(columns="block").reset_index(drop=True), block=b)
        if b == "confirmation" and planned:
            cl = [replace(c, n_planned=planned[c.id]) if planned.get(c.id) else c for c in cl]
        if model:
            cl = [replace(c, id=c.id.replace("@lr", f"@{model}_lr") if "@lr" in c.id else f"{c.id}@{model}",
                          setting=f"{model} model, {c.setting}") for c in cl]
        claims += cl
    write_claims(out, claims, claims_markdown(claims, columns=CLAIM_COLUMNS))
    return claims


def run_confirmation(pilot: StudyConfig, full: StudyConfig, out, *, n_jobs: int = 1, progress: bool = True,
                     root=None, n_min: int = N_MIN, n_max: int = N_MAX) -> dict:
    """The decided study: the ``pilot`` block, :func:`plan_seeds` on it (written to ``out/plan.json`` once, so a
    resumed study keeps its plan), then ``full`` with its seeds replaced by the first n confirmation seeds; both
    blocks' runs under ``out/runs``. Returns the plan."""
    out = Path(out)
    if block_of(pilot.seeds) != "discovery" or block_of(full.seeds) != "confirmation":
        raise ValueError("pilot must hold discovery seeds and full confirmation seeds")
    run_study(pilot, out, n_jobs=n_jobs, progress=progress, root=root)

    def make() -> dict:
        runs = load_runs(out)
        return {**plan_seeds(runs[runs.seed.isin(pilot.seeds)], n_min=n_min, n_max=n_max),
                "pilot_seeds": list(pilot.seeds)}

    plan = plan_once(out / "plan.json", make)
    if progress:
        for r in plan["rows"]:
            print(f"[plan] {r['id']}: n = {r['n']} ({r['reason']})", flush=True)
        print(f"[plan] confirmation block: {plan['n']} seeds per primary arm (floor {plan['n_min']}, budget "
              f"{plan['n_max']})", flush=True)
    seeds = tuple(range(CONFIRMATION_START, CONFIRMATION_START + plan["n"]))
    run_study(replace(full, seeds=seeds), out, n_jobs=n_jobs, progress=progress, root=root)
    return plan


# ---- the one experiment protocol (gapdyn.evidence.experiment) ---------------------------------------------------------
GRID = ("methods", "lrs", "seeds", "mode")
"""The StudyConfig fields that are the grid (and its name); every other field is a run setting."""


def cells(config: StudyConfig, instances=None) -> list[dict]:
    """One cell per (method, lr, seed) in :func:`run_study`'s order (instances: the seeds), each with the run
    settings (``study``: every StudyConfig field but :data:`GRID`)."""
    seeds = config.seeds if instances is None else tuple(instances)
    study = {f.name: getattr(config, f.name) for f in fields(config) if f.name not in GRID}
    study["num_iterations"] = [list(p) for p in study["num_iterations"]]
    k, olr = config.other_seeds, config.other_lrs
    return [{"method": m, "lr": lr, "seed": int(s), "study": study} for lr in config.lrs for m in config.methods
            if m in PRIMARY_METHODS or olr is None or lr in olr
            for s in (seeds if m in PRIMARY_METHODS or k is None else seeds[:k])]


def _study_config(study: dict, method: str, lr: float, seed: int) -> StudyConfig:
    return StudyConfig(**{**study, "num_iterations": tuple(tuple(p) for p in study["num_iterations"])},
                       methods=(method,), lrs=(lr,), seeds=(seed,))


def analyse(results, config: StudyConfig, *, block: str = "discovery") -> list[Claim]:
    """The claims of a block from its runs' rows (:func:`run_row` of each run folder: the entropy law reads the
    folders in ``dir``)."""
    if not len(results):
        return []
    runs = results.assign(_name=[Path(d).name for d in results["dir"]]).sort_values("_name")  # load_runs' order
    return [replace(c, block=block) for c in study_claims(runs=runs.drop(columns="_name").reset_index(drop=True),
                                                          block=block)]


EXPERIMENT = Experiment(name=NAME, claims=SPECS, config=StudyConfig, cells=cells, run_cell=run_cell, analyse=analyse,
                        command="gapdyn train ablation --mode full", seed_field="seeds", seed_meaning=STREAM_SEEDS,
                        cell_name=cell_name, result_file=RESULT)
"""This study in the one protocol (gapdyn.evidence.experiment.Experiment); its cells are run folders (:func:`run_study`)."""
