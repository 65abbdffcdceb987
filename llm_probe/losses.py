"""Policy-gradient losses as small registered functions sharing one aggregation helper.

Per-token loss (TRL ``_compute_loss``, PPO-clip): l_t = -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A),
r_t = exp(logp_t - old_logp_t) (GSPO: one ratio per sequence, exp of the mean log-ratio). Advantages come
from :func:`gapdyn.group_advantages` (one source of truth for the rules). Aggregation (TRL loss_type;
verl ``loss_agg_mode`` names are aliases):

| mode (alias)                               | loss                                                   |
|--------------------------------------------|--------------------------------------------------------|
| grpo (seq-mean-token-mean)                 | mean_i [ sum_t l m / sum_t m ]                          |
| bnpo (token-mean)                          | sum l m / sum m  (local batch)                          |
| dr_grpo (seq-mean-token-sum-norm)          | sum l m / (N * max_completion_length)                   |
| dapo                                       | sum l m / num_items (active tokens of the accumulated batch; = bnpo without accumulation) |
| token-sum, seq-mean-token-sum              | sum l m ;  mean_i sum_t l m                             |
| wapo                                       | sum l m / (G * max_seq_len) / max(G+, 1), G+ = groups with a winner |

Registered losses (name: advantage rule, clip, aggregation):
- grpo: gapdyn grpo (Bessel std, eps 1e-4: TRL scale_rewards="group"), eps 0.2/0.2, grpo.  [Shao et al. 2024]
- bnpo: as grpo, bnpo aggregation.                                                          [TRL]
- dr_grpo: r - mean (no std), eps 0.2/0.2, dr_grpo.                                          [Liu et al. 2025]
- dapo: grpo advantages, clip-higher 0.2/0.28, dapo aggregation.                            [Yu et al. 2025]
- gspo: grpo advantages, sequence-level ratio, eps 3e-4/4e-4, grpo aggregation.             [Zheng et al. 2025]
- wapo: mean-centred, winners only (A > 0), upper clip only at 1 + 9, wapo aggregation.     [WAPO code, docs/theory.md §9.2]
- psr / nsr / w_reinforce: A = r / r - 1 / (lam if r else -1), eps 0.2/0.2, token-mean.     [Zhu et al. 2025; the
  aggregation there is verl's default token-mean]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from gapdyn import group_advantages

__all__ = [
    "AGG_MODES",
    "AGG_ALIASES",
    "LossSpec",
    "LOSSES",
    "LOSS_NAMES",
    "LossResult",
    "aggregate",
    "compute_advantages",
    "ppo_clip_token_loss",
    "upper_clip_token_loss",
    "importance_ratio",
    "policy_loss",
]

AGG_MODES = ("grpo", "bnpo", "dr_grpo", "dapo", "token-sum", "seq-mean-token-sum", "wapo")
AGG_ALIASES = {"seq-mean-token-mean": "grpo", "token-mean": "bnpo", "seq-mean-token-sum-norm": "dr_grpo"}


def aggregate(per_token_loss, mask, mode: str, *, max_completion_length: int | None = None, group_size: int | None = None,
              n_groups_with_winner: int | None = None, num_items: float | None = None):
    """Reduce a per-token loss [N, T] with mask [N, T] to a scalar (table in the module doc)."""
    mode = AGG_ALIASES.get(mode, mode)
    if mode not in AGG_MODES:
        raise ValueError(f"mode must be one of {AGG_MODES + tuple(AGG_ALIASES)}, got {mode!r}")
    lm = per_token_loss * mask
    if mode == "grpo":
        return (lm.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if mode == "bnpo":
        return lm.sum() / mask.sum().clamp(min=1.0)
    if mode == "dapo":
        n = mask.sum() if num_items is None else torch.as_tensor(num_items, dtype=lm.dtype)
        return lm.sum() / n.clamp(min=1.0)
    if mode == "token-sum":
        return lm.sum()
    if mode == "seq-mean-token-sum":
        return lm.sum(-1).mean()
    if max_completion_length is None or max_completion_length < 1:
        raise ValueError(f"max_completion_length must be >= 1 for mode {mode!r}, got {max_completion_length}")
    if mode == "dr_grpo":
        return lm.sum() / (per_token_loss.shape[0] * max_completion_length)
    # wapo
    if group_size is None or n_groups_with_winner is None:
        raise ValueError("mode 'wapo' needs group_size and n_groups_with_winner")
    return lm.sum() / (group_size * max_completion_length) / max(int(n_groups_with_winner), 1)


def importance_ratio(logp, old_logp, mask, level: str = "token"):
    """r = exp(logp - old_logp) per token [N, T], or per sequence [N, 1] = exp(mean_t log-ratio) (GSPO)."""
    log_ratio = logp - old_logp
    if level == "token":
        return torch.exp(log_ratio)
    if level == "sequence":
        lw = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return torch.exp(lw).unsqueeze(-1)
    raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")


def ppo_clip_token_loss(coef, adv, eps_low: float, eps_high: float):
    """-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) (TRL/PPO); adv [N, 1] broadcasts over tokens."""
    return -torch.min(coef * adv, torch.clamp(coef, 1 - eps_low, 1 + eps_high) * adv)


def upper_clip_token_loss(coef, adv, eps_low: float, eps_high: float):
    """-A min(r, 1 + eps_high): WAPO's one-sided clip (eps_low unused)."""
    return -adv * torch.clamp(coef, max=1 + eps_high)


