"""llm_probe.sampler (batched KV-cache sampler, shared-prompt scored forward) against the plain routes: the
model's own full forward (log-probs, gradients) and the plain sampling loop (tokens, distributions)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llm_probe.losses import policy_loss
from llm_probe.model import TinyQwenSpec, completion_logprobs
from llm_probe.rollout import NonFinitePolicyError, encode_prompts, make_rollout, sample_groups
from llm_probe.sampler import fast_completion_logprobs, supports_fast_path
from llm_probe.tasks import AdditionTask
from tests.llm_helpers import tiny

torch.set_num_threads(1)
CASES = [("qwen2", "float32", False), ("qwen3", "float32", True), ("qwen2", "float64", False)]


def _model(arch="qwen2", dtype="float32", tied=False, seed=0):
    from tests.llm_helpers import SMALL

    spec = TinyQwenSpec(**{**SMALL.__dict__, "tie_word_embeddings": tied})
    return tiny(arch, seed=seed, spec=spec, dtype=dtype)


def _prompts(tok, B=5, seed=0):
    probs = AdditionTask(lo=1, hi=999).sample(np.random.default_rng(seed), B)  # 4..8 characters: left padding
    return probs, *encode_prompts(tok, [p.prompt for p in probs])


def _kw(tok, **kw):
    return dict(eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, **kw)


@pytest.mark.parametrize("arch, dtype, tied", CASES)
def test_sampled_logprobs_equal_a_full_forward_and_tokens_equal_the_plain_loop(arch, dtype, tied):
    """The batched route's tokens = the plain loop's (same generator), its log-probs = the model's own full
    forward over the sampled sequences."""
    model, tok = _model(arch, dtype, tied)
    model.eval()
    assert supports_fast_path(model)
    _, ids, mask = _prompts(tok)
    kw = _kw(tok, G=4, max_new_tokens=6, temperature=1.3)
    fast = sample_groups(model, ids, mask, generator=torch.Generator().manual_seed(3), fast=True, **kw)
    plain = sample_groups(model, ids, mask, generator=torch.Generator().manual_seed(3), fast=False, **kw)
    assert torch.equal(fast.completion_ids, plain.completion_ids)
    assert torch.equal(fast.completion_mask, plain.completion_mask)
    assert torch.equal(fast.terminated, plain.terminated)
    assert (fast.completion_mask == 0).any() and fast.completion_mask.sum() > 10  # ended rows and live rows
    with torch.no_grad():
        ref = completion_logprobs(model, ids.repeat_interleave(4, 0), mask.repeat_interleave(4, 0),
                                  fast.completion_ids, fast.completion_mask)
    tol = 1e-5 if dtype == "float32" else 1e-6  # float64: HF's norms and softmax run in float32
    torch.testing.assert_close(fast.logp, ref.float(), rtol=0, atol=tol)
    torch.testing.assert_close(plain.logp, ref.float(), rtol=0, atol=tol)
    assert (fast.logp[fast.completion_mask == 0] == 0).all()


@pytest.mark.parametrize("arch, dtype, tied", CASES)
def test_shared_prompt_forward_gives_the_same_logprobs_and_gradients(arch, dtype, tied):
    """fast_completion_logprobs (each prompt run once for its G rows) = completion_logprobs: values, entropies,
    full log-distributions, and the gradient of a GRPO loss on the same batch (same batch -> same update)."""
    model, tok = _model(arch, dtype, tied)
    probs, _, _ = _prompts(tok, B=4, seed=1)
    ro = make_rollout(model, tok, AdditionTask(lo=1, hi=999), probs, G=4, max_new_tokens=5,
                      generator=torch.Generator().manual_seed(0))
    assert ro.texts == [tok.decode([t for t, k in zip(r, m) if k and t != tok.eos_token_id])
                        for r, m in zip(ro.completion_ids.tolist(), ro.completion_mask.tolist())]
    ro.rewards = (torch.rand(4, 4, generator=torch.Generator().manual_seed(2)) < 0.5).float()
    args = (ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    grads, outs = [], []
    for route in ("fast", "full"):
        model.zero_grad(set_to_none=True)
        out = (fast_completion_logprobs(model, *args, G=4, return_entropy=True) if route == "fast"
               else completion_logprobs(model, *args, return_entropy=True))
        res = policy_loss("grpo", out[0], out[0].detach(), ro.completion_mask, ro.rewards, max_completion_length=5)
        (res.loss + 0.1 * (out[1] * ro.completion_mask).sum()).backward()  # an entropy term reaches logp_all
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
        outs.append([o.detach() for o in out])
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == "float32" else dict(rtol=1e-6, atol=1e-7)
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, **tol)
    assert grads[1].abs().max() > 1e-3  # a gradient that can differ
    torch.testing.assert_close(grads[0], grads[1], **tol)


def _first_token_probs(model, ids, mask, tok, temperature):
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[0, -1].double()
    logits[tok.pad_token_id] = -float("inf")
    return torch.softmax(logits / temperature, -1).numpy()


def _pooled_table(a: np.ndarray, b: np.ndarray, min_count: int = 10) -> np.ndarray:
    """2 x K contingency table of two count vectors, categories with fewer than ``min_count`` pooled."""
    keep = (a + b) >= min_count
    table = np.stack([a[keep], b[keep]], axis=0)
    rest = np.array([[a[~keep].sum()], [b[~keep].sum()]])
    return np.concatenate([table, rest], axis=1) if rest.sum() else table


def test_token_distributions_match_the_plain_sampler_by_chi_square():
    """Fixed prompt, 3000 draws per route (independent seeds): the first generated token against the exact
    softmax (goodness of fit) for both routes, and the first and third positions of the batched route against
    the plain loop's (2 x K contingency tables). A wrong distribution (e.g. the temperature or the pad mask
    not applied, or a wrong position id) fails these at this size."""
    from scipy.stats import chi2_contingency, chisquare

    model, tok = _model(seed=4)
    model.eval()
    with torch.no_grad():  # spread the logits (a fresh model is near uniform): temperature and position matter
        model.lm_head.weight.mul_(25.0)
    ids, mask = encode_prompts(tok, ["12+7="])
    n, V, temp = 3000, len(tok), 1.5
    kw = _kw(tok, G=n, max_new_tokens=3, temperature=temp)
    fast = sample_groups(model, ids, mask, generator=torch.Generator().manual_seed(10), fast=True, **kw)
    plain = sample_groups(model, ids, mask, generator=torch.Generator().manual_seed(11), fast=False, **kw)
    p0 = _first_token_probs(model, ids, mask, tok, temp)
    for s in (fast, plain):
        counts = np.bincount(s.completion_ids[:, 0].numpy(), minlength=V)
        assert counts[p0 == 0].sum() == 0  # <pad> (probability 0) never drawn
        ok, small = p0 * n >= 5, (p0 > 0) & (p0 * n < 5)
        obs, exp = counts[ok], p0[ok] * n
        if small.any():
            obs, exp = np.append(obs, counts[small].sum()), np.append(exp, p0[small].sum() * n)
        assert chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3
    for t in (0, 2):
        a = np.bincount(fast.completion_ids[:, t].numpy(), minlength=V)
        b = np.bincount(plain.completion_ids[:, t].numpy(), minlength=V)
        assert chi2_contingency(_pooled_table(a, b)).pvalue > 1e-3, t
    # the same test sees a real difference: temperature 1 against 1.5 at the first token
    other = sample_groups(model, ids, mask, generator=torch.Generator().manual_seed(12), fast=True,
                          **_kw(tok, G=n, max_new_tokens=1, temperature=1.0))
    c = np.bincount(other.completion_ids[:, 0].numpy(), minlength=V)
    a = np.bincount(fast.completion_ids[:, 0].numpy(), minlength=V)
    assert chi2_contingency(_pooled_table(a, c)).pvalue < 1e-3


class _Wrapped(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, **kw):
        return self.model(**kw)


def test_other_models_take_the_plain_route_and_fast_true_refuses_them():
    """A wrapper or a forward hook sends sampling to the plain loop (same tokens); fast=True then is a
    ValueError; the shared-prompt forward needs prompt-major rows."""
    model, tok = _model()
    model.eval()
    _, ids, mask = _prompts(tok, B=3)
    kw = _kw(tok, G=2, max_new_tokens=4)
    ref = sample_groups(model, ids, mask, generator=torch.Generator().manual_seed(0), **kw)
    wrapped = _Wrapped(model)
    assert not supports_fast_path(wrapped)
    got = sample_groups(wrapped, ids, mask, generator=torch.Generator().manual_seed(0), **kw)
    assert torch.equal(got.completion_ids, ref.completion_ids)
    with pytest.raises(ValueError, match="fast=True"):
        sample_groups(wrapped, ids, mask, generator=torch.Generator(), fast=True, **kw)
    h = model.lm_head.register_forward_hook(lambda m, i, o: o)
    try:
        assert not supports_fast_path(model)
    finally:
        h.remove()
    assert supports_fast_path(model)
    N = ids.shape[0] * 2
    c = torch.ones(N, 2, dtype=torch.long) * 3
    with pytest.raises(ValueError, match="prompt_ids must repeat"):
        fast_completion_logprobs(model, ids.repeat(2, 1), mask.repeat(2, 1), c, torch.ones(N, 2), G=2)
    with pytest.raises(ValueError, match="G must"):
        sample_groups(model, ids, mask, generator=torch.Generator(), **{**kw, "G": 0})


def test_a_non_finite_policy_is_reported_by_the_batched_route():
    model, tok = _model()
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    _, ids, mask = _prompts(tok, B=2)
    with pytest.raises(NonFinitePolicyError, match="position 0"):
        sample_groups(model, ids, mask, generator=torch.Generator(), fast=True, **_kw(tok, G=2, max_new_tokens=3))


def test_logprobs_without_the_entropy_are_the_same_tensors():
    """return_all=True gives (logp, logp_all) of return_entropy=True, bit for bit, without the entropy."""
    torch.manual_seed(0)
    model, tok = tiny()
    ids = torch.randint(3, len(tok), (8, 7))
    pm, cm = torch.ones(8, 4, dtype=torch.long), torch.ones(8, 3)
    full = fast_completion_logprobs(model, ids[:, :4], pm, ids[:, 4:], cm, G=1, return_entropy=True)
    part = fast_completion_logprobs(model, ids[:, :4], pm, ids[:, 4:], cm, G=1, return_all=True)
    assert len(part) == 2 and torch.equal(part[0], full[0]) and torch.equal(part[1], full[2])
