"""Configuration of an online RLVR run (parsed into the ``gapdyn train`` CLI by tyro).

Every setting is checked when the config is made (:func:`check_settings`): a ValueError names the
setting, so a bad command line ends as one line, never as a run that silently does something else
(a negative ``max_grad_norm`` would turn descent into ascent).
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Annotated, Literal

import tyro

from gapdyn._validate import check_seed
from gapdyn.theory.safe_step import SAFE_STEP_C, SAFE_STEP_DELTA

from .collapse import CollapseConfig

__all__ = ["TrainConfig", "DTYPES", "LOSS_NAMES", "check_settings", "check_device", "check_method", "WARMUP_STEPS",
           "WARMUP_BATCH", "WARMUP_LR"]

DTYPES = ("float32", "float64", "bfloat16", "float16")
LOSS_NAMES = ("grpo", "bnpo", "dr_grpo", "dapo", "gspo", "wapo", "psr", "nsr", "w_reinforce")
"""The names of the registered losses, in their order (llm_probe.losses.LOSSES, whose module imports torch): what
``--method`` is checked against before torch loads."""
WARMUP_STEPS, WARMUP_BATCH, WARMUP_LR = 400, 128, 1e-3
"""The supervised warm-up of the tiny Qwen (llm_probe.warmup): steps, batch size and Adam learning rate; the
default of every warm-up and the recipe of the pinned checkpoints."""

_INF = math.inf
# setting -> (kind, lowest, highest, lowest allowed?, None allowed?); kind "seed": gapdyn._validate.check_seed (an
# integer in [0, 2^64 - 1], what torch.Generator.manual_seed and numpy's SeedSequence take; the bounds are unused)
_RANGES: dict[str, tuple[str, float, float, bool, bool]] = {
    "seed": ("seed", 0, 2**64 - 1, True, False),
    "steps": ("int", 1, _INF, True, False),
    "prompts_per_step": ("int", 1, _INF, True, False),
    "group_size": ("int", 2, _INF, True, False),
    "num_iterations": ("int", 1, _INF, True, False),
    "max_new_tokens": ("int", 1, _INF, True, False),
    "temperature": ("float", 0, _INF, False, False),
    "lr": ("float", 0, _INF, False, False),
    "weight_decay": ("float", 0, _INF, True, False),
    "max_grad_norm": ("float", 0, _INF, False, True),
    "eps_low": ("float", 0, 1, True, True),
    "eps_high": ("float", 0, _INF, True, True),
    "warmup_steps": ("int", 0, _INF, True, False),
    "lr_warmup_steps": ("int", 0, _INF, True, False),
    "warmup_batch": ("int", 1, _INF, True, False),
    "warmup_lr": ("float", 0, _INF, False, False),
    "probe_every": ("int", 0, _INF, True, False),
    "probe_prompts": ("int", 0, _INF, True, False),
    "probe_group_size": ("int", 2, _INF, True, False),
    "headroom_every": ("int", 1, _INF, True, False),
    "warn_forward_every": ("int", 1, _INF, True, False),
    "checkpoint_every": ("int", 0, _INF, True, False),
    "max_faults": ("int", 1, _INF, True, False),
    "num_threads": ("int", 1, _INF, True, True),
    "safe_step_c": ("float", 0, _INF, False, False),
    "safe_step_delta": ("float", 0, _INF, False, False),
}


def _flag(name: str) -> str:
    """The command-line flag of a setting, with the field name when they differ: ``--max-faults (max_faults)``."""
    flag = "--" + name.replace("_", "-")
    return flag if "_" not in name else f"{flag} ({name})"


def check_settings(obj, ranges: dict[str, tuple[str, float, float, bool, bool]]) -> None:
    """Type, finiteness and range of each named numeric setting of ``obj``; a ValueError naming it."""
    for name, (kind, lo, hi, lo_ok, none_ok) in ranges.items():
        v = getattr(obj, name)
        if v is None and none_ok:
            continue
        if kind == "seed":
            check_seed(v, _flag(name))
            continue
        ok_type = numbers.Integral if kind == "int" else numbers.Real
        if isinstance(v, bool) or not isinstance(v, ok_type):
            raise ValueError(f"{_flag(name)} must be {'an integer' if kind == 'int' else 'a number'}, got {v!r}")
        if not math.isfinite(v):
            raise ValueError(f"{_flag(name)} must be finite, got {v}")
        above = v >= lo if lo_ok else v > lo
        if not (above and v < hi if hi == 1 else above):
            bound = (f">= {lo}" if lo_ok else f"> {lo}") + (f" and < {hi}" if hi == 1 else "")
            raise ValueError(f"{_flag(name)} must be {bound}{' (or None)' if none_ok else ''}, got {v}")


def check_method(method: str) -> str:
    """``--method``: one of :data:`LOSS_NAMES`; a ValueError listing them (with the nearest name) otherwise."""
    if method in LOSS_NAMES:
        return method
    from gapdyn.cmdline import did_you_mean

    near = did_you_mean(str(method), LOSS_NAMES).strip()
    raise ValueError(f"--method must be one of {', '.join(LOSS_NAMES)}, got {method!r}" + (f"; {near}" if near else ""))


def check_device(device: str) -> str:
    """'auto', 'cpu', 'cuda' or 'cuda:N'; a CUDA device must exist on this machine."""
    if device in ("auto", "cpu"):
        return device
    m = re.fullmatch(r"cuda(?::(\d+))?", str(device))
    if m is None:
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")
    import torch

    if not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available on this machine (use --device cpu or auto)")
    index = int(m.group(1) or 0)
    if index >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device


@dataclass
class TrainConfig:
    """An online RLVR run of a (tiny) Qwen policy with gradient-gap probes."""

    out_dir: Annotated[str, tyro.conf.arg(name="out")] = "gapdyn_out/train"
    """Folder for metrics.jsonl, metrics.parquet, probe_prompts.jsonl, alerts.json, summary.json,
    checkpoint.safetensors."""
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
    num_iterations: int = 1
    """mu (TRL's name): optimizer steps on each sampled batch. With mu > 1 the importance ratio
    pi_theta / pi_theta_k leaves 1 after the first step, so the loss's clips act (DAPO, PPO); the probes measure
    the net update theta_{k+1} - theta_k of the mu steps against the gaps at theta_k."""
    max_new_tokens: int = 6
    """Completion cap (the max_completion_length of dr_grpo / wapo aggregation)."""
    temperature: float = 1.0
    """Sampling temperature."""
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    """Optimizer; with sgd the parameter change is exactly -lr * grad."""
    lr: float = 3e-4
    """Learning rate (3e-4 is a normal, 5e-4..1e-3 a large step for the tiny model with Adam)."""
    weight_decay: float = 0.0
    """Weight decay (adamw / sgd)."""
    lr_warmup_steps: int = 0
    """Linear learning-rate warm-up: step k (from 0) uses lr * min(1, (k + 1) / lr_warmup_steps); 0: constant lr.
    Adam's first steps are about lr in size whatever the gradient (its moments start at 0), so real runs warm up."""
    shuffle_rewards: bool = False
    """The random-advantage control: permute each group's rewards at random before the loss (same advantage
    magnitudes, signs shuffled within the group; the logged reward stays the sampled one). Meant to show optimiser
    damage apart from the Gradient Gap's threshold; on the testbed it collapses even where GRPO learns
    (docs/testbed.md)."""
    max_grad_norm: float | None = None
    """Clip the gradient norm to this value (TRL's default is 1.0); None: no clipping."""
    eps_low: float | None = None
    """Override the loss's lower clip epsilon, in [0, 1) (None: the registered default)."""
    eps_high: float | None = None
    """Override the loss's upper clip epsilon (None: the registered default)."""
    task: str = "addition"
    """'addition' (bundled two-digit addition) or the path of a JSONL file with question/answer lines."""
    init_from: str | None = None
    """Local directory of a saved causal LM + tokenizer; None: build a tiny Qwen and warm it up."""
    arch: Literal["qwen2", "qwen3"] = "qwen2"
    """Architecture of the tiny model built when init_from is None."""
    warmup_steps: int = WARMUP_STEPS
    """Supervised warm-up steps before RL (tiny model only)."""
    warmup_batch: int = WARMUP_BATCH
    """Warm-up batch size."""
    warmup_lr: float = WARMUP_LR
    """Warm-up Adam learning rate."""
    probe_every: int = 10
    """Run the gradient-gap probes every n steps (0: never; 1: every step). A probed step costs about 2.1x a plain
    step on the testbed cell on CPU (dot or ghost route, with the headroom meter, whose forward-mode pass is about
    0.7x of it; 4.9x on the tiny Qwen with more mixed groups, measured before the shared passes), so the default
    cadence of 10 keeps the amortised cost near 1.1-1.5x; every step with the ghost route and headroom_every =
    warn_forward_every = 10 about 1.2x amortised (BENCHMARKS.md: "Every-step ghost probe", "Targets")."""
    probe_params: str = "all"
    """Parameters the probes differentiate: 'all' (= 'trainable': every parameter with requires_grad, the
    adapters under PEFT/LoRA), 'lm_head', or a regex on parameter names."""
    probe_alignment: Literal["dot", "jvp", "both", "stream", "ghost"] = "dot"
    """Route for dmu: dot products with gap vectors, a forward-mode JVP, both (logs their max difference),
    stream (one group at a time: memory does not grow with prompts x parameters; 'dot'/'both' switch to it
    on their own above 1 GiB of gap vectors), or ghost (llm_probe.ghost: the dot route's numbers from one
    forward + backward over the mixed groups without per-prompt gradient vectors; needs probe_prompts 0)."""
    probe_prompts: int = 8
    """Size of the fixed probe-prompt set whose cumulative M_q is tracked (0: none)."""
    probe_group_size: int = 8
    """Completions sampled per probe prompt at each probe step (own generator: training is unaffected)."""
    headroom_every: int = 1
    """The headroom meter (gap/headroom, gap/headroom_lr: one forward-mode pass over the whole batch, about 0.7x
    a plain step) on every n-th probe step only: steps k with k % (probe_every * n) == 0 (1: every probe step).
    The gap/* metrics stay on every probe step (BENCHMARKS.md, "Every-step ghost probe")."""
    warn_forward_every: int = 1
    """The warn/* statistics at theta_{k+1} (warn/dH_same, warn/curv_gap, warn/wrong_max_frac, warn/x_*_mean: one
    no-grad forward over the whole batch, about 0.2x a plain step) on every n-th probe step only: steps k with
    k % (probe_every * n) == 0 (1: every probe step)."""
    checkpoint_every: int = 0
    """Write checkpoint.safetensors every n steps (0: only at the end)."""
    resume: bool = False
    """Resume from <out>/checkpoint.safetensors if it exists (the settings that define the run must match it;
    see --resume-force)."""
    stop_on_alert: bool = False
    """Stop the run at the first alert of the collapse rule (an event, not the run's outcome)."""
    collapse: CollapseConfig = field(default_factory=CollapseConfig)
    """Collapse-rule thresholds (llm_probe.collapse)."""
    max_faults: int = 3
    """Stop after this many consecutive steps with a non-finite loss or gradient (each is skipped)."""
    num_threads: int | None = None
    """torch threads (None: the process's count: 1 unless GAPDYN_TORCH_THREADS; llm_probe.threads)."""
    device: str = "auto"
    """'auto' (CUDA when available), 'cpu', 'cuda' or 'cuda:N'."""
    dtype: str = "float32"
    """Model dtype: float32, float64, bfloat16, float16."""
    progress: bool = True
    """Show tqdm progress bars (warm-up and RL steps)."""
    resume_force: bool = False
    """Resume even when settings that define the run (method, lr, seed, ...; llm_probe.checkpoint.RESUME_POLICY)
    differ from the checkpoint's; the metrics files then mix two configurations."""
    truncate_prompts: bool = False
    """Cut prompts longer than the model context minus max_new_tokens to their last tokens; off: such a prompt is
    an error naming its length and the context."""
    safe_step: bool = False
    """Scale every optimizer step by the safe step multiplier a in [0, 1]: theta = theta_k + a (theta' - theta_k),
    a = min(1, delta / sd_hat, c dmu_hat / kappa_hat) from one JVP over the step's completions
    (docs/theory.md section 11; llm_probe.safe_step). Costs one forward-mode pass per step."""
    safe_step_c: float = SAFE_STEP_C
    """Safe step: fraction c of the model-optimal step dmu_hat / kappa_hat (> 0; 1 = the model's maximiser)."""
    safe_step_delta: float = SAFE_STEP_DELTA
    """Safe step: trust region delta on the spread of the change of log pi per step (> 0)."""

    def __post_init__(self):
        check_settings(self, _RANGES)
        if not str(self.out_dir).strip():
            raise ValueError("--out must be a folder path, got an empty string")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {DTYPES}, got {self.dtype!r}")
        if not str(self.method).strip():
            raise ValueError("--method must name a loss, got an empty string")
        check_device(self.device)
        if self.probe_alignment == "ghost" and self.probe_prompts != 0:
            raise ValueError(f"--probe-alignment ghost tracks no fixed probe prompts: it needs --probe-prompts "
                             f"(probe_prompts) 0, got {self.probe_prompts}")
        if self.safe_step and self.num_iterations != 1:
            raise ValueError(f"--safe-step needs --num-iterations 1 (it scales one optimizer step), got "
                             f"{self.num_iterations}")
        for name in ("resume_force", "truncate_prompts", "shuffle_rewards"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{_flag(name)} must be True or False, got {getattr(self, name)!r}")
