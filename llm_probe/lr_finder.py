"""``gapdyn lr-finder``: a suggested learning rate from K <= 20 probed RL steps at a stated probe lr.

    gapdyn lr-finder [--lr 1e-4 --steps 20]                              the testbed's pinned warm start and task
    gapdyn lr-finder --model DIR --task FILE.jsonl --lr 1e-6 [--steps K]   a local from_pretrained folder + JSONL task

Runs K RL steps (GRPO by default, constant lr, Adam as ``gapdyn train``) with the headroom meter on every step
(probe_every = 1): each step k logs ``gap/headroom_lr`` = lr h_k, the learning rate at which the safe step rule's
cap would just bind on that step (llm_probe.headroom; docs/theory.md, section 11). The suggested lr is the
**median of lr h_k over the probed steps with a measured h** (a zero update measures none); its uncertainty is
the distribution-free order-statistic interval of that median (gapdyn.evidence.alarm.median_interval, 95 %), which treats
the K steps as exchangeable: they are serially dependent, so read it as the spread over steps of this run, not a
sampling interval over runs; with fewer than 6 measured steps it is unbounded. The command prints the
suggestion, the interval and the number of steps it rests on, and writes ``lr_finder.json`` beside the run's
metrics. Whether the suggestion is safe is what the testbed's dose-response study measures (docs/testbed.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from .suggest import lr_suggestion

__all__ = ["MAX_STEPS", "LrFinderArgs", "lr_suggestion", "find_lr", "main"]

MAX_STEPS = 20
"""Most probed steps the finder runs (the suggestion is meant to cost a few steps of one run)."""
TESTBED = "testbed"


@dataclass
class LrFinderArgs:
    """Suggest a learning rate from K <= 20 probed RL steps at a stated probe lr: the median over steps of the lr at
    which the safe step rule's cap would bind, with its interval and the number of steps it rests on."""

    model: str = TESTBED
    """'testbed' (its pinned warm start, --size, --length) or a local from_pretrained folder (needs --task)."""
    task: Annotated[str | None, tyro.conf.arg(metavar="FILE")] = None
    """A JSONL task ({"question": ..., "answer": ...} per line; llm_probe.tasks) for a --model folder."""
    lr: float | None = None
    """The probe lr (constant; the testbed: its documented learning lr 1e-4 when not given; a folder: needed)."""
    steps: int = 20
    """K, the probed RL steps (1 to 20; 20 is the K of docs/testbed.md's lr table)."""
    method: str = "grpo"
    """Loss (llm_probe.losses.LOSSES)."""
    size: Literal["small", "large"] = "small"
    """Testbed warm start."""
    length: Literal["long", "short"] = "long"
    """Testbed scratchpad."""
    prompts_per_step: int = 16
    """B: prompts per step."""
    group_size: int = 8
    """G: completions per prompt."""
    max_new_tokens: int | None = None
    """Completion cap (the testbed: its task's longest answer + 4; a folder: 256 when not given)."""
    seed: int = 0
    """Seed of the prompt stream and the sampler."""
    out_dir: Annotated[str, tyro.conf.arg(name="out")] = "gapdyn_out/lr-finder"
    """Folder of the probed run (metrics.jsonl) and lr_finder.json."""
    device: str = "auto"
    """'auto', 'cpu', 'cuda' or 'cuda:N'."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self):
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or not 1 <= self.steps <= MAX_STEPS:
            raise ValueError(f"--steps must be an integer in [1, {MAX_STEPS}], got {self.steps!r}")
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"--lr must be a positive number, got {self.lr!r}")
        if self.model != TESTBED and self.task is None:
            raise ValueError("--model FOLDER needs --task FILE.jsonl (the testbed brings its own task)")
        if self.model != TESTBED and self.lr is None:
            raise ValueError("--model FOLDER needs --lr (the probe lr: e.g. the lr you would train with)")
        if self.model == TESTBED and self.task is not None:
            raise ValueError("--task is for a --model folder; the testbed brings its own task")


def find_lr(args: LrFinderArgs) -> dict:
    """Run the K probed steps of ``args`` into ``args.out_dir`` and return :func:`lr_suggestion` of their rows
    (with the probe lr, K and the model added)."""
    from .config import TrainConfig
    from .trainer import Trainer

    model = tok = task = None
    common = dict(out_dir=str(args.out_dir), method=args.method, seed=args.seed, steps=args.steps,
                  prompts_per_step=args.prompts_per_step, group_size=args.group_size, lr_warmup_steps=0,
                  probe_every=1, probe_prompts=0, warmup_steps=0, progress=args.progress, device=args.device)
    if args.model == TESTBED:
        from .model import load_policy
        from .testbed.run import DEFAULT_LR
        from .testbed.task import ScratchpadAddition
        from .testbed.warm import pinned_testbed

        lr = DEFAULT_LR if args.lr is None else args.lr
        task = ScratchpadAddition(length=args.length)
        max_new = args.max_new_tokens or task.max_completion_tokens() + 4
        import torch

        device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
        model, tok = load_policy(pinned_testbed(args.size), device=device)
        cfg = TrainConfig(**common, lr=lr, max_new_tokens=max_new)
    else:
        if not Path(args.model).is_dir():
            raise ValueError(f"--model must be 'testbed' or a from_pretrained folder, got {args.model!r}")
        lr = args.lr
        cfg = TrainConfig(**common, lr=lr, max_new_tokens=args.max_new_tokens or 256, task=args.task,
                          init_from=args.model)
    Trainer(cfg, model=model, tokenizer=tok, task=task).run(checkpoint=False)
    rows = [json.loads(ln) for ln in (Path(args.out_dir) / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    return {**lr_suggestion(rows), "probe_lr": lr, "K": args.steps, "model": args.model, "method": args.method}


def main(argv: list[str] | None = None) -> int:
    """``gapdyn lr-finder [--model testbed|DIR] [--task FILE.jsonl] [--lr LR] [--steps K] [--out DIR]``."""
    import sys

    from gapdyn.cmdline import command, output_dir, parse, say

    @command("gapdyn lr-finder")
    def run(argv: list[str]) -> int:
        args = parse(LrFinderArgs, argv, prog="gapdyn lr-finder")
        out = output_dir("lr-finder", args.out_dir)
        args.out_dir = str(out)
        r = find_lr(args)
        (out / "lr_finder.json").write_text(json.dumps(r, indent=1))
        if r["steps"] == 0:
            say("lr-finder", f"no step measured a headroom in {r['K']} steps at probe lr {r['probe_lr']:g} (every "
                             f"update was zero: no group with mixed rewards?); no suggestion")
            return 1
        pct = round(100 * r["confidence"])
        spread = (f"[{r['lo']:.3g}, {r['hi']:.3g}]" if math.isfinite(r["lo"]) and math.isfinite(r["hi"])
                  else "unbounded (fewer than 6 measured steps)")
        say("lr-finder", f"suggested lr {r['suggested_lr']:.3g} (median over {r['steps']} probed steps of "
                         f"{r['K']} at probe lr {r['probe_lr']:g}; {pct} % order-statistic interval over steps "
                         f"{spread}; median headroom h {r['headroom_median']:.3g})")
        say("lr-finder", f"wrote {out}/ (lr_finder.json, metrics.jsonl)")
        return 0

    return run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
