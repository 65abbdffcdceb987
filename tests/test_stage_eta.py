"""paper_figs.stage_eta: the time left of gapdyn reproduce, against a hand computation over constructed stages."""

from __future__ import annotations

import pytest

from paper_figs.stage_eta import QUICK_STAGE_S, WARMUP, StageETA

STAGES = [("experiment", "a"), ("experiment", "b"), ("experiment", "c"), ("figure", "f")]
REF = {("experiment", "a"): 80.0, ("experiment", "b"): 10.0, ("experiment", "c"): 30.0, ("figure", "f"): 5.0}


def test_no_pace_before_a_timed_stage_and_warm_up_never_sets_it():
    clock = StageETA(STAGES, REF, warmup={("experiment", "a")})
    assert clock.pace() is None and clock.left() == (None, 0)
    clock.done(("experiment", "a"), 500.0)  # a compile stage, however slow, sets no pace
    assert clock.pace() is None and "after the first timed stage" in clock.text()


def test_pace_and_time_left_equal_a_hand_computation():
    clock = StageETA(STAGES, REF, warmup={("experiment", "a")})
    clock.done(("experiment", "a"), 500.0)
    clock.done(("experiment", "b"), 40.0)  # 4x the measured 10 s
    assert clock.pace() == pytest.approx(4.0)
    assert clock.left() == (pytest.approx(4.0 * (30.0 + 5.0)), 0)
    clock.done(("experiment", "c"), 60.0)  # pace over b and c: (40 + 60) / (10 + 30)
    assert clock.left()[0] == pytest.approx((40 + 60) / (10 + 30) * 5.0)
    assert "2:" not in clock.text() and "0:12 left" in clock.text()


def test_unmeasured_stages_are_named_not_guessed_and_no_reference_shows_counts_only():
    clock = StageETA([*STAGES, ("experiment", "new")], REF, warmup=set())
    clock.done(("experiment", "a"), 160.0)
    assert clock.left() == (pytest.approx(2.0 * 45.0), 1) and "1 stages without a measured time" in clock.text()
    assert StageETA(STAGES, None).left() == (None, 4) and "no time left shown" in StageETA(STAGES, None).text()


def test_the_quick_reference_covers_every_stage_gapdyn_reproduce_runs():
    from paper_figs.cli import FIGURES
    from paper_figs.reproduce import EXPERIMENT_ORDER

    stages = {("experiment", n) for n in EXPERIMENT_ORDER} | {("llm", "llm_probe")} | {("figure", f) for f in FIGURES}
    assert stages == set(QUICK_STAGE_S) and WARMUP <= stages
