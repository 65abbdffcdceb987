"""The gap probe on a run spread over processes: prompt sharding under DDP, forward-only metrics under FSDP2 /
DeepSpeed ZeRO-3 (used by :class:`llm_probe.callback.GapProbeCallback`). The split and the gathers are those of
llm_probe.collectives, x_n those of llm_probe.logp_change, the headroom that of llm_probe.headroom (their names are
re-exported here).

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

import os
from dataclasses import dataclass

import torch

from gapdyn.theory.methods import group_advantages
from gapdyn.theory.safe_step import SAFE_STEP_C, SAFE_STEP_DELTA

from .collectives import RankFailure, agree, gather_by_index, owned_groups, sub_rollout
from .headroom import headroom_from_x, sharded_step_rule
from .logp_change import completion_forward, forward_difference_logprobs, logp_change
from .probes import mixed_groups, objectives_from_logprobs, token_stats
from .step_hook import HookResult, Step, check_step
from .warning import logp_adv_covariance

__all__ = ["owned_groups", "sub_rollout", "gather_by_index", "sharded_step_rule", "sharded_kind", "ForwardProbe",
           "deepspeed_engine_stepped_in_backward",
           "NEEDS_FULL_PARAMETERS", "forward_difference_logprobs", "agree", "RankFailure"]

NEEDS_FULL_PARAMETERS = ("gap/dmu_update", "gap/dmu_grad", "gap/norm", "gap/norm_mean", "gap/cos_update_mean",
                         "gap/cos_grad_mean", "gap/dmu_grad_mean", "gap/jvp_dot_maxdiff", "grad_norm_probe",
                         "update_norm")  # gap vectors, gradients, JVPs and norms of the sharded step


def sharded_kind(args=None, model=None, *, env: bool = True) -> str | None:
    """"FSDP" or "DeepSpeed" when the run shards its parameters (TrainingArguments, accelerate's environment
    unless ``env`` is False, an FSDP2 ``fully_shard`` module or a ZeRO-3 parameter), else None (one process or
    DDP)."""
    def flag(name):
        return env and os.environ.get(name, "").lower() in ("1", "true")

    if getattr(args, "deepspeed", None) or flag("ACCELERATE_USE_DEEPSPEED"):
        return "DeepSpeed"
    if getattr(args, "fsdp", None) or flag("ACCELERATE_USE_FSDP"):
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


def deepspeed_engine_stepped_in_backward(accelerator):
    """The DeepSpeed engine that ``accelerator.backward`` steps, or None when accelerate runs without DeepSpeed.

    Under DeepSpeed accelerate's ``DeepSpeedEngineWrapper.backward`` runs ``engine.backward(loss)`` and, at a
    gradient-accumulation boundary, ``engine.step()`` (the update; accelerate's optimizer ``step`` is a no-op), so
    under transformers' Trainer theta_{k+1} is in place before ``on_pre_optimizer_step``. accelerate runs DeepSpeed
    only when its state's ``distributed_type`` is DEEPSPEED, which ``ACCELERATE_USE_CPU=true`` (``accelerate launch
    --cpu``, ``use_cpu: true`` in an accelerate config) prevents: ``AcceleratorState`` then keeps the CPU type and
    drops the DeepSpeed plugin, and the Trainer runs DDP (docs/llm_probe.md, "Distributed"). A ValueError (one line)
    when the type is DEEPSPEED but accelerate holds no engine wrapper: where the update happens is then unknown."""
    if not str(getattr(accelerator, "distributed_type", "")).endswith("DEEPSPEED"):
        return None
    wrapped = getattr(accelerator, "deepspeed_engine_wrapped", None)
    engine = getattr(wrapped, "engine", None)
    if engine is None or not callable(getattr(engine, "step", None)):
        raise ValueError("accelerate runs DeepSpeed but holds no DeepSpeed engine wrapper (accelerator."
                         "deepspeed_engine_wrapped): the probe cannot place its theta_k forward before DeepSpeed's "
                         "step; refused")
    return engine


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
        """True between :meth:`before` and :meth:`after` (or :meth:`cancel`)."""
        return self._s is not None

    def cancel(self) -> None:
        """Drop the step recorded by :meth:`before` (the step was skipped)."""
        self._s = None

    def before(self, step: Step) -> dict:
        """Forward at theta_k (the step hook of llm_probe.step_hook; ``step.ro`` the whole gathered batch): token
        statistics of the batch; records log pi_k(o_n) for :meth:`after`."""
        ro = check_step(step, "ForwardProbe").ro
        seq, logp_all, tok = completion_forward(self.model, ro)
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

    def after(self) -> HookResult:
        """Forward at theta_{k+1}: dphi_q per mixed prompt, its summaries, M_dphi and (``headroom``) h from x_n, in
        the result's ``metrics``."""
        if self._s is None:
            raise RuntimeError("ForwardProbe.after() called without a matching before()")
        s, self._s = self._s, None
        seq_new = completion_forward(self.model, s.ro)[0]
        x = logp_change(seq_new, s.seq_logp)  # [N] forward-difference x_n
        out = {"gap/n_prompts": int(len(s.groups))}
        dphi = objectives_from_logprobs(s.ro.rewards, s.groups, x) if len(s.groups) else torch.zeros(0)
        if len(dphi):
            self.M_dphi += float(dphi.clamp(min=0).mean())
            out.update({"gap/dphi_mean": float(dphi.mean()), "gap/dphi_pos_frac": float((dphi > 0).double().mean())})
        out["gap/M_dphi"] = self.M_dphi
        out["gap/dphi"] = dphi.tolist()
        if self.headroom:
            out["gap/headroom"] = headroom_from_x(x, s.ro.rewards, c=self.c, delta=self.delta)
        return HookResult(out)
