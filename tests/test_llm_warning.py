"""Machinery of the early-warning and entropy-mechanics statistics (llm_probe.warning, .early_warning, .entropy):
each statistic against an independent route (loop, autograd, constructed streams with a known answer)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_probe.experiments.early_warning import STATISTICS, lead_auc, lead_times, warning_table, warning_table_by_lr
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
    assert m["warn/dH_same"] == pytest.approx(0.0, abs=1e-12)
    assert m["warn/curv_gap"] == pytest.approx(0.0, abs=1e-12)
    assert {"warn/mass_pos_peak", "warn/mass_neg_valley", "warn/cov_logp_adv"} <= set(m)


def test_signed_cumulative_alignment_matches_running_sums():
    df = pd.DataFrame({"gap/n_prompts": [2, np.nan, 4, 0, 1],
                       "gap/dmu_update_pos_sum": [1.0, np.nan, 2.0, 0.0, 0.5],
                       "gap/dmu_update_neg_sum": [-0.4, np.nan, -1.0, 0.0, -0.2]})
    pos, neg = signed_cumulative_alignment(df)
    np.testing.assert_allclose(pos, [0.5, 0.5, 1.0, 1.0, 1.5])
    np.testing.assert_allclose(neg, [-0.2, -0.2, -0.45, -0.45, -0.65])


def _constructed_study(n_col=6, n_healthy=6, steps=40, rise=12):
    """Collapsed runs: warn/curv_gap jumps from 0 to 1 at c - rise (c = 20 + run); healthy runs stay at 0 +- 0.05."""
    rows = []
    rng = np.random.default_rng(0)
    for run in range(n_col + n_healthy):
        collapsed = run < n_col
        c = 20 + run if collapsed else -1
        for k in range(steps):
            v = (1.0 if collapsed and k >= c - rise else 0.0) + rng.uniform(-0.05, 0.05)
            rows.append({"run": run, "step": k, "collapsed": collapsed, "collapse_step": c, "lr": 1e-3,
                         "warn/curv_gap": v, "reward": 0.5})
    return pd.DataFrame(rows)


def test_lead_time_and_auc_on_a_constructed_stream():
    """Known answer: on the jump step the window-5 rolling mean is >= (1 - 5 * 0.05) / 5 = 0.15, above every
    healthy value (<= 0.05), so AUC = 1 at leads <= rise and every collapsed run is warned exactly rise steps
    ahead with zero false alarms."""
    assert STATISTICS["curv_gap"][1] == 5 and STATISTICS["curv_gap"][2] == 1
    steps = _constructed_study()
    for lead in (0, 5, 9):
        e = lead_auc(steps, "curv_gap", lead)
        assert e.estimate == 1.0 and e.n == 12 and 0 <= e.lo <= e.hi <= 1
    assert lead_auc(steps, "curv_gap", 30) is None  # no collapsed run has a step 30 before its collapse
    lt = lead_times(steps, "curv_gap")
    assert lt["threshold"] <= 0.05 and lt["leads"] == [12.0] * 6
    tab = warning_table(steps).set_index("statistic")
    assert tab.loc["curv_gap", "useful"] and tab.loc["curv_gap", "warned_ge5"] == 6
    assert np.isnan(tab.loc["cov_logp_adv", "auc_L5"])  # column absent: no score


def test_a_statistic_that_tracks_the_lr_separates_pooled_runs_but_not_within_an_lr():
    """curv_gap = 1 in every run at lr 1e-3 (4 collapsed, 4 healthy) and 0 at lr 3e-4 (6 healthy): pooled, each
    positive beats the 6 runs at 3e-4 and ties the 4 others, AUC = (6 + 4/2) / 10 = 0.8; within lr 1e-3 all
    scores tie, AUC = 0.5; lr 3e-4 has no collapsed run and gets no row."""
    rows = []
    for run in range(14):
        lr, collapsed = (1e-3, run < 4) if run < 8 else (3e-4, False)
        for k in range(30):
            rows.append({"run": run, "step": k, "collapsed": collapsed, "collapse_step": 20 if collapsed else -1,
                         "lr": lr, "warn/curv_gap": 1.0 if lr == 1e-3 else 0.0, "reward": 0.5})
    steps = pd.DataFrame(rows)
    assert lead_auc(steps, "curv_gap", 5).estimate == pytest.approx(0.8)
    by_lr = warning_table_by_lr(steps)
    assert set(by_lr.lr) == {1e-3}
    row = by_lr.set_index("statistic").loc["curv_gap"]
    assert row["auc_L5"] == pytest.approx(0.5) and row["n_collapsed"] == 4 and row["n_healthy"] == 4
    assert warning_table_by_lr(steps[steps.lr == 3e-4]).empty


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
