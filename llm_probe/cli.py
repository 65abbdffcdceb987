"""``gapdyn train ...``: the llm_probe command line (tyro parses the config dataclasses).

    gapdyn train [--method grpo --lr 3e-4 --steps 100 ...]   one RLVR run (TrainConfig)
    gapdyn train warmup --out-dir DIR [...]                   build + warm up a tiny Qwen, save it (init_from)
    gapdyn train demo [--out-dir DIR --seeds 0 1 2 ...]       GRPO vs WAPO at a normal and a large lr (DemoConfig)
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

__all__ = ["main", "WarmupConfig"]


@dataclass
class WarmupConfig:
    """Build a tiny Qwen, warm it up on the addition task, save model + tokenizer."""

    out_dir: str = "runs/llm_probe/warm"
    """Directory to save into (load later with --init-from)."""
    arch: str = "qwen2"
    """qwen2 or qwen3."""
    seed: int = 0
    """Init and data seed."""
    steps: int = 400
    """Warm-up steps."""
    batch: int = 128
    """Warm-up batch size."""
    lr: float = 1e-3
    """Warm-up Adam learning rate."""
    num_threads: int | None = None
    """torch.set_num_threads."""


def _warmup_main(argv: list[str]) -> int:
    import tyro

    cfg = tyro.cli(WarmupConfig, args=argv, prog="gapdyn train warmup")
    from .demo import prepare_warm_model

    d, acc = prepare_warm_model(cfg.out_dir, arch=cfg.arch, seed=cfg.seed, steps=cfg.steps, batch=cfg.batch,
                                lr=cfg.lr, num_threads=cfg.num_threads, force=True)
    print(json.dumps({"saved": str(d), "sampled_accuracy": acc}))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns an exit code (1 when a run stops on repeated faults)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "demo":
        from .demo import main as demo_main

        return demo_main(argv[1:])
    if argv and argv[0] == "warmup":
        return _warmup_main(argv[1:])
    import tyro

    from .config import TrainConfig

    cfg = tyro.cli(TrainConfig, args=argv, prog="gapdyn train",
                   description="Online RLVR run of a tiny Qwen with gradient-gap probes "
                               "(subcommands: `gapdyn train demo`, `gapdyn train warmup`).")
    from .trainer import FaultError, train

    try:
        summary = train(cfg)
    except FaultError as exc:
        print(f"gapdyn train: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    return 0
