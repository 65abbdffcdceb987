"""CPU demonstration: GRPO vs WAPO on a warmed-up tiny Qwen at a normal and a large Adam learning rate.

    gapdyn train demo --out gapdyn_out/train-demo --seeds 0 1 2 --steps 150

Every run starts from the warm model of the one cache (llm_probe.warmup.warm_model: ``./gapdyn_out/warm/<key>/``).
Writes into out_dir (``--out``, default ``./gapdyn_out/train-demo``; documented in docs/llm_probe.md):
- ``<method>_lr<lr>_s<seed>/``: each run's metrics.jsonl / metrics.parquet / probe_prompts.jsonl / alerts.json;
- ``runs.csv`` and ``runs.parquet``: one row per run (columns in RUN_COLUMNS);
- ``metrics_all.parquet``: every run's per-step metrics stacked (method, lr, seed columns);
- ``summary.json``: per (method, lr): runs, runs with an alert, mean final reward, and the warm model's baseline.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import tyro

import numpy as np

from gapdyn.cmdline import optional
from gapdyn.io import atomic_write_json, write_parquet, write_with

from ..config import WARMUP_BATCH, WARMUP_LR, WARMUP_STEPS

__all__ = ["DemoConfig", "prepare_warm_model", "run_demo", "summarize_run", "RUN_COLUMNS"]

RUN_COLUMNS = (
    "method", "lr", "seed", "steps_run", "reward_first25", "reward_last25", "reward_min_roll10", "entropy_first",
    "entropy_last25", "length_last25", "clipped_last25", "M_mean_final", "M_batch_final", "dmu_pos_frac_mean",
    "cos_update_mean", "alerted", "alert_step", "alert_rule", "alerts", "wall_s",
)


@dataclass
class DemoConfig:
    """GRPO vs WAPO at a normal and a large Adam learning rate, several seeds, on the CPU."""

    out_dir: Annotated[str, tyro.conf.arg(name="out")] = "gapdyn_out/train-demo"
    """Output folder (see the module doc for the files)."""
    methods: tuple[str, ...] = ("grpo", "wapo")
    """Losses to compare."""
    lrs: tuple[float, ...] = (3e-4, 1e-3)
    """Adam learning rates (3e-4 is a normal, 5e-4..1e-3 a large step for the tiny model)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """RL seeds (prompt stream and sampler); the warm model is shared."""
    seed: int | None = None
    """One RL seed (the same as --seeds S; it replaces the default seeds)."""
    steps: int = 150
    """RL steps per run."""
    prompts_per_step: int = 16
    """B."""
    group_size: int = 8
    """G."""
    probe_every: int = 5
    """Probe cadence (M accumulates on probe steps only)."""
    probe_prompts: int = 8
    """Fixed probe prompts."""
    warmup_steps: int = WARMUP_STEPS
    """Warm-up steps of the shared tiny model."""
    warm_seed: int = 0
    """Seed of the shared warm model."""
    init_from: Annotated[str | None, optional("DIR")] = None
    """Start every run from this saved model instead of the cached warm one (its warm-up skipped); a saved model
    in ``<out>/warm`` is used the same way."""
    stop_on_alert: bool = False
    """Stop each run at its first alert (faster; collapse is absorbing with binary rewards)."""
    num_threads: int = 1
    """torch threads per run."""
    n_jobs: Annotated[int, tyro.conf.arg(name="jobs")] = 1
    """Parallel runs (joblib processes); -1 = all cores."""
    progress: bool = True
    """Show progress bars (warm-up, runs)."""
    extra: Annotated[dict, tyro.conf.Suppress] = field(default_factory=dict)
    """Extra TrainConfig fields for every run (e.g. {"optimizer": "sgd"}); Python API only."""

    def __post_init__(self):
        from gapdyn.cmdline import check_jobs

        from ..config import check_settings

        inf = float("inf")
        check_settings(self, {"steps": ("int", 1, inf, True, False), "prompts_per_step": ("int", 1, inf, True, False),
                              "group_size": ("int", 2, inf, True, False), "probe_every": ("int", 0, inf, True, False),
                              "probe_prompts": ("int", 0, inf, True, False), "warmup_steps": ("int", 0, inf, True, False),
                              "warm_seed": ("int", 0, inf, True, False), "num_threads": ("int", 1, inf, True, False)})
        check_jobs(self.n_jobs)
        if self.seed is not None:
            from gapdyn.evidence.runner import resolve_seeds

            self.seeds = resolve_seeds(seed=self.seed)
        if not self.methods or not self.lrs or not self.seeds:
            raise ValueError("--methods, --lrs and --seeds must each name at least one value")
        for lr in self.lrs:
            if not (isinstance(lr, (int, float)) and 0 < lr < inf):
                raise ValueError(f"--lrs must be finite and > 0, got {lr}")
        for s in self.seeds:
            if isinstance(s, bool) or not isinstance(s, int) or s < 0:
                raise ValueError(f"--seeds must be integers >= 0, got {s!r}")


