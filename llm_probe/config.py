"""Configuration of an online RLVR run (parsed into the ``gapdyn train`` CLI by tyro)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .collapse import CollapseConfig

__all__ = ["TrainConfig"]


@dataclass
class TrainConfig:
    """An online RLVR run of a (tiny) Qwen policy with gradient-gap probes."""

    out_dir: str = "runs/llm_probe"
    """Directory for metrics.jsonl, metrics.parquet, probe_prompts.jsonl, alerts.json, checkpoint.pt."""
    method: str = "grpo"
    """Loss: grpo, bnpo, dr_grpo, dapo, gspo, wapo, psr, nsr, w_reinforce (llm_probe.losses.LOSSES)."""
    seed: int = 0
    """Seed of the model init, the warm-up data, the prompt stream and the sampler (torch.Generator)."""
    steps: int = 100
    """Number of RL optimizer steps."""
    prompts_per_step: int = 16
    """B: prompts per step."""
    group_size: int = 8
    """G: completions sampled per prompt."""
    max_new_tokens: int = 6
    """Completion cap (the max_completion_length of dr_grpo / wapo aggregation)."""
    temperature: float = 1.0
    """Sampling temperature."""
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    """Optimizer; with sgd the parameter change is exactly -lr * grad."""
    lr: float = 3e-4
    """Learning rate (SIMULATIONS.md: 3e-4 normal, 5e-4..1e-3 large for the tiny model with Adam)."""
    weight_decay: float = 0.0
    """Weight decay (adamw / sgd)."""
    max_grad_norm: float | None = None
    """Clip the gradient norm to this value (TRL's default is 1.0); None: no clipping."""
    eps_low: float | None = None
    """Override the loss's lower clip epsilon (None: the registered default)."""
    eps_high: float | None = None
    """Override the loss's upper clip epsilon (None: the registered default)."""
    task: str = "addition"
    """'addition' (bundled two-digit addition) or the path of a JSONL file with question/answer lines."""
    init_from: str | None = None
    """Local directory of a saved causal LM + tokenizer; None: build a tiny Qwen and warm it up."""
    arch: Literal["qwen2", "qwen3"] = "qwen2"
    """Architecture of the tiny model built when init_from is None."""
    warmup_steps: int = 400
    """Supervised warm-up steps before RL (tiny model only)."""
    warmup_batch: int = 128
    """Warm-up batch size."""
    warmup_lr: float = 1e-3
    """Warm-up Adam learning rate."""
    probe_every: int = 1
    """Run the gradient-gap probes every n steps (0: never). A probe step costs ~2.4-3.5x a plain step of the
    tiny Qwen on CPU (BENCHMARKS.md section 3); probe_every=10 keeps the amortised cost within issue 6's 1.5x."""
    probe_params: str = "all"
    """Parameters the probes differentiate: 'all', 'lm_head', or a regex on parameter names."""
    probe_alignment: Literal["dot", "jvp", "both"] = "dot"
    """Route for dmu: dot products with gap vectors, a forward-mode JVP, or both (logs their max difference)."""
    probe_prompts: int = 8
    """Size of the fixed probe-prompt set whose cumulative M_q is tracked (0: none)."""
    probe_group_size: int = 8
    """Completions sampled per probe prompt at each probe step (own generator: training is unaffected)."""
    checkpoint_every: int = 0
    """Write checkpoint.pt every n steps (0: only at the end)."""
    resume: bool = False
    """Resume from out_dir/checkpoint.pt if it exists."""
    stop_on_collapse: bool = False
    """Stop the run at the first collapse alert."""
    collapse: CollapseConfig = field(default_factory=CollapseConfig)
    """Collapse-rule thresholds (llm_probe.collapse)."""
    max_faults: int = 3
    """Stop after this many consecutive steps with a non-finite loss or gradient (each is skipped)."""
    num_threads: int | None = None
    """torch.set_num_threads (None: leave torch's default)."""
    device: str = "auto"
    """'auto' (CUDA when available), 'cpu' or 'cuda'."""
    dtype: str = "float32"
    """Model dtype: float32, float64, bfloat16, float16."""
    progress: bool = True
    """Show a tqdm progress bar."""
