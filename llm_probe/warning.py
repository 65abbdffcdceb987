"""Per-step early-warning and entropy-mechanics statistics of one RL step (logged as ``warn/*``).

Every step (from the training forward, no extra cost):
- ``warn/cov_logp_adv`` = Cov(log pi(y_t), A) over the step's completion tokens (token-weighted, population
  covariance): the sampled form of the entropy-mechanism quantity of Cui et al. (arXiv 2505.22617), for which
  vanilla policy gradient on softmax logits gives dH ~ -eta Cov_{a~pi}(log pi(a), pi(a) A(a)) per state;
- ``warn/mass_<cell>``: gradient mass sum_t |dL/dlogp_t| (1 - p_t) in each WAPO taxonomy cell
  (gapdyn.theory.taxonomy.token_bin_index: peak/valley x sign of A), on steps where dL/dlogp is kept.

On probe steps, one extra no-grad forward at theta_{k+1} on the same completions gives
- x_i = log pi_{k+1}(o_i) - log pi_k(o_i), the change of each completion's sequence log-prob along the
  update (first order: x_i = <delta, s(o_i)>, s the sequence score);
- ``warn/dH_same`` = H_{k+1} - H_k, the token entropy change on the same completions (no sampling noise);
- ``warn/curv_gap`` = mean over mixed groups of Var(x_i | wrong) - Var(x_i | correct) (population variances:
  gapdyn.theory.curvature.curvature_gap with ``ddof`` = :data:`CURV_GAP_DDOF`);
- ``warn/wrong_max_frac`` = fraction of mixed groups whose largest x_i belongs to a wrong completion;
- ``warn/x_wrong_mean``, ``warn/x_right_mean``: mean x_i over wrong / correct completions of mixed groups.
The signed cumulative alignment (sum of eta [dmu]_+ and of eta [dmu]_-) is read from the logged
``gap/dmu_update_{pos,neg}_sum`` by :func:`signed_cumulative_alignment` (eta = 1: dmu is the real change).
"""

from __future__ import annotations

import numpy as np
import torch

from gapdyn.theory.curvature import curvature_gap
from gapdyn.theory.taxonomy import BIN_NAMES, collision_probability, token_bin_index

from .logp_change import logp_change, prompt_group
from .model import completion_logprobs, current_scoring_temperature, eval_mode
from .sampler import fast_completion_logprobs, supports_fast_path

__all__ = ["logp_adv_covariance", "cell_gradient_mass", "group_curvature", "sequence_logp_change",
           "step_warning_metrics", "after_step_metrics", "forward_at_current", "signed_cumulative_alignment",
           "WARN_STATS", "CURV_GAP_DDOF"]

WARN_STATS = ("warn/cov_logp_adv", "warn/dH_same", "warn/curv_gap", "warn/wrong_max_frac",
              "warn/M_pos", "warn/M_neg")
CURV_GAP_DDOF = 0
"""``warn/curv_gap`` uses population variances (ddof = 0): the statistic as the early-warning study logged it and
the testbed's collapse alarm froze it (docs/testbed.md); the safe step's kappa_hat, the same estimator, takes
ddof = 1 (gapdyn.theory.safe_step.KAPPA_DDOF)."""


