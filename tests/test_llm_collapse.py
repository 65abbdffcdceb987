"""The collapse rule on synthetic metric streams: every collapse kind is detected within a bounded delay,
healthy streams raise no alarm (false-alarm count measured), thresholds and state behave as documented."""

from __future__ import annotations

import numpy as np
import pytest

from llm_probe.collapse import CollapseConfig, CollapseDetector, detection_stats, synthetic_stream


@pytest.mark.parametrize("kind,rule", [("blowup", "entropy_blowup"), ("entropy_collapse", None),
                                       ("reward_collapse", "reward_collapse")])
def test_collapse_detected_with_bounded_delay(kind, rule):
    s = detection_stats(kind, n_streams=60, steps=100, onset=40, seed=1)
    assert s["detected"] == 60 and s["false_alarms"] == 0, s
    # ramp of 5 steps + window 5 + patience 3: the first alert comes 5..10 steps after the onset
    assert 4 <= s["delay_mean"] <= 10 and s["delay_max"] <= 12, s
    if rule:
        assert set(s["first_rules"]) == {rule}


@pytest.mark.parametrize("noise,R0", [(0.04, 0.4), (0.08, 0.4), (0.04, 0.1)])
def test_no_false_alarm_on_healthy_streams(noise, R0):
    s = detection_stats("healthy", n_streams=100, steps=150, seed=2, noise=noise, R0=R0)
    assert s["false_alarms"] == 0, s


def test_thresholds_discriminate():
    """A 40% reward dip is not a collapse; a drop to 10% of the baseline is (reward_floor = 0.25)."""
    for factor, expect in ((0.6, False), (0.1, True)):
        det = CollapseDetector(CollapseConfig(baseline_entropy=0.4, baseline_reward=0.4))
        for k in range(30):
            det.update(k, {"entropy": 0.4, "reward": 0.4 * (factor if k >= 10 else 1.0),
                           "completions/distinct_frac": 0.6})
        assert det.alerted is expect
    det = CollapseDetector(CollapseConfig(baseline_entropy=0.4, baseline_reward=0.4))
    for k in range(10):
        det.update(k, {"entropy": 0.4, "reward": 0.4, "completions/distinct_frac": 0.1})
    assert [a.rule for a in det.alerts] == ["identical_rollouts"]
    assert "identical_rollouts" in str(det.alerts[0])


def test_baseline_period_and_state_round_trip():
    cfg = CollapseConfig(baseline_steps=10)
    rng = np.random.default_rng(0)
    stream = synthetic_stream("blowup", 60, rng, onset=5)  # onset inside the baseline period
    # with the median baseline the early blow-up contaminates H0; a pre-RL baseline (set_baseline) avoids that
    det2 = CollapseDetector(cfg)
    det2.set_baseline(0.4, 0.4)
    first = next(k for k, m in enumerate(stream) if det2.update(k, m))
    assert first < 15
    a = CollapseDetector(cfg)
    b = CollapseDetector(cfg)
    for k, m in enumerate(stream[:20]):
        a.update(k, m)
    b.load_state_dict(a.state_dict())
    for k, m in enumerate(stream[20:], 20):
        assert a.update(k, m) == b.update(k, m)
    assert a.baseline() == b.baseline()


def test_bad_config_and_kind():
    with pytest.raises(ValueError, match="window"):
        CollapseConfig(window=0)
    with pytest.raises(ValueError, match="kind"):
        synthetic_stream("weird", 10, np.random.default_rng(0))


@pytest.mark.parametrize("field,value", [("blowup_factor", float("nan")), ("blowup_factor", 0.5),
                                         ("collapse_factor", -0.1), ("reward_floor", float("inf")),
                                         ("distinct_floor", 2.0), ("blowup_margin", -1.0), ("baseline_reward", float("nan"))])
def test_bad_thresholds_raise(field, value):
    with pytest.raises(ValueError, match=field):
        CollapseConfig(**{field: value})


# ---- recorded runs of the real trainer (tests/data, written by llm_probe.Trainer; columns the rule reads) -------
DATA = __import__("pathlib").Path(__file__).parent / "data"


def _replay(name: str, **cfg):
    import json

    lines = (DATA / f"llm_{name}_metrics.jsonl").read_text().splitlines()
    head, rows = json.loads(lines[0]), [json.loads(ln) for ln in lines[1:]]
    det = CollapseDetector(CollapseConfig(**cfg))
    det.set_baseline(head["baseline"]["entropy"], head["baseline"]["reward"])
    fired_online = [a.rule for r in rows for a in det.update(r["step"], r)]
    return head, rows, det, fired_online


def test_recorded_healthy_run_replays_without_alarm():
    """A real trainer run at Adam 3e-4 (60 steps, warm model): the recorded alerts and the replayed detector
    agree, and the stream is what the trainer logged (steps 0..59, rewards in [0, 1])."""
    head, rows, det, fired = _replay("healthy_lr3e-4_s0")
    assert [r["step"] for r in rows] == list(range(60))
    assert all(0.0 <= r["reward"] <= 1.0 for r in rows)
    assert fired == [a["rule"] for a in head["alerts"]]
    assert det.alerts == [] and not det.alerted


def test_weak_baseline_disables_the_ratio_rule():
    """R0 below min_baseline_reward: reward_collapse never fires, however low the reward; above it, it does."""
    zeros = [{"entropy": 2.0, "reward": 0.0, "completions/distinct_frac": 0.9}] * 10
    for R0, mb, expect in ((0.002, 0.05, []), (0.002, 0.0, ["reward_collapse"]), (0.3, 0.05, ["reward_collapse"])):
        det = CollapseDetector(CollapseConfig(min_baseline_reward=mb))
        det.set_baseline(2.0, R0)
        for k, m in enumerate(zeros):
            det.update(k, m)
        assert [a.rule for a in det.alerts] == expect, (R0, mb)
        if expect:
            assert det.alerts[0].step == 2  # window 1..3 and patience 3 from the first step
    with pytest.raises(ValueError, match="min_baseline_reward"):
        CollapseConfig(min_baseline_reward=1.5)


def test_recorded_weak_baseline_run():
    """A real run from a barely warmed model (R0 = 0.004, three zero-reward steps first): without the floor the
    ratio rule fires at step 2 (the false alarm); with the default floor nothing fires, as the trainer recorded."""
    head, rows, det, fired = _replay("weak_lr3e-4_s2")
    assert head["baseline"]["reward"] < CollapseConfig().min_baseline_reward
    assert fired == [a["rule"] for a in head["alerts"]] == []
    _, _, old, _ = _replay("weak_lr3e-4_s2", min_baseline_reward=0.0)
    assert [(a.rule, a.step) for a in old.alerts] == [("reward_collapse", 2)]
