"""The gap probe on a run spread over processes: prompt sharding under DDP, forward-only metrics under FSDP2 /
DeepSpeed ZeRO-3 (used by :class:`llm_probe.callback.GapProbeCallback`).

DDP (every rank holds the full theta and the averaged gradient): after the gather of the small per-completion
records, group b of the B gathered groups is owned by rank b % world_size (:func:`owned_groups`); each rank
probes the rollout of its own groups only (:func:`sub_rollout`) and the per-prompt scalars (dmu_q, ||g_q||,
Phi_hat_q before and after, the JVP values; per completion the headroom's x_n) are all-gathered and put back in
the one-process order (:func:`gather_by_index`). Every logged number is a function of these per-prompt scalars
and of the step's norms ||delta||, ||grad L|| (the same on every rank), so every rank logs the one-process
numbers; no gap vector crosses processes.

FSDP2 (``torch.distributed.fsdp.fully_shard``) / DeepSpeed ZeRO-3 (parameters and gradients sharded): a
forward pass still sees the full model, so :class:`ForwardProbe` keeps what two forwards give, at theta_k
(before the step) and theta_{k+1} (after):

    dphi_q = Phi_hat_q(theta_{k+1}) - Phi_hat_q(theta_k) = <delta, g_q> + (1/2) delta^T H_q delta + O(||delta||^3),

the realised change of the log-odds proxy, a forward-difference estimate of dmu_q = <delta, g_q> whose error is
O(||delta||^2) (halving the step quarters it; tests/test_llm_fsdp.py); likewise x_n = log pi_{k+1}(o_n) -
log pi_k(o_n) estimates the headroom's directional derivative (llm_probe.safe_step.completion_logprob_jvp).
At theta_k: entropy split by advantage sign and WAPO taxonomy bins (:func:`llm_probe.probes.token_stats`),
Cov(log pi, A) (:func:`llm_probe.warning.logp_adv_covariance`), advantages by gapdyn's ``grpo`` rule (population
std). What needs full parameters or gradients is skipped and named in :data:`NEEDS_FULL_PARAMETERS`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

import numpy as np
import torch

from gapdyn.methods import group_advantages
from gapdyn.safe_step import SAFE_STEP_C, SAFE_STEP_DELTA

from .model import completion_logits, eval_mode
from .probes import mixed_groups, objectives_from_logprobs, token_stats
from .safe_step_rule import completion_logprob_jvp, rule_from_x
from .warning import logp_adv_covariance

__all__ = ["owned_groups", "sub_rollout", "gather_by_index", "sharded_step_rule", "sharded_kind", "ForwardProbe",
           "NEEDS_FULL_PARAMETERS", "forward_difference_logprobs", "agree", "RankFailure"]

NEEDS_FULL_PARAMETERS = ("gap/dmu_update", "gap/dmu_grad", "gap/norm", "gap/norm_mean", "gap/cos_update_mean",
                         "gap/cos_grad_mean", "gap/dmu_grad_mean", "gap/jvp_dot_maxdiff", "grad_norm_probe",
                         "update_norm")  # gap vectors, gradients, JVPs and norms of the sharded step


def _dist():
    d = torch.distributed
    return d if d.is_available() and d.is_initialized() else None


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


def sharded_step_rule(model, ro, owned: torch.Tensor, theta_k: dict, d: dict, *, c: float = SAFE_STEP_C,
                      delta: float = SAFE_STEP_DELTA):
    """:func:`llm_probe.safe_step.step_rule` of the whole batch ``ro`` with x_n computed for this rank's groups
    ``owned`` only (:func:`llm_probe.safe_step.completion_logprob_jvp` on :func:`sub_rollout`) and gathered; the
    same gapdyn.SafeStep on every rank. A collective: every rank calls it; a rank whose own x fails makes every
    rank raise :class:`RankFailure` (:func:`agree`)."""
    G = ro.G
    mine = sub_rollout(ro, owned)
    x = torch.zeros(0, dtype=torch.float64)
    failure = None
    try:
        if mine.B:
            with eval_mode(model):
                x = completion_logprob_jvp(model, mine, theta_k, d)
    except Exception as exc:  # noqa: BLE001 - announced to every rank, then raised there (agree)
        failure = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    agree(failure)
    rows = (owned.view(-1, 1) * G + torch.arange(G)).reshape(-1)
    x = gather_by_index(rows, {"x": x})[1]["x"].numpy()
    return rule_from_x(x, ro.rewards, c=c, delta=delta)  # as step_rule


def sharded_kind(args=None, model=None) -> str | None:
    """"FSDP" or "DeepSpeed" when the run shards its parameters (TrainingArguments, accelerate's environment,
    an FSDP2 ``fully_shard`` module or a ZeRO-3 parameter), else None (one process or DDP)."""
    if getattr(args, "deepspeed", None) or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true"):
        return "DeepSpeed"
    if getattr(args, "fsdp", None) or os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true"):
        return "FSDP"
    dist_type = str(getattr(getattr(args, "distributed_state", None), "distributed_type", ""))
    if "FSDP" in dist_type:
        return "FSDP"
    if "DEEPSPEED" in dist_type:
        return "DeepSpeed"
    if model is not None:
        from torch.distributed.fsdp import FSDPModule

        if any(isinstance(m, FSDPModule) for m in model.modules()):
            return "FSDP"
        if any(hasattr(p, "ds_id") for p in model.parameters()):
            return "DeepSpeed"
    return None


def _reshard(model) -> None:
    """Free every FSDP2 module's unsharded parameters: a no-grad forward leaves the root's gathered (it expects a
    backward), and the next forward would reuse them after the optimizer changed the shards."""
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def _forward(model, ro):
    """(seq log pi(o_n) [N] float64 CPU, token log-probs [N, T, V], token log pi [N, T]) at the current
    parameters (no grad, eval; FSDP2: gathered afresh and resharded after)."""
    with eval_mode(model):
        _reshard(model)
        try:
            with torch.no_grad():
                logits = completion_logits(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                           ro.completion_mask)
                if logits.dtype not in (torch.float32, torch.float64):
                    logits = logits.float()
                logp_all = torch.log_softmax(logits, -1)
        finally:
            _reshard(model)
    tok = logp_all.gather(-1, ro.completion_ids.unsqueeze(-1)).squeeze(-1) * ro.completion_mask
    return tok.sum(-1).double().cpu(), logp_all, tok


def forward_difference_logprobs(model, ro, theta_a: dict, theta_b: dict) -> torch.Tensor:
    """x_n = log pi_{theta_b}(o_n) - log pi_{theta_a}(o_n) [N] (float64): two forwards, loading each state into
    ``model`` (restored after). An estimate of the directional derivative along d = theta_b - theta_a with error
    (1/2) d^T H_n d + O(||d||^3) (module docstring)."""
    own = {n: p for n, p in model.named_parameters() if n in theta_a}
    keep = {n: p.detach().clone() for n, p in own.items()}
    try:
        with torch.no_grad():
            for n, p in own.items():
                p.copy_(theta_a[n])
        a = _forward(model, ro)[0]
        with torch.no_grad():
            for n, p in own.items():
                p.copy_(theta_b[n])
        b = _forward(model, ro)[0]
    finally:
        with torch.no_grad():
            for n, p in own.items():
                p.copy_(keep[n])
    return b - a


@dataclass
class _Before:
    ro: object
    groups: torch.Tensor  # [Q] mixed groups
    seq_logp: torch.Tensor  # [N] log pi_k(o_n)


class ForwardProbe:
    """The forward-only probe of a sharded step (module docstring): :meth:`before` at theta_k, :meth:`after` at
    theta_{k+1}; running sum ``M_dphi`` = sum_k mean_q [dphi_q,k]_+, the forward-difference estimate of
    :attr:`llm_probe.gap_probe.GapProbe.M_batch`. Every rank of the run calls both (each forward is collective
    under FSDP / ZeRO-3) on the same gathered rollout, so every rank logs the same numbers."""

    def __init__(self, model, *, c: float = SAFE_STEP_C, delta: float = SAFE_STEP_DELTA, headroom: bool = True):
        self.model = model
        self.c, self.delta, self.headroom = float(c), float(delta), bool(headroom)
        self.M_dphi = 0.0
        self._s: _Before | None = None

    @property
    def pending(self) -> bool:
        return self._s is not None

    def cancel(self) -> None:
        self._s = None

    def before(self, ro) -> dict:
        """Forward at theta_k: token statistics of the batch; records log pi_k(o_n) for :meth:`after`."""
        seq, logp_all, tok = _forward(self.model, ro)
        rewards = ro.rewards
        scored = ~torch.isnan(rewards).any(-1)
        A = torch.zeros_like(rewards, dtype=torch.float64)
        if scored.any():
            A[scored] = group_advantages("grpo", rewards[scored].double())
        A = A.reshape(-1)
        keep = scored.repeat_interleave(ro.G).to(ro.completion_mask).unsqueeze(-1)  # unscored groups: left out
        m = ro.completion_mask * keep
        out = {k: v for k, v in token_stats(logp_all, ro.completion_ids, m, A.to(logp_all)).items()}
        out["warn/cov_logp_adv"] = logp_adv_covariance(tok, A, m)
        self._s = _Before(ro, mixed_groups(rewards), seq)
        return out

    def after(self) -> dict:
        """Forward at theta_{k+1}: dphi_q per mixed prompt, its summaries, M_dphi and (``headroom``) h from x_n."""
        if self._s is None:
            raise RuntimeError("ForwardProbe.after() called without a matching before()")
        s, self._s = self._s, None
        seq_new = _forward(self.model, s.ro)[0]
        x = seq_new - s.seq_logp  # [N] forward-difference x_n
        out = {"gap/n_prompts": int(len(s.groups))}
        dphi = objectives_from_logprobs(s.ro.rewards, s.groups, x) if len(s.groups) else torch.zeros(0)
        if len(dphi):
            self.M_dphi += float(dphi.clamp(min=0).mean())
            out.update({"gap/dphi_mean": float(dphi.mean()), "gap/dphi_pos_frac": float((dphi > 0).double().mean())})
        out["gap/M_dphi"] = self.M_dphi
        out["gap/dphi"] = dphi.tolist()
        if self.headroom:
            out["gap/headroom"] = self._headroom(x, s.ro)
        return out

    def _headroom(self, x: torch.Tensor, ro) -> float:
        """h of llm_probe.safe_step.step_rule with x_n from forward differences (groups with a NaN reward left
        out); NaN for a zero step, 0 for a non-finite x (as step_rule)."""
        if not bool(x.abs().gt(0).any()):
            return math.nan
        return float(rule_from_x(x.numpy(), ro.rewards, c=self.c, delta=self.delta).headroom)
