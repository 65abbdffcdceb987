"""The probe where users train: GapProbeCallback's cadence (probe_every) and headroom meter (gap/headroom), the
pure headroom rule of gapdyn.theory.safe_step, and load_policy's named pair.

Independent routes: the rule against a transcription of docs/theory.md section 11 in plain Python; the cadence
against a second callback probing every step on the same trainer (probing never changes training); the meter
against the SafeStepCallback controller's logged estimates, combined by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from gapdyn.theory.safe_step import (SAFE_STEP_C, SAFE_STEP_DELTA, safe_step_estimates, safe_step_headroom,
                              safe_step_multiplier, safe_step_size)
from tests.strategies import safe_step_batches

pytestmark = pytest.mark.llm


def _hand_headroom(dmu, kappa, sd, n_mixed, c=SAFE_STEP_C, delta=SAFE_STEP_DELTA):
    """min(delta / sd, c dmu / kappa) with the terms and edge cases of docs/theory.md, section 11."""
    terms = []
    if sd > 0:
        terms.append(delta / sd)
    if n_mixed:
        if dmu <= 1e-12 * sd:
            return 0.0
        if kappa > 0:
            terms.append(c * dmu / kappa)
    return min(terms) if terms else math.inf


@settings(max_examples=150, deadline=None)
@given(safe_step_batches(), st.floats(0.05, 4.0), st.floats(0.05, 8.0), st.floats(-3.0, 3.0))
def test_headroom_is_the_rule_before_its_cap(batch, c, delta, log10_eta0):
    x, r, groups = batch
    dmu, kappa, sd, n = safe_step_estimates(x, r, groups)
    h = safe_step_headroom(dmu, kappa, sd, c=c, delta=delta, mixed=n > 0)
    assert h == pytest.approx(_hand_headroom(dmu, kappa, sd, n, c, delta), rel=1e-12)
    rule = safe_step_multiplier(x, r, groups, c=c, delta=delta)
    assert rule.headroom == h and rule.a == min(1.0, h)
    eta0 = 10.0**log10_eta0
    assert safe_step_size(dmu, kappa, sd, eta0, c=c, delta=delta, mixed=n > 0) == min(eta0, h)


def test_headroom_edge_cases_and_validation():
    assert safe_step_headroom(0.0, 0.0, 0.0, mixed=False) == math.inf  # nothing constrains the step
    assert safe_step_headroom(-1.0, 1.0, 1.0) == 0.0  # descent of the log-odds
    assert safe_step_headroom(1.0, -5.0, 0.5) == pytest.approx(SAFE_STEP_DELTA / 0.5)  # no curvature term
    for kw, name in ((dict(dmu_hat=math.nan), "dmu_hat"), (dict(sd_hat=-1.0), "sd_hat"), (dict(c=0.0), "c"),
                     (dict(delta=-1.0), "delta"), (dict(mixed=1), "mixed")):
        args = {"dmu_hat": 1.0, "kappa_hat": 1.0, "sd_hat": 1.0, **kw}
        with pytest.raises(ValueError, match=name):
            safe_step_headroom(args.pop("dmu_hat"), args.pop("kappa_hat"), args.pop("sd_hat"), **args)


# --- GapProbeCallback on a real trl.GRPOTrainer ----------------------------------------------------------


def _trainer(tmp_path, model, tok, reward, callbacks, *, steps, optim="sgd", lr=0.05, seed=0):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from llm_probe.tasks import AdditionTask

    probs = AdditionTask().sample(np.random.default_rng(seed), 32)
    ds = Dataset.from_dict({"prompt": [p.prompt for p in probs], "answer": [p.answer for p in probs]})
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=5, max_steps=steps, learning_rate=lr, optim=optim,
                      lr_scheduler_type="constant", use_cpu=True, bf16=False, report_to="none",
                      gradient_checkpointing=False, logging_steps=1, save_strategy="no", temperature=1.0, beta=0.0,
                      seed=seed, warmup_steps=0, max_grad_norm=1e9 if optim == "sgd" else 1.0)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok,
                          callbacks=callbacks)
    for cb in callbacks:  # registered in this order (nested reward wrappers: attach would refuse them)
        if hasattr(cb, "capture_batches"):
            cb.capture_batches(trainer)
    return trainer


def _exact_match(prompts, completions, completion_ids=None, answer=None, **kw):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


def test_cadence_probes_every_kth_step_and_sums_m_over_them(tmp_path):
    """Two callbacks on one trainer (the reward wrapped by both): probe_every = 2 logs exactly the rows of steps
    0, 2, 4 of the every-step callback, and its M_batch is the sum of mean_q [dmu_q]_+ over those rows."""
    pytest.importorskip("trl")
    from llm_probe.callback import GapProbeCallback
    from tests.llm_helpers import warm_model

    model, tok = warm_model()
    every, second = GapProbeCallback(tok, 4, probe_every=1), GapProbeCallback(tok, 4, probe_every=2)
    reward = second.wrap_reward(every.wrap_reward(_exact_match))
    trainer = _trainer(tmp_path, model, tok, reward, [every, second], steps=5)
    trainer.train()
    assert [r["step"] for r in every.history] == [0, 1, 2, 3, 4]
    assert [r["step"] for r in second.history] == [0, 2, 4]
    m_plus = [float(np.clip(r["gap/dmu_update"], 0, None).mean()) if r["gap/dmu_update"] else 0.0
              for r in every.history]
    assert any(m > 0 for m in m_plus), "no mixed group: the check would be vacuous"
    for row in second.history:
        ref = every.history[row["step"]]
        for k in ("gap/dmu_update", "gap/norm", "update_norm", "gap/headroom"):
            np.testing.assert_allclose(row[k], ref[k], rtol=1e-5, atol=1e-9, err_msg=k)
    assert second.M_batch == pytest.approx(sum(m_plus[k] for k in (0, 2, 4)), rel=1e-6, abs=1e-12)
    assert every.M_batch == pytest.approx(sum(m_plus), rel=1e-6, abs=1e-12)
    s = second.summary()
    assert s["probed_steps"] == 3 and s["M_batch_scaled"] == pytest.approx(2 * second.M_batch)
    for row in every.history:  # SGD: no mixed group -> zero gradient -> no update, no direction: h is NaN
        assert math.isnan(row["gap/headroom"]) == (row["update_norm"] == 0.0)
        assert math.isnan(row["gap/headroom"]) or row["gap/headroom"] >= 0.0
    h = [r["gap/headroom_lr"] for r in every.history if math.isfinite(r["gap/headroom_lr"])]
    assert h  # some step moved (m_plus > 0 above)
    assert every.summary()["suggested_lr"] == sorted(h)[(len(h) - 1) // 2]  # the lower median (llm_probe.suggest)


def test_headroom_equals_the_safe_step_controllers_pre_cap_quantity(tmp_path):
    """GapProbeCallback (first) and SafeStepCallback (after it) on one Adam run: on every step the meter's h equals
    min(delta / sd_hat, c dmu_hat / kappa_hat) formed by hand from the controller's logged estimates, and the
    controller's multiplier is min(1, h). The suggested lr is lr times the lower median of h (constant lr)."""
    pytest.importorskip("trl")
    from llm_probe.callback import GapProbeCallback
    from llm_probe.safe_step import SafeStepCallback
    from tests.llm_helpers import warm_model

    model, tok = warm_model()
    delta, lr = 0.5, 1e-2
    probe = GapProbeCallback(tok, 4, probe_every=1, delta=delta)
    safe = SafeStepCallback(tok, 4, delta=delta)
    reward = safe.wrap_reward(probe.wrap_reward(_exact_match))
    # probe before safe (attach would refuse: the trainer's reward functions are safe's wrappers of probe's)
    trainer = _trainer(tmp_path, model, tok, reward, [probe, safe], steps=4, optim="adamw_torch", lr=lr, seed=1)
    trainer.train()
    assert len(probe.history) == len(safe.history) == 4
    for row, ctl in zip(probe.history, safe.history):
        h = _hand_headroom(ctl["safe/dmu_hat"], ctl["safe/kappa_hat"], ctl["safe/sd_hat"], ctl["safe/n_mixed"],
                           delta=delta)
        assert row["gap/headroom"] == pytest.approx(h, rel=1e-4, abs=1e-9)
        assert ctl["safe/headroom"] == pytest.approx(h, rel=1e-4, abs=1e-9)
        assert ctl["safe/a"] == pytest.approx(min(1.0, h), rel=1e-4, abs=1e-9)
        assert row["gap/headroom_lr"] == pytest.approx(lr * row["gap/headroom"], rel=1e-12)
    assert any(c["safe/n_mixed"] > 0 for c in safe.history), "no mixed group: the check would be vacuous"
    hs = [r["gap/headroom"] for r in probe.history if math.isfinite(r["gap/headroom"])]
    assert probe.summary()["suggested_lr"] == pytest.approx(lr * sorted(hs)[(len(hs) - 1) // 2], rel=1e-12)
    logged = [h for h in trainer.state.log_history if "gap/headroom" in h]
    assert len(logged) == 4 and all("gap/suggested_lr" in h for h in logged)


def test_probe_every_and_the_named_pair_are_validated(tmp_path):
    from llm_probe.callback import GapProbeCallback
    from llm_probe.gap_probe import GapProbe
    from llm_probe.measure import measure
    from llm_probe.model import PolicyPair, load_policy, save_policy
    from llm_probe.safe_step import SafeStepController
    from tests.llm_helpers import tiny

    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(ValueError, match="probe_every"):
            GapProbeCallback(object(), 4, probe_every=bad)
    model, tok = tiny()
    save_policy(model, tok, tmp_path)
    pair = load_policy(tmp_path, device="cpu")
    assert isinstance(pair, PolicyPair) and pair.model is pair[0] and pair.tokenizer is pair[1]
    m2, t2 = pair  # still unpackable
    for name, p in model.named_parameters():
        assert torch.equal(p, dict(m2.named_parameters())[name]), name
    for call in (lambda: GapProbe(pair), lambda: SafeStepController(pair),
                 lambda: measure(pair, t2, ["1+2="] * 2, ["3", "4"], [1.0, 0.0])):
        with pytest.raises(ValueError, match="pair.model"):
            call()
    with pytest.raises(ValueError, match="pair.tokenizer"):
        GapProbeCallback(pair, 4)


def test_the_pair_passed_to_grpo_trainer_fails_inside_trl(tmp_path):
    """Documented in docs/llm_probe.md: our code is not on this path; TRL itself reads model.config."""
    pytest.importorskip("trl")
    from llm_probe.model import load_policy, save_policy
    from tests.llm_helpers import tiny

    model, tok = tiny()
    save_policy(model, tok, tmp_path / "m")
    pair = load_policy(tmp_path / "m", device="cpu")
    with pytest.raises(AttributeError, match="config"):
        _trainer(tmp_path, pair, pair.tokenizer, _exact_match, [], steps=1)


def test_the_probe_and_the_headroom_meter_share_one_snapshot_of_theta_k(tmp_path):
    """At real size a second copy of the weights is gigabytes: the gap probe's theta_k (``old``, what the update is
    measured against) is the headroom meter's snapshot itself, not a copy of it."""
    pytest.importorskip("trl")
    from transformers import TrainerCallback

    from llm_probe.callback import GapProbeCallback
    from tests.llm_helpers import warm_model

    model, tok = warm_model()
    probe = GapProbeCallback(tok, 4, probe_every=1)
    seen = []

    class Inspect(TrainerCallback):  # runs before the probe's own on_optimizer_step (earlier in the list)
        def on_optimizer_step(self, args, state, control, **kw):
            old, snap = probe.probe._pending.old, probe._theta_k
            seen.append(all(old[n].data_ptr() == snap[n].data_ptr() for n in old))

    trainer = _trainer(tmp_path, model, tok, probe.wrap_reward(_exact_match), [Inspect(), probe], steps=2)
    trainer.train()
    assert seen == [True, True] and len(probe.history) == 2