def prepare_warm_model(out_dir=None, *, arch="qwen2", seed=0, steps=WARMUP_STEPS, batch=WARMUP_BATCH, lr=WARMUP_LR,
                       num_threads=None,
                       progress=False, root=None):
    """The warm tiny Qwen of these settings from the one cache (llm_probe.warmup.warm_model, under ``root``:
    default ./gapdyn_out); returns (its folder, sampled accuracy on 512 problems, stored beside it once).
    out_dir: also save a copy there (for ``--init-from``), and return that folder.
    num_threads: torch threads (None: the process's count, 1 unless GAPDYN_TORCH_THREADS; llm_probe.threads)."""
    import shutil

    from ..model import TinyQwenSpec, load_policy
    from ..tasks import AdditionTask
    from ..warmup import sampled_accuracy, warm_model

    d = warm_model(TinyQwenSpec(arch=arch), AdditionTask(), steps=steps, batch_size=batch, lr=lr, seed=seed,
                   num_threads=num_threads, root=root, progress=progress)
    acc_file = d / "sampled_accuracy.json"
    if acc_file.exists():
        acc = json.loads(acc_file.read_text())["sampled_accuracy"]
    else:
        model, tok = load_policy(d)
        acc = sampled_accuracy(model, tok, AdditionTask(), n=512, seed=seed)
        atomic_write_json(acc_file, {"n": 512, "seed": seed, "sampled_accuracy": acc})
    if out_dir is None:
        return d, acc
    dest = Path(out_dir)
    dest.mkdir(parents=True, exist_ok=True)
    for f in d.iterdir():
        if f.is_file():
            shutil.copyfile(f, dest / f.name)
    return dest, acc


def summarize_run(df, alerts: list, wall_s: float) -> dict:
    """One row of runs.csv from a run's per-step metrics DataFrame and its alerts."""
    r = df["reward"].to_numpy()
    tail = df.tail(25)

    def col(name, frame=df, how="last"):
        if name not in frame or frame[name].dropna().empty:
            return float("nan")
        s = frame[name].dropna()
        return float(s.iloc[-1] if how == "last" else s.mean())

    return {
        "method": df["method"].iloc[0], "lr": float(df["lr"].iloc[0]), "seed": int(df["seed"].iloc[0]),
        "steps_run": int(len(df)), "reward_first25": float(r[:25].mean()), "reward_last25": float(tail["reward"].mean()),
        "reward_min_roll10": float(np.convolve(r, np.ones(10) / 10, "valid").min()) if len(r) >= 10 else float(r.mean()),
        "entropy_first": float(df["entropy"].iloc[0]), "entropy_last25": float(tail["entropy"].mean()),
        "length_last25": float(tail["completions/mean_length"].mean()),
        "clipped_last25": float(tail["completions/clipped_ratio"].mean()),
        "M_mean_final": col("gap/M_mean"), "M_batch_final": col("gap/M_batch"),
        "dmu_pos_frac_mean": col("gap/dmu_update_pos_frac", how="mean"),
        "cos_update_mean": col("gap/cos_update_mean", how="mean"),
        "alerted": bool(alerts), "alert_step": int(alerts[0]["step"]) if alerts else -1,
        "alert_rule": alerts[0]["rule"] if alerts else "", "alerts": ";".join(f"{a['rule']}@{a['step']}" for a in alerts),
        "wall_s": float(wall_s),
    }


