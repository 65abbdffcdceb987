"""The probes on a CUDA device (marker ``gpu``; skipped without one): per-group gaps (vmap and loop), the
streamed route and forward-mode alignment on the GPU equal the reference routes (one backward per prompt through
the whole batch; explicit dot products), and equal the same computation on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch

from llm_probe.probes import (
    dot_alignment,
    flat,
    jvp_alignment,
    per_prompt_gaps,
    per_prompt_gaps_batched,
    select_params,
    streamed_gap_stats,
)
from tests.llm_helpers import sampled_rollout, tiny

pytestmark = [pytest.mark.llm, pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _to(ro, device):
    ro = copy.copy(ro)
    for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask"):
        setattr(ro, k, getattr(ro, k).to(device))
    return ro


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_probes_on_cuda_equal_reference_routes_and_cpu(dtype):
    cpu_model, tok = tiny("qwen2", seed=1, dtype=dtype)
    ro = sampled_rollout(cpu_model, tok, B=3, G=4, T=5, seed=0)
    model = copy.deepcopy(cpu_model).cuda()
    ro_gpu = _to(ro, "cuda")
    params = select_params(model, "all")
    ref = per_prompt_gaps_batched(model, ro_gpu, params)
    scale = float(ref.gaps.abs().max())
    tol = dict(rtol=1e-4, atol=1e-5 * scale)  # float64 too: eager attention takes its softmax in float32
    for vectorize in (True, False):
        est = per_prompt_gaps(model, ro_gpu, params, vectorize=vectorize)
        torch.testing.assert_close(est.gaps, ref.gaps, **tol)
    cpu = per_prompt_gaps(cpu_model, ro, select_params(cpu_model, "all"))
    torch.testing.assert_close(est.gaps, cpu.gaps, **tol)
    g = torch.Generator().manual_seed(0)
    v = {k: torch.randn(p.shape, generator=g, dtype=p.dtype).cuda() for k, p in params.items()}
    expect = dot_alignment(ref.gaps, flat(v))
    atol = tol["atol"] / scale * float(expect.abs().max()) * 10
    torch.testing.assert_close(jvp_alignment(model, ro_gpu, est.groups, {k: p.detach() for k, p in params.items()}, v),
                               expect, rtol=tol["rtol"], atol=atol)
    st = streamed_gap_stats(model, ro_gpu, params, {"v": v})
    torch.testing.assert_close(st.dots["v"].to(expect.dtype), expect, rtol=tol["rtol"], atol=atol)
    torch.testing.assert_close(st.norms.to(ref.gaps.dtype), ref.norms, rtol=tol["rtol"], atol=0)
