"""``gapdyn train``: tiny-Qwen RLVR runs with gradient-gap probes (options: the TrainConfig fields).

    gapdyn train [--method grpo --lr 3e-4 --steps 100 ...]   one RLVR run (TrainConfig)
    gapdyn train warmup [--out DIR ...]                      build + warm up a tiny Qwen, save it (--init-from)
    gapdyn train demo [--out DIR --seeds 0 1 2 ...]          GRPO vs WAPO at a normal and a large lr (DemoConfig)
    gapdyn train ablation [--mode test|quick|full] [--study ablation|warning] [--jobs N] [--out DIR]
                                                             the method ablation / early-warning study, with claims
    gapdyn train early-warning --study DIR                   lead time and ROC AUC of the warn/* statistics
    gapdyn train entropy --study DIR                         dH against -lr Cov(log pi, A) and the taxonomy cells
    gapdyn train offline --before DIR --after DIR --rollouts F --out DIR
                                                             gaps and alignment from two checkpoints + a rollout JSONL
    gapdyn train safe-step [--mode test|quick|full] [--jobs N] [--out DIR]
                                                             the safe-step experiment (constant vs safe step)

Outputs go to ``./gapdyn_out/train`` (``train-warmup``, ``train-demo``, ``train-ablation``) unless ``--out DIR``.

``gapdyn train`` on a folder that holds a checkpoint continues it with ``--resume`` (it says "resumed at step N";
the summary counts the steps this process ran and the run's total) and refuses without it (exit 2, saying how
to resume or start afresh). SIGINT / SIGTERM end it with one line naming the last checkpoint and the command that
resumes, exit 130 / 143 (gapdyn.cmdline); a failing write (a full disk while checkpointing) is one line naming
the file, exit 1, and the checkpoint committed before it stays.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from gapdyn.cmdline import command, on_interrupt, output_dir, parse, say

from .config import check_settings

__all__ = ["main", "WarmupConfig", "AblationArgs"]


@dataclass
class WarmupConfig:
    """Build a tiny Qwen, warm it up on the addition task, save model + tokenizer (load with --init-from)."""

    out_dir: Annotated[str, tyro.conf.arg(name="out")] = "gapdyn_out/train-warmup"
    """Folder to save into."""
    arch: Literal["qwen2", "qwen3"] = "qwen2"
    """Architecture of the tiny model."""
    seed: int = 0
    """Init and data seed."""
    steps: int = 400
    """Warm-up steps."""
    batch: int = 128
    """Warm-up batch size."""
    lr: float = 1e-3
    """Warm-up Adam learning rate."""
    num_threads: int | None = None
    """torch threads (None: 1, or GAPDYN_TORCH_THREADS; llm_probe.threads)."""
    progress: bool = True
    """Show the warm-up progress bar."""

    def __post_init__(self):
        check_settings(self, {"seed": ("int", 0, float("inf"), True, False),
                              "steps": ("int", 0, float("inf"), True, False),
                              "batch": ("int", 1, float("inf"), True, False),
                              "lr": ("float", 0, float("inf"), False, False),
                              "num_threads": ("int", 1, float("inf"), True, True)})


def _warmup_main(argv: list[str]) -> int:
    cfg = parse(WarmupConfig, argv, prog="gapdyn train warmup")
    out = output_dir("train-warmup", cfg.out_dir)
    from .demo import prepare_warm_model

    d, acc = prepare_warm_model(out, arch=cfg.arch, seed=cfg.seed, steps=cfg.steps, batch=cfg.batch, lr=cfg.lr,
                                num_threads=cfg.num_threads, force=True, progress=cfg.progress)
    say("train", f"warm model saved in {d} (sampled accuracy {acc:.3f}); use it with --init-from {d}")
    return 0


@dataclass
class AblationArgs:
    """The llm_probe ablation (GRPO, Dr.GRPO, WAPO, PSR, NSR x learning rates x seeds) or the early-warning
    study, resumable (finished runs are skipped); prints its claims with intervals (docs/llm_probe.md)."""

    mode: Literal["test", "quick", "full"] = "quick"
    """Sizes: test (seconds, machinery), quick (indicative, ~20 min on 2 cores), full (>= 10 seeds per arm)."""
    study: Literal["ablation", "warning"] = "ablation"
    """ablation: methods x lrs with survival, reward, entropy at matched accuracy, pass@k; warning: GRPO and
    WAPO x 3 lrs with every-step probes (then `gapdyn train early-warning --study DIR`)."""
    out_dir: Annotated[str | None, tyro.conf.arg(name="out")] = None
    """Study folder (default ./gapdyn_out/train-ablation/<study>-<mode>)."""
    jobs: int = 1
    """Parallel runs (processes)."""
    seed: int | None = None
    """Run only this seed (None: the mode's seeds)."""
    progress: bool = True
    """Show progress."""


def _ablation_main(argv: list[str]) -> int:
    from dataclasses import replace

    from gapdyn.cmdline import check_jobs

    from . import ablation

    args = parse(AblationArgs, argv, prog="gapdyn train ablation")
    check_jobs(args.jobs)
    key = args.mode if args.study == "ablation" else ("warning" if args.mode == "full" else "warning-quick")
    if args.study == "warning" and args.mode == "test":
        key = "test"
    cfg = ablation.CONFIGS[key]
    if args.seed is not None:
        cfg = replace(cfg, seeds=(int(args.seed),))
    default = Path.cwd() / "gapdyn_out" / "train-ablation" / f"{args.study}-{args.mode}"
    out = output_dir("train-ablation", args.out_dir or default)
    t0 = time.perf_counter()
    ablation.run_study(cfg, out, n_jobs=max(1, args.jobs), progress=args.progress)
    claims = ablation.summarize(out)
    import gapdyn

    print(gapdyn.claims_markdown(claims))
    n = gapdyn.count_verdicts(claims)
    say("train", f"{args.study} ({args.mode}): {n['holds']} hold, {n['does not hold']} do not, "
                 f"{n['inconclusive']} inconclusive of {len(claims) - n['identity']} claims; "
                 f"wall {time.perf_counter() - t0:.0f} s")
    say("train", f"wrote {out}/ (runs.csv, survival.csv, claims.json, claims.md)")
    return 0


def _fmt(v) -> str:
    """A number for the summary line (n/a when missing or NaN)."""
    if v is None or (isinstance(v, float) and v != v):
        return "n/a"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def checkpoint_step(path: Path) -> tuple[int, int | None] | None:
    """(step, steps of the run that wrote it) from a checkpoint's metadata, read without loading or verifying
    its tensors (the trainer verifies it when it resumes); None when there is no readable one."""
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt", device="cpu") as f:
            state = json.loads((f.metadata() or {})["state"])
        total = state.get("config", {}).get("steps")
        return int(state["step"]), (total if isinstance(total, int) else None)
    except Exception:
        return None


def _resume_command(argv: list[str]) -> str:
    return shlex.join(["gapdyn", "train", *argv, *([] if "--resume" in argv else ["--resume"])])


def _train_main(argv: list[str]) -> int:
    from .config import TrainConfig

    cfg = parse(TrainConfig, argv, prog="gapdyn train",
                description="Online RLVR run of a tiny Qwen with gradient-gap probes "
                            "(also: `gapdyn train demo`, `gapdyn train warmup`).")
    from .threads import configure_threads

    configure_threads(cfg.num_threads)
    out = output_dir("train", cfg.out_dir)
    from .checkpoint import CHECKPOINT_NAME

    ckpt = out / CHECKPOINT_NAME
    found = checkpoint_step(ckpt) if ckpt.exists() else None
    if ckpt.exists() and not cfg.resume:  # never start a run over a checkpoint silently
        at = f"at step {found[0]}" + (f" of a {found[1]}-step run" if found[1] else "") if found else "(unreadable)"
        raise ValueError(f"{out} holds a checkpoint {at}: continue it with --resume ({_resume_command(argv)}), or "
                         f"start afresh in another --out folder or after deleting {out / 'checkpoint'}*")
    start = found[0] if (cfg.resume and found) else 0
    if start:
        say("train", f"resuming {ckpt} at step {start}")

    def interrupted() -> str:
        now = checkpoint_step(ckpt) if ckpt.exists() else None
        if now is None:
            every = (f"--checkpoint-every {cfg.checkpoint_every}" if cfg.checkpoint_every else
                     "--checkpoint-every 0: only the finished run writes one; set --checkpoint-every N to keep one "
                     "every N steps")
            return f"no checkpoint in {out} yet ({every}); rerunning starts at step 0"
        return f"last checkpoint {ckpt} at step {now[0]}; resume with: {_resume_command(argv)}"

    on_interrupt(interrupted)
    from .demo import summarize_run
    from .trainer import FaultError, train
    from .warmup import warmup_progress

    t0 = time.perf_counter()
    with warmup_progress(cfg.progress):
        try:
            summary = train(cfg)
        except FaultError as exc:  # documented: exit code 1 and the fault on stderr
            print(f"gapdyn train: {' '.join(str(exc).split())}", file=sys.stderr)
            return 1
    wall = time.perf_counter() - t0
    from gapdyn.io import atomic_write_json

    ran = summary["steps"] - start
    atomic_write_json(out / "summary.json", {**summary, "steps_this_process": ran, "resumed_at": start},
                      indent=1, default=str)
    import pandas as pd

    row = summarize_run(pd.read_parquet(out / "metrics.parquet"), summary["alerts"], wall)
    say("train", f"{cfg.method} lr={cfg.lr:g} seed={cfg.seed}: {ran} steps in {wall:.0f} s"
                 + (f" (resumed at step {start}; run total {summary['steps']} of {cfg.steps})" if start else
                    f" (run total {summary['steps']} of {cfg.steps})")
                 + (f", stopped: {summary['stopped']}" if summary.get("stopped") else ""))
    collapse = (f"collapse ({row['collapse_rule']}) at step {row['collapse_step']}" if row.get("collapsed")
                else "no collapse alert")
    say("train", f"reward {_fmt(row.get('reward_first25'))} -> {_fmt(row.get('reward_last25'))} (first / last 25 "
                 f"steps), entropy {_fmt(row.get('entropy_last25'))}, M {_fmt(row.get('M_mean_final'))}; {collapse}")
    if summary.get("faults"):
        say("train", f"skipped non-finite steps: {summary['faults']}")
    say("train", f"wrote {out}/ (metrics.parquet, metrics.jsonl, alerts.json, summary.json)")
    return 0


@command("gapdyn train")
def main(argv: list[str]) -> int:
    """Entry point; returns an exit code (1 when a run stops on repeated faults)."""
    if argv and argv[0] == "demo":
        from .demo import demo_main

        return demo_main(argv[1:])
    if argv and argv[0] == "warmup":
        return _warmup_main(argv[1:])
    if argv and argv[0] == "ablation":
        return _ablation_main(argv[1:])
    if argv and argv[0] in _ANALYSES:
        import importlib

        return importlib.import_module(f".{_ANALYSES[argv[0]]}", __package__).main(argv[1:],
                                                                                  prog=f"gapdyn train {argv[0]}")
    return _train_main(argv)


_ANALYSES = {"early-warning": "early_warning", "entropy": "entropy", "offline": "offline",
             "safe-step": "safe_step_experiment"}
"""gapdyn train subcommand -> llm_probe module whose main(argv, prog) it runs."""
