"""Our registered losses vs TRL's own ``GRPOTrainer._compute_loss`` (called on a minimal stand-in object)
and vs loop re-implementations of the WAPO/aggregation formulas (docs/theory.md §9.2, TRL 1.16 conventions)."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")
from tests.llm_helpers import sampled_rollout, tiny  # noqa: E402

from llm_probe.losses import LOSS_NAMES, aggregate, compute_advantages, policy_loss  # noqa: E402
from llm_probe.model import completion_logprobs  # noqa: E402

pytestmark = pytest.mark.llm


class _Acc:
    num_processes = 1
    is_main_process = True

    def autocast(self):
        return contextlib.nullcontext()

    def reduce(self, x, reduction="sum"):
        return x

    def gather(self, x):
        return x

    gather_for_metrics = gather


def _trl_stub(model, loss_type, *, eps_low, eps_high, level, max_len):
    from trl import GRPOTrainer

    stub = SimpleNamespace(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level=level, beta=0.0,
        loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high,
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        use_vllm=False, vllm_importance_sampling_correction=False, model=model, current_gradient_accumulation_steps=1,
        max_completion_length=max_len, accelerator=_Acc(), _entropy_bonus_enabled=False, aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    stub._get_per_token_logps_and_entropies = GRPOTrainer._get_per_token_logps_and_entropies.__get__(stub)
    return stub, GRPOTrainer._compute_loss.__get__(stub)


@pytest.mark.parametrize("name,loss_type,level", [("grpo", "grpo", "token"), ("dapo", "dapo", "token"),
                                                  ("dr_grpo", "dr_grpo", "token"), ("bnpo", "bnpo", "token"),
                                                  ("gspo", "grpo", "sequence")])
def test_loss_and_gradient_equal_trl(name, loss_type, level):
    """Same batch, same advantages rule: value and every parameter gradient equal TRL's real code."""
    import copy

    from trl.trainer.utils import add_fused_lm_head

    from llm_probe.losses import LOSSES

    model, tok = tiny(seed=3)
    model.train()
    ro = sampled_rollout(model, tok, B=3, G=4, T=5, seed=1)
    ro.rewards[2] = 1.0  # one all-equal group (zero advantage)
    spec = LOSSES[name]
    T = ro.completion_ids.shape[1]
    # ours
    logp = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    ours = policy_loss(name, logp, logp.detach(), ro.completion_mask, ro.rewards, max_completion_length=T)
    g_ours = torch.autograd.grad(ours.loss, list(model.parameters()))
    # TRL: its advantage rule is (r - mean) / (std_bessel + 1e-4) ("group"), or r - mean ("none", Dr. GRPO)
    r = ro.rewards
    adv_trl = r - r.mean(-1, keepdim=True)
    if name != "dr_grpo":
        adv_trl = adv_trl / (r.std(-1, keepdim=True) + 1e-4)
    torch.testing.assert_close(ours.advantages, adv_trl.reshape(-1), rtol=1e-6, atol=1e-6)
    trl_model = copy.deepcopy(model)
    add_fused_lm_head(trl_model, temperature=1.0, outputs=("log_probs", "entropy"))
    stub, compute = _trl_stub(trl_model, loss_type, eps_low=spec.eps_low, eps_high=spec.eps_high, level=level, max_len=T)
    inputs = {"prompt_ids": ro.prompt_ids, "prompt_mask": ro.prompt_mask, "completion_ids": ro.completion_ids,
              "completion_mask": ro.completion_mask.long(), "advantages": adv_trl.reshape(-1),
              "num_items_in_batch": ro.completion_mask.sum()}
    theirs = compute(trl_model, inputs)
    g_theirs = torch.autograd.grad(theirs, list(trl_model.parameters()))
    torch.testing.assert_close(ours.loss, theirs, rtol=1e-5, atol=1e-7)
    gnorm = torch.sqrt(sum((g ** 2).sum() for g in g_ours))
    assert gnorm > 1e-3
    for a, b in zip(g_ours, g_theirs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # TRL's entropy metric equals our token-mean entropy
    _, ent, _ = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                    return_entropy=True)
    m = ro.completion_mask > 0
    assert abs(stub._metrics["train"]["entropy"][0] - float(ent.detach()[m].mean())) < 1e-5


