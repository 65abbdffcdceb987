"""GapProbeCallback / SafeStepCallback on TRL's settings: the probe's forward state switched and restored, the
safe step on TRL's defaults (gradient checkpointing, sdpa, a temperature) against the float64 reference, a probe
failure skipped and counted, the summary's cadence with num_iterations, per-group learning rates, unscorable
groups kept out of the headroom and +-inf rewards treated as unscorable."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("datasets")

from llm_probe.callback import GapProbeCallback  # noqa: E402
from llm_probe.model import build_tiny_qwen, completion_logprobs, current_scoring_temperature  # noqa: E402
from llm_probe.probe_forward import REQUIRE_GRADS_HOOK, probe_forwards  # noqa: E402
from llm_probe.tokenizer import build_char_tokenizer  # noqa: E402
from tests.test_llm_trl_matrix import (  # noqa: E402
    G, SPEC, _reference_prompt_ids, _rule_headroom, _score, _tokenizer, relative_errors)

pytestmark = pytest.mark.llm
torch.set_num_threads(1)


def _batch(tok, seed=0):
    """Two prompts of 4 and 7 tokens, G completions each (digits then <eos>), mixed 0/1 rewards."""
    g = torch.Generator().manual_seed(seed)
    digits = tok("0123456789", add_special_tokens=False)["input_ids"]
    prompts, cids = [], []
    for p in ("1+2=", "12+345="):
        for _ in range(G):
            n = int(torch.randint(0, 4, (1,), generator=g))
            cids.append([digits[int(i)] for i in torch.randint(0, 10, (n,), generator=g)] + [tok.eos_token_id])
            prompts.append(p)
    return prompts, cids, [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]


def _state(model) -> dict:
    hooks = {id(m): [getattr(h, "__name__", "") for h in m._forward_hooks.values()] for m in model.modules()}
    return {"attn": model.config._attn_implementation, "training": model.training,
            "ckpt": [getattr(m, "gradient_checkpointing", None) for m in model.modules()], "hooks": hooks,
            "forward": model.__dict__.get("forward"), "T": current_scoring_temperature()}


def _jvp_of_logprobs(model, tok):
    """x_n = d/ds log pi_{theta + s v}(o_n) by torch.func.jvp (what the headroom meter runs)."""
    from llm_probe.rollout import encode_prompts
    from llm_probe.safe_step import completion_logprob_jvp

    prompts, cids, _ = _batch(tok)
    p_ids, p_mask = encode_prompts(tok, prompts)
    T = max(map(len, cids))
    ro = SimpleNamespace(prompt_ids=p_ids, prompt_mask=p_mask,
                         completion_ids=torch.tensor([c + [0] * (T - len(c)) for c in cids]),
                         completion_mask=torch.tensor([[1.0] * len(c) + [0.0] * (T - len(c)) for c in cids]))
    theta = {n: p.detach() for n, p in model.named_parameters()}
    v = {n: torch.ones_like(p) * 1e-3 for n, p in theta.items()}
    return completion_logprob_jvp(model, ro, theta, v)


def test_probe_forwards_switches_and_restores_the_training_state():
    """A model as TRL leaves it (sdpa attention, gradient checkpointing, the input-require-grads hook, train mode,
    accelerate's autocast forward): the forward-mode pass fails on it; inside probe_forwards it runs with eager
    attention, checkpointing off, the hook detached, eval mode, the wrapped forward unwrapped and the temperature
    set; on exit every piece is back, also when the block raises."""
    tok = build_char_tokenizer()
    model = build_tiny_qwen(tok, SPEC, seed=0)
    model.set_attn_implementation("sdpa")
    model.gradient_checkpointing_enable()
    model.enable_input_require_grads()
    model.train()
    calls = []
    model._original_forward = model.forward

    def wrapped(*a, **kw):  # stands for accelerate's autocast wrapper
        calls.append(1)
        return model._original_forward(*a, **kw)

    model.forward = wrapped
    before = _state(model)
    assert before["attn"] == "sdpa" and any(before["ckpt"]) and before["training"]
    assert any(REQUIRE_GRADS_HOOK in names for names in before["hooks"].values())
    with pytest.raises((RuntimeError, NotImplementedError)):  # what the probe met on TRL's defaults
        _jvp_of_logprobs(model, tok)
    with probe_forwards(model, 0.7):
        inside = _state(model)
        n = len(calls)
        x = _jvp_of_logprobs(model, tok)
        assert len(calls) == n  # the unwrapped forward ran
    assert torch.isfinite(x).all() and len(x) == 2 * G
    assert inside["attn"] == "eager" and not inside["training"] and not any(inside["ckpt"]) and inside["T"] == 0.7
    assert not any(REQUIRE_GRADS_HOOK in names for names in inside["hooks"].values())
    assert _state(model) == before
    with pytest.raises(KeyError):
        with probe_forwards(model, 0.5):
            raise KeyError("inside")
    assert _state(model) == before


def _trainer(tmp_path, tok, model, funcs, *, T, steps=2, checkpointing=True, callbacks=(), lr=0.05, **kw):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rng = np.random.default_rng(0)
    ds = Dataset.from_dict({"prompt": [f"{a}+{b}=" for a, b in rng.integers(1, 1000, size=(16, 2))]})
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2 * G, num_generations=G,
                      max_completion_length=6, max_steps=steps, learning_rate=lr, lr_scheduler_type="constant",
                      use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=checkpointing,
                      logging_steps=1, save_strategy="no", temperature=T, beta=0.0, seed=0, warmup_steps=0, **kw)
    return GRPOTrainer(model=model, reward_funcs=funcs, args=args, train_dataset=ds, processing_class=tok,
                       callbacks=list(callbacks))


def _parity(seen):
    def parity(prompts, completions, completion_ids=None, **kw):
        r = [float(sum(c) % 2) for c in completion_ids]
        seen.append((list(prompts), [list(c) for c in completion_ids], r))
        return r
    return parity


def test_safe_step_callback_on_trl_defaults_matches_the_reference(tmp_path):
    """SafeStepCallback attached on gradient checkpointing, sdpa attention and temperature 0.7 (Adam): no step is
    skipped; each step's h equals the rule on x_n = <d, s_n> from the float64 per-sequence reference along the
    optimizer's proposal d, and the parameters end at theta_k + a d."""
    from transformers import TrainerCallback

    from llm_probe.safe_step import SafeStepCallback

    tok, T = _tokenizer("bos"), 0.7
    model = build_tiny_qwen(tok, SPEC, seed=0)
    state0 = {k: v.clone() for k, v in model.state_dict().items()}
    model.set_attn_implementation("sdpa")

    class Spy(TrainerCallback):
        def __init__(self):
            self.rows = []

        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            self.rows.append({"k": {n: p.detach().clone() for n, p in model.named_parameters()}})

        def on_optimizer_step(self, args, state, control, model=None, **kw):
            self.rows[-1]["proposed"] = {n: p.detach().clone() for n, p in model.named_parameters()}

    class After(TrainerCallback):
        def __init__(self):
            self.rows = []

        def on_optimizer_step(self, args, state, control, model=None, **kw):
            self.rows.append({n: p.detach().clone() for n, p in model.named_parameters()})

    seen, spy, after = [], Spy(), After()
    safe = SafeStepCallback(tok, G, delta=0.5)
    trainer = _trainer(tmp_path, tok, model, safe.wrap_rewards([_parity(seen)]), T=T, callbacks=[spy, after],
                       optim="adamw_torch", lr=1e-2)
    safe.attach(trainer)
    trainer.callback_handler.callbacks.remove(after)
    trainer.callback_handler.callbacks.append(after)  # after reads the controlled parameters
    trainer.train()
    assert safe.skipped_steps == [] and len(safe.history) == 2
    assert model.is_activation_checkpointing and model.config._attn_implementation == "sdpa"
    ref = build_tiny_qwen(tok, SPEC, seed=0, dtype="float64")
    ref.load_state_dict({k: v.double() for k, v in state0.items()})
    names, params = zip(*ref.named_parameters())
    checked = 0
    for ctl, s, new, (ps, cids, r) in zip(safe.history, spy.rows, after.rows, seen):
        with torch.no_grad():
            for n, p in ref.named_parameters():
                p.copy_(s["k"][n].double())
        d = torch.cat([(s["proposed"][n] - s["k"][n]).double().reshape(-1) for n in names])
        x = torch.stack([_score(ref, _reference_prompt_ids(tok, p), c, T, list(params))[0] @ d
                         for p, c in zip(ps, cids)]).numpy().reshape(-1, G)
        h = _rule_headroom(x, (np.array(r) > 0).reshape(-1, G), delta=0.5)
        err = relative_errors({"h": ctl["safe/headroom"]}, {"h": h})["h"]
        print(f"\nsafe step h {ctl['safe/headroom']:.6g} reference {h:.6g}: relative error {err:.1e}")
        assert err <= 1e-5
        for n in new:
            torch.testing.assert_close(new[n], s["k"][n] + ctl["safe/a"] * (s["proposed"][n] - s["k"][n]),
                                       rtol=0, atol=1e-7)
        checked += ctl["safe/n_mixed"]
    assert checked > 0, "no mixed group: the rule's terms were not checked"


def test_a_callback_not_attached_is_refused_at_train_begin(tmp_path):
    tok = build_char_tokenizer()
    cb = GapProbeCallback(tok, G)
    trainer = _trainer(tmp_path, tok, build_tiny_qwen(tok, SPEC, seed=0), cb.wrap_rewards([_parity([])]), T=1.0,
                       callbacks=[cb], checkpointing=False)
    with pytest.raises(ValueError, match=r"not attached: call cb.attach\(trainer\)"):
        trainer.train()


def test_a_probe_that_fails_skips_its_step_and_training_goes_on(tmp_path, monkeypatch, caplog):
    """The first probed step raises inside the probe: training completes, that step is logged, counted and named
    in summary(), and the next step is probed as usual."""
    from llm_probe.gap_probe import GapProbe

    tok = build_char_tokenizer()
    cb = GapProbeCallback(tok, G, probe_every=1)
    trainer = _trainer(tmp_path, tok, build_tiny_qwen(tok, SPEC, seed=0), cb.wrap_rewards([_parity([])]), T=1.0,
                       steps=3, optim="sgd")
    cb.attach(trainer)
    real, calls = GapProbe.before, []

    def failing(self, *a, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a kernel without a forward-mode rule")
        return real(self, *a, **kw)

    monkeypatch.setattr(GapProbe, "before", failing)
    with caplog.at_level(logging.WARNING, logger="llm_probe.callback"):
        trainer.train()
    assert trainer.state.global_step == 3
    assert cb.skipped_steps == [{"step": 0, "reason": "RuntimeError: a kernel without a forward-mode rule"}]
    assert [r["step"] for r in cb.history] == [1, 2]
    s = cb.summary()
    assert s["skipped_steps"] == 1 and s["probed_steps"] == 2 and s["M_batch_steps"] == 2
    assert s["skip_reasons"] == {"RuntimeError: a kernel without a forward-mode rule": 1}
    assert s["suggested_lr_steps"] == sum(math.isfinite(r["gap/headroom_lr"]) for r in cb.history)
    assert "step 0 not probed" in caplog.text


def test_a_step_failing_after_its_alignment_adds_nothing_to_m(monkeypatch):
    """The headroom fails after GapProbe.after has added the step's mean_q [dmu_q]_+ to M_batch: the step is
    skipped and M_batch is what it was before it (the sum of the recorded rows only)."""
    import llm_probe.safe_step_rule as rule

    tok = build_char_tokenizer()
    cb = GapProbeCallback(tok, G, probe_every=1)
    model = build_tiny_qwen(tok, SPEC, seed=0)
    _drive(cb, model, tok, (0.3, 0.3))
    m1 = cb.M_batch
    assert m1 > 0
    monkeypatch.setattr(rule, "completion_logprob_jvp", lambda *a, **kw: (_ for _ in ()).throw(MemoryError("jvp")))
    cb._rewards = None  # a fresh wrap for the second hand-driven step
    _drive(cb, model, tok, (0.3, 0.3))
    assert cb.M_batch == m1 and len(cb.history) == 1
    assert cb.skipped_steps == [{"step": 0, "reason": "MemoryError: jvp"}]


@pytest.mark.parametrize("probe_every,mu", [(1, 1), (2, 2), (4, 2), (3, 2), (10, 3), (1, 4), (6, 4)])
def test_m_batch_scaled_counts_generation_batches(probe_every, mu):
    """M_batch sums one row per probed generation batch (each the net change over its mu steps): the scale to the
    every-batch sum is (generation batches) / (probed batches), counted here by walking the steps."""
    steps = 12 * probe_every * mu
    batches = [k for k in range(steps) if k % mu == 0]  # a new generation batch at these steps
    probed = [k for k in batches if k % probe_every == 0]
    cb = GapProbeCallback(build_char_tokenizer(), G, probe_every=probe_every)
    cb.on_train_begin(SimpleNamespace(num_iterations=mu, gradient_accumulation_steps=1), None, None)
    cb.probe = SimpleNamespace(M_batch=0.25)
    assert cb.summary()["M_batch_scaled"] == pytest.approx(0.25 * len(batches) / len(probed), rel=1e-12)


def _drive(cb, model, tok, lrs, *, rewards=None):
    """One probed SGD step of ``cb`` by hand: the optimizer's groups hold the parameters split in two halves with
    learning rates ``lrs``; returns the row."""
    prompts, cids, r = _batch(tok)
    r = rewards or r
    f = cb.wrap_rewards([lambda prompts, completions, completion_ids=None, **kw: r])[0]
    f(prompts=prompts, completions=[""] * len(cids), completion_ids=cids)
    params = list(model.parameters())
    groups = [{"params": params[: len(params) // 2], "lr": lrs[0]}, {"params": params[len(params) // 2:], "lr": lrs[1]}]
    g = torch.Generator().manual_seed(1)
    for q in params:
        q.grad = torch.randn(q.shape, generator=g) * 1e-2
    state = SimpleNamespace(global_step=0)
    opt = SimpleNamespace(param_groups=groups)
    cb.on_pre_optimizer_step(None, state, None, model=model, optimizer=opt)
    with torch.no_grad():
        for grp in groups:
            for q in grp["params"]:
                q -= grp["lr"] * q.grad
    cb.on_optimizer_step(None, state, None, model=model, optimizer=opt)
    return cb.history[-1]


def test_headroom_lr_reads_every_parameter_group(caplog):
    """Equal learning rates in two parameter groups: headroom_lr = lr h. Different ones: lr h names no single lr,
    so headroom_lr and suggested_lr are NaN (h itself is still logged) and one line says why."""
    tok = build_char_tokenizer()
    row = _drive(GapProbeCallback(tok, G, probe_every=1), build_tiny_qwen(tok, SPEC, seed=0), tok, (0.3, 0.3))
    assert row["gap/headroom"] > 0 and row["gap/headroom_lr"] == pytest.approx(0.3 * row["gap/headroom"], rel=1e-12)
    cb = GapProbeCallback(tok, G, probe_every=1)
    with caplog.at_level(logging.WARNING, logger="llm_probe.callback"):
        row = _drive(cb, build_tiny_qwen(tok, SPEC, seed=0), tok, (0.3, 0.1))
    assert row["gap/headroom"] > 0 and math.isnan(row["gap/headroom_lr"])
    s = cb.summary()
    assert math.isnan(s["suggested_lr"]) and s["suggested_lr_steps"] == 0 and s["probed_steps"] == 1
    assert "learning rates [0.1, 0.3]" in caplog.text


def test_unscorable_groups_enter_no_term_of_the_headroom():
    """rule_from_x with a group holding a NaN reward equals the rule (written here) on the other groups alone, and
    differs from reading NaN as a failure; with no decided group h is NaN and a = 1."""
    from llm_probe.safe_step import rule_from_x

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, G)) + np.array([[0.0], [0.0], [5.0]])  # the unscorable group spreads the most
    r = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0], [1.0, math.nan, 0.0, 0.0]])
    got = rule_from_x(x.reshape(-1), r, delta=2.0)
    want = _rule_headroom(x[:2], r[:2].numpy() > 0, delta=2.0)
    assert got.headroom == pytest.approx(want, rel=1e-12) and got.n_mixed == 2
    as_failure = _rule_headroom(x, np.nan_to_num(r.numpy()) > 0, delta=2.0)
    assert abs(as_failure - want) > 1e-3 * abs(want)  # the test would see NaN read as a failure
    none = rule_from_x(x.reshape(-1), torch.full((3, G), math.nan))
    assert math.isnan(none.headroom) and none.a == 1.0


