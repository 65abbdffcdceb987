"""Probes on a PEFT LoRA model (adapters on q_proj / v_proj, base frozen): only the adapter weights are probed,
and every route (vmap'd and looped gaps, the streamed route, forward-mode alignment, GapProbe around an SGD step)
equals one backward per sequence through the wrapped model."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft")

from llm_probe.gap_probe import GapProbe  # noqa: E402
from llm_probe.losses import policy_loss  # noqa: E402
from llm_probe.model import completion_logprobs  # noqa: E402
from llm_probe.step_hook import Step  # noqa: E402
from llm_probe.probes import (  # noqa: E402
    dot_alignment,
    flat,
    jvp_alignment,
    per_prompt_gaps,
    select_params,
    streamed_gap_stats,
)
from tests.llm_helpers import reference_gaps, sampled_rollout, tiny  # noqa: E402

pytestmark = pytest.mark.llm


def lora_model(arch="qwen2", seed=0):
    from peft import LoraConfig, get_peft_model

    base, tok = tiny(arch, seed=seed)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                     init_lora_weights=False)  # random A and B: the gap has a nonzero part on both
    return get_peft_model(base, cfg), tok


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_lora_gaps_and_alignment_over_adapter_parameters(arch):
    model, tok = lora_model(arch, seed=2)
    model.eval()
    params = select_params(model, "trainable")
    assert params.keys() == select_params(model, "all").keys()
    assert params and all("lora_" in n for n in params)
    assert sum(p.numel() for p in params.values()) < sum(p.numel() for p in model.parameters()) / 5
    ro = sampled_rollout(model, tok, B=3, G=4, T=5, seed=1)
    ro.rewards[2] = 0.0  # not mixed
    ref = reference_gaps(model, ro, params)
    scale = float(ref.abs().max())
    assert scale > 0
    for vectorize in (True, False):
        est = per_prompt_gaps(model, ro, params, vectorize=vectorize)
        assert est.groups.tolist() == [0, 1]
        torch.testing.assert_close(est.gaps, ref, rtol=1e-4, atol=1e-5 * scale)
    g = torch.Generator().manual_seed(0)
    v = {k: torch.randn(p.shape, generator=g) for k, p in params.items()}
    expect = ref @ flat(v)
    tol = dict(rtol=1e-4, atol=1e-5 * float(expect.abs().max()))
    torch.testing.assert_close(dot_alignment(est.gaps, flat(v)), expect, **tol)
    torch.testing.assert_close(jvp_alignment(model, ro, est.groups, {k: p.detach() for k, p in params.items()}, v),
                               expect, **tol)
    st = streamed_gap_stats(model, ro, params, {"v": v})
    torch.testing.assert_close(st.dots["v"].float(), expect, **tol)
    torch.testing.assert_close(st.norms.float(), ref.norm(dim=-1), rtol=1e-4, atol=0)


@pytest.mark.parametrize("alignment", ["both", "stream"])
def test_gap_probe_on_lora_sgd_step(alignment):
    """GapProbe around an SGD step on the adapter only: the base does not move, dmu_update = <delta, reference
    gap> = lr * dmu_grad, over the adapter parameters."""
    model, tok = lora_model(seed=3)
    ro = sampled_rollout(model, tok, B=3, G=4, T=5, seed=4)
    params = select_params(model, "trainable")
    base0 = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    model.eval()
    ref = reference_gaps(model, ro, params)
    lr = 0.05
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    probe = GapProbe(model, "trainable", alignment=alignment)
    logp = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    policy_loss("grpo", logp, logp.detach(), ro.completion_mask, ro.rewards, max_completion_length=5).loss.backward()
    ascent = flat([-p.grad for p in params.values()])
    theta0 = flat([p.detach().clone() for p in params.values()])
    probe.before(Step(ro))
    kept = probe._pending.theta_k  # forward-mode / streamed routes evaluate there: only the adapter is copied
    live = dict(model.named_parameters())
    assert all((kept[n].data_ptr() == p.data_ptr()) == (not p.requires_grad) for n, p in live.items())
    opt.step()
    res = probe.after()
    delta = flat([p.detach() for p in params.values()]) - theta0
    assert float(delta.norm()) > 0
    assert all(torch.equal(p, base0[n]) for n, p in model.named_parameters() if not p.requires_grad)
    expect = ref @ delta
    tol = dict(rtol=1e-4, atol=1e-5 * float(expect.abs().max()))
    torch.testing.assert_close(res.dmu_update, expect, **tol)
    torch.testing.assert_close(res.dmu_grad, ref @ ascent, rtol=1e-4, atol=1e-5 * float((ref @ ascent).abs().max()))
    torch.testing.assert_close(res.dmu_update, lr * res.dmu_grad, **tol)
    if alignment == "both":
        assert res.metrics["gap/jvp_dot_maxdiff"] <= 1e-4 * float(expect.abs().max())


def test_callback_on_grpo_trainer_with_peft_config(tmp_path):
    """TRL wraps the model with the LoRA config itself: the callback probes the adapter weights only, and with
    SGD dmu_update = lr * dmu_grad per prompt (as on the full model, tests/test_llm_callback.py)."""
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from llm_probe.callback import GapProbeCallback

    model, tok = tiny("qwen2", seed=0)
    ds = Dataset.from_dict({"prompt": [f"{a}+{a + 3}=" for a in range(10, 30)]})

    def parity(prompts, completions, completion_ids=None, **kw):
        return [float(sum(c) % 2) for c in completion_ids]

    G, lr = 4, 0.05
    cb = GapProbeCallback(tok, num_generations=G, probe_every=1)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2 * G, num_generations=G,
                      max_completion_length=5, max_steps=2, learning_rate=lr, optim="sgd", lr_scheduler_type="constant",
                      use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False, logging_steps=1,
                      save_strategy="no", beta=0.0, seed=0, max_grad_norm=1e9, warmup_steps=0,
                      generation_kwargs={"suppress_tokens": [tok.pad_token_id]})
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, init_lora_weights=False)
    trainer = GRPOTrainer(model=model, reward_funcs=cb.wrap_reward(parity), args=args, train_dataset=ds,
                          processing_class=tok, peft_config=lora)
    cb.attach(trainer)
    trainer.train()
    assert cb.probe.params and all("lora_" in n for n in cb.probe.params)
    rows = [r for r in cb.history if r["gap/n_prompts"] > 0]
    assert rows  # not vacuous
    for r in rows:
        assert r["update_norm"] > 0
        d_u, d_g = torch.tensor(r["gap/dmu_update"]), torch.tensor(r["gap/dmu_grad"])
        torch.testing.assert_close(d_u, lr * d_g, rtol=2e-3, atol=1e-6)
