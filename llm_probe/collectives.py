"""How a probed batch is split over the processes of a data-parallel (DDP) run and put back together: the one
module where the probes talk to other processes (``torch.distributed``).

Group b of the B groups of a gathered batch is owned by rank b % world_size (:func:`owned_groups`); a rank probes
the rollout of its own groups (:func:`sub_rollout`) and the per-prompt or per-completion scalars come back in the
one-process order (:func:`gather_by_index`: one ``all_gather_object`` of CPU scalars, no parameter-sized tensor).
Before a gather that needs every rank's part, :func:`agree` exchanges each rank's outcome, so a failure on one rank
raises :class:`RankFailure` on all of them instead of leaving the others waiting. Without a process group every
function is the one-process identity (no communication).
"""

from __future__ import annotations

from dataclasses import replace

import torch

__all__ = ["world_size", "rank", "all_gather_objects", "owned_groups", "sub_rollout", "gather_by_index", "agree",
           "RankFailure"]


def _dist():
    d = torch.distributed
    return d if d.is_available() and d.is_initialized() else None


def world_size() -> int:
    """The number of processes of the run (1 without a process group)."""
    d = torch.distributed
    return d.get_world_size() if d.is_available() and d.is_initialized() else 1


def rank() -> int:
    """This process's rank (0 without a process group)."""
    d = torch.distributed
    return d.get_rank() if d.is_available() and d.is_initialized() else 0


def all_gather_objects(obj) -> list:
    """Every rank's ``obj``, in rank order (``all_gather_object``); ``[obj]`` without a process group. A collective:
    every rank calls it."""
    if world_size() == 1:
        return [obj]
    shares = [None] * world_size()
    torch.distributed.all_gather_object(shares, obj)
    return shares


def owned_groups(B: int, rank: int, world: int) -> torch.Tensor:
    """[B_r] the groups b (0 <= b < B) of rank ``rank``: b % world == rank, ascending."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank must lie in [0, world) with world >= 1, got rank={rank}, world={world}")
    return torch.arange(rank, B, world)


def sub_rollout(ro, groups: torch.Tensor):
    """The Rollout of ``groups`` [B_r] of ``ro`` (their G rows each, padding unchanged: the same inputs)."""
    G = ro.G
    rows = (groups.view(-1, 1) * G + torch.arange(G)).reshape(-1)
    dev = ro.completion_ids.device
    ix = rows.to(dev)
    pick = lambda t: None if t is None else t[ix.to(t.device)]  # noqa: E731
    return replace(ro, problems=[ro.problems[b] for b in groups.tolist()], prompt_ids=pick(ro.prompt_ids),
                   prompt_mask=pick(ro.prompt_mask), completion_ids=pick(ro.completion_ids),
                   completion_mask=pick(ro.completion_mask), terminated=ro.terminated[rows],
                   texts=[ro.texts[n] for n in rows.tolist()], rewards=ro.rewards[groups], logp=pick(ro.logp))


class RankFailure(RuntimeError):
    """Some rank could not compute its part of a probed step; raised on every rank by :func:`agree`."""


def agree(failure: str | None) -> None:
    """Exchange every rank's outcome of its own part of a probed step (``failure``: None, or why it failed) before a
    collective that needs all of them: a :class:`RankFailure` naming each failed rank on every rank when any failed,
    so no rank waits for one that gave up. One ``all_gather_object`` of a short string; every rank must call it
    (a collective). Without a process group: raises for its own failure only."""
    d = _dist()
    if d is None or d.get_world_size() == 1:
        if failure:
            raise RankFailure(f"rank 0: {failure}")
        return
    shares = [None] * d.get_world_size()
    d.all_gather_object(shares, failure)
    bad = [f"rank {r}: {f}" for r, f in enumerate(shares) if f]
    if bad:
        raise RankFailure("; ".join(bad))


def gather_by_index(index: torch.Tensor, values: dict) -> tuple[torch.Tensor, dict]:
    """All ranks' (global index [n_r], {name: [n_r] tensor}) concatenated and sorted by index: the one-process
    order. One ``all_gather_object`` of CPU scalars (no parameter-sized tensor); without a process group: as given.
    Every rank must call it (a collective)."""
    d = _dist()
    index = index.cpu()
    values = {k: v.detach().cpu() for k, v in values.items()}
    if d is None or d.get_world_size() == 1:
        return index, values
    shares = [None] * d.get_world_size()
    d.all_gather_object(shares, (index, values))
    idx = torch.cat([s[0] for s in shares])
    order = torch.argsort(idx, stable=True)
    return idx[order], {k: torch.cat([s[1][k] for s in shares])[order] for k in values}
