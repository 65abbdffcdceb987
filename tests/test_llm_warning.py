"""Machinery of the early-warning and entropy-mechanics statistics (llm_probe.warning, .entropy; the benchmark
itself, llm_probe.experiments.early_warning, is tests/test_llm_early_warning.py):
each statistic against an independent route (loop, autograd, constructed streams with a known answer)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_probe.experiments.entropy import mechanism_fit
from llm_probe.model import completion_logprobs
from llm_probe.warning import (
    group_curvature,
    logp_adv_covariance,
    sequence_logp_change,
    signed_cumulative_alignment,
    step_warning_metrics,
)
from tests.llm_helpers import sampled_rollout, tiny


@settings(max_examples=40, deadline=None)
@given(N=st.integers(1, 6), T=st.integers(1, 5), seed=st.integers(0, 10_000))
def test_covariance_matches_a_loop_over_tokens(N, T, seed):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(N, T, generator=g, dtype=torch.float64) * 3
    mask = (torch.rand(N, T, generator=g) < 0.7).double()
    adv = torch.randn(N, generator=g, dtype=torch.float64)
    pairs = [(float(logp[i, t]), float(adv[i])) for i in range(N) for t in range(T) if mask[i, t] > 0]
    got = logp_adv_covariance(logp, adv, mask)
    if not pairs:
        assert np.isnan(got)
        return
    lm = sum(p[0] for p in pairs) / len(pairs)
    am = sum(p[1] for p in pairs) / len(pairs)
    want = sum((lv - lm) * (av - am) for lv, av in pairs) / len(pairs)
    assert got == pytest.approx(want, rel=1e-10, abs=1e-12)


def test_covariance_rejects_bad_shapes():
    with pytest.raises(ValueError, match="advantages"):
        logp_adv_covariance(torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="mask"):
        logp_adv_covariance(torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 2))


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 4), G=st.integers(2, 5), seed=st.integers(0, 10_000))
def test_group_curvature_matches_numpy_loop(B, G, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=B * G)
    r = (rng.random((B, G)) < 0.5).astype(float)
    got = group_curvature(torch.tensor(x), torch.tensor(r))
    gaps, wmax = [], []
    for b in range(B):
        xb, rb = x[b * G:(b + 1) * G], r[b]
        if rb.min() == rb.max():
            continue
        gaps.append(np.var(xb[rb == 0]) - np.var(xb[rb == 1]))
        wmax.append(float(rb[np.argmax(xb)] == 0))
    if not gaps:
        assert np.isnan(got["warn/curv_gap"])
        return
    assert got["warn/curv_gap"] == pytest.approx(np.mean(gaps), rel=1e-10, abs=1e-12)
    assert got["warn/wrong_max_frac"] == pytest.approx(np.mean(wmax))


def test_x_forward_route_matches_autograd_directional_derivative():
    """x_i = log pi_{theta+eps u}(o_i) - log pi_theta(o_i) (forward route) against eps <s(o_i), u> (autograd, one
    backward per completion): relative error O(eps), and the residual quadruples when eps doubles (float64)."""
    torch.manual_seed(0)
    model, tok = tiny(dtype="float64")
    model.eval()
    ro = sampled_rollout(model, tok, B=2, G=3, T=4)
    params = [p for p in model.parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(3)
    u = [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in params]
    logp0 = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    seq = logp0.sum(-1)
    grad_dir = torch.stack([sum((gi * ui).sum() for gi, ui in zip(torch.autograd.grad(seq[i], params,
                                                                                          retain_graph=True), u))
                            for i in range(seq.shape[0])]).detach()
    residual = []
    for eps in (5e-5, 1e-4):  # the residual must dominate the norms' float32 rounding (~1e-7)
        with torch.no_grad():
            for p, ui in zip(params, u):
                p.add_(eps * ui)
        x = sequence_logp_change(model, ro, logp0.detach())
        with torch.no_grad():
            for p, ui in zip(params, u):
                p.sub_(eps * ui)
        residual.append(float((x - eps * grad_dir).abs().max()))
        assert torch.allclose(x, eps * grad_dir, rtol=0.1, atol=1e-9)
    assert 3.0 < residual[1] / residual[0] < 5.0


def test_step_metrics_keys_and_same_completion_entropy():
    """After a zero update, dH on the same completions and every x_i are exactly 0."""
    model, tok = tiny(dtype="float64")
    ro = sampled_rollout(model, tok, B=2, G=4, T=4)
    logp, _, logp_all = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                            ro.completion_mask, return_entropy=True)
    adv = torch.randn(ro.B * ro.G, dtype=torch.float64)
    m = step_warning_metrics(model, ro, logp.detach(), logp_all.detach(), adv, torch.ones_like(logp), after=True)
    # theta_{k+1} is scored by the sampler's shared-prompt forward, theta_k by the model's own: in float64 they differ
    # by up to ~7e-9 per token log pi on an AVX2 machine (the shared-prompt route rounds at float32 level
    # somewhere, e.g. its rotary table: to be fixed at its root), so dH is 0 to that rounding, not bit for bit
    assert m["warn/dH_same"] == pytest.approx(0.0, abs=1e-8)
    assert m["warn/curv_gap"] == pytest.approx(0.0, abs=1e-12)
    assert {"warn/mass_pos_peak", "warn/mass_neg_valley", "warn/cov_logp_adv"} <= set(m)


def test_signed_cumulative_alignment_matches_running_sums():
    df = pd.DataFrame({"gap/n_prompts": [2, np.nan, 4, 0, 1],
                       "gap/dmu_update_pos_sum": [1.0, np.nan, 2.0, 0.0, 0.5],
                       "gap/dmu_update_neg_sum": [-0.4, np.nan, -1.0, 0.0, -0.2]})
    pos, neg = signed_cumulative_alignment(df)
    np.testing.assert_allclose(pos, [0.5, 0.5, 1.0, 1.0, 1.5])
    np.testing.assert_allclose(neg, [-0.2, -0.2, -0.45, -0.45, -0.65])


def test_mechanism_fit_recovers_a_constructed_slope():
    rng = np.random.default_rng(1)
    rows = []
    for run in range(8):
        for k in range(30):
            cov = rng.normal()
            rows.append({"run": run, "method": "grpo" if run % 2 else "wapo", "lr": 1e-3, "step": k,
                         "warn/cov_logp_adv": cov, "warn/dH_same": -2.0 * 1e-3 * cov + rng.normal(0, 1e-5)})
    fit = mechanism_fit(pd.DataFrame(rows), rng=np.random.default_rng(0), n_resamples=300)
    e = fit["all"]
    assert e.lo < 2.0 < e.hi and e.hi - e.lo < 0.1 and e.n == 8
    assert set(mechanism_fit(pd.DataFrame(rows), rng=np.random.default_rng(0), n_resamples=300, by="method")) == {
        "grpo", "wapo"}


def test_forward_at_current_shared_prompt_route_matches_the_model_forward():
    """forward_at_current through llm_probe.sampler's shared-prompt forward equals the model's own forward over full
    rows (float64, 1e-6): token log-probs and entropies, with prompt-major rows and with rows shuffled (no sharing),
    and at a scoring temperature != 1 (the model's own forward, which applies it)."""
    from llm_probe.model import scoring_temperature
    from llm_probe.sampler import supports_fast_path
    from llm_probe.warning import forward_at_current

    model, tok = tiny(dtype="float64")
    assert supports_fast_path(model)
    ro = sampled_rollout(model, tok, B=3, G=4, T=5)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    shuffled = type(ro)(**{**ro.__dict__, **{k: getattr(ro, k)[perm] for k in
                                             ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}})
    for T in (1.0, 0.7):
        with scoring_temperature(T):
            for r in (ro, shuffled):
                logp, ent = forward_at_current(model, r)
                with torch.no_grad():
                    ref_logp, ref_ent, _ = completion_logprobs(model, r.prompt_ids, r.prompt_mask, r.completion_ids,
                                                               r.completion_mask, return_entropy=True)
                m = r.completion_mask > 0
                torch.testing.assert_close(logp, ref_logp, rtol=1e-6, atol=1e-9)
                torch.testing.assert_close(ent[m], ref_ent[m], rtol=1e-6, atol=1e-9)
