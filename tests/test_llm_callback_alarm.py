"""GapProbeCallback's online alarm and its lr-finder summary.

The alarm's firing step is checked three ways on the same logged series: by hand (a loop over Page's CUSUM
recursion, or the first value at or above a threshold), by gapdyn.evidence.alarm.alarm_step offline, and by the callback
online (which also stops a real trl.GRPOTrainer run there through control.should_training_stop).
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("transformers")

from transformers import TrainerControl  # noqa: E402

from gapdyn.evidence.alarm import AlarmRun, AlarmSpec, alarm_step  # noqa: E402
from gapdyn.evidence.detectors import Cusum, Threshold  # noqa: E402
from llm_probe.callback import GapProbeCallback  # noqa: E402
from llm_probe.online_alarm import load_alarm_specs  # noqa: E402
from llm_probe.tokenizer import build_char_tokenizer  # noqa: E402

pytestmark = pytest.mark.llm

REWARD = [0.50, 0.52, 0.48, 0.51, 0.49, 0.50, 0.45, 0.40, 0.30, 0.20, 0.10, 0.05]


def _cusum_by_hand(x, ref=4, drift=0.5):
    """Page's recursion, a loop: S = max(0, S + (mu - x_t) / sd - drift) after the first ``ref`` values."""
    mu = sum(x[:ref]) / ref
    sd = math.sqrt(sum((v - mu) ** 2 for v in x[:ref]) / (ref - 1))
    S, out = 0.0, [-math.inf] * ref
    for v in x[ref:]:
        S = max(0.0, S + (mu - v) / sd - drift)
        out.append(S)
    return out


def _feed(cb, series, key="reward", start=1):
    """Drive cb.on_log as transformers does (log_history gets the row first); returns (control, log rows)."""
    state = SimpleNamespace(global_step=0, log_history=[])
    control, rows = TrainerControl(), []
    for t, v in enumerate(series, start=start):
        state.global_step = t
        logs = {key: v, "loss": 0.0}
        state.log_history.append({**logs, "step": t})
        cb.on_log(None, state, control, logs=logs)
        rows.append(logs)
        if control.should_training_stop:
            break
    return control, rows, state


def test_cusum_alarm_fires_online_where_the_hand_loop_and_the_offline_route_do():
    det = Cusum(direction=-1, reference_steps=4, drift=0.5, threshold=10.0)
    by_hand = _cusum_by_hand(REWARD)
    step = 1 + next(i for i, s in enumerate(by_hand) if s >= 10.0)  # steps count from 1, as global_step
    calls = []
    cb = GapProbeCallback(build_char_tokenizer(), 4, alarm=AlarmSpec("reward_drop", "reward", det),
                          stop_on_alarm=True, on_alarm=lambda *a: calls.append(a))
    control, rows, state = _feed(cb, REWARD)
    assert control.should_training_stop and state.global_step == step < len(REWARD)
    assert calls == [("reward_drop", step, REWARD[step - 1])]
    assert [r["alarm/reward_drop"] for r in rows] == [int(s >= 10.0) for s in by_hand[:step]]
    scores = [r["alarm/reward_drop_score"] for r in rows]
    assert all(math.isnan(s) for s in scores[:4]) and scores[4:] == pytest.approx(by_hand[4:step], rel=1e-12)
    offline = alarm_step(AlarmRun("r", {"reward": (np.arange(1, 13), np.array(REWARD))}, None), "reward", det)
    assert offline == step and cb.summary()["alarms"]["reward_drop"]["step"] == step
    assert state.log_history[-1]["alarm/reward_drop"] == 1


def test_an_alarm_without_stop_fires_once_and_training_goes_on():
    calls = []
    cb = GapProbeCallback(build_char_tokenizer(), 4, alarm=("low", "reward", Threshold(sign=-1), -0.25),
                          on_alarm=lambda *a: calls.append(a))
    control, rows, _ = _feed(cb, REWARD + [float("nan")] + REWARD)
    assert not control.should_training_stop and len(rows) == 2 * len(REWARD) + 1
    # the first value <= 0.25 (cutoff -0.25 in score units): the 10th; later firings call nothing
    assert calls == [("low", 10, 0.20)]
    assert "alarm/low" not in rows[len(REWARD)]  # NaN: not logged, not fed


def test_without_alarm_the_logged_keys_are_unchanged():
    rows = [{"step": 0, "gap/headroom": 2.0, "gap/headroom_lr": 1e-3, "reward": 0.4}]
    logged = []
    for alarm in (None, ("h", "gap/headroom", Threshold(sign=-1, threshold=1.0))):
        cb = GapProbeCallback(build_char_tokenizer(), 4, alarm=alarm)
        cb.history, cb._unlogged = list(rows), list(rows)
        _, out, _ = _feed(cb, [0.5])
        logged.append(out[0])
    assert set(logged[1]) - set(logged[0]) == {"alarm/h", "alarm/h_score"}
    assert {k: v for k, v in logged[1].items() if not k.startswith("alarm/")} == logged[0]
    assert logged[1]["alarm/h"] == 0 and logged[1]["alarm/h_score"] == -2.0


