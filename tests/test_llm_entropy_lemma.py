"""llm_probe.experiments.entropy_lemma: Cui et al.'s (arXiv 2505.22617) Lemma 1 against finite differences and
autograd, the vocabulary covariance against a loop, the state extraction on a hand-made batch, the PG forms
against their closed forms, and a test-mode run of the study (its trajectory against the plain Trainer's)."""

import json
import math

import numpy as np
import pytest
import torch

from llm_probe.experiments import entropy_lemma as el


def _logits(seed, shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2.0


def test_lemma_is_the_first_order_entropy_change():
    z, u = _logits(0, (5, 11)), _logits(1, (5, 11))
    # autograd: dH/dz . u equals -Cov(log pi, u) (the first-order term, exactly)
    zz = z.clone().requires_grad_(True)
    el.entropy(zz).sum().backward()
    np.testing.assert_allclose((zz.grad * u).sum(-1), el.lemma_dH(z, z + u), rtol=1e-12, atol=1e-14)
    # finite differences: the remainder is second order (x100 smaller for eps/10)
    err = []
    for eps in (1e-3, 1e-4):
        exact = el.entropy(z + eps * u) - el.entropy(z)
        err.append((exact - el.lemma_dH(z, z + eps * u)).abs().max().item())
        np.testing.assert_allclose(exact, el.lemma_dH(z, z + eps * u), rtol=5e-2 * eps / 1e-3)
    assert 50 < err[0] / err[1] < 200


def test_vocab_cov_matches_a_loop():
    z, x = _logits(2, (3, 7)), _logits(3, (3, 7))
    logp = torch.log_softmax(z, -1)
    got = el.vocab_cov(logp, x)
    for i in range(3):
        p = [math.exp(v) for v in logp[i].tolist()]
        lp, xx = logp[i].tolist(), x[i].tolist()
        m_l = sum(pa * la for pa, la in zip(p, lp))
        m_x = sum(pa * xa for pa, xa in zip(p, xx))
        ref = sum(pa * (la - m_l) * (xa - m_x) for pa, la, xa in zip(p, lp, xx))
        assert got[i].item() == pytest.approx(ref, rel=1e-12, abs=1e-15)
    with pytest.raises(ValueError, match="logp and x"):
        el.vocab_cov(logp, x[:, :3])


def test_visited_states_on_a_hand_made_batch():
    # 2 prompts x G=2; prompt 0's rows share the prefix (5,), prompt 1's rows differ at once; masks end early
    ids = torch.tensor([[5, 6, 7], [5, 8, 0], [5, 6, 0], [9, 6, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 0, 0]], dtype=torch.float32)
    st = el.visited_states(ids, mask, G=2)
    # states: p0:() p0:(5,) p0:(5,6) | p1:() p1:(5,)   (row 3's prefix () is prompt 1's first state)
    assert st.row.tolist() == [0, 0, 0, 2, 2]
    assert st.pos.tolist() == [0, 1, 2, 0, 1]
    assert st.n_visits.tolist() == [2, 2, 1, 2, 1]
    assert st.visit_state.tolist() == [0, 1, 2, 0, 1, 3, 4, 3]
    assert st.visit_token.tolist() == [5, 6, 7, 5, 8, 5, 6, 9]
    assert st.n_visits.sum() == int(mask.sum())
    with pytest.raises(ValueError, match="G must"):
        el.visited_states(ids, mask, G=3)


def test_pg_forms_against_closed_forms_and_a_tabular_model():
    ids = torch.tensor([[1, 2], [1, 3], [0, 2], [3, 1]])
    mask = torch.ones(4, 2)
    st = el.visited_states(ids, mask, G=2)
    S, V = len(st.row), 5
    zb = _logits(4, (S, V))
    logp = torch.log_softmax(zb, -1)
    g = _logits(5, (len(st.visit_state),))
    adv = _logits(6, (len(st.visit_state),))
    eta = 0.3
    dz = el.pg_logit_change(logp, st, g, eta)
    ref = torch.zeros(S, V, dtype=torch.float64)
    for s, a, gi in zip(st.visit_state, st.visit_token, g.tolist()):
        e = torch.zeros(V, dtype=torch.float64)
        e[a] = 1.0
        ref[s] -= eta * gi * (e - logp[s].exp())
    np.testing.assert_allclose(dz, ref, rtol=1e-12, atol=1e-15)
    # NPG: -eta Cov(log pi, A_hat) = -(eta / n_s) sum_i A_i (log pi(a_i) + H(s))
    pred = -el.vocab_cov(logp, el.npg_logit_change(logp, st, adv, eta))
    H = el.entropy(zb)
    closed = torch.zeros(S, dtype=torch.float64)
    for s, a, A in zip(st.visit_state, st.visit_token, adv.tolist()):
        closed[s] -= eta / st.n_visits[s] * A * (logp[s, a] + H[s])
    np.testing.assert_allclose(pred, closed, rtol=1e-12, atol=1e-15)
    # a tabular policy trained by that SGD step: the lemma's and the PG form's predictions coincide
    before = torch.zeros(4, 2, V, dtype=torch.float64)
    before[st.row, st.pos] = zb
    after = before.clone()
    after[st.row, st.pos] = zb + dz
    gg = torch.zeros(4, 2, dtype=torch.float64)
    gg[st.visit_row, st.visit_pos] = g
    rows = el.state_rows(before, after, st, gg, torch.zeros(4, dtype=torch.float64), eta)
    np.testing.assert_allclose(rows["pg"], rows["lemma"], rtol=1e-10, atol=1e-14)
    with pytest.raises(ValueError, match="eta"):
        el.state_rows(before, after, st, gg, torch.zeros(4), 0.0)


def test_study_test_mode_keeps_the_trainers_trajectory(tmp_path):
    from llm_probe.config import TrainConfig
    from llm_probe.experiments.ablation import SplitAddition
    from llm_probe.experiments.pinned import pinned_warm
    from llm_probe.trainer import Trainer

    cfg = el.CONFIGS["test"]
    claims = el.main_study("test", tmp_path, command="gapdyn train entropy-lemma --mode test", runs_dir=tmp_path)
    rows = json.loads((tmp_path / "claims.json").read_text())
    assert {r["criteria_hash"] for r in rows} == {el.CRITERIA_HASH}
    ids = {c.id for c in claims}
    assert "llm.entropy_lemma@sgd_lr0.003" in ids and "llm.entropy_pg_form_adam@adam_lr0.0004_step0" in ids
    assert len(claims) == 3 * (1 + 2)
    steps = (tmp_path / "steps.csv").read_text().splitlines()
    assert len(steps) == 1 + cfg.steps * len(cfg.runs)
    # the recorder leaves the trajectory as the plain Trainer's (same rewards, losses and gradient norms)
    opt, lr = cfg.runs[0]
    tc = TrainConfig(out_dir=str(tmp_path / "plain"), method=cfg.method, lr=lr, seed=cfg.seeds[0], steps=cfg.steps,
                     prompts_per_step=cfg.prompts_per_step, group_size=cfg.group_size,
                     max_new_tokens=cfg.max_new_tokens, optimizer=opt, init_from=str(pinned_warm(cfg.shape)),
                     probe_every=0, probe_prompts=0, num_threads=1, progress=False, device="cpu")
    Trainer(tc, task=SplitAddition()).run(checkpoint=False)
    read = lambda d: [(r["reward"], r["loss"], r["grad_norm"])  # noqa: E731
                      for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())]
    assert read(tmp_path / "plain") == read(tmp_path / "runs" / cfg.label(opt, lr, 0))
