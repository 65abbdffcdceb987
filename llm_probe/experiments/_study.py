"""What the LLM studies on the addition task share (one module): the split task, the held-out evaluation of a
run, a run folder's files and outcome, the study folder's runs read back as rows, the survival table, the
block (discovery or confirmation) of a set of seeds, and the run-folder cells run through the one runner
(gapdyn.evidence.runner.run_cells: resumable, a lock per cell) with a pilot's plan written once.

A study module (ablation, safe_step_experiment, entropy_lemma) is then its config, its cells, one run (its
``run_cell`` writes ``<study>/runs/<run_name>/done.json`` last) and its analysis. The early-warning and entropy
studies read a finished study's run folders with :func:`read_metrics`, :func:`read_evals` and
:func:`outcome_from_rows`."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gapdyn.evidence.claims import CONFIRMATION_SEEDS

from ..collapse import OUTCOME_WINDOW, SENSITIVITY_WINDOW, RewardOutcome, reward_outcome
from ..seeds import STUDY_SEED, derive_seed

__all__ = ["CONFIRMATION_START", "RESULT", "ModePresets", "AdditionBatch", "SplitAddition", "outcome_from_rows", "folder_outcome", "read_evals",
           "read_metrics", "block_of", "run_name", "heldout_problems", "heldout_eval", "train_with_heldout_eval",
           "start_run", "file_sha256", "warm_sha256", "outcome_columns", "run_outcome_columns", "finished_runs", "load_runs", "survival_table",
           "one_sided_wilcoxon", "run_study", "write_table", "write_claims", "plan_once"]

CONFIRMATION_START = CONFIRMATION_SEEDS[0]
"""Seeds >= this are confirmation seeds (gapdyn.CONFIRMATION_SEEDS starts the range); smaller ones are discovery."""


# ---- a study's sizes -------------------------------------------------------------------------------------------
class ModePresets:
    """The ``test`` / ``quick`` / ``full`` constructors a study config gives gapdyn.Experiment (``configure``): each
    returns the config of that mode from the class's ``PRESETS`` (mode -> config, set on the class once the study's
    table of sizes is built)."""

    PRESETS: dict = {}

    @classmethod
    def test(cls):
        return cls.PRESETS["test"]

    @classmethod
    def quick(cls):
        return cls.PRESETS["quick"]

    @classmethod
    def full(cls):
        return cls.PRESETS["full"]


@dataclass(frozen=True)
class AdditionBatch:
    """The RL batch every addition study uses (a base of the study configs): B prompts per step, G completions per
    prompt, completions of at most ``max_new_tokens`` tokens (the answer and the end token)."""

    prompts_per_step: int = 16
    group_size: int = 8
    max_new_tokens: int = 6


# ---- the split task ------------------------------------------------------------------------------------------
class SplitAddition:
    """Two-digit addition with held-out pairs: (a, b) is held out iff (7a + 3b) % mod == 0.

    :meth:`sample` draws only training pairs (rejection from AdditionTask's uniform draw); :meth:`heldout`
    returns held-out problems (a fixed order set by ``rng``)."""

    name = "addition-split"

    def __init__(self, mod: int = 20):
        from ..tasks import AdditionTask

        if int(mod) < 2:
            raise ValueError(f"mod must be >= 2, got {mod}")
        self.base, self.mod = AdditionTask(), int(mod)
        self.cache_key = f"addition-split:{self.base.lo}-{self.base.hi}:{self.mod}"  # llm_probe.warmup.task_key

    def is_heldout(self, a: int, b: int) -> bool:
        return (7 * a + 3 * b) % self.mod == 0

    def _draw(self, rng, n, keep):
        from ..tasks import Problem

        out = []
        while len(out) < n:
            ab = rng.integers(self.base.lo, self.base.hi + 1, size=(2 * (n - len(out)) + 8, 2))
            out += [Problem(f"{a}+{b}=", str(a + b)) for a, b in ab.tolist() if self.is_heldout(a, b) == keep]
        return out[:n]

    def sample(self, rng: np.random.Generator, n: int):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        return self._draw(rng, n, False)

    def heldout(self, rng: np.random.Generator, n: int):
        return self._draw(rng, n, True)

    def reward(self, completion, problem, *, terminated):
        return self.base.reward(completion, problem, terminated=terminated)

    def max_answer_len(self):
        return self.base.max_answer_len()


# ---- run outcomes ------------------------------------------------------------------------------------------
def outcome_from_rows(rows: list, done: dict, evals: list, *, window: int = OUTCOME_WINDOW) -> RewardOutcome:
    """The run outcome (llm_probe.collapse.reward_outcome) of one run: rewards from its metrics rows (step order),
    alerts from the rows' ``alerts`` (step, rule), held-out accuracies from ``evals`` (step 0 first), the fault
    from ``done`` (its ``fault`` message; older summaries mark it ``collapse_rule == "faults"``)."""
    if not isinstance(done, dict):
        raise ValueError(f"done must be a run summary dict, got {type(done).__name__}")
    if not rows:
        return reward_outcome([np.nan], fault=True, window=window)
    rewards = [r.get("reward", np.nan) for r in sorted(rows, key=lambda r: r["step"])]
    alerts = [{"step": int(r["step"]), "rule": rule} for r in rows for rule in r.get("alerts", [])]
    acc = [e["acc"] for e in sorted(evals, key=lambda e: e["step"])]
    fault = done.get("fault") or done.get("collapse_rule") == "faults"
    return reward_outcome(rewards, alerts=alerts, heldout=acc if len(acc) >= 2 else None, fault=bool(fault),
                       window=window)


def folder_outcome(d, *, window: int = OUTCOME_WINDOW) -> RewardOutcome:
    """:func:`outcome_from_rows` of a finished run folder (metrics.jsonl, done.json, eval.jsonl)."""
    d = Path(d)
    if not (d / "done.json").exists():
        raise ValueError(f"d must be a finished run folder (with done.json), got {d}")
    f = d / "metrics.jsonl"
    rows = [json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()] if f.exists() else []
    return outcome_from_rows(rows, json.loads((d / "done.json").read_text()), read_evals(d), window=window)


def read_metrics(path) -> list:
    """The rows of a run folder's metrics.jsonl (the trainer's per-step log, step order); [] without the file."""
    f = Path(path) / "metrics.jsonl"
    return [json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()] if f.exists() else []


def read_evals(path) -> list:
    """The rows of a run folder's eval.jsonl (held-out accuracy and entropy by step); [] without the file."""
    f = Path(path) / "eval.jsonl"
    return [json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()] if f.exists() else []


