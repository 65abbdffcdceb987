"""llm_probe.ghost against an independent float64 reference: one backward per unpadded sequence through the Hugging
Face forward, the gap g_q = sum_n c_qn grad log pi(o_n) (+1/|O+| winners, -1/|O-| losers) formed as vectors."""

from __future__ import annotations

import pytest
import torch

from llm_probe.ghost import ghost_gaps
from llm_probe.model import TinyQwenSpec

from .llm_helpers import SMALL, sampled_rollout, tiny


def _reference(model, ro, names):
    """([Q, P] gap vectors, [Q] Phi_hat) of the mixed groups, one backward per unpadded sequence."""
    params = dict(model.named_parameters())
    plist = [params[n] for n in names]
    gaps, phis = [], []
    for b in range(ro.B):
        r = ro.rewards[b]
        if not ((r > 0).any() and (r <= 0).any()):
            continue
        g_sum, phi = 0, 0.0
        for i in range(ro.G):
            n = b * ro.G + i
            p = ro.prompt_ids[n][ro.prompt_mask[n] > 0]
            c = ro.completion_ids[n][ro.completion_mask[n] > 0]
            logits = model(input_ids=torch.cat([p, c])[None]).logits[0, len(p) - 1:-1]
            lp = torch.log_softmax(logits, -1).gather(-1, c[:, None]).sum()
            grads = torch.autograd.grad(lp, plist)
            w = 1 / float((r > 0).sum()) if r[i] > 0 else -1 / float((r <= 0).sum())
            g_sum = g_sum + w * torch.cat([x.reshape(-1) for x in grads])
            phi += w * float(lp.detach())
        gaps.append(g_sum)
        phis.append(phi)
    return torch.stack(gaps), torch.tensor(phis, dtype=torch.float64)


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def case(request):
    spec = TinyQwenSpec(**{**SMALL.__dict__, "tie_word_embeddings": request.param})
    model, tok = tiny(spec=spec, dtype="float64")
    ro = sampled_rollout(model, tok, B=3, G=4, T=5)
    ro.rewards[2] = 1.0  # one group all winners: not mixed, left out
    names = [n for n, _ in model.named_parameters()]
    gen = torch.Generator().manual_seed(3)
    dirs = [{n: torch.randn(p.shape, generator=gen, dtype=p.dtype) for n, p in model.named_parameters()}
            for _ in range(2)]
    gaps, phi = _reference(model, ro, names)
    flat = [torch.cat([d[n].reshape(-1) for n in names]) for d in dirs]
    return model, ro, dirs, gaps, phi, flat


