"""``gapdyn train``: tiny-Qwen RLVR runs with gradient-gap probes (options: the TrainConfig fields).

    gapdyn train [--method grpo --lr 3e-4 --steps 100 ...]   one RLVR run (TrainConfig)
    gapdyn train warmup [--out DIR ...]                      build + warm up a tiny Qwen, save it (--init-from)
    gapdyn train demo [--out DIR --seeds 0 1 2 ...]          GRPO vs WAPO at a normal and a large lr (DemoConfig)
    gapdyn train ablation [--mode test|quick|full] [--study ablation|warning] [--seeds 0 1 ...] [--jobs N] [--out DIR]
                                                             the method ablation / early-warning study, with claims
    gapdyn train early-warning --from DIR [--seeds ...]      time-matched AUC of the warning statistics vs the reward
    gapdyn train entropy --from DIR [--seeds ...]            dH against -lr Cov(log pi, A) and the taxonomy cells
    gapdyn train entropy-lemma [--mode test|full] [--seeds ...] [--out DIR]
                                                             Cui et al.'s entropy lemma per visited state, claims
    gapdyn train offline --before DIR --after DIR --rollouts F --out DIR
                                                             gaps and alignment from two checkpoints + a rollout JSONL
    gapdyn train safe-step [--mode test|quick|full] [--seeds 0 1 ...] [--jobs N] [--out DIR]
                                                             the safe-step experiment (constant vs safe step)

The studies live in llm_probe.experiments; this module is their only command line (tyro, gapdyn.cmdline). Every
study takes ``--seeds S ...`` / ``--seed S`` (gapdyn.evidence.runner.resolve_seeds) in every mode, with one meaning: run
seeds, each the stream seed of one run from the shared warm start; a study that trains runs its grid on exactly
those seeds (in full mode without the pilot's planned confirmation block, into ``<mode>-seeds-<label>`` unless
``--out``), an analysis of a finished study reads only the runs of those seeds.
Inputs are checked before any output folder is created, and an error names the flag (``--from``, ``--init-from``).
Outputs go to ``./gapdyn_out/train`` (``train-warmup``, ``train-demo``, ``train-ablation``, ``train-safe-step``)
unless ``--out DIR``.

``gapdyn train`` on a folder that holds a checkpoint continues it with ``--resume`` (it says "resumed at step N";
the summary counts the steps this process ran and the run's total) and refuses without it (exit 2, saying how
to resume or start afresh; a finished run: how to start afresh or train it further). ``--method`` and ``--task``
are checked before any output folder exists; a refusal is exactly one line and removes the output folder it made. SIGINT / SIGTERM end it with one line naming the last checkpoint and the command that
resumes, exit 130 / 143 (gapdyn.cmdline); a failing write (a full disk while checkpointing) is one line naming
the file, exit 1, and the checkpoint committed before it stays.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from gapdyn.cmdline import Mode, command, on_interrupt, optional, output_dir, parse, say

from .config import WARMUP_BATCH, WARMUP_LR, WARMUP_STEPS, check_settings

__all__ = ["main", "SUBCOMMANDS", "WarmupConfig", "AblationArgs", "StudyArgs", "OfflineArgs", "SafeStepArgs",
           "EntropyLemmaArgs"]


@dataclass
class WarmupConfig:
    """Build a tiny Qwen, warm it up on the addition task (once: the warm model is cached in
    ./gapdyn_out/warm/<key>/, llm_probe.warmup.warm_model), save model + tokenizer (load with --init-from)."""

    out_dir: Annotated[str, tyro.conf.arg(name="out")] = "gapdyn_out/train-warmup"
    """Folder to save into."""
    arch: Literal["qwen2", "qwen3"] = "qwen2"
    """Architecture of the tiny model."""
    seed: int = 0
    """Init and data seed."""
    steps: int = WARMUP_STEPS
    """Warm-up steps."""
    batch: int = WARMUP_BATCH
    """Warm-up batch size."""
    lr: float = WARMUP_LR
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
    from .experiments.demo import prepare_warm_model

    d, acc = prepare_warm_model(out, arch=cfg.arch, seed=cfg.seed, steps=cfg.steps, batch=cfg.batch, lr=cfg.lr,
                                num_threads=cfg.num_threads, progress=cfg.progress)
    say("train", f"warm model saved in {d} (sampled accuracy {acc:.3f}); use it with --init-from {d}")
    return 0


@dataclass
class AblationArgs:
    """The llm_probe ablation (GRPO, WAPO, PSR, NSR, DAPO x learning rates x seeds) or the early-warning
    study, resumable (finished runs are skipped); prints its claims with intervals (docs/llm_probe.md)."""

    mode: Mode = "quick"
    """Sizes: test (seconds, machinery), quick (indicative), full (the decided study: a pilot block sizes the
    confirmation block by power; pinned warm checkpoint)."""
    study: Literal["ablation", "warning", "wide"] = "ablation"
    """ablation: methods x lrs with survival, reward, entropy at matched accuracy, pass@k (full mode also feeds
    `gapdyn train early-warning --from DIR`); wide: the WAPO-vs-GRPO primaries on the 4x wider pinned model (full
    mode); warning: GRPO and WAPO x 3 lrs with every-step probes."""
    out_dir: Annotated[str | None, tyro.conf.arg(name="out")] = None
    """Study folder (default ./gapdyn_out/train-ablation/<study>-<mode>)."""
    jobs: int = 1
    """Parallel runs (processes)."""
    seeds: tuple[int, ...] | None = None
    """Run seeds (each the stream seed of one run; the warm start is shared): run the mode's grid on exactly these
    seeds, in every mode (full: no pilot and no planned confirmation block; each run's block is its seed's)."""
    seed: int | None = None
    """One run seed (the same as --seeds S)."""
    init_from: Annotated[str | None, optional("DIR")] = None
    """Start every run from this saved model (skips the warm-up; default: the cached warm model,
    ./gapdyn_out/warm/<key>/)."""
    progress: bool = True
    """Show progress."""


def _check_seeds(args) -> tuple[int, ...] | None:
    """``--seeds`` / ``--seed`` of ``args``: None, or at least one seed, each an integer in [0, 2^64 - 1], none
    twice (gapdyn.evidence.runner.resolve_seeds)."""
    from gapdyn.evidence.runner import resolve_seeds

    return resolve_seeds(args.seeds, args.seed)


def _seeds_folder(name: str, seeds) -> str:
    """The default folder name of a run on ``--seeds``: ``<name>-seeds-<label>`` (gapdyn.evidence.runner.seeds_label), apart
    from the study's own folder."""
    from gapdyn.evidence.runner import seeds_label

    return name if seeds is None else f"{name}-seeds-{seeds_label(seeds)}"


