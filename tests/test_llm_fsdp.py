"""GapProbeCallback with sharded parameters: the forward-only probe (llm_probe.sharding.ForwardProbe).

- The forward difference dphi_q = Phi_hat_q(theta + s v) - Phi_hat_q(theta) against the exact directional
  derivative s <v, g_q> (forward-mode JVP, llm_probe.probes.jvp_alignment) on an unsharded float64 tiny Qwen:
  the error is (s^2 / 2) v^T H_q v + O(s^3), so halving s divides it by ~4; the same for each completion's
  log-prob change against llm_probe.safe_step.completion_logprob_jvp.
- FSDP2 (``torch.distributed.fsdp.fully_shard``, per decoder layer and the root) in two CPU processes (gloo): one
  real SGD step driven through the callback's hooks (:func:`worker`); every logged number equals the callback's
  forward-only route on the unsharded model in this process (1e-5 relative, :func:`assert_fsdp_rows`), whose
  dphi equals GapProbe's (the dot route's own Phi_hat forward) and whose headroom follows step_rule's (JVP) to
  first order. In the default suite the FSDP2 step runs inside the DDP test's launch (one launch for both,
  tests/test_llm_distributed.py); its own launch here is behind ``slow``.
- GPU only: FSDP2 over NCCL, and DeepSpeed ZeRO-3 (skipped without a CUDA device / deepspeed).

This file is also the worker script: ``torchrun --nproc_per_node 2 tests/test_llm_fsdp.py OUT_DIR [cuda]``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

G, B, T = 4, 4, 5  # 4 prompts x 4 completions; rank r's reward function sees rows [8 r, 8 r + 8)
LR = 5e-3


def batch(tok, seed: int = 0):
    """(prompts [N], completion ids [N][T], rewards [N]): made-up completions, every group mixed."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [f"{a}+{a + 5}=" for a in range(11, 11 + B) for _ in range(G)]
    cids = torch.randint(2, len(tok), (B * G, T), generator=gen).tolist()
    r = (torch.rand(B, G, generator=gen) < 0.5).float()
    r[:, 0], r[:, 1] = 1.0, 0.0
    return prompts, cids, r.reshape(-1).tolist()


def sgd_step_through_callback(cb, model, tok, lo: int, hi: int, *, k: int = 0, device="cpu") -> dict:
    """The callback's hooks around one SGD step on loss = -mean_n log pi(o_n) of the whole batch (the same loss
    on every rank, so FSDP's averaged gradient is the one-process gradient); this rank records rows [lo, hi)."""
    from llm_probe.model import completion_logprobs
    from llm_probe.rollout import encode_prompts

    prompts, cids, rewards = batch(tok)
    fn = cb._rewards.wrapped[0] if cb._rewards is not None else cb.wrap_reward(_replay_reward)
    fn(prompts=prompts[lo:hi], completions=[""] * (hi - lo), completion_ids=cids[lo:hi], rewards=rewards[lo:hi])
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    p_ids, p_mask = encode_prompts(tok, prompts, device)
    c_ids = torch.tensor(cids, device=device)
    loss = -completion_logprobs(model, p_ids, p_mask, c_ids, torch.ones_like(c_ids, dtype=torch.float32)).sum(-1).mean()
    loss.backward()
    state = SimpleNamespace(global_step=k, log_history=[])
    cb.on_pre_optimizer_step(None, state, None, model=model, optimizer=opt)
    opt.step()
    cb.on_optimizer_step(None, state, None, model=model, optimizer=opt)
    return cb.history[-1]


def _replay_reward(prompts, completions, completion_ids=None, rewards=None, **kw):
    return list(rewards)


