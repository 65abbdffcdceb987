"""Probe identities on the tiny model, each against an independent route:
gap = difference of separately computed per-sequence gradients (loop) and, for the LM head, the closed form
(e_y - pi) h^T; JVP alignment = explicit dot product; with tied and untied embeddings, gaps and JVPs = one
backward per sequence on a copy without ``padding_idx`` (the plain gradient of the function), on rollouts whose
sampler is pushed towards <pad>; float64 with left padding = each row alone; a small SGD step changes
Phi_hat_q by eta * dmu_q to first order (residual O(eta^2)); token bins/gradient mass vs gapdyn's numpy
taxonomy and a closed form."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

from gapdyn.theory.taxonomy import token_step_effects
from llm_probe.losses import policy_loss
from llm_probe.model import completion_logprobs
from llm_probe.step_hook import Step
from llm_probe.probes import (
    GRADMASS_NAMES,
    dot_alignment,
    flat,
    jvp_alignment,
    mixed_groups,
    per_prompt_gaps,
    per_prompt_gaps_batched,
    prompt_objectives,
    select_params,
    token_stats,
)
from tests.llm_helpers import reference_gaps, sampled_rollout, tiny, without_padding_idx

pytestmark = pytest.mark.llm


ROUTES = {"vmap": partial(per_prompt_gaps, vectorize=True, chunk=1),  # one group per chunk: 2 chunks
          "loop": partial(per_prompt_gaps, vectorize=False), "batched": per_prompt_gaps_batched}


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_gap_equals_difference_of_per_sequence_gradients(arch, route):
    model, tok = tiny(arch, seed=1)
    ro = sampled_rollout(model, tok, B=3, G=4, T=5, seed=0)
    ro.rewards[1] = 0.0  # one group without winners: not a mixed group
    params = select_params(model, "all")
    est = ROUTES[route](model, ro, params)
    assert est.groups.tolist() == [0, 2]
    torch.testing.assert_close(est.gaps, reference_gaps(model, ro, params), rtol=1e-4, atol=1e-5)
    assert torch.all(est.norms > 0)


@pytest.mark.parametrize("vectorize", [True, False])
@pytest.mark.parametrize("subset", ["all", "lm_head"])
def test_per_group_route_equals_batched_route(subset, vectorize):
    """per_prompt_gaps (one fwd+bwd per group) == per_prompt_gaps_batched (one backward per prompt through the
    whole batch): gaps, Phi_hat and counts, on a batch with left-padded prompts of different lengths."""
    from llm_probe.rollout import make_rollout
    from llm_probe.tasks import AdditionTask, Problem

    model, tok = tiny(seed=3)
    probs = [Problem("5+3=", "8"), Problem("95+66=", "161"), Problem("7+12=", "19"), Problem("40+4=", "44")]
    ro = make_rollout(model, tok, AdditionTask(), probs, G=4, max_new_tokens=5,
                      generator=torch.Generator().manual_seed(7))
    ro.rewards = torch.tensor([[1.0, 0, 0, 1], [0, 1, 0, 0], [1, 1, 1, 1], [1, 0, 1, 0]])  # group 2: not mixed
    params = select_params(model, subset)
    a = per_prompt_gaps(model, ro, params, vectorize=vectorize, chunk=2)  # 3 mixed groups: chunks of 2 and 1
    b = per_prompt_gaps_batched(model, ro, params)
    assert a.groups.tolist() == b.groups.tolist() and 2 not in a.groups.tolist()
    torch.testing.assert_close(a.gaps, b.gaps, rtol=1e-4, atol=1e-5 * float(b.gaps.abs().max()))
    torch.testing.assert_close(a.phi, b.phi, rtol=1e-5, atol=1e-5)
    assert a.n_pos.tolist() == b.n_pos.tolist() and a.n_neg.tolist() == b.n_neg.tolist()
    assert float(b.gaps.abs().max()) > 0
    assert ro.prompt_mask.min() == 0  # the batch does hold left padding


def test_head_gap_matches_closed_form():
    """LM head: grad_W log pi(y_t) = (e_{y_t} - pi_t) h_t^T (softmax-regression gradient), summed over tokens."""
    model, tok = tiny(seed=2)
    ro = sampled_rollout(model, tok, B=2, G=4, T=5, seed=3)
    head = select_params(model, "lm_head")
    assert list(head) == ["lm_head.weight"]
    est = per_prompt_gaps(model, ro, head)
    ids = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
    attn = torch.cat([ro.prompt_mask, ro.completion_mask.long()], 1)
    from llm_probe.model import position_ids_from_mask

    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn), output_hidden_states=True)
    T = ro.completion_ids.shape[1]
    h = out.hidden_states[-1][:, -T - 1:-1, :]  # [N, T, d] final-norm hidden states
    pi = torch.softmax(out.logits[:, -T - 1:-1, :], -1)
    e = torch.nn.functional.one_hot(ro.completion_ids, pi.shape[-1]).float()
    per_seq = torch.einsum("ntv,ntd->nvd", (e - pi) * ro.completion_mask[..., None], h)  # [N, V, d]
    for q, b in enumerate(est.groups.tolist()):
        r = ro.rewards[b]
        s = per_seq[b * ro.G:(b + 1) * ro.G]
        ref = s[r > 0].mean(0) - s[r <= 0].mean(0)
        torch.testing.assert_close(est.gaps[q], ref.reshape(-1), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("subset", ["all", "lm_head", r"layers\.1\."])
def test_jvp_alignment_equals_dot_product(subset):
    model, tok = tiny(seed=5)
    ro = sampled_rollout(model, tok, B=3, G=4, T=5, seed=4)
    params = select_params(model, subset)
    est = per_prompt_gaps(model, ro, params)
    g = torch.Generator().manual_seed(0)
    v = {k: torch.randn(p.shape, generator=g) for k, p in params.items()}
    j = jvp_alignment(model, ro, est.groups, {k: p.detach() for k, p in params.items()}, v)
    d = dot_alignment(est.gaps, flat(v))
    torch.testing.assert_close(j, d, rtol=1e-4, atol=1e-4 * float(d.abs().max()))
    # several directions in one vmap'd pass: row k == the dot product with direction k
    v2 = {k: torch.randn(p.shape, generator=g) for k, p in params.items()}
    jj = jvp_alignment(model, ro, est.groups, {k: p.detach() for k, p in params.items()}, [v, v2])
    dd = torch.stack([d, dot_alignment(est.gaps, flat(v2))])
    assert jj.shape == (2, len(est.groups))
    torch.testing.assert_close(jj, dd, rtol=1e-4, atol=1e-4 * float(dd.abs().max()))


class _PadLover(torch.nn.Module):
    """The model with its <pad> logit raised by 6 (an unmasked sampler would then emit <pad> often) and its
    <eos> logit by 2 (so some rows end early and are padded)."""

    def __init__(self, model, pad_id, eos_id):
        super().__init__()
        self.model, self.pad_id, self.eos_id = model, pad_id, eos_id

    def forward(self, **kw):
        out = self.model(**kw)
        out.logits[..., self.pad_id] += 6.0
        out.logits[..., self.eos_id] += 2.0
        return out


def _pad_pushed_rollout(model, tok, *, B=3, G=4, T=5, seed=0):
    from llm_probe.rollout import Rollout, encode_prompts, sample_completions
    from llm_probe.tasks import AdditionTask

    probs = AdditionTask().sample(np.random.default_rng(seed), B)
    p_ids, p_mask = encode_prompts(tok, [p.prompt for p in probs])
    p_ids, p_mask = p_ids.repeat_interleave(G, 0), p_mask.repeat_interleave(G, 0)
    c_ids, c_mask, term = sample_completions(_PadLover(model, tok.pad_token_id, tok.eos_token_id), p_ids, p_mask, max_new_tokens=T,
                                             eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                                             generator=torch.Generator().manual_seed(seed))
    rewards = (torch.rand(B, G, generator=torch.Generator().manual_seed(seed + 1)) < 0.5).float()
    rewards[:, 0], rewards[:, 1] = 1.0, 0.0
    return Rollout(probs, p_ids, p_mask, c_ids, c_mask, term, [""] * (B * G), rewards)


def _reference_gaps(model, ro, names):
    """:func:`reference_gaps` on a padding_idx-free copy of ``model`` (over the parameters ``names``)."""
    ref = without_padding_idx(model)
    return reference_gaps(ref, ro, {n: p for n, p in ref.named_parameters() if n in names})


@pytest.mark.parametrize("arch, tied", [("qwen2", False), ("qwen2", True), ("qwen3", False), ("qwen3", True)])
def test_gaps_and_jvp_exact_with_tied_or_untied_embeddings(arch, tied):
    """per_prompt_gaps (vmap and loop) and jvp_alignment along two random directions = the padding_idx-free
    per-sequence reference, on completions from a sampler pushed towards <pad> (which it must never emit)."""
    from llm_probe.model import TinyQwenSpec
    from tests.llm_helpers import SMALL

    model, tok = tiny(arch, seed=5, spec=TinyQwenSpec(**{**SMALL.__dict__, "tie_word_embeddings": tied}))
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    ro = _pad_pushed_rollout(model, tok)
    pad = tok.pad_token_id
    assert not ((ro.completion_ids == pad) & (ro.completion_mask > 0)).any(), "the sampler emitted <pad>"
    assert ((ro.completion_ids == pad) & (ro.completion_mask == 0)).any()  # padding after <eos> still exists
    params = select_params(model, "all")
    ref = _reference_gaps(model, ro, set(params))
    scale = float(ref.abs().max())
    for vectorize in (True, False):
        est = per_prompt_gaps(model, ro, params, vectorize=vectorize)
        torch.testing.assert_close(est.gaps, ref, rtol=1e-4, atol=1e-5 * scale)
    g = torch.Generator().manual_seed(0)
    vs = [{k: torch.randn(p.shape, generator=g) for k, p in params.items()} for _ in range(2)]
    jj = jvp_alignment(model, ro, est.groups, {k: p.detach() for k, p in params.items()}, vs)
    dd = torch.stack([ref @ flat(v) for v in vs])
    torch.testing.assert_close(jj, dd, rtol=1e-4, atol=1e-4 * float(dd.abs().max()))


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_float64_left_padding_equals_each_row_alone(arch):
    """A float64 batch with left-padded prompts: finite log-probs equal to each row scored without padding."""
    from llm_probe.rollout import make_rollout
    from llm_probe.tasks import AdditionTask, Problem

    model, tok = tiny(arch, seed=3, dtype="float64")
    probs = [Problem("5+3=", "8"), Problem("95+66=", "161")]
    ro = make_rollout(model, tok, AdditionTask(), probs, G=2, max_new_tokens=4,
                      generator=torch.Generator().manual_seed(7))
    assert ro.prompt_mask.min() == 0
    lp = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    assert lp.dtype == torch.float64 and torch.isfinite(lp).all()
    for n in range(len(lp)):
        keep = ro.prompt_mask[n] > 0
        alone = completion_logprobs(model, ro.prompt_ids[n:n + 1, keep], ro.prompt_mask[n:n + 1, keep],
                                    ro.completion_ids[n:n + 1], ro.completion_mask[n:n + 1])
        torch.testing.assert_close(lp[n:n + 1], alone, rtol=1e-10, atol=1e-12)


def test_first_order_change_of_log_odds_proxy():
    """Phi_hat_q(theta - eta grad L) - Phi_hat_q(theta) = eta dmu_q + O(eta^2), dmu_q = <-grad L, g_q>
    (float64; the residual ratio between eta and eta/2 is ~4)."""
    model, tok = tiny(seed=6, dtype="float64")
    ro = sampled_rollout(model, tok, B=3, G=4, T=5, seed=5)
    params = select_params(model, "all")
    logp = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    loss = policy_loss("grpo", logp, logp.detach(), ro.completion_mask, ro.rewards, max_completion_length=5).loss
    grad = torch.autograd.grad(loss, list(params.values()))
    est = per_prompt_gaps(model, ro, params)
    dmu = est.gaps.double() @ flat([-g.double() for g in grad]).double()
    theta0 = [p.detach().clone() for p in params.values()]
    residuals = []
    for eta in (2e-3, 1e-3):
        with torch.no_grad():
            for p, t0, g in zip(params.values(), theta0, grad):
                p.copy_(t0 - eta * g)
            phi1 = prompt_objectives(model, ro, est.groups).double()
            for p, t0 in zip(params.values(), theta0):
                p.copy_(t0)
        dphi = phi1 - est.phi.double()
        torch.testing.assert_close(dphi, eta * dmu, rtol=0.05, atol=1e-9)
        residuals.append((dphi - eta * dmu).abs())
    ratio = residuals[0] / residuals[1]
    assert torch.all((ratio > 3.0) & (ratio < 5.0)), ratio


def test_token_stats_bins_and_gradient_mass():
    model, tok = tiny(seed=7)
    ro = sampled_rollout(model, tok, B=3, G=4, T=5, seed=6)
    logp, ent, logp_all = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                              ro.completion_mask, return_entropy=True)
    res = policy_loss("grpo", logp, logp.detach(), ro.completion_mask, ro.rewards, max_completion_length=5)
    dl = torch.autograd.grad(res.loss, logp)[0]
    st = token_stats(logp_all.detach(), ro.completion_ids, ro.completion_mask, res.advantages, dl)
    m = (ro.completion_mask > 0).numpy()
    # bins from gapdyn's numpy taxonomy (an independent implementation on float64 logits)
    z = torch.log_softmax(logp_all.detach(), -1).double().numpy()
    A = np.broadcast_to(res.advantages.numpy()[:, None], m.shape)
    eff = token_step_effects(z, ro.completion_ids.numpy(), A, 1.0)
    for i, name in enumerate(("pos_peak", "pos_valley", "neg_peak", "neg_valley")):
        assert st[f"taxonomy/{name}"] == int(((eff.bin == i) & m).sum())
    assert sum(st[f"taxonomy/{n}"] for n in ("pos_peak", "pos_valley", "neg_peak", "neg_valley")) == int(
        (m & (A != 0)).sum())
    # gradient mass, closed form for grpo aggregation: |dl/dz_s| = |A_i| (1 - p_s) / (N |o_i|)
    N = m.shape[0]
    p_s = np.exp(logp.detach().numpy())
    lens = m.sum(1, keepdims=True)
    mass = np.abs(A) * (1 - p_s) / (N * lens) * m
    edges = [0, .01, .1, .25, .5, 1.0000001]
    for j, name in enumerate(GRADMASS_NAMES):
        sel = (p_s >= edges[j]) & (p_s < edges[j + 1])
        assert abs(st[name] - mass[sel].sum()) < 1e-6
    assert abs(st["entropy"] - float(ent.detach()[ro.completion_mask > 0].mean())) < 1e-6


def test_select_params_and_mixed_groups_errors():
    model, _ = tiny()
    with pytest.raises(ValueError, match="selects no trainable parameter"):
        select_params(model, "no_such_param")
    r = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.0, 1.0]])
    assert mixed_groups(r).tolist() == [0, 3]


@pytest.mark.parametrize("tied", [False, True])
def test_gap_probe_around_an_adam_step(tied):
    """GapProbe.before/after around a real Adam step: dmu_update = <theta_{k+1} - theta_k, reference gap>,
    dmu_grad = <-grad L, reference gap>, M_batch = mean [dmu]_+, and the forward-mode route, evaluated at
    theta_k after the weights moved, agrees (gap/jvp_dot_maxdiff), with tied and untied embeddings."""
    from llm_probe.gap_probe import GapProbe
    from llm_probe.model import TinyQwenSpec
    from tests.llm_helpers import SMALL

    model, tok = tiny("qwen2", seed=4, spec=TinyQwenSpec(**{**SMALL.__dict__, "tie_word_embeddings": tied}))
    ro = sampled_rollout(model, tok, B=3, G=4, T=5, seed=2)
    params = select_params(model, "all")
    ref = _reference_gaps(model, ro, set(params))  # at theta_k
    probe = GapProbe(model, "all", alignment="both")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    logp = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    policy_loss("grpo", logp, logp.detach(), ro.completion_mask, ro.rewards, max_completion_length=5).loss.backward()
    ascent = flat([-p.grad for p in params.values()])
    theta0 = flat([p.detach().clone() for p in params.values()])
    probe.before(Step(ro))
    opt.step()
    res = probe.after()
    delta = flat([p.detach() for p in params.values()]) - theta0
    expect = ref @ delta
    assert float(delta.norm()) > 0 and res.update_norm == pytest.approx(float(delta.norm()), rel=1e-5)
    torch.testing.assert_close(res.dmu_update, expect, rtol=1e-4, atol=1e-4 * float(expect.abs().max()))
    torch.testing.assert_close(res.dmu_grad, ref @ ascent, rtol=1e-4, atol=1e-4 * float((ref @ ascent).abs().max()))
    assert res.metrics["gap/jvp_dot_maxdiff"] <= 1e-4 * float(expect.abs().max())
    assert res.metrics["gap/M_batch"] == pytest.approx(float(expect.clamp(min=0).mean()), rel=1e-4, abs=1e-9)
    assert not probe.pending


@pytest.mark.parametrize("tied", [False, True])
def test_streamed_route_equals_gap_matrix_route(tied):
    """streamed_gap_stats (one gap at a time, reduced at once) = per_prompt_gaps + dot products: Phi_hat, norms,
    dots along two directions and the mean gap; then GapProbe around one Adam step with batch and probe prompts:
    "stream", and "dot" switched to streaming by max_gap_bytes=0, log the dot route's numbers."""
    from llm_probe.gap_probe import GapProbe
    from llm_probe.model import TinyQwenSpec
    from llm_probe.probes import gap_matrix_bytes, streamed_gap_stats
    from tests.llm_helpers import SMALL

    model, tok = tiny("qwen2", seed=6, spec=TinyQwenSpec(**{**SMALL.__dict__, "tie_word_embeddings": tied}))
    ro = sampled_rollout(model, tok, B=3, G=4, T=5, seed=3)
    ro.rewards[1] = 1.0  # not mixed
    params = select_params(model, "all")
    est = per_prompt_gaps(model, ro, params)
    g = torch.Generator().manual_seed(1)
    vs = {d: {k: torch.randn(p.shape, generator=g) for k, p in params.items()} for d in ("a", "b")}
    st = streamed_gap_stats(model, ro, params, vs, mean_gap=True)
    assert st.groups.tolist() == est.groups.tolist() == [0, 2]
    assert gap_matrix_bytes(2, params) == est.gaps.numel() * est.gaps.element_size()
    torch.testing.assert_close(st.phi, est.phi)
    torch.testing.assert_close(st.norms.float(), est.norms, rtol=1e-5, atol=0)
    for d, v in vs.items():
        ref = dot_alignment(est.gaps, flat(v))
        torch.testing.assert_close(st.dots[d].float(), ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    torch.testing.assert_close(flat(st.mean_gap), est.gaps.mean(0), rtol=1e-5, atol=1e-7)

    probe_ro = sampled_rollout(model, tok, B=2, G=4, T=5, seed=9)
    probes = {"dot": GapProbe(model, alignment="dot", n_probe_prompts=2, max_gap_bytes=None),
              "stream": GapProbe(model, alignment="stream", n_probe_prompts=2),
              "auto": GapProbe(model, alignment="dot", n_probe_prompts=2, max_gap_bytes=0)}
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    logp = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    policy_loss("grpo", logp, logp.detach(), ro.completion_mask, ro.rewards, max_completion_length=5).loss.backward()
    for p in probes.values():
        p.before(Step(ro, probe_ro=probe_ro))
    assert probes["auto"]._pending.stream and not probes["dot"]._pending.stream
    opt.step()
    res = {k: p.after() for k, p in probes.items()}
    ref = res["dot"]
    for k in ("stream", "auto"):
        scale = float(ref.dmu_update.abs().max())
        torch.testing.assert_close(res[k].dmu_update, ref.dmu_update, rtol=1e-5, atol=1e-5 * scale)
        gscale = float(ref.dmu_grad.abs().max())
        torch.testing.assert_close(res[k].dmu_grad, ref.dmu_grad, rtol=1e-5, atol=1e-5 * gscale)
        torch.testing.assert_close(res[k].gap_norms.float(), ref.gap_norms, rtol=1e-5, atol=0)
        assert res[k].metrics.keys() == ref.metrics.keys()
        for m, v in ref.metrics.items():
            assert res[k].metrics[m] == pytest.approx(v, rel=1e-4, abs=1e-6 * scale), m
        for a, b in zip(res[k].prompts, ref.prompts):
            assert a["dmu_update"] == pytest.approx(b["dmu_update"], rel=1e-4, abs=1e-6 * scale)
