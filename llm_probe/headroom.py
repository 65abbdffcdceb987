"""The headroom of an optimizer step: the safe step rule before its cap, measured on the step actually taken (the
one module where it is computed; :class:`llm_probe.Trainer`, :class:`llm_probe.GapProbeCallback` and the
forward-only probe of a sharded run call it).

docs/theory.md, section 11: for the step d = theta_{k+1} - theta_k and the change x_n of each completion's
log-probability along it (llm_probe.logp_change), h = min(delta / sd_hat, c dmu_hat / kappa_hat)
(:func:`gapdyn.theory.safe_step.safe_step_headroom`, through :func:`llm_probe.safe_step_rule.rule_from_x`; defaults
c = ``SAFE_STEP_C``, delta = ``SAFE_STEP_DELTA``). h < 1: the safe step would shrink this step by h; h > 1: it
could grow h-fold before a cap binds. ``gap/headroom_lr`` = lr h is the learning rate at which the cap would just
bind (d scales with lr for SGD and Adam alike). A zero step has no direction: h is NaN (not measured).

Routes of x: exact first order (:func:`step_headroom`: one forward-mode pass at theta_k; under DDP each rank's own
groups, gathered: :func:`sharded_step_rule`) or forward differences (:func:`headroom_from_x`, the forward-only
probe of a run whose parameters are sharded).
"""

from __future__ import annotations

import math

import torch

from gapdyn.theory.safe_step import SAFE_STEP_C, SAFE_STEP_DELTA

from .collectives import agree, gather_by_index, sub_rollout
from .logp_change import completion_logprob_jvp
from .model import eval_mode
from .safe_step_rule import rule_from_x, step_rule

__all__ = ["step_headroom", "step_headroom_x", "headroom_from_x", "headroom_metrics", "sharded_step_rule"]


def headroom_metrics(h: float, lr: float) -> dict:
    """The logged keys: ``gap/headroom`` = h and ``gap/headroom_lr`` = lr h (module docstring)."""
    return {"gap/headroom": h, "gap/headroom_lr": lr * h}


def step_headroom(model, ro, theta_k: dict, *, c: float = SAFE_STEP_C, delta: float = SAFE_STEP_DELTA,
                  owned: torch.Tensor | None = None) -> float:
    """h of the step theta_k -> the model's current parameters, over the parameters ``theta_k`` names (name ->
    tensor at theta_k): :func:`llm_probe.safe_step_rule.step_rule` on d = theta - theta_k; NaN for a zero step.
    ``owned`` [B_r]: this rank's groups of a DDP run (:func:`sharded_step_rule`, a collective)."""
    d = {n: p.detach() - theta_k[n] for n, p in model.named_parameters() if n in theta_k}
    if all(not bool(v.any()) for v in d.values()):  # no update: no direction to measure
        return math.nan
    if owned is not None:  # DDP: x_n of this rank's groups, gathered
        return float(sharded_step_rule(model, ro, owned, theta_k, d, c=c, delta=delta).headroom)
    return float(step_rule(model, ro, theta_k, d, c=c, delta=delta).headroom)


def step_headroom_x(model, ro, theta_k: dict, *, c: float = SAFE_STEP_C, delta: float = SAFE_STEP_DELTA,
                    shared_prompt: bool = False) -> tuple[float, torch.Tensor]:
    """(h, x): :func:`step_headroom` (one process) and the x_n [B*G] (float64) it rests on, the first-order change
    of each completion's log-probability along the step (llm_probe.logp_change; 0 for a zero step, where h is
    NaN; ``shared_prompt``: llm_probe.logp_change.completion_logprob_jvp's). A host reuses x:
    sum_n c_qn x_n = <theta_{k+1} - theta_k, g_q> (llm_probe.ghost.GhostProbe.reuse)."""
    d = {n: p.detach() - theta_k[n] for n, p in model.named_parameters() if n in theta_k}
    if all(not bool(v.any()) for v in d.values()):
        return math.nan, torch.zeros(ro.completion_ids.shape[0], dtype=torch.float64)
    with eval_mode(model):
        x = completion_logprob_jvp(model, ro, theta_k, d, shared_prompt=shared_prompt)
    return float(rule_from_x(x.numpy(), ro.rewards, c=c, delta=delta).headroom), x


def headroom_from_x(x: torch.Tensor, rewards: torch.Tensor, *, c: float = SAFE_STEP_C,
                    delta: float = SAFE_STEP_DELTA) -> float:
    """h from given x_n [N] (e.g. forward differences; groups with a NaN reward left out); NaN for a zero step,
    0 for a non-finite x (as step_rule)."""
    if not bool(x.abs().gt(0).any()):
        return math.nan
    return float(rule_from_x(x.numpy(), rewards, c=c, delta=delta).headroom)


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