def worker(out: Path, device: str = "cpu") -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from llm_probe.callback import GapProbeCallback
    from tests.llm_helpers import tiny

    torch.set_num_threads(1)
    if not dist.is_initialized():  # else: the group of the run that called it (tests/test_llm_distributed.py)
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    model, tok = tiny("qwen2", seed=0)
    model.to(device)
    mesh = init_device_mesh(device, (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    cb = GapProbeCallback(tok, num_generations=G, probe_every=1)
    N = B * G
    row = sgd_step_through_callback(cb, model, tok, rank * N // world, (rank + 1) * N // world, device=device)
    (out / f"row{rank}.json").write_text(json.dumps({"row": row, "sharded": cb._sharded,
                                                     "skipped": list(cb.skipped)}))


def _one_process_row(device: str = "cpu"):
    from llm_probe.callback import GapProbeCallback
    from tests.llm_helpers import tiny

    model, tok = tiny("qwen2", seed=0)
    model.to(device)
    cb = GapProbeCallback(tok, num_generations=G, probe_every=1)
    cb._set_sharded("FSDP")  # the forward-only route on the unsharded model
    return sgd_step_through_callback(cb, model, tok, 0, B * G, device=device), cb


def _assert_rows_close(row, ref, rtol):
    from tests.test_llm_distributed import assert_rows_close

    assert_rows_close(row, ref, rtol=rtol)


def test_forward_difference_error_is_quadratic_in_the_step():
    from llm_probe.probes import jvp_alignment, mixed_groups
    from llm_probe.safe_step import completion_logprob_jvp
    from llm_probe.sharding import ForwardProbe, forward_difference_logprobs
    from llm_probe.step_hook import Step
    from tests.llm_helpers import sampled_rollout, tiny

    model, tok = tiny("qwen2", seed=0, dtype="float64")
    ro = sampled_rollout(model, tok, B=3, G=4, T=5, seed=1)
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(2)
    v = {n: torch.randn(p.shape, generator=gen, dtype=torch.float64) for n, p in theta.items()}
    groups = mixed_groups(ro.rewards)
    exact = jvp_alignment(model, ro, groups, theta, v)  # [Q] <v, g_q>
    exact_x = completion_logprob_jvp(model, ro, theta, v)  # [N] <v, s(o_n)>
    probe = ForwardProbe(model, headroom=False)
    errs, errs_x = [], []
    for s in (2e-4, 1e-4):
        model.load_state_dict(theta, strict=False)
        probe.before(Step(ro))  # at theta
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(theta[n] + s * v[n])
        dphi = torch.tensor(probe.after().metrics["gap/dphi"], dtype=torch.float64)  # forward at theta + s v
        x = forward_difference_logprobs(model, ro, theta, {n: theta[n] + s * v[n] for n in theta})
        errs.append(float((dphi - s * exact).abs().max()))
        errs_x.append(float((x - s * exact_x).abs().max()))
        assert errs[-1] < 0.05 * s * float(exact.abs().max())  # first order right, small second-order error
    assert 3.0 < errs[0] / errs[1] < 5.0, errs
    assert 3.0 < errs_x[0] / errs_x[1] < 5.0, errs_x


@pytest.mark.llm
def test_forward_route_unsharded_matches_gap_probe_and_step_rule():
    """One process, no sharding: the forward-only row against the full probe's row of the same step."""
    pytest.importorskip("trl")
    from llm_probe.callback import GapProbeCallback
    from llm_probe.sharding import NEEDS_FULL_PARAMETERS
    from tests.llm_helpers import tiny

    row, cb = _one_process_row()
    model, tok = tiny("qwen2", seed=0)
    full = sgd_step_through_callback(GapProbeCallback(tok, num_generations=G, probe_every=1), model, tok, 0, B * G)
    assert cb.skipped == NEEDS_FULL_PARAMETERS and not set(row) & set(NEEDS_FULL_PARAMETERS)
    assert row["gap/n_prompts"] == full["gap/n_prompts"] == B
    # GapProbe's own Phi_hat forward (float32 Phi_hat ~ 10: a difference of two carries ~1e-6 of round-off)
    assert row["gap/dphi_mean"] == pytest.approx(full["gap/dphi_mean"], abs=1e-5)
    dmu = torch.tensor(full["gap/dmu_update"])
    dphi = torch.tensor(row["gap/dphi"])
    assert float((dphi - dmu).abs().max()) < 0.2 * float(dmu.abs().max())  # first order: dphi ~ dmu
    assert row["gap/M_dphi"] == pytest.approx(float(dphi.clamp(min=0).mean()), rel=1e-6)
    assert row["gap/headroom"] == pytest.approx(full["gap/headroom"], rel=0.2)  # step_rule's x by JVP
    for key in ("taxonomy/pos_peak", "taxonomy/neg_valley"):
        assert key in row
    # entropy by advantage sign and Cov(log pi, A) at theta_k, by a plain loop over tokens (numpy) on the
    # model's own completion_logprobs (its entropy output), advantages (r - mean) / std per group (population)
    import numpy as np

    from llm_probe.model import completion_logprobs
    from llm_probe.rollout import encode_prompts

    model, tok = tiny("qwen2", seed=0)
    model.eval()
    prompts, cids, rewards = batch(tok)
    p_ids, p_mask = encode_prompts(tok, prompts, "cpu")
    c_ids = torch.tensor(cids)
    with torch.no_grad():
        lp, ent, _ = completion_logprobs(model, p_ids, p_mask, c_ids, torch.ones_like(c_ids, dtype=torch.float32),
                                      return_entropy=True)
    r = np.array(rewards).reshape(B, G)
    A = ((r - r.mean(1, keepdims=True)) / r.std(1, keepdims=True)).reshape(-1)  # gapdyn grpo: population std
    l_tok, a_tok, e_tok = lp.double().numpy().reshape(-1), np.repeat(A, T), ent.double().numpy().reshape(-1)
    assert row["warn/cov_logp_adv"] == pytest.approx(float(np.mean((l_tok - l_tok.mean()) * (a_tok - a_tok.mean()))),
                                                     rel=1e-4)
    assert row["entropy"] == pytest.approx(float(e_tok.mean()), rel=1e-5)
    assert row["entropy/pos_adv"] == pytest.approx(float(e_tok[a_tok > 0].mean()), rel=1e-5)
    assert row["entropy/neg_adv"] == pytest.approx(float(e_tok[a_tok < 0].mean()), rel=1e-5)
    assert sum(v for k, v in row.items() if k.startswith("taxonomy/") and not k.endswith("_kept")) == B * G * T
    assert row["gap/headroom_lr"] == pytest.approx(LR * row["gap/headroom"])
    summ = cb.summary()
    assert summ["suggested_lr"] == pytest.approx(row["gap/headroom_lr"]) and summ["M_batch"] != summ["M_batch"]
    logs = {}
    cb.on_log(None, SimpleNamespace(log_history=[]), None, logs=logs)
    assert logs["gap/M_dphi"] == row["gap/M_dphi"] and "gap/norm_mean" not in logs


def assert_fsdp_rows(out: Path, nproc: int = 2, device: str = "cpu", rtol: float = 1e-5) -> None:
    """The rows :func:`worker` wrote under FSDP2 equal the unsharded forward-only route's (every number)."""
    ref, _ = _one_process_row(device)
    for rank in range(nproc):
        got = json.loads((out / f"row{rank}.json").read_text())
        assert got["sharded"] == "FSDP" and "gap/cos_update_mean" in got["skipped"]
        _assert_rows_close(got["row"], ref, rtol=rtol)


@pytest.mark.slow
@pytest.mark.llm
def test_callback_under_fsdp2_equals_unsharded_forward_route(tmp_path):
    pytest.importorskip("trl")
    from tests.test_llm_distributed import launch_twice

    assert_fsdp_rows(launch_twice(Path(__file__).resolve(), tmp_path, timeout=300))


@pytest.mark.gpu
@pytest.mark.llm
def test_callback_under_fsdp2_on_cuda(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from tests.test_llm_distributed import launch

    nproc = min(2, torch.cuda.device_count())
    out = tmp_path / "cuda"
    out.mkdir()
    rc, tail = launch(Path(__file__).resolve(), out, "cuda", nproc=nproc, timeout=300)
    assert rc == 0, tail
    assert_fsdp_rows(out, nproc, "cuda", rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.llm
def test_callback_under_deepspeed_zero3(tmp_path):
    """transformers' Trainer under ZeRO-3 on CUDA, one process per device (at most 2): two SGD steps with the
    callback attached (tests/test_llm_deepspeed.py's trainer worker). DeepSpeed steps inside backward, before
    on_pre_optimizer_step (checked), and every row equals the unsharded forward-only route's on the device (1e-4)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytest.importorskip("deepspeed")
    from tests.test_llm_deepspeed import assert_zero3_trainer_rows

    assert_zero3_trainer_rows(tmp_path, nproc=min(2, torch.cuda.device_count()), device="cuda", rtol=1e-4)


if __name__ == "__main__":
    worker(Path(sys.argv[1]), *(sys.argv[2:3] or ["cpu"]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # results are written; skip interpreter teardown (the gloo group's threads can abort it)
