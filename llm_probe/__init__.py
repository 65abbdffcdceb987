"""llm_probe: gradient-gap probes inside online RLVR (GRPO, WAPO, ...) runs of a Qwen policy (torch).

Imports torch; ``gapdyn`` and ``bandits`` never import this package. See docs/llm_probe.md.
"""

from .threads import set_wait_policy as _set_wait_policy

_set_wait_policy()  # OMP_WAIT_POLICY=PASSIVE unless set: OpenMP reads it once, at torch's first import (threads.py)

from .checkpoint import CheckpointError, RunFolderLockedError
from .collapse import (
    RULES,
    RUN_OUTCOMES,
    Alert,
    CollapseConfig,
    CollapseDetector,
    RunOutcome,
    collapse_onset,
    detection_stats,
    outcome_counts,
    run_outcome,
    synthetic_stream,
)
from .config import TrainConfig
from .losses import AGG_ALIASES, AGG_MODES, LOSS_NAMES, LOSSES, LossSpec, aggregate, compute_advantages, policy_loss
from .model import (
    TinyQwenSpec,
    build_tiny_qwen,
    completion_logprobs,
    default_device,
    load_policy,
    save_policy,
    sequence_logprob,
)
from .gap_probe import GapProbe, ProbeResult
from .measure import encode_rollout, measure, parameter_change
from .probes import (
    GapEstimate,
    GapStats,
    alignment_metrics,
    dot_alignment,
    flat,
    gap_matrix_bytes,
    jvp_alignment,
    mixed_groups,
    per_prompt_gaps,
    prompt_objectives,
    select_params,
    streamed_gap_stats,
    token_stats,
)
from .rollout import Rollout, left_pad, make_rollout, sample_completions
from .safe_step import SafeStepController, SafeStepResult, completion_logprob_jvp
from .tasks import AdditionTask, JsonlTask, Problem, check_answer, extract_answer, load_jsonl_problems, normalize_answer
from .threads import configure_threads, use_threads
from .tokenizer import build_char_tokenizer, load_tokenizer
from .trainer import FaultError, Trainer, build_policy, make_task, train
from .warmup import sampled_accuracy, warmup


def __getattr__(name):  # the TRL callback imports transformers.TrainerCallback: load it on first use
    if name == "GapProbeCallback":
        from .callback import GapProbeCallback

        return GapProbeCallback
    if name == "SafeStepCallback":
        from .safe_step_callback import SafeStepCallback

        return SafeStepCallback
    raise AttributeError(name)

__all__ = [
    "AGG_ALIASES", "AGG_MODES", "AdditionTask", "Alert", "CollapseConfig", "CollapseDetector", "FaultError",
    "GapEstimate", "GapProbe", "GapStats", "GapProbeCallback", "JsonlTask", "LOSSES", "LOSS_NAMES", "LossSpec", "Problem", "RULES", "Rollout", "TinyQwenSpec",
    "TrainConfig", "Trainer", "aggregate", "alignment_metrics", "build_char_tokenizer", "build_policy",
    "build_tiny_qwen", "check_answer", "completion_logprobs", "compute_advantages", "default_device",
    "detection_stats", "dot_alignment", "encode_rollout", "extract_answer", "flat", "gap_matrix_bytes",
    "jvp_alignment", "load_jsonl_problems", "load_policy",
    "load_tokenizer", "make_rollout", "make_task", "measure", "mixed_groups", "normalize_answer", "per_prompt_gaps",
    "parameter_change", "policy_loss", "ProbeResult", "prompt_objectives", "sample_completions", "sampled_accuracy", "save_policy", "select_params",
    "sequence_logprob", "streamed_gap_stats", "synthetic_stream", "token_stats", "train", "warmup",
    "SafeStepCallback", "SafeStepController", "SafeStepResult", "completion_logprob_jvp",
    "CheckpointError", "RunFolderLockedError", "RUN_OUTCOMES", "RunOutcome", "collapse_onset", "outcome_counts",
    "run_outcome", "left_pad", "configure_threads", "use_threads",
]