def _ablation_main(argv: list[str]) -> int:
    from dataclasses import replace

    from gapdyn.cmdline import check_jobs

    from .experiments import ablation

    args = parse(AblationArgs, argv, prog="gapdyn train ablation")
    check_jobs(args.jobs)
    seeds = _check_seeds(args)
    decided = args.mode == "full" and args.study in ("ablation", "wide") and seeds is None
    if args.study == "wide" and args.mode != "full":
        raise ValueError("--study wide runs in --mode full only (the primaries on the 4x wider pinned model)")
    key = args.mode if args.study == "ablation" else ("warning" if args.mode == "full" else "warning-quick")
    if args.study == "warning" and args.mode == "test":
        key = "test"
    if args.study == "wide":
        key = "wide"
    pilot, cfg = ((ablation.CONFIGS["pilot"], ablation.CONFIGS["full"]) if args.study == "ablation" else
                  (ablation.CONFIGS["wide-pilot"], ablation.CONFIGS["wide"])) if decided else (None, ablation.CONFIGS[key])
    if seeds is not None:  # the grid of the mode on exactly these seeds (gapdyn.evidence.runner.with_seeds)
        from gapdyn.evidence.runner import with_seeds

        cfg = with_seeds(ablation.EXPERIMENT, cfg, seeds)
    if args.init_from:
        init = str(saved_model_folder(args.init_from, "--init-from").resolve())
        cfg = replace(cfg, init_from=init, pinned=None)
        pilot = pilot and replace(pilot, init_from=init, pinned=None)
    default = Path.cwd() / "gapdyn_out" / "train-ablation" / _seeds_folder(f"{args.study}-{args.mode}", seeds)
    out = output_dir("train-ablation", args.out_dir or default)
    t0 = time.perf_counter()
    if decided:
        n = dict(n_min=ablation.WIDE_N, n_max=ablation.WIDE_N) if args.study == "wide" else {}
        ablation.run_confirmation(pilot, cfg, out, n_jobs=max(1, args.jobs), progress=args.progress, **n)
    else:
        ablation.run_study(cfg, out, n_jobs=max(1, args.jobs), progress=args.progress)
    claims = ablation.summarize(out, model="wide" if args.study == "wide" else "")
    import gapdyn

    print(gapdyn.claims_markdown(claims))
    n = gapdyn.count_verdicts(claims)
    say("train", f"{args.study} ({args.mode}): {n['holds']} hold, {n['does not hold']} do not, "
                 f"{n['inconclusive']} inconclusive of {len(claims) - n['identity']} claims; "
                 f"wall {time.perf_counter() - t0:.0f} s")
    say("train", f"wrote {out}/ (runs.csv, survival.csv, claims.json, claims.md)")
    return 0