@pytest.mark.parametrize("kw, msg", [
    ({"alarm": "reward"}, "not a readable alarm_specs.json"),
    ({"alarm": 3}, "must be an AlarmSpec"),
    ({"alarm": ("a", "reward", "cusum")}, "must be a gapdyn.evidence.detectors.Detector"),
    ({"alarm": ("a", "reward", Threshold(), float("nan"))}, "cutoff must be a number"),
    ({"alarm": [("a", "reward", Threshold()), ("a", "entropy", Threshold())]}, "names must be unique"),
    ({"alarm": []}, "empty list"),
    ({"stop_on_alarm": True}, "need an alarm"),
    ({"alarm": ("a", "reward", Threshold()), "on_alarm": 1}, "on_alarm must be"),
])
def test_a_bad_alarm_argument_is_a_one_line_error(kw, msg):
    with pytest.raises(ValueError, match=msg) as e:
        GapProbeCallback(build_char_tokenizer(), 4, **kw)
    assert "\n" not in str(e.value)


def test_calibrated_specs_round_trip_through_alarm_specs_json(tmp_path):
    from llm_probe.testbed.alarm_report import ALARM_SPECS, calibrated_specs

    rows = [{"alarm": s.name, "cutoff": -0.25 if s.name == "headroom_low" else math.nan, "cal_negatives": 40}
            for s in ALARM_SPECS]
    p = tmp_path / "alarm_frozen.json"
    p.write_text(json.dumps({"specs": [s.to_dict() for s in ALARM_SPECS], "calibrated": calibrated_specs(rows),
                             "primary": "headroom_low"}))
    (spec,) = load_alarm_specs(p)
    assert spec.name == "headroom_low" and spec.detector.cutoff == -0.25 and spec.detector.threshold == 0.25
    assert [s.name for s in load_alarm_specs(p, roles=("exploratory",))] == ["headroom_low"]
    cb = GapProbeCallback(build_char_tokenizer(), 4, alarm=p)
    assert [(a.name, a.detector) for a in cb.alarms] == [(spec.name, spec.detector)]
    with pytest.raises(ValueError, match="no calibrated alarm"):
        load_alarm_specs(p, names=["reward_cusum"])
    p.write_text(json.dumps({"specs": [], "calibrated": calibrated_specs(rows)}))  # no frozen primary
    with pytest.raises(ValueError, match="no frozen primary"):
        load_alarm_specs(p)
    p.write_text(json.dumps({"specs": []}))
    with pytest.raises(ValueError, match="no calibrated cutoffs"):
        load_alarm_specs(p)


def test_summary_reports_the_lr_finder_median_with_its_count():
    cb = GapProbeCallback(build_char_tokenizer(), 4)
    lr_h = [5e-4, 1e-4, 3e-4, float("nan"), 2e-4, 4e-4, 6e-4, 7e-4]
    cb.history = [{"step": k, "gap/headroom": x / 1e-3, "gap/headroom_lr": x} for k, x in enumerate(lr_h)]
    s = cb.summary()
    finite = sorted(x for x in lr_h if not math.isnan(x))
    assert s["suggested_lr_steps"] == 7 and s["suggested_lr"] == finite[3]
    assert s["suggested_lr_interval"] == (finite[0], finite[6])  # n = 7: l = 1 (P(B <= 0) = 1/128 <= 0.025 < P(B <= 1))
    cb.history += [{"step": 8 + k, "gap/headroom": 1.0, "gap/headroom_lr": 1.0} for k in range(30)]
    later = cb.summary()  # the first 20 probed steps with a value only: the 7 above, then 13 of the 1.0s
    assert later["suggested_lr_steps"] == 20 and later["suggested_lr"] == sorted(finite + [1.0] * 13)[9]


def test_an_alarm_stops_a_trl_run_at_the_step_computed_from_its_logged_series(tmp_path):
    """Rewards 0.5 x parity for two generation batches, then 1 for every completion: TRL's logged ``reward``
    first reaches 0.75 at step 3, so the alarm stops the run there (of 6) and the hook is called once."""
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    from llm_probe.model import build_tiny_qwen
    from tests.test_llm_trl_matrix import G, SPEC
    from tests.test_llm_trl_settings import _trainer

    batches, calls = [], []

    def reward(prompts, completions, completion_ids=None, **kw):
        batches.append(1)
        return [1.0 if len(batches) >= 3 else 0.5 * (sum(c) % 2) for c in completion_ids]

    tok = build_char_tokenizer()
    det = Threshold(sign=1, threshold=0.75)
    cb = GapProbeCallback(tok, G, probe_every=1000, headroom=False, alarm=("reward_high", "reward", det),
                          stop_on_alarm=True, on_alarm=lambda *a: calls.append(a))
    trainer = _trainer(tmp_path, tok, build_tiny_qwen(tok, SPEC, seed=0), cb.wrap_rewards([reward]), T=1.0,
                       steps=6, checkpointing=False)
    cb.attach(trainer)
    trainer.train()
    hist = [r for r in trainer.state.log_history if "reward" in r]
    steps, vals = [r["step"] for r in hist], [r["reward"] for r in hist]
    by_hand = steps[next(i for i, v in enumerate(vals) if v >= 0.75)]
    offline = alarm_step(AlarmRun("trl", {"reward": (np.array(steps), np.array(vals))}, None), "reward", det)
    assert by_hand == offline == trainer.state.global_step == 3 and steps == [1, 2, 3]
    assert calls == [("reward_high", 3, 1.0)]
    assert [r["alarm/reward_high"] for r in hist] == [0, 0, 1]