def test_off_policy_clip_equals_trl():
    """With a perturbed old_logp (ratio != 1) the clipped dapo loss and clip ratios still equal TRL's."""
    import copy

    from trl.trainer.utils import add_fused_lm_head

    model, tok = tiny(seed=4)
    ro = sampled_rollout(model, tok, B=2, G=4, T=5, seed=2)
    T = ro.completion_ids.shape[1]
    logp = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    old = (logp.detach() + 0.4 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(0))) * ro.completion_mask
    ours = policy_loss("dapo", logp, old, ro.completion_mask, ro.rewards, max_completion_length=T)
    trl_model = copy.deepcopy(model)
    add_fused_lm_head(trl_model, temperature=1.0, outputs=("log_probs", "entropy"))
    stub, compute = _trl_stub(trl_model, "dapo", eps_low=0.2, eps_high=0.28, level="token", max_len=T)
    inputs = {"prompt_ids": ro.prompt_ids, "prompt_mask": ro.prompt_mask, "completion_ids": ro.completion_ids,
              "completion_mask": ro.completion_mask.long(), "advantages": ours.advantages,
              "num_items_in_batch": ro.completion_mask.sum(), "old_per_token_logps": old}
    theirs = compute(trl_model, inputs)
    torch.testing.assert_close(ours.loss, theirs, rtol=1e-5, atol=1e-7)
    for a, b in zip(torch.autograd.grad(ours.loss, list(model.parameters())),
                    torch.autograd.grad(theirs, list(trl_model.parameters()))):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    for k in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        assert abs(ours.metrics[k] - stub._metrics["train"][k][0]) < 1e-6
    assert ours.metrics["clip_ratio/region_mean"] > 0


def test_wapo_loss_matches_loop_formula():
    """WAPO: sum over winners' tokens of -A min(r, 10) / (K * L) / G+ (docs/theory.md §9.2), loop reference."""
    g = torch.Generator().manual_seed(0)
    B, G, T = 4, 4, 6
    rewards = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
    logp = -torch.rand(B * G, T, generator=g).requires_grad_()
    old = -torch.rand(B * G, T, generator=g)
    old[0] = logp.detach()[0] - 3.0  # ratio e^3 > 10: clipped
    mask = (torch.rand(B * G, T, generator=g) > 0.2).float()
    res = policy_loss("wapo", logp, old, mask, rewards, max_completion_length=T)
    total, n_win = 0.0, 0
    for b in range(B):
        r = rewards[b]
        A = r - r.mean()
        if (A > 0).any():
            n_win += 1
        for i in range(G):
            if A[i] <= 0:
                continue
            n = b * G + i
            for t in range(T):
                if mask[n, t]:
                    ratio = torch.exp(logp[n, t] - old[n, t])
                    total = total - A[i] * torch.clamp(ratio, max=10.0) / (G * T)
    ref = total / max(n_win, 1)
    torch.testing.assert_close(res.loss, ref)
    ga = torch.autograd.grad(res.loss, logp, retain_graph=True)[0]
    gb = torch.autograd.grad(ref, logp)[0]
    torch.testing.assert_close(ga, gb)
    assert torch.all(ga[0] == 0)  # the clipped row carries no gradient
    assert torch.all(ga[2 * G: 4 * G] == 0)  # all-equal groups give nothing


@pytest.mark.parametrize("mode,alias", [("grpo", "seq-mean-token-mean"), ("bnpo", "token-mean"),
                                        ("dr_grpo", "seq-mean-token-sum-norm")])
def test_verl_aliases(mode, alias):
    g = torch.Generator().manual_seed(1)
    x, m = torch.randn(5, 7, generator=g), (torch.rand(5, 7, generator=g) > 0.3).float()
    a = aggregate(x, m, mode, max_completion_length=7)
    b = aggregate(x, m, alias, max_completion_length=7)
    assert a == b
    ref = {"grpo": sum((x[i] * m[i]).sum() / m[i].sum() for i in range(5)) / 5, "bnpo": (x * m).sum() / m.sum(),
           "dr_grpo": (x * m).sum() / 35}[mode]
    torch.testing.assert_close(a, ref)


def test_psr_nsr_w_reinforce_advantages():
    r = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    assert compute_advantages("psr", r).tolist() == [[1, 0, 1, 0]]
    assert compute_advantages("nsr", r).tolist() == [[0, -1, 0, -1]]
    torch.testing.assert_close(compute_advantages("w_reinforce", r), torch.tensor([[0.1, -1.0, 0.1, -1.0]]))


def test_bad_inputs_raise():
    x = torch.zeros(4, 3)
    with pytest.raises(ValueError, match="loss must be one of"):
        policy_loss("ppo", x, x, x, torch.zeros(2, 2), max_completion_length=3)
    with pytest.raises(ValueError, match="rewards must be"):
        policy_loss("grpo", x, x, x, torch.zeros(3, 2), max_completion_length=3)
    with pytest.raises(ValueError, match="mode must be one of"):
        aggregate(x, x, "mean")
    assert set(LOSS_NAMES) >= {"grpo", "dr_grpo", "dapo", "gspo", "wapo", "psr", "nsr", "w_reinforce"}


def test_shape_mismatch_and_empty_batch_raise():
    lp = torch.zeros(4, 3)
    with pytest.raises(ValueError, match="share one"):
        policy_loss("grpo", torch.zeros(4, 4), lp, lp, torch.zeros(2, 2), max_completion_length=3)
    with pytest.raises(ValueError, match="share one"):
        policy_loss("grpo", lp, lp, torch.ones(4, 5), torch.zeros(2, 2), max_completion_length=3)
    with pytest.raises(ValueError, match="empty batch"):
        policy_loss("grpo", torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0, 2),
                    max_completion_length=3)