@dataclass(frozen=True)
class LossSpec:
    """A registered loss: advantage rule (gapdyn name + options), token loss, clip, ratio level, aggregation."""

    name: str
    advantage: str
    adv_opts: dict = field(default_factory=dict)
    token_loss: Callable = ppo_clip_token_loss
    eps_low: float = 0.2
    eps_high: float = 0.2
    ratio_level: str = "token"
    agg: str = "grpo"
    source: str = ""


_TRL_STD = {"std": "bessel", "eps": 1e-4}
LOSSES: dict[str, LossSpec] = {
    s.name: s
    for s in [
        LossSpec("grpo", "grpo", _TRL_STD, agg="grpo", source="Shao et al. 2024; TRL loss_type='grpo'"),
        LossSpec("bnpo", "grpo", _TRL_STD, agg="bnpo", source="TRL loss_type='bnpo'"),
        LossSpec("dr_grpo", "dr_grpo", agg="dr_grpo", source="Liu et al. 2025; TRL loss_type='dr_grpo'"),
        LossSpec("dapo", "grpo", _TRL_STD, eps_high=0.28, agg="dapo", source="Yu et al. 2025; TRL loss_type='dapo'"),
        LossSpec("gspo", "grpo", _TRL_STD, eps_low=3e-4, eps_high=4e-4, ratio_level="sequence", agg="grpo",
                 source="Zheng et al. 2025; TRL importance_sampling_level='sequence'"),
        LossSpec("wapo", "wapo", token_loss=upper_clip_token_loss, eps_low=0.0, eps_high=9.0, agg="wapo",
                 source="WAPO authors' code (docs/theory.md §9.2)"),
        LossSpec("psr", "psr", agg="bnpo", source="Zhu et al. 2025"),
        LossSpec("nsr", "nsr", agg="bnpo", source="Zhu et al. 2025"),
        LossSpec("w_reinforce", "w_reinforce", {"lam": 0.1}, agg="bnpo", source="Zhu et al. 2025"),
    ]
}
LOSS_NAMES = tuple(LOSSES)


def compute_advantages(name: str, rewards: torch.Tensor) -> torch.Tensor:
    """Advantages [B, G] of loss ``name`` from binary rewards [B, G], via gapdyn.group_advantages."""
    spec = _spec(name)
    return group_advantages(spec.advantage, rewards.float(), **spec.adv_opts).float()


def _spec(name: str) -> LossSpec:
    if name not in LOSSES:
        raise ValueError(f"loss must be one of {LOSS_NAMES}, got {name!r}")
    return LOSSES[name]


@dataclass
class LossResult:
    loss: torch.Tensor  # scalar
    advantages: torch.Tensor  # [N] per completion
    per_token_loss: torch.Tensor  # [N, T] (or broadcastable)
    metrics: dict  # clip ratios (TRL names)


def policy_loss(name: str, logp, old_logp, mask, rewards, *, max_completion_length: int, num_items=None,
                eps_low: float | None = None, eps_high: float | None = None, agg: str | None = None) -> LossResult:
    """The loss of registered method ``name`` on one batch.

    logp, old_logp, mask: [N, T] with N = B * G rows ordered prompt-major; rewards [B, G] binary.
    ``old_logp`` is the sampler's log-prob (logp.detach() for the on-policy first iteration).
    """
    spec = _spec(name)
    if logp.ndim != 2 or old_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(f"logp, old_logp and mask must share one [N, T] shape, got {tuple(logp.shape)}, "
                         f"{tuple(old_logp.shape)}, {tuple(mask.shape)}")
    if logp.shape[0] == 0:
        raise ValueError("logp must hold at least one completion (empty batch)")
    if rewards.ndim != 2 or rewards.shape[0] * rewards.shape[1] != logp.shape[0]:
        raise ValueError(f"rewards must be [B, G] with B*G = {logp.shape[0]} rows, got {tuple(rewards.shape)}")
    el = spec.eps_low if eps_low is None else eps_low
    eh = spec.eps_high if eps_high is None else eps_high
    B, G = rewards.shape
    adv = compute_advantages(name, rewards).reshape(-1).to(logp.device)  # [N]
    coef = importance_ratio(logp, old_logp, mask, spec.ratio_level)
    A = adv.unsqueeze(1)
    ptl = spec.token_loss(coef, A, el, eh)
    n_win = int(((adv.view(B, G) > 0).any(-1)).sum())
    loss = aggregate(ptl, mask, agg or spec.agg, max_completion_length=max_completion_length, group_size=G,
                     n_groups_with_winner=n_win, num_items=num_items)
    with torch.no_grad():
        low = ((coef < 1 - el) & (A < 0)).float().expand_as(mask)
        high = ((coef > 1 + eh) & (A > 0)).float().expand_as(mask)
        tot = mask.sum().clamp(min=1.0)
        metrics = {
            "clip_ratio/low_mean": float((low * mask).sum() / tot),
            "clip_ratio/high_mean": float((high * mask).sum() / tot),
            "clip_ratio/region_mean": float((((low + high) > 0).float() * mask).sum() / tot),
        }
    return LossResult(loss, adv, ptl, metrics)