def _rel(x, ref):
    return float((x - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("route,keep", [("ghost", "captures"), ("grad", "captures"), ("auto", "blocks"),
                                        ("auto", "auto")])
def test_ghost_matches_per_sequence_reference(case, route, keep):
    """Gram matrix, norms, cosines, Phi_hat, <v, g_q> for a direction given up front and one dotted later from the
    kept captures or per-group blocks: all within 1e-6 of the reference (HF's eager attention softmax runs in float32, so the padded
    and unpadded forwards differ at ~1e-8), on both embeddings layouts and every route."""
    model, ro, dirs, gaps, phi, flat = case
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)
    gg = ghost_gaps(model, ro, "all", {"v": dirs[0]}, keep=keep, route=route)
    assert all(bool((p.grad == 7.0).all()) for p in model.parameters())  # p.grad untouched
    assert gg.groups.tolist() == [0, 1]
    gram = gaps @ gaps.T
    assert _rel(gg.gram, gram) < 1e-6
    assert _rel(gg.norms, gaps.norm(dim=-1)) < 1e-6
    cos = gram / (gaps.norm(dim=-1)[:, None] * gaps.norm(dim=-1)[None])
    assert float((gg.cosines() - cos).abs().max()) < 1e-6
    assert _rel(gg.phi, phi) < 1e-6
    assert _rel(gg.dots["v"], gaps @ flat[0]) < 1e-6
    current = dict(model.named_parameters())
    later = gg.dot({n: current[n] + dirs[1][n] for n in current}, minus=current)  # v = (theta + d) - theta
    assert _rel(later, gaps @ flat[1]) < 1e-6
    if route == "ghost":  # the forced route did take the token-pair sums somewhere
        assert "ghost" in gg.routes.values()
    assert gg.held_bytes() > 0
    gg.release()
    assert gg.held_bytes() == 0
    with pytest.raises(RuntimeError, match="keep="):
        gg.dot(dirs[1])
    for p in model.parameters():
        p.grad = None


def test_ghost_subset_and_bad_input(case):
    """A parameter subset gives the reference's sub-block; bad route, direction or no mixed group: one line."""
    model, ro, dirs, _, _, _ = case
    names = [n for n, _ in model.named_parameters() if "mlp" in n]
    gaps, _ = _reference(model, ro, names)
    gg = ghost_gaps(model, ro, "mlp")
    assert _rel(gg.gram, gaps @ gaps.T) < 1e-6
    with pytest.raises(ValueError, match="route"):
        ghost_gaps(model, ro, route="fast")
    with pytest.raises(ValueError, match="keep"):
        ghost_gaps(model, ro, keep=True)
    with pytest.raises(ValueError, match="lacks"):
        ghost_gaps(model, ro, "all", {"v": {}})
    ro2 = type(ro)(**{**ro.__dict__, "rewards": torch.ones_like(ro.rewards)})
    empty = ghost_gaps(model, ro2)
    assert empty.gram.shape == (0, 0) and len(empty.phi) == 0


@pytest.mark.parametrize("keep", ["auto", None])
def test_ghost_probe_step_hook(case, keep):
    """GhostProbe through the step hook: dmu_update = <theta_{k+1} - theta_k, g_q>, dmu_grad = <-grad L, g_q> and
    the norms against the reference; the metric names are GapProbe's (dot route) on the same step."""
    from llm_probe.gap_probe import GapProbe
    from llm_probe.ghost import GhostProbe
    from llm_probe.step_hook import Step

    model, ro, dirs, gaps, _, flat = case
    names = [n for n, _ in model.named_parameters()]
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    metrics = {}
    try:
        for key, probe in (("ghost", GhostProbe(model, keep=keep)), ("dot", GapProbe(model, alignment="dot"))):
            for n, p in model.named_parameters():
                p.grad = dirs[0][n].clone()
            probe.before(Step(ro))
            with torch.no_grad():
                for n, p in model.named_parameters():
                    p.add_(1e-3 * dirs[1][n])
            res = probe.after()
            metrics[key] = res.metrics
            if key == "ghost":
                delta = torch.cat([(p.detach() - saved[n]).reshape(-1) for n, p in model.named_parameters()])
                assert _rel(res.dmu_update, gaps @ delta) < 1e-6
                assert _rel(res.dmu_grad, -(gaps @ flat[0])) < 1e-6
                assert _rel(res.gap_norms, gaps.norm(dim=-1)) < 1e-6
                assert res.metrics["gap/n_prompts"] == 2
                assert probe.M_batch == pytest.approx(float((gaps @ delta).clamp(min=0).mean()), rel=1e-6, abs=1e-12)
            with torch.no_grad():
                for n, p in model.named_parameters():
                    p.copy_(saved[n])
        assert set(metrics["ghost"]) == set(metrics["dot"])
        with pytest.raises(ValueError, match="probe prompts"):
            GhostProbe(model, n_probe_prompts=2)
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(saved[n])
                p.grad = None
    assert names


def test_ghost_probe_reuses_the_hosts_x_and_next_forward(case):
    """GhostProbe.reuse: dmu_update from the headroom meter's x_n (sum_n c_qn x_n) and dphi from the warn/* forward
    at theta_{k+1} equal the probe's own routes on the same step (keep="auto": the held per-group gradients dotted
    with the update, and a forward of its own), and the per-sequence reference's <theta_{k+1} - theta_k, g_q>."""
    from llm_probe.ghost import GhostProbe
    from llm_probe.headroom import step_headroom_x
    from llm_probe.step_hook import Step
    from llm_probe.warning import forward_at_current

    model, ro, dirs, gaps, _, _ = case
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    own, shared = GhostProbe(model, keep="auto"), GhostProbe(model, keep=None)
    try:
        for n, p in model.named_parameters():
            p.grad = dirs[0][n].clone()
        for probe in (own, shared):
            probe.before(Step(ro, theta_k=saved))
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.add_(1e-3 * dirs[1][n])
        _, x = step_headroom_x(model, ro, saved, shared_prompt=True)
        shared.reuse(x=x, seq_logp_next=forward_at_current(model, ro)[0].sum(-1))
        a, b = own.after(), shared.after()
        delta = torch.cat([(p.detach() - saved[n]).reshape(-1) for n, p in model.named_parameters()])
        assert _rel(b.dmu_update, gaps @ delta) < 1e-6 and _rel(b.dmu_update, a.dmu_update) < 1e-6
        assert a.metrics.keys() == b.metrics.keys()
        for k, v in a.metrics.items():
            assert b.metrics[k] == pytest.approx(v, rel=1e-6, abs=1e-12), k
        with pytest.raises(ValueError, match=r"x must be \[B\*G\]"):
            shared.before(Step(ro, theta_k=saved))
            shared.reuse(x=x[:-1])
        shared.cancel()
        with pytest.raises(RuntimeError, match="without a matching before"):
            shared.reuse(x=x)
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(saved[n])
                p.grad = None