def test_infinite_rewards_are_unscorable_as_none_and_nan_are():
    """+-inf from a reward function counts as no reward from it: with a finite second function the aggregate is
    the finite part; with none, the completion is undecided and its group left out."""
    tok = build_char_tokenizer()
    prompts, cids, _ = _batch(tok)
    r1 = [math.inf, 1.0, -math.inf, 0.0, math.inf, 0.0, 1.0, 0.0]
    r2 = [0.5, 0.0, -1.0, None, None, 0.0, 0.0, 0.0]
    cb = GapProbeCallback(tok, G, probe_every=1)
    f1, f2 = cb.wrap_rewards([lambda prompts, completions, completion_ids=None, **kw: r1,
                              lambda prompts, completions, completion_ids=None, **kw: r2])
    kw = dict(prompts=prompts, completions=[""] * len(cids), completion_ids=cids)
    f1(**kw), f2(**kw)
    ro = cb.take_rollout("cpu")
    want = []
    for a, b in zip(r1, r2):  # inf and None both mean: this function gave no reward
        vals = [v for v in (a, b) if v is not None and math.isfinite(v)]
        want.append(float(sum(vals) > 0) if vals else math.nan)
    want = np.array(want).reshape(-1, G)
    want[np.isnan(want).any(-1)] = math.nan
    np.testing.assert_array_equal(ro.rewards.numpy(), want)
    assert np.isnan(want[1]).all() and not np.isnan(want[0]).any()  # one group left out, one kept