def _one_run(cfg: DemoConfig, warm_dir: str, method: str, lr: float, seed: int) -> tuple[dict, str]:
    import pandas as pd

    from ..config import TrainConfig
    from ..trainer import Trainer

    run_dir = Path(cfg.out_dir) / f"{method}_lr{lr:g}_s{seed}"
    tc = TrainConfig(out_dir=str(run_dir), method=method, lr=lr, seed=seed, steps=cfg.steps,
                     prompts_per_step=cfg.prompts_per_step, group_size=cfg.group_size, init_from=warm_dir,
                     probe_every=cfg.probe_every, probe_prompts=cfg.probe_prompts, num_threads=cfg.num_threads,
                     stop_on_alert=cfg.stop_on_alert, progress=False, device="cpu", **cfg.extra)
    t0 = time.perf_counter()
    summary = Trainer(tc).run()
    wall = time.perf_counter() - t0
    df = pd.read_parquet(run_dir / "metrics.parquet")
    return summarize_run(df, summary["alerts"], wall), str(run_dir)


def run_demo(cfg: DemoConfig) -> "object":
    """Run every (method, lr, seed); write runs.csv/.parquet, metrics_all.parquet, summary.json; return the runs table."""
    import pandas as pd

    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    given = Path(cfg.init_from) if cfg.init_from else out / "warm"
    if (given / "config.json").is_file():
        warm_dir = given
        meta = [json.loads(f.read_text()) for f in (given / "warmup.json", given / "sampled_accuracy.json") if f.exists()]
        acc = meta[-1].get("sampled_accuracy", float("nan")) if meta else float("nan")
    else:
        warm_dir, acc = prepare_warm_model(seed=cfg.warm_seed, steps=cfg.warmup_steps, num_threads=cfg.num_threads,
                                           progress=cfg.progress)
    jobs = [(m, lr, s) for lr in cfg.lrs for m in cfg.methods for s in cfg.seeds]
    if cfg.n_jobs != 1:
        from joblib import Parallel, delayed

        results = Parallel(n_jobs=cfg.n_jobs)(delayed(_one_run)(cfg, str(warm_dir), m, lr, s) for m, lr, s in jobs)
    else:
        from tqdm.auto import tqdm

        results = [_one_run(cfg, str(warm_dir), m, lr, s)
                   for m, lr, s in tqdm(jobs, desc="demo runs", disable=not cfg.progress)]
    runs = pd.DataFrame([r for r, _ in results], columns=list(RUN_COLUMNS))
    write_with(out / "runs.csv", lambda tmp: runs.to_csv(tmp, index=False))
    write_parquet(out / "runs.parquet", runs)
    write_parquet(out / "metrics_all.parquet",
                  pd.concat([pd.read_parquet(Path(d) / "metrics.parquet") for _, d in results], ignore_index=True))
    base = json.loads((Path(results[0][1]) / "baseline.json").read_text()) if results else {}
    groups = []
    for (m, lr), g in runs.groupby(["method", "lr"], sort=False):
        groups.append({"method": m, "lr": lr, "runs": int(len(g)), "alerted": int(g["alerted"].sum()),
                       "reward_last25_mean": float(g["reward_last25"].mean()),
                       "reward_first25_mean": float(g["reward_first25"].mean())})
    atomic_write_json(out / "summary.json", {"warm_sampled_accuracy": acc, "baseline": base, "steps": cfg.steps,
                                             "groups": groups}, indent=1)
    return runs
