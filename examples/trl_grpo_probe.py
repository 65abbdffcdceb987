"""Gradient-Gap probes on a real trl.GRPOTrainer run: copy this file and swap in your model, data and reward.

    python examples/trl_grpo_probe.py                      # a tiny random Qwen2 built here, CPU
    python examples/trl_grpo_probe.py --model DIR          # any local from_pretrained folder (never downloaded)

The callback wraps the reward function (it sees each step's groups there), probes every ``probe_every``-th
optimizer step and writes its gap/* metrics into TRL's own log rows (docs/llm_probe.md, "On a TRL run").
"""

import tempfile
from dataclasses import dataclass
from typing import Annotated

import numpy as np
import tyro
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from gapdyn.cmdline import optional
from llm_probe.callback import GapProbeCallback
from llm_probe.model import build_tiny_qwen, load_policy
from llm_probe.tokenizer import build_char_tokenizer

SHOWN = ("reward", "gap/n_prompts", "gap/dmu_update_mean", "gap/cos_update_mean", "gap/M_batch", "gap/headroom")


def partial_credit(prompts, completions, answer, **kw):
    """Share of the answer's characters at their place: > 0 counts as a success for the probe (O+)."""
    return [sum(x == y for x, y in zip(c.strip(), a)) / len(a) for c, a in zip(completions, answer)]


@dataclass
class Args:
    """GRPO on two-digit additions with GapProbeCallback attached; prints its gap/* metrics."""

    model: Annotated[str | None, optional("DIR", "build a tiny random Qwen2")] = None  # a local from_pretrained folder
    steps: int = 30  # optimizer steps
    probe_every: int = 10  # probe every k-th optimizer step
    lr: float = 1e-3  # learning rate (TRL's default 1e-6 barely moves a random tiny model)
    out: Annotated[str | None, optional("DIR", "a temporary folder")] = None  # GRPOConfig.output_dir


def main(argv=None):
    a = tyro.cli(Args, args=argv)
    if a.model:
        model, tok = load_policy(a.model, device="cpu")  # a PolicyPair: pass .model and .tokenizer, not the pair
    else:
        tok = build_char_tokenizer()
        model = build_tiny_qwen(tok, seed=0)
    rng = np.random.default_rng(0)
    ab = rng.integers(10, 100, size=(64, 2))
    ds = Dataset.from_dict({"prompt": [f"{x}+{y}=" for x, y in ab], "answer": [str(x + y) for x, y in ab]})

    G = 4
    cb = GapProbeCallback(tok, num_generations=G, probe_every=a.probe_every)
    args = GRPOConfig(output_dir=a.out or tempfile.mkdtemp(prefix="trl_grpo_probe_"), max_steps=a.steps,
                      per_device_train_batch_size=2 * G, num_generations=G, max_completion_length=6,
                      learning_rate=a.lr, logging_steps=1, save_strategy="no", seed=0, beta=0.0,
                      use_cpu=True, bf16=False, report_to="none")  # CPU; gradient checkpointing: TRL's default
    trainer = GRPOTrainer(model=model, reward_funcs=cb.wrap_rewards([partial_credit]), args=args,
                          train_dataset=ds, processing_class=tok)
    cb.attach(trainer)  # first callback (its metrics join TRL's logs); captures the token ids TRL trains on
    trainer.train()
    trainer.save_state()  # trainer_state.json in output_dir: `gapdyn inspect DIR` reports on the run from it

    for row in trainer.state.log_history:
        if "gap/M_batch" in row:
            print(f"step {row['step']:>3}  " + "  ".join(f"{k} {row[k]:.4g}" for k in SHOWN if k in row))
    s = cb.summary()  # suggested_lr: the lr finder's median of lr x headroom over the first 20 probed steps
    print(f"probed {s['probed_steps']} steps, M_batch {s['M_batch']:.4g} (x probe_every: {s['M_batch_scaled']:.4g}), "
          f"suggested lr {s['suggested_lr']:.3g} from {s['suggested_lr_steps']} probed steps (ran at {a.lr:g})")
    return trainer, cb


if __name__ == "__main__":
    main()