def test_sampling_settings_are_named_and_unattached_chat_prompts_refused(caplog):
    """TRL samples through top_p / top_k / min_p / repetition_penalty / generation_kwargs but trains log
    softmax(z / T): one log line names those that differ from neutral (none for GRPOConfig's defaults). Driven
    without a trainer, conversational prompts cannot be re-tokenized: a one-line error says to attach."""
    from trl import GRPOConfig

    tok = build_char_tokenizer()
    base = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False, num_generations=G, per_device_train_batch_size=G)
    for kw, named in (({}, None), (dict(top_p=0.9, top_k=20, generation_kwargs={"suppress_tokens": [0]}),
                                   "top_p=0.9, top_k=20, generation_kwargs={'suppress_tokens': [0]}")):
        cb = GapProbeCallback(tok, G)
        cb._attached = True  # as attach() leaves it
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="llm_probe.callback"):
            cb.on_train_begin(GRPOConfig(**base, temperature=0.7, **kw), None, None, train_dataloader=object())
        assert cb.temperature == 0.7
        assert ("TRL samples with" in caplog.text) == (named is not None)
        if named:
            assert f"TRL samples with {named} but trains log_softmax(logits / 0.7)" in caplog.text
    cb = GapProbeCallback(tok, G)
    prompts, cids, r = _batch(tok)
    chat = [[{"role": "user", "content": p}] for p in prompts]
    cb.wrap_rewards([lambda prompts, completions, completion_ids=None, **kw: r])[0](
        prompts=chat, completions=[""] * len(cids), completion_ids=cids)
    with pytest.raises(ValueError, match=r"not strings \(conversational message lists\?\): attach"):
        cb.take_rollout("cpu")
