"""Prototype kept as a measured reference route (not used by the library).

- :func:`per_group_gaps`: llm_probe.per_prompt_gaps computed with one forward + one backward over each
  mixed group's own G rows, instead of one forward over all rows and one backward per prompt through the
  whole batch's graph. Adopted (vectorised over groups) as llm_probe.per_prompt_gaps; benchmarks/llm.py
  times it and checks it equal to the library's route.
"""

from __future__ import annotations

__all__ = ["per_group_gaps"]


def per_group_gaps(model, ro, params):
    """Same result as llm_probe.per_prompt_gaps (a GapEstimate), by one forward + backward per mixed group
    over that group's G rows only."""
    import torch

    from llm_probe.model import completion_logprobs
    from llm_probe.probes import GapEstimate, flat, mixed_groups

    groups = mixed_groups(ro.rewards)
    plist = list(params.values())
    P = sum(p.numel() for p in plist)
    if len(groups) == 0:
        z = torch.zeros(0)
        return GapEstimate(groups, torch.zeros(0, P), z, z, z)
    G = ro.G
    gaps, phis = [], []
    for b in groups.tolist():
        rows = slice(b * G, (b + 1) * G)
        r = ro.rewards[b]
        pos = (r > 0).float()
        w = pos / pos.sum() - (1.0 - pos) / (1.0 - pos).sum()
        lp = completion_logprobs(model, ro.prompt_ids[rows], ro.prompt_mask[rows], ro.completion_ids[rows],
                                 ro.completion_mask[rows]).sum(-1)
        phi = w.to(lp.dtype) @ lp
        g = torch.autograd.grad(phi, plist, allow_unused=True)
        gaps.append(flat([torch.zeros_like(p) if gi is None else gi for gi, p in zip(g, plist)]))
        phis.append(phi.detach())
    rg = ro.rewards[groups]
    return GapEstimate(groups, torch.stack(gaps).cpu(), torch.stack(phis).cpu(), (rg > 0).sum(-1), (rg <= 0).sum(-1))
