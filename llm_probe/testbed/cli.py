"""``gapdyn train testbed``: one testbed run (the default setting at its documented learning lr) into ``--out``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import tyro

__all__ = ["TestbedArgs", "testbed_main"]


@dataclass
class TestbedArgs:
    """One RL run on the testbed from its pinned warm start; writes summary.json (held-out accuracy before and
    after, median completion tokens, outcome against the pre-RL start) beside metrics.jsonl."""

    seed: int = 0
    """Seed of the run (prompt stream, sampler, control permutations, evaluation streams)."""
    out_dir: Annotated[str, tyro.conf.arg(name="out")] = "gapdyn_out/testbed"
    """Folder of the run."""
    method: str = "grpo"
    """Loss (llm_probe.losses.LOSSES): grpo, dr_grpo, wapo, psr, ..."""
    lr: float | None = None
    """Adam learning rate (None: the documented learning lr, llm_probe.testbed.run.DEFAULT_LR)."""
    steps: int = 100
    """RL steps."""
    size: Literal["small", "large"] = "small"
    """Pinned warm start: small (about 1 M parameters) or large (about 4 M)."""
    length: Literal["long", "short"] = "long"
    """Scratchpad verbosity: long (40-token completions) or short (17)."""
    control: bool = False
    """The random-advantage control (rewards permuted within each group before the loss)."""
    progress: bool = True
    """Show a progress bar."""


def testbed_main(argv: list[str]) -> int:
    from gapdyn.cmdline import output_dir, parse, say

    from .run import DEFAULT_LR, TestbedSetting, run_testbed

    args = parse(TestbedArgs, argv, prog="gapdyn train testbed")
    setting = TestbedSetting(method=args.method, lr=DEFAULT_LR if args.lr is None else args.lr, steps=args.steps,
                             size=args.size, length=args.length, control=args.control)
    from ..config import check_method

    check_method(setting.method)  # before torch loads
    out = output_dir("train-testbed", args.out_dir)
    s = run_testbed(setting, args.seed, out, progress=args.progress)
    say("train", f"testbed {setting.method} lr={setting.lr:g} seed={args.seed}: held-out accuracy "
                 f"{s['heldout_acc_before']:.3f} -> {s['heldout_acc_after']:.3f}, median completion "
                 f"{s['completion_tokens_median']:g} tokens, outcome {s['outcome']}")
    say("train", f"wrote {out}/ (summary.json, metrics.jsonl, metrics.parquet)")
    return 0