def saved_model_folder(path, flag: str) -> Path:
    """``path`` as a Path when it is a folder holding a saved model (``save_pretrained``: config.json), else a
    ValueError naming ``flag``; checked before any output folder is made."""
    p = Path(path)
    if not (p / "config.json").is_file():
        why = "does not exist" if not p.exists() else ("is a file" if not p.is_dir() else "holds no config.json")
        raise ValueError(f"{flag} must name a folder holding a saved model (save_pretrained: config.json, the "
                         f"weights, the tokenizer), but {p} {why}")
    return p


def _study_folder(path) -> Path:
    """``--from``: a study folder with finished runs (runs/*/done.json, written by ``gapdyn train ablation``)."""
    p = Path(path)
    if not p.is_dir() or not any(p.glob("runs/*/done.json")):
        why = "does not exist" if not p.exists() else ("is a file" if not p.is_dir() else "has no finished run")
        raise ValueError(f"--from must name a study folder of `gapdyn train ablation` with finished runs "
                         f"(runs/*/done.json), but {p} {why} (no finished run to analyse)")
    return p


@dataclass
class StudyArgs:
    """A finished study to analyse (its tables are written into it)."""

    from_dir: Annotated[str, tyro.conf.arg(name="from")]
    """Study folder written by `gapdyn train ablation --out DIR` (for early-warning: --study warning)."""
    seeds: tuple[int, ...] | None = None
    """Read only the runs of these run seeds (None: every run the analysis reads)."""
    seed: int | None = None
    """Read only the runs of this run seed (the same as --seeds S)."""


def _early_warning_main(argv: list[str]) -> int:
    args = parse(StudyArgs, argv, prog="gapdyn train early-warning",
                 description="Time-matched AUC within lr of the warning statistics of a finished study, against the "
                             "reward (writes early_warning.csv and early_warning_claims.json / .md into it).")
    study = _study_folder(args.from_dir)
    from .experiments import early_warning

    early_warning.report(study, seeds=_check_seeds(args))
    return 0


def _entropy_main(argv: list[str]) -> int:
    args = parse(StudyArgs, argv, prog="gapdyn train entropy",
                 description="dH against -lr Cov(log pi, A) and the taxonomy cells' mass of a finished study.")
    study = _study_folder(args.from_dir)
    from .experiments import entropy

    entropy.report(study, seeds=_check_seeds(args))
    return 0


@dataclass
class EntropyLemmaArgs:
    """Cui et al.'s entropy dynamics per visited state (Lemma 1, the PG and NPG forms) on the tiny Qwen under SGD
    and Adam, with claims (llm_probe.experiments.entropy_lemma; docs/llm_probe.md)."""

    mode: Mode = "full"
    """Sizes: test (seconds, machinery), quick = full (5 SGD lrs + Adam 4e-4, 30 steps each, minutes of CPU)."""
    out_dir: Annotated[str | None, tyro.conf.arg(name="out")] = None
    """Folder for claims.json, claims.md and steps.csv (default ./gapdyn_out/train-entropy-lemma/<mode>); the
    trainer's run folders go to a temporary folder."""
    seeds: tuple[int, ...] | None = None
    """Run seeds (each the stream seed of one run; the pinned warm start is shared): every (optimizer, lr) of the
    mode on each (None: the study's seed 0)."""
    seed: int | None = None
    """One run seed (the same as --seeds S)."""


def _entropy_lemma_main(argv: list[str]) -> int:
    args = parse(EntropyLemmaArgs, argv, prog="gapdyn train entropy-lemma")
    seeds = _check_seeds(args)
    out = output_dir("train-entropy-lemma", args.out_dir or Path.cwd() / "gapdyn_out" / "train-entropy-lemma"
                     / _seeds_folder(args.mode, seeds))
    from .experiments import entropy_lemma

    command = shlex.join(["gapdyn", "train", "entropy-lemma", "--mode", args.mode, "--out", str(args.out_dir or out),
                          *(["--seeds", *map(str, seeds)] if seeds else [])])
    claims = entropy_lemma.main_study(args.mode, out, command=command, seeds=seeds)
    import gapdyn

    print(gapdyn.claims_markdown(claims))
    say("train", f"wrote {out}/ (claims.json, claims.md, steps.csv)")
    return 0