def block_of(seeds) -> str:
    """"confirmation" when every seed is a confirmation seed (>= :data:`CONFIRMATION_START`), else "discovery"."""
    seeds = set(int(s) for s in seeds)
    return "confirmation" if seeds and min(seeds) >= CONFIRMATION_START else "discovery"


# ---- held-out evaluation of one run -----------------------------------------------------------------------
def heldout_eval(trainer, problems, samples: int, seed: int) -> tuple[float, float, np.ndarray]:
    """(sampled accuracy, mean token entropy, correct count per prompt) of ``samples`` completions per problem."""
    import torch

    from ..model import completion_logprobs, eval_mode

    model = trainer.model
    with eval_mode(model), torch.no_grad():
        ro = trainer.rollout(problems, samples, torch.Generator().manual_seed(seed))
        _, ent, _ = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                        ro.completion_mask, return_entropy=True)
    mk = ro.completion_mask > 0
    return float(ro.rewards.mean()), float(ent[mk].mean()), ro.rewards.sum(-1).numpy().astype(int)


def train_with_heldout_eval(tr, log: Path, problems, samples: int, every: int) -> tuple[list, str | None]:
    """Run the trainer ``tr`` to its last step (:meth:`Trainer.run`, no checkpoint; it measures H0, R0 for the
    collapse rule before step 0) with the held-out accuracy and entropy of ``samples`` completions per problem
    evaluated at step 0, every ``every`` steps and at the last (:func:`heldout_eval`, own generators: the training
    trajectory is the same with or without it), each appended to ``log``. Returns (the evaluations, the fault
    message when it stopped on numerical faults, else None)."""
    from ..trainer import FaultError

    evals, fault = [], None

    def evaluate(step):
        acc, ent, _ = heldout_eval(tr, problems, samples, seed=derive_seed(STUDY_SEED, "heldout_eval"))
        evals.append({"step": step, "acc": acc, "entropy": ent})
        with open(log, "a") as f:
            f.write(json.dumps(evals[-1]) + "\n")

    def after_step(trainer, k, m):
        if trainer.step % every == 0 or trainer.step == tr.cfg.steps:
            evaluate(trainer.step)

    evaluate(0)
    try:
        tr.run(on_step=after_step, checkpoint=False)
    except FaultError as exc:  # stopped on numerical faults: the run is "failed", reported apart
        fault = str(exc)
    return evals, fault


