"""llm_probe.seeds: one table of derived seeds; the values recorded runs depend on, and the 2^63 - 1 bound."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from llm_probe.seeds import OFFSETS, SEED_LIMIT, derive_seed  # noqa: E402

FROZEN = {"train": 0, "probe_sampler": 1_000_003, "probe_prompts": 17, "baseline_prompts": 29, "baseline_sampler": 31,
          "accuracy_prompts": 7919, "heldout_problems": 12345, "heldout_eval": 777, "heldout_passk": 778,
          "claims_bootstrap": 12345, "control": 2_000_003, "testbed_eval": 3_000_017}
"""The offsets the code used before the table (the seeds of every recorded run): changing one changes results."""


def test_offsets_are_the_recorded_ones_and_streams_of_one_run_differ():
    assert OFFSETS == FROZEN
    one_run = ("train", "probe_sampler", "probe_prompts", "baseline_prompts", "baseline_sampler", "control",
               "testbed_eval")
    assert len({OFFSETS[p] for p in one_run}) == len(one_run)
    assert len({OFFSETS[p] for p in ("heldout_problems", "heldout_eval", "heldout_passk")}) == 3
    for seed in (0, 7, 2**40 + 3):
        assert all(derive_seed(seed, p) == seed + off and type(derive_seed(seed, p)) is int for p, off in FROZEN.items())


@pytest.mark.parametrize("purpose", sorted(FROZEN))
def test_derived_seed_never_passes_the_signed_64_bit_limit(purpose):
    top = SEED_LIMIT - FROZEN[purpose]
    assert derive_seed(top, purpose) == 2**63 - 1
    with pytest.raises(ValueError, match="seed"):
        derive_seed(top + 1, purpose)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3", None])
def test_bad_seed_or_purpose_is_a_value_error_naming_it(bad):
    with pytest.raises(ValueError, match="^seed"):
        derive_seed(bad, "train")
    with pytest.raises(ValueError, match="^purpose"):
        derive_seed(0, "nope")


def test_trainer_refuses_an_overflowing_seed_before_it_creates_its_folder(tmp_path):
    """TrainConfig takes any unsigned 64-bit seed; the trainer's probe seed seed + 1_000_003 must fit 2^63 - 1."""
    from llm_probe import TrainConfig, Trainer

    out = tmp_path / "run"
    with pytest.raises(ValueError, match="seed"):
        Trainer(TrainConfig(out_dir=str(out), seed=2**63, progress=False))
    assert not out.exists()