@dataclass
class OfflineArgs:
    """Gradient-gap analysis of one recorded step from two checkpoints and its rollouts (llm_probe.offline)."""

    before: str
    """Saved model folder at theta_k (save_pretrained: model + tokenizer)."""
    after: str
    """Saved model folder at theta_{k+1}."""
    rollouts: str
    """JSONL of {prompt, completion, reward} (optionally completion_ids, step) of step k."""
    out_dir: Annotated[str, tyro.conf.arg(name="out")]
    """Output folder (offline_gap.json, per_prompt.jsonl); created after the inputs are checked."""
    params: str = "all"
    """'all', 'lm_head' or a regex on parameter names."""
    route: str = "auto"
    """Alignment route (llm_probe.measure.MEASURE_ROUTES)."""
    device: str = "cpu"
    """Device of the before model."""
    dtype: str = "float32"
    """Model dtype."""
    append_eos: bool = False
    """End every text completion with <eos>."""
    step: int | None = None
    """Use the lines with this 'step' (GapProbeCallback's rollout_path holds every step)."""


def _offline_main(argv: list[str]) -> int:
    args = parse(OfflineArgs, argv, prog="gapdyn train offline")
    before, after = saved_model_folder(args.before, "--before"), saved_model_folder(args.after, "--after")
    if not Path(args.rollouts).is_file():
        raise ValueError(f"--rollouts must name a JSONL file, but {args.rollouts} is not a file")
    from .measure import MEASURE_ROUTES

    if args.route not in MEASURE_ROUTES:
        raise ValueError(f"--route must be one of {list(MEASURE_ROUTES)}, got {args.route!r}")
    out = output_dir("train-offline", args.out_dir)
    from .offline import analyse, write_report

    res = analyse(before, after, args.rollouts, params=args.params, route=args.route, device=args.device,
                  dtype=args.dtype, append_eos=args.append_eos, step=args.step)
    print(json.dumps(write_report(res, out, before=before, after=after, rollouts=args.rollouts)))
    return 0


@dataclass
class SafeStepArgs:
    """The safe-step experiment: constant vs safe step on the tiny Qwen, resumable, with claims (docs/llm_probe.md)."""

    mode: Mode = "quick"
    """Sizes: test (seconds, machinery), quick (indicative), full (the claims' size)."""
    out_dir: Annotated[str | None, tyro.conf.arg(name="out")] = None
    """Experiment folder (default ./gapdyn_out/train-safe-step/<mode>)."""
    seeds: tuple[int, ...] | None = None
    """Run seeds (each the stream seed of one run; the warm start is shared): both arms at both lrs of the mode on
    exactly these seeds, in every mode (no pilot plan, no confirmation block; each run's block is its seed's)."""
    seed: int | None = None
    """One run seed (the same as --seeds S)."""
    jobs: int = 1
    """Parallel runs (joblib processes; -1: all cores)."""
    analyse_only: bool = False
    """No new runs: the claims from the finished runs in --out (e.g. while a run is in progress)."""
    cost_steps: int = 0
    """Only time this many interleaved steps without / with the safe step (no runs)."""
    init_from: Annotated[str | None, optional("DIR")] = None
    """Start every run from this saved model (skips the warm-up; default: the cached warm model,
    ./gapdyn_out/warm/<key>/)."""
    progress: bool = True
    """Show progress."""


def _safe_step_main(argv: list[str]) -> int:
    from dataclasses import replace

    from gapdyn.cmdline import check_jobs

    args = parse(SafeStepArgs, argv, prog="gapdyn train safe-step")
    check_jobs(args.jobs)
    seeds = _check_seeds(args)
    if isinstance(args.cost_steps, bool) or args.cost_steps < 0:
        raise ValueError(f"--cost-steps must be an integer >= 0, got {args.cost_steps!r}")
    init_from = str(saved_model_folder(args.init_from, "--init-from").resolve()) if args.init_from else None
    out = output_dir("train-safe-step", args.out_dir or Path.cwd() / "gapdyn_out" / "train-safe-step"
                     / _seeds_folder(args.mode, seeds))
    if args.analyse_only and not any(out.glob("runs/*/run.json")):
        raise ValueError(f"--analyse-only needs finished runs (runs/*/run.json) in --out, but {out} has none")
    from .experiments import safe_step_experiment as sse

    exp = replace(sse.PRESETS[args.mode], init_from=init_from)
    exp = exp if seeds is None else replace(exp, seeds=seeds, replicate=True)
    sse.run_and_report(exp, out, n_jobs=args.jobs, analyse_only=args.analyse_only, cost_steps=args.cost_steps,
                       progress=args.progress)
    return 0