def logp_adv_covariance(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> float:
    """Cov(log pi(y_t), A_i) over masked tokens: mean_t (l_t - l_bar)(A_t - A_bar), each token weighted once.

    logp, mask: [N, T]; advantages: [N] (every token of completion i carries A_i). NaN with no token.
    """
    if logp.ndim != 2 or mask.shape != logp.shape:
        raise ValueError(f"logp and mask must share an [N, T] shape, got {tuple(logp.shape)}, {tuple(mask.shape)}")
    if advantages.shape != (logp.shape[0],):
        raise ValueError(f"advantages must be [N] = [{logp.shape[0]}], got {tuple(advantages.shape)}")
    with torch.no_grad():
        m = mask > 0
        if not m.any():
            return float("nan")
        lv = logp.detach().double()[m]
        av = advantages.detach().double().to(logp.device).view(-1, 1).expand_as(mask)[m]
        return float(((lv - lv.mean()) * (av - av.mean())).mean())


def cell_gradient_mass(logp_all, completion_ids, mask, advantages, dloss_dlogp) -> dict:
    """sum_t |dL/dlogp_t| (1 - p_t) per WAPO taxonomy cell (``warn/mass_<cell>``); the cells of gapdyn.theory.taxonomy."""
    with torch.no_grad():
        p_all = logp_all.exp()
        p_s = p_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
        A = advantages.view(-1, 1).expand_as(mask).to(p_s.device)
        bins = token_bin_index(p_s, collision_probability(p_all), A)
        mass = dloss_dlogp.abs() * (1 - p_s) * (mask > 0)
        return {f"warn/mass_{name}": float(mass[bins == i].sum()) for i, name in enumerate(BIN_NAMES)}


def group_curvature(x: torch.Tensor, rewards: torch.Tensor) -> dict:
    """Statistics of x [B*G] (per-completion log-prob change) over the mixed groups of rewards [B, G].

    curv_gap = mean_q [Var(x | wrong, q) - Var(x | correct, q)] (gapdyn.theory.curvature.curvature_gap, population
    variances: :data:`CURV_GAP_DDOF`); wrong_max_frac = share of mixed groups whose argmax x is wrong;
    x_wrong_mean / x_right_mean over the mixed groups' completions. NaN without a mixed group.
    """
    B, G = rewards.shape
    if x.shape != (B * G,):
        raise ValueError(f"x must be [B*G] = [{B * G}], got {tuple(x.shape)}")
    xs = x.detach().double().cpu().view(B, G)
    ok = (rewards > 0).cpu()
    wmax, xw, xr = [], [], []
    for b in range(B):
        win, lose = xs[b][ok[b]], xs[b][~ok[b]]
        if len(win) == 0 or len(lose) == 0:
            continue
        wmax.append(float(not bool(ok[b][int(torch.argmax(xs[b]))])))
        xw.append(lose.numpy())
        xr.append(win.numpy())
    if not wmax:
        nan = float("nan")
        return {"warn/curv_gap": nan, "warn/wrong_max_frac": nan, "warn/x_wrong_mean": nan, "warn/x_right_mean": nan}
    gap, _ = curvature_gap(xs.reshape(-1).numpy(), ok.reshape(-1).numpy(), np.repeat(np.arange(B), G),
                           ddof=CURV_GAP_DDOF)
    return {"warn/curv_gap": gap, "warn/wrong_max_frac": float(np.mean(wmax)),
            "warn/x_wrong_mean": float(np.concatenate(xw).mean()), "warn/x_right_mean": float(np.concatenate(xr).mean())}


def forward_at_current(model, ro) -> tuple[torch.Tensor, torch.Tensor]:
    """(token log pi [N, T], token entropies [N, T]) of the batch's completions at the current parameters: the
    no-grad forward of :func:`after_step_metrics` (a host that needs log pi_{k+1} too runs it once and passes it):
    llm_probe.sampler's shared-prompt forward where it supports the model and the scoring temperature is 1 (the
    same function of the weights), else the model's own."""
    args = (ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    with eval_mode(model), torch.no_grad():
        if supports_fast_path(model) and current_scoring_temperature() == 1.0:
            logp, ent, _ = fast_completion_logprobs(model, *args, G=prompt_group(ro), return_entropy=True)
        else:
            logp, ent, _ = completion_logprobs(model, *args, return_entropy=True)
    return logp, ent


def sequence_logp_change(model, ro, logp_before: torch.Tensor) -> torch.Tensor:
    """x_i = log pi(o_i) at the current parameters minus the summed ``logp_before`` [N, T]: [N] (no grad)."""
    logp_after, _ = forward_at_current(model, ro)
    return logp_change(logp_after, logp_before.detach())


def after_step_metrics(model, ro, logp_before: torch.Tensor, ent_before: torch.Tensor, at_next=None) -> dict:
    """One no-grad forward at theta_{k+1} on the batch's completions: x_i, dH on the same tokens, curvature.
    ``at_next``: that forward's :func:`forward_at_current` output when the host already ran it (not run again)."""
    logp_after, ent_after = forward_at_current(model, ro) if at_next is None else at_next
    m = ro.completion_mask > 0
    x = logp_change(logp_after, logp_before.detach())
    out = group_curvature(x, ro.rewards)
    out["warn/dH_same"] = float(ent_after[m].mean() - ent_before.detach()[m].mean()) if m.any() else float("nan")
    return out


def step_warning_metrics(model, ro, logp, logp_all, advantages, dloss_dlogp=None, *, after: bool = False,
                         at_next=None) -> dict:
    """The ``warn/*`` metrics of one step (module doc). Call after ``optimizer.step()``; ``after=True`` (probe
    steps) adds the forward at theta_{k+1} (``at_next``: its :func:`forward_at_current` output, if already run).
    logp, logp_all: the training forward's [N, T] / [N, T, V] at theta_k."""
    out = {"warn/cov_logp_adv": logp_adv_covariance(logp, advantages, ro.completion_mask)}
    if dloss_dlogp is not None:
        out.update(cell_gradient_mass(logp_all.detach(), ro.completion_ids, ro.completion_mask, advantages,
                                      dloss_dlogp))
    if after:
        ent_before = -(logp_all.detach().exp() * logp_all.detach()).sum(-1)
        out.update(after_step_metrics(model, ro, logp, ent_before, at_next))
    return out


def signed_cumulative_alignment(df):
    """(M_pos, M_neg) per row of one run's metrics frame: running sums over probe steps of eta [dmu]_+ and
    eta [dmu]_- averaged over the batch's mixed prompts (eta = 1; M_pos equals gap/M_batch). Steps without a
    probe carry the last value."""
    import pandas as pd

    n = df.get("gap/n_prompts", pd.Series(np.nan, index=df.index)).astype(float)
    pos = df.get("gap/dmu_update_pos_sum", pd.Series(np.nan, index=df.index)).astype(float)
    neg = df.get("gap/dmu_update_neg_sum", pd.Series(np.nan, index=df.index)).astype(float)
    ok = n > 0
    step_pos = (pos / n).where(ok, 0.0).fillna(0.0)
    step_neg = (neg / n).where(ok, 0.0).fillna(0.0)
    return step_pos.cumsum().to_numpy(), step_neg.cumsum().to_numpy()