def file_sha256(path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def warm_sha256(warm_dir) -> str:
    """sha256 of the warm model's weights file (the bytes every run of a study starts from)."""
    f = Path(warm_dir) / "model.safetensors"
    return file_sha256(f) if f.is_file() else ""


def outcome_columns(out: RewardOutcome, sens: RewardOutcome) -> dict:
    """A run's outcome columns: outcome (and the 10-step sensitivity variant), alerted, collapsed = ends
    collapsed, failed, collapse_step = the onset of the final collapse (-1 if none), first alert step/rule."""
    return {"outcome": out.label, f"outcome_w{sens.window}": sens.label, "alerted": out.alerted,
            "collapsed": out.collapsed, "failed": out.label == "failed",
            "collapse_step": -1 if out.onset is None else out.onset,
            "first_alert_step": out.alerts[0][0] if out.alerts else -1,
            "first_alert_rule": out.alerts[0][1] if out.alerts else ""}


def survival_table(runs):
    """Per (method, lr): runs, alerted, recovered (alerted, not collapsed), ends collapsed, failed (apart), the
    collapse rate among the runs that did not fail with its Clopper-Pearson 95 % interval, and the collapses of
    the 10-step sensitivity variant (columns outcome, alerted, outcome_w10 of :func:`load_runs`)."""
    import pandas as pd

    from gapdyn.evidence.stats import clopper_pearson_interval

    rows = []
    sens = f"outcome_w{SENSITIVITY_WINDOW}"
    for (m, lr), g in runs.groupby(["method", "lr"], sort=True):
        lab = g["outcome"]
        k, failed = int((lab == "collapsed").sum()), int((lab == "failed").sum())
        n = len(g) - failed
        cp = clopper_pearson_interval(k, n) if n else None
        rows.append({"method": m, "lr": lr, "n": len(g), "alerted": int(g["alerted"].sum()),
                     "recovered": int((lab == "recovered").sum()), "collapsed": k, "failed": failed,
                     "rate": k / n if n else float("nan"), "cp_lo": cp.lo if cp else float("nan"),
                     "cp_hi": cp.hi if cp else float("nan"),
                     f"collapsed_w{SENSITIVITY_WINDOW}": int((g[sens] == "collapsed").sum()),
                     "reward_last25": float(g.reward_last25.mean()),
                     "clip_region_mean": float(g.clip_region_mean.mean()) if "clip_region_mean" in g else float("nan"),
                     "heldout_acc_final": float(g.heldout_acc_final.mean()),
                     "warm_sha256": ",".join(sorted(set(g["warm_sha256"].fillna("")))) if "warm_sha256" in g else ""})
    return pd.DataFrame(rows)


def one_sided_wilcoxon(x, y) -> float:
    """One-sided Wilcoxon signed-rank p of H1: x - y tends to be > 0 (paired; zero differences dropped; exact
    null without ties for n <= 50, else the normal approximation; scipy.stats.wilcoxon). No nonzero pair: 1."""
    from scipy.stats import wilcoxon

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.ndim != 1 or x.shape != y.shape or not np.all(np.isfinite(x) & np.isfinite(y)):
        raise ValueError(f"x and y must be finite 1-D arrays of one length, got shapes {x.shape}, {y.shape}")
    d = x - y
    d = d[d != 0]
    return 1.0 if d.size == 0 else float(wilcoxon(d, alternative="greater").pvalue)




def run_outcome_columns(d) -> dict:
    """:func:`outcome_columns` of a finished run folder, recomputed from its files by the current rule
    (:func:`folder_outcome` at the outcome window and at the 10-step sensitivity window)."""
    return outcome_columns(*(folder_outcome(d, window=w) for w in (OUTCOME_WINDOW, SENSITIVITY_WINDOW)))


# ---- run folders: one per cell, through the one runner ---------------------------------------------------------
RESULT = "done.json"
"""The file a run writes last: a run folder holding it is finished (gapdyn.evidence.runner.run_cells' result file)."""


def run_name(*labels, lr: float, seed: int | None = None) -> str:
    """A run folder's name: the labels, ``lr<lr:g>`` and ``s<seed>``, joined by "_" (e.g. ``grpo_lr0.0005_s3``,
    ``grpo_safe_lr0.0003_s1000``; no seed: ``sgd_lr0.003``)."""
    return "_".join([*map(str, labels), f"lr{lr:g}", *([] if seed is None else [f"s{seed}"])])


def start_run(d, logs=("metrics.jsonl", "eval.jsonl")) -> Path:
    """The folder ``d`` made ready for a run from its first step: created, the appended logs of an earlier,
    unfinished run removed."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    for f in logs:
        (d / f).unlink(missing_ok=True)
    return d


def heldout_problems(task: SplitAddition, *sizes: int) -> list:
    """Held-out problem sets of the given sizes, drawn in order from one generator seeded by the study seed (the
    same problems for every run of every study: the evaluation does not vary with the run's seed)."""
    rng = np.random.default_rng(derive_seed(STUDY_SEED, "heldout_problems"))
    return [task.heldout(rng, n) for n in sizes]


def finished_runs(out, seeds=None) -> list[Path]:
    """The finished run folders under ``out/runs`` (folder-name order); with ``seeds``, only the runs of those seeds
    (the ``seed`` of their done.json)."""
    found = [f.parent for f in sorted(Path(out, "runs").glob(f"*/{RESULT}"))]
    if seeds is None:
        return found
    keep = {int(s) for s in seeds}
    return [d for d in found if int(json.loads((d / RESULT).read_text())["seed"]) in keep]


def load_runs(out, row):
    """One row per finished run folder under ``out/runs`` (``row(folder) -> dict``), in folder-name order, as a
    pandas DataFrame (empty without one)."""
    import pandas as pd

    return pd.DataFrame([row(d) for d in finished_runs(out)])


def run_study(cells: list, out, *, name, run, describe, n_jobs: int = 1, progress: bool = True) -> list:
    """Every cell of a study into ``out/runs/<name(cell)>`` (gapdyn.evidence.runner.run_cells: a finished folder is read
    back, an unfinished one rerun from its start, a cell claimed by another process skipped); ``run(cell, folder)``
    writes :data:`RESULT` last and returns it. ``n_jobs`` > 1: that many processes, each cell claimed by its lock.
    Returns the results of the cells finished or found finished."""
    from gapdyn.evidence.runner import run_cells

    log = print if progress else (lambda *a, **k: None)
    kw = dict(name=name, run=run, result_file=RESULT, describe=describe, log=log)
    root = Path(out) / "runs"
    if n_jobs == 1:
        return run_cells(cells, root, **kw)
    from joblib import Parallel, delayed

    parts = Parallel(n_jobs=n_jobs, verbose=10 if progress else 0)(
        delayed(run_cells)([c], root, **kw) for c in cells)
    return [r for part in parts for r in part]


def write_table(path, table) -> None:
    """A study's table (runs.csv, survival.csv) as CSV without the index, atomically."""
    from gapdyn.io import write_with

    write_with(Path(path), lambda tmp: table.to_csv(tmp, index=False))


def write_claims(out, claims, markdown: str) -> None:
    """A study's claims into ``out``: claims.json (gapdyn.evidence.claims.claims_to_json) and claims.md (``markdown``, its
    rendering), atomically."""
    from gapdyn.evidence.claims import claims_to_json
    from gapdyn.io import atomic_write_text

    atomic_write_text(Path(out) / "claims.json", claims_to_json(claims))
    atomic_write_text(Path(out) / "claims.md", markdown + "\n")


def plan_once(path, make) -> dict:
    """A study's plan (the confirmation block sized from its pilot): read from ``path`` when it exists, else
    ``make()`` written there, so a resumed study keeps the plan it made first."""
    from gapdyn.io import atomic_write_json

    path = Path(path)
    if path.exists():
        return json.loads(path.read_text())
    plan = make()
    atomic_write_json(path, plan, indent=1)
    return plan