def _demo_main(argv: list[str]) -> int:
    """``gapdyn train demo``: parse a DemoConfig, run the grid, print the runs table and a summary."""
    from .experiments.demo import DemoConfig, run_demo

    cfg = parse(DemoConfig, argv, prog="gapdyn train demo")
    out = output_dir("train-demo", cfg.out_dir)
    runs = run_demo(cfg)
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 12):
        print(runs[["method", "lr", "seed", "reward_first25", "reward_last25", "entropy_last25", "length_last25",
                    "M_mean_final", "alerted", "alert_rule", "alert_step"]].to_string(index=False))
    for (m, lr), g in runs.groupby(["method", "lr"], sort=False):
        say("train", f"demo {m} lr={lr:g}: {int(g['alerted'].sum())}/{len(g)} runs with an alert, "
                     f"final reward {g['reward_last25'].mean():.3f}")
    say("train", f"wrote {out}/ (runs.csv, runs.parquet, metrics_all.parquet, summary.json, one folder per run)")
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


def _finished(found: tuple[int, int | None] | None) -> bool:
    """Whether a checkpoint's (step, steps of its run) says the run reached its last step."""
    return found is not None and found[1] is not None and found[0] >= found[1]


def _train_task(spec: str):
    """``--task`` as the task object, loaded once before any folder is made; a ValueError naming ``--task``."""
    from .trainer import make_task

    try:
        return make_task(spec)
    except ValueError as exc:
        raise ValueError(f"--task: {' '.join(str(exc).split())}") from None


class _HeldResumeNotes:
    """stderr for the block, holding back the trainer's "[resume] ... continuing with changed settings" note
    until :meth:`release` (after the first step of the resumed run): a resume refused after that note (another
    model's checkpoint under --resume-force) ends as its one error line, without the note before it."""

    def __init__(self, stream):
        self.stream, self.held, self.released = stream, [], False

    def write(self, text: str) -> int:
        open_line = bool(self.held) and not self.held[-1].endswith("\n")  # print writes the newline apart
        if not self.released and (open_line or text.startswith("[resume] ")):
            self.held.append(text)
            return len(text)
        return self.stream.write(text)

    def release(self, *_) -> None:
        if not self.released:
            self.released = True
            for text in self.held:
                self.stream.write(text)
            self.stream.flush()

    def __getattr__(self, name):  # flush, isatty, fileno, encoding ... of the real stream
        return getattr(self.stream, name)


