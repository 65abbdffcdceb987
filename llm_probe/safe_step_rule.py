"""The safe step rule and its controller (the pieces :mod:`llm_probe.safe_step` exports), in a module of their
own so the TRL callbacks, the sharded probe and the trainer import them without importing one another.

x_n = d/ds log pi_{theta_k + s d}(o_n) |_{s=0} by one forward-mode pass (:func:`completion_logprob_jvp`), the
rule of :func:`gapdyn.safe_step_multiplier` on x (:func:`rule_from_x`, :func:`step_rule`; docs/theory.md,
section 11) and :class:`SafeStepController`, which applies theta_{k+1} = theta_k + a (theta' - theta_k).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch.func import functional_call, jvp

import gapdyn
from gapdyn.safe_step import SAFE_STEP_C, SAFE_STEP_DELTA

from .model import check_model, completion_logprobs, eval_mode

__all__ = ["SafeStepController", "SafeStepResult", "completion_logprob_jvp", "step_rule", "rule_from_x"]


class _AtValues(torch.nn.Module):
    """``model`` evaluated with the parameter values ``values`` (name -> tensor; the rest: the module's)."""

    def __init__(self, model, values: dict):
        super().__init__()
        self._model = (model,)  # a tuple: not registered as a submodule
        self.values = values
        self.dtype = getattr(model, "dtype", None)

    def forward(self, **kw):
        return functional_call(self._model[0], self.values, args=(), kwargs=kw, strict=False)


def completion_logprob_jvp(model, ro, theta: dict[str, torch.Tensor], direction: dict[str, torch.Tensor]) -> torch.Tensor:
    """x_n = d/ds log pi_{theta + s d}(o_n | q_n) at s = 0 for every completion of ``ro``, [N] (float64, CPU).

    ``theta`` and ``direction`` map parameter names (as ``model.named_parameters()`` gives them) to tensors;
    parameters not named keep the module's values. log pi(o | q) = sum of the completion's token log-probs
    (llm_probe.model.completion_logprobs). One forward-mode pass (torch.func.jvp).
    """
    keys = [k for k in theta]
    if set(direction) != set(keys):
        raise ValueError("direction must have the keys of theta")
    args = (ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)

    def f(*vals):
        return completion_logprobs(_AtValues(model, dict(zip(keys, vals))), *args).sum(-1)

    primals = tuple(theta[k].detach() for k in keys)
    tangents = tuple(direction[k].detach().to(theta[k].dtype) for k in keys)
    with torch.no_grad():
        _, x = jvp(f, primals, tangents)
    return x.detach().to(torch.float64).cpu()


def step_rule(model, ro, theta_k: dict[str, torch.Tensor], d: dict[str, torch.Tensor], *, c: float = SAFE_STEP_C,
              delta: float = SAFE_STEP_DELTA) -> gapdyn.SafeStep:
    """The safe step rule (estimates, headroom h, multiplier a = min(1, h)) for the step d taken at theta_k.

    x_n = :func:`completion_logprob_jvp` along d at theta_k (model in eval mode: no dropout), groups = the
    rollout's prompts, success = reward > 0, groups with an undecided (NaN) reward left out; then
    :func:`gapdyn.safe_step_multiplier` (:func:`rule_from_x`). A non-finite x (the proposal left the finite
    range) gives a = h = 0 and NaN estimates. Nothing is changed in ``model``.
    """
    with eval_mode(model):
        x = completion_logprob_jvp(model, ro, theta_k, d)
    return rule_from_x(x.numpy(), ro.rewards, c=c, delta=delta)


def rule_from_x(x: np.ndarray, rewards: torch.Tensor, *, c: float = SAFE_STEP_C,
                delta: float = SAFE_STEP_DELTA) -> gapdyn.SafeStep:
    """:func:`gapdyn.safe_step_multiplier` of x [B*G] (prompt-major rows) with success = reward > 0 and one group
    per prompt, over the groups whose rewards [B, G] are all decided: a group holding a NaN (an unscorable
    completion) enters no term (not sd_hat, dmu_hat nor kappa_hat). No such group left: a = 1 (the step is
    left as it is) and h NaN (not measured). A non-finite x among them: a = h = 0 and NaN estimates."""
    r = rewards.detach().to(torch.float64).cpu()
    B, G = r.shape
    keep = ~torch.isnan(r).any(-1)
    x = np.asarray(x, dtype=np.float64).reshape(B, G)[keep.numpy()].reshape(-1)
    if not len(x):
        return gapdyn.SafeStep(dmu_hat=math.nan, kappa_hat=math.nan, sd_hat=math.nan, n_mixed=0, a=1.0,
                               headroom=math.nan)
    if not np.all(np.isfinite(x)):
        return gapdyn.SafeStep(dmu_hat=math.nan, kappa_hat=math.nan, sd_hat=math.nan, n_mixed=0, a=0.0, headroom=0.0)
    won = (r[keep] > 0).to(torch.float64).reshape(-1).numpy()
    groups = np.repeat(np.arange(int(keep.sum())), G)  # prompt-major rows (llm_probe.rollout)
    return gapdyn.safe_step_multiplier(x, won, groups, c=c, delta=delta)


@dataclass(frozen=True)
class SafeStepResult:
    """What one controlled step did: the rule's estimates and multiplier, and the step's sizes."""

    rule: gapdyn.SafeStep  # dmu_hat, kappa_hat, sd_hat, n_mixed, a
    update_norm: float  # ||d|| = ||theta' - theta_k|| (the optimizer's proposal)
    applied_norm: float  # ||a d||

    @property
    def metrics(self) -> dict:
        """``safe/*`` scalars for a metrics row (names in docs/llm_probe.md, "Safe step")."""
        r = self.rule
        return {"safe/a": r.a, "safe/dmu_hat": r.dmu_hat, "safe/kappa_hat": r.kappa_hat, "safe/sd_hat": r.sd_hat,
                "safe/n_mixed": r.n_mixed, "safe/headroom": r.headroom, "safe/update_norm": self.update_norm,
                "safe/applied_norm": self.applied_norm}


class SafeStepController:
    """Scale each optimizer step by the safe step multiplier a (module docstring; docs/theory.md, section 11).

    Call :meth:`before` at theta_k (just before ``optimizer.step()``), or pass a copy of theta_k to
    :meth:`after`, which is called with the step's Rollout right after ``optimizer.step()`` and sets the
    trainable parameters to theta_k + a (theta' - theta_k).
    """

    def __init__(self, model, *, c: float = SAFE_STEP_C, delta: float = SAFE_STEP_DELTA):
        for name, v in (("c", c), ("delta", delta)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        check_model(model)
        self.model = model
        self.c, self.delta = float(c), float(delta)
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self._theta_k: dict | None = None

    @property
    def pending(self) -> bool:
        """True between :meth:`before` and :meth:`after` (or :meth:`cancel`)."""
        return self._theta_k is not None

    def before(self) -> None:
        """Record theta_k (a copy of every trainable parameter)."""
        self._theta_k = {n: p.detach().clone() for n, p in self.params.items()}

    def cancel(self) -> None:
        """Forget a recorded theta_k (e.g. a skipped step)."""
        self._theta_k = None

    def after(self, ro, *, theta_k: dict | None = None) -> SafeStepResult:
        """theta <- theta_k + a d with d = theta - theta_k; returns the rule's estimates and a.

        theta_k: name -> tensor of the parameters before the step (e.g. the trainer's own copy); None: the copy
        made by :meth:`before`.
        """
        if theta_k is None:
            if self._theta_k is None:
                raise RuntimeError("SafeStepController.after() needs theta_k or a call to before()")
            theta_k = self._theta_k
        elif not set(self.params) <= set(theta_k):
            raise ValueError("theta_k must hold every trainable parameter by name")
        self._theta_k = None
        theta_k = {n: theta_k[n] for n in self.params}
        d = {n: p.detach() - theta_k[n] for n, p in self.params.items()}
        rule = step_rule(self.model, ro, theta_k, d, c=self.c, delta=self.delta)  # x not finite: a = 0, no move
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(theta_k[n] + rule.a * d[n])
        norm = math.sqrt(sum(float((v.double() ** 2).sum()) for v in d.values()))
        return SafeStepResult(rule, norm, rule.a * norm)
