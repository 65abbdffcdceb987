"""Every seed llm_probe derives from a run's seed, by purpose: one table instead of offsets spread over the code.

    derive_seed(seed, purpose) = seed + OFFSETS[purpose]        (0 <= result <= 2^63 - 1, else ValueError)

Each stream of randomness (CONTRIBUTING.md: only explicit ``numpy.random.Generator`` / ``torch.Generator``
seeds) gets its own offset, so probing or measuring never moves the training trajectory. The offsets are the
values the code used before this table existed, so every recorded run reproduces. The training streams
themselves (prompt draw and sampler) use the run's seed as it is (offset 0, ``"train"``). A study's shared
streams (the same held-out problems for every run) derive from :data:`STUDY_SEED`.
"""

from __future__ import annotations

import numbers

__all__ = ["OFFSETS", "STUDY_SEED", "SEED_LIMIT", "derive_seed"]

SEED_LIMIT = 2**63 - 1
"""Largest derived seed: fits a signed 64-bit integer wherever it goes (torch, numpy, JSON readers)."""
STUDY_SEED = 0
"""The seed of a study's shared streams (held-out problems and their samplers), the same for every run."""
OFFSETS: dict[str, int] = {
    "train": 0,  # training prompts (numpy) and completions (torch): llm_probe.trainer
    "probe_sampler": 1_000_003,  # completions of the fixed probe prompts (torch): llm_probe.trainer
    "probe_prompts": 17,  # the fixed probe prompts (numpy): llm_probe.trainer
    "baseline_prompts": 29,  # fresh prompts of the pre-RL baseline H0, R0 (numpy): Trainer.measure_baseline
    "baseline_sampler": 31,  # their completions (torch): Trainer.measure_baseline
    "accuracy_prompts": 7919,  # problems of llm_probe.warmup.sampled_accuracy (numpy)
    "heldout_problems": 12345,  # a study's held-out problems (numpy): experiments.ablation, from STUDY_SEED
    "heldout_eval": 777,  # their completions at each evaluation (torch): experiments.ablation
    "heldout_passk": 778,  # their completions for pass@k (torch): experiments.ablation
    "claims_bootstrap": 12345,  # the bootstrap of a study's claims (numpy): experiments.safe_step_experiment
    "control": 2_000_003,  # the random-advantage control's permutations (numpy, with the step): llm_probe.trainer
    "testbed_eval": 3_000_017,  # held-out completions at each evaluation (torch, with its index): llm_probe.testbed
}
"""purpose -> offset added to the seed (distinct per stream that can meet in one run)."""


def derive_seed(seed: int, purpose: str) -> int:
    """``seed + OFFSETS[purpose]``, a Python int in [0, 2^63 - 1].

    >>> derive_seed(5, "probe_prompts")
    22

    ValueError naming ``seed`` for a seed that is not an integer >= 0 or whose derived seed would pass
    2^63 - 1; naming ``purpose`` for an unknown purpose (the known ones are listed).
    """
    if purpose not in OFFSETS:
        raise ValueError(f"purpose must be one of {sorted(OFFSETS)}, got {purpose!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or int(seed) < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    offset = OFFSETS[purpose]
    if int(seed) > SEED_LIMIT - offset:
        raise ValueError(f"seed must be <= 2^63 - 1 - {offset} = {SEED_LIMIT - offset} so that its {purpose} "
                         f"seed (seed + {offset}) fits a signed 64-bit integer, got {int(seed)}")
    return int(seed) + offset