@contextlib.contextmanager
def _hf_progress(enabled: bool):
    """transformers' own bars (loading and writing a saved model) follow --progress / --no-progress."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was and not enabled:
            hf_logging.enable_progress_bar()


def _train_main(argv: list[str]) -> int:
    from .config import TrainConfig

    cfg = parse(TrainConfig, argv, prog="gapdyn train",
                description="Online RLVR run of a tiny Qwen with gradient-gap probes. Subcommands (each with "
                            "--help): " + "; ".join(f"gapdyn train {name}: {what}"
                                                   for name, (_, what) in SUBCOMMANDS.items()) + ".")
    if cfg.init_from:
        saved_model_folder(cfg.init_from, "--init-from")
    from .config import check_method

    check_method(cfg.method)  # before any output and before torch loads: one line
    task = _train_task(cfg.task)
    if not cfg.init_from:
        from .warmup import warm_root

        warm_root()  # $GAPDYN_WARM_CACHE naming a file: its one line now, before any output
    from .threads import configure_threads

    configure_threads(cfg.num_threads)
    out = output_dir("train", cfg.out_dir, announce=False)
    from .checkpoint import CHECKPOINT_NAME

    ckpt = out / CHECKPOINT_NAME
    found = checkpoint_step(ckpt) if ckpt.exists() else None
    if ckpt.exists() and not cfg.resume:  # never start a run over a checkpoint silently
        if _finished(found):
            raise ValueError(f"{out} holds a finished {found[1]}-step run: start afresh in another --out folder or "
                             f"after deleting {out / 'checkpoint'}*, or train it further with --resume and --steps "
                             f"above {found[1]}")
        at = f"at step {found[0]}" + (f" of a {found[1]}-step run" if found[1] else "") if found else "(unreadable)"
        raise ValueError(f"{out} holds a checkpoint {at}: continue it with --resume ({_resume_command(argv)}), or "
                         f"start afresh in another --out folder or after deleting {out / 'checkpoint'}*")
    start = found[0] if (cfg.resume and found) else 0

    def interrupted() -> str:
        now = checkpoint_step(ckpt) if ckpt.exists() else None
        if now is None:
            every = (f"--checkpoint-every {cfg.checkpoint_every}" if cfg.checkpoint_every else
                     "--checkpoint-every 0: only the finished run writes one; set --checkpoint-every N to keep one "
                     "every N steps")
            return f"no checkpoint in {out} yet ({every}); rerunning starts at step 0"
        return f"last checkpoint {ckpt} at step {now[0]}; resume with: {_resume_command(argv)}"

    from gapdyn.io import output_folder

    with output_folder(out, what="--out folder"):  # read-only: one line now; a refusal below leaves no empty folder
        say("train", f"writing under {out.resolve()}")
        if start:
            say("train", f"resuming {ckpt} at step {start}")
        on_interrupt(interrupted)
        from .experiments.demo import summarize_run
        from .trainer import FaultError, Trainer
        from .warmup import warmup_progress

        t0 = time.perf_counter()
        notes = _HeldResumeNotes(sys.stderr)
        with warmup_progress(cfg.progress), _hf_progress(cfg.progress):
            try:
                sys.stderr = notes
                summary = Trainer(cfg, task=task).run(on_step=notes.release)
                notes.release()
            except FaultError as exc:  # documented: exit code 1 and the fault on stderr
                notes.release()
                print(f"gapdyn train: {' '.join(str(exc).split())}", file=notes.stream)
                return 1
            finally:
                sys.stderr = notes.stream
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
    collapse = (f"first alert ({row['alert_rule']}) at step {row['alert_step']}" if row.get("alerted")
                else "no collapse alert")
    say("train", f"reward {_fmt(row.get('reward_first25'))} -> {_fmt(row.get('reward_last25'))} (first / last 25 "
                 f"steps), entropy {_fmt(row.get('entropy_last25'))}, M {_fmt(row.get('M_mean_final'))}; {collapse}")
    if summary.get("faults"):
        say("train", f"skipped non-finite steps: {summary['faults']}")
    say("train", f"wrote {out}/ (metrics.parquet, metrics.jsonl, alerts.json, summary.json)")
    return 0


def _testbed_main(argv: list[str]) -> int:
    from .testbed.cli import testbed_main

    return testbed_main(argv)


@command("gapdyn train")
def main(argv: list[str]) -> int:
    """Entry point; returns an exit code (1 when a run stops on repeated faults)."""
    if argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]][0](argv[1:])
    if argv and not argv[0].startswith("-"):  # the plain run takes options only: a word first is a subcommand
        from gapdyn.cmdline import did_you_mean

        raise ValueError(f"unknown subcommand {argv[0]!r}; {did_you_mean(argv[0], SUBCOMMANDS)}"
                         f"subcommands: {', '.join(SUBCOMMANDS)} (or options only, for one run)")
    return _train_main(argv)


SUBCOMMANDS: dict = {
    "warmup": (_warmup_main, "build and warm up a tiny Qwen, save it (then --init-from DIR)"),
    "demo": (_demo_main, "GRPO vs WAPO at a normal and a large learning rate"),
    "ablation": (_ablation_main, "the method ablation or the early-warning study, with claims"),
    "early-warning": (_early_warning_main, "time-matched AUC of the warning statistics vs the reward (--from DIR)"),
    "entropy": (_entropy_main, "dH against -lr Cov(log pi, A) and the taxonomy cells of a study (--from DIR)"),
    "entropy-lemma": (_entropy_lemma_main, "Cui et al.'s entropy lemma and PG forms per visited state, with claims"),
    "offline": (_offline_main, "gaps and alignment from two checkpoints and a rollout JSONL"),
    "safe-step": (_safe_step_main, "the safe-step experiment (constant vs safe step), with claims"),
    "testbed": (_testbed_main, "one RL run on the learning testbed (scratchpad addition), outcome vs its start"),
}
"""gapdyn train <name> -> (its main(argv) -> int, the line `gapdyn train --help` shows for it)."""
