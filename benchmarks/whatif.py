"""Prototypes of the fixes proposed in BENCHMARKS.md for the missed targets, measured against the code
they would replace (same run, interleaved) and checked for equal results. Nothing here is used by the
library; the owners of bandits/ and llm_probe/ decide whether to adopt them.

- :func:`engine_variant`: ``bandits.engine`` compiled with LLVM fast-math flags (re-associated sums,
  contractions, reciprocals; no nnan/ninf, so the -inf maxima stay valid). Built at run time from the
  engine's own source with only the ``@njit(cache=True)`` decorators changed, so it tracks the engine.
  Results differ from the IEEE-order engine by round-off only (checked against bandits.reference).
- :func:`per_group_gaps`: llm_probe.per_prompt_gaps computed with one forward + one backward over each
  mixed group's own G rows, instead of one forward over all rows and one backward per prompt through the
  whole batch's graph (each of which walks all B*G rows although only G of them carry gradient).
  Adopted (vectorised over groups) as llm_probe.per_prompt_gaps; kept here as the measured prototype.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

__all__ = ["FASTMATH_FLAGS", "engine_variant", "variant_maxdiff", "per_group_gaps"]

FASTMATH_FLAGS = frozenset({"reassoc", "contract", "arcp"})


def engine_variant(flags=FASTMATH_FLAGS) -> types.ModuleType:
    """A copy of bandits.engine with its numba kernels compiled with ``fastmath=flags`` (empty: IEEE order,
    i.e. the engine itself, compiled again). No disk cache."""
    spec = importlib.util.find_spec("bandits.engine")
    src = Path(spec.origin).read_text()
    n = src.count("@njit(cache=True)")
    if n == 0:
        raise RuntimeError("bandits.engine has no '@njit(cache=True)' kernels to recompile")
    deco = f"@njit(fastmath={set(sorted(flags))!r})" if flags else "@njit"
    src = src.replace("@njit(cache=True)", deco)
    name = f"bandits._engine_whatif_{'_'.join(sorted(flags)) or 'ieee'}"
    mod = types.ModuleType(name)
    mod.__package__ = "bandits"
    mod.__file__ = spec.origin
    sys.modules[name] = mod
    exec(compile(src, f"<fastmath copy of {spec.origin}>", "exec"), mod.__dict__)
    return mod


def variant_maxdiff(variant: types.ModuleType, w, mode: str) -> float:
    """max |variant - bandits.reference| over all recorded arrays, on the benchmark's reference runs."""
    from bandits.reference import simulate_reference

    from .bandit import _ref_subset, compare_trajectories, grid

    bandit = w.bandit()
    eta, seed = grid(w)
    sub = _ref_subset(w)
    ref = simulate_reference(bandit, w.dynamics(mode, w.ref_steps), eta=eta[sub], seed=seed[sub])
    vd = variant.Dynamics(method=w.method, mode=mode, group_size=w.group_size, steps=w.ref_steps)
    return max(compare_trajectories(variant.simulate(bandit, vd, eta=eta[sub], seed=seed[sub]), ref).values())


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
