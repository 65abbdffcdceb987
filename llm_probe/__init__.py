"""llm_probe: gradient-gap probes inside online RLVR (GRPO, WAPO, ...) runs of a Qwen policy (torch).

``gapdyn`` and ``bandits`` never import this package. See docs/llm_probe.md. Names are exported lazily
(PEP 562): ``import llm_probe`` imports neither torch nor any submodule, and ``llm_probe.<name>`` imports the
module that defines it on first use (so ``gapdyn train --help`` reads TrainConfig without loading torch), through
gapdyn's one helper (:func:`gapdyn._lazy.export_lazily`). To export a name, add it to its module's tuple in
``_EXPORTS_BY_MODULE`` and to ``__all__``.
"""

from gapdyn._lazy import export_lazily as _export_lazily

from .threads import set_wait_policy as _set_wait_policy

_set_wait_policy()  # OMP_WAIT_POLICY=PASSIVE unless set: OpenMP reads it once, at torch's first import (threads.py)

_EXPORTS_BY_MODULE: dict[str, tuple[str, ...]] = {
    "checkpoint": ("CheckpointError", "RunFolderLockedError"),
    "collapse": ("RULES", "REWARD_OUTCOMES", "Alert", "CollapseConfig", "CollapseDetector", "RewardOutcome",
        "collapse_onset", "detection_stats", "outcome_counts", "reward_outcome", "synthetic_stream"),
    "config": ("TrainConfig",),
    "losses": ("AGG_ALIASES", "AGG_MODES", "LOSS_NAMES", "LOSSES", "LossSpec", "aggregate", "compute_advantages",
        "policy_loss"),
    "model": ("TinyQwenSpec", "build_tiny_qwen", "completion_logprobs", "default_device", "load_policy",
        "save_policy", "sequence_logprob"),
    "gap_probe": ("GapProbe", "ProbeResult"),
    "measure": ("encode_rollout", "measure", "parameter_change"),
    "probes": ("GapEstimate", "GapStats", "alignment_metrics", "dot_alignment", "flat", "gap_matrix_bytes",
        "jvp_alignment", "mixed_groups", "per_prompt_gaps", "prompt_objectives", "select_params",
        "streamed_gap_stats", "token_stats"),
    "rollout": ("Rollout", "left_pad", "make_rollout", "sample_completions"),
    "safe_step": ("SafeStepController", "SafeStepResult", "completion_logprob_jvp"),
    "tasks": ("AdditionTask", "JsonlTask", "Problem", "check_answer", "extract_answer", "load_jsonl_problems",
        "normalize_answer"),
    "threads": ("configure_threads", "use_threads"),
    "tokenizer": ("build_char_tokenizer", "load_tokenizer"),
    "trainer": ("FaultError", "Trainer", "build_policy", "make_task", "train"),
    "warmup": ("sampled_accuracy", "warmup"),
    "callback": ("GapProbeCallback",),
    "safe_step_callback": ("SafeStepCallback",),
}
"""Submodule -> the public names it defines (the TRL callbacks import transformers: loaded on first use too)."""
_EXPORTS: dict[str, str] = _export_lazily(__name__, _EXPORTS_BY_MODULE)


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
    "CheckpointError", "RunFolderLockedError", "REWARD_OUTCOMES", "RewardOutcome", "collapse_onset", "outcome_counts",
    "reward_outcome", "left_pad", "configure_threads", "use_threads",
]
