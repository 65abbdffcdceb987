"""The safe step rule and its controller (the pieces :mod:`llm_probe.safe_step` exports), in a module of their
own so the TRL callbacks, the sharded probe and the trainer import them without importing one another.

x_n = d/ds log pi_{theta_k + s d}(o_n) |_{s=0} by one forward-mode pass (:func:`completion_logprob_jvp`, defined
in llm_probe.logp_change and re-exported here), the
rule of :func:`gapdyn.safe_step_multiplier` on x (:func:`rule_from_x`, :func:`step_rule`; docs/theory.md,
section 11) and :class:`SafeStepController`, which applies theta_{k+1} = theta_k + a (theta' - theta_k).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

import gapdyn
from gapdyn.theory.safe_step import SAFE_STEP_C, SAFE_STEP_DELTA

from .logp_change import completion_logprob_jvp
from .model import check_model, eval_mode
from .step_hook import Step, check_step

__all__ = ["SafeStepController", "SafeStepResult", "completion_logprob_jvp", "step_rule", "rule_from_x"]


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

    The step hook of llm_probe.step_hook: :meth:`before` at theta_k (just before ``optimizer.step()``) records
    theta_k and the step's Rollout; :meth:`after`, right after ``optimizer.step()``, sets the trainable
    parameters to theta_k + a (theta' - theta_k).
    """

    def __init__(self, model, *, c: float = SAFE_STEP_C, delta: float = SAFE_STEP_DELTA):
        for name, v in (("c", c), ("delta", delta)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        check_model(model)
        self.model = model
        self.c, self.delta = float(c), float(delta)
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self._pending: tuple | None = None  # (Rollout, theta_k of the trainable parameters)

    @property
    def pending(self) -> bool:
        """True between :meth:`before` and :meth:`after` (or :meth:`cancel`)."""
        return self._pending is not None

    def before(self, step: Step) -> dict:
        """Record the step's Rollout ``step.ro`` and theta_k: ``step.theta_k`` (name -> tensor, e.g. the trainer's
        own copy; it must hold every trainable parameter) or, when None, a copy of every trainable parameter.
        Returns {} (nothing is logged at theta_k)."""
        step = check_step(step, "SafeStepController")
        if step.theta_k is None:
            theta_k = {n: p.detach().clone() for n, p in self.params.items()}
        elif not set(self.params) <= set(step.theta_k):
            raise ValueError("theta_k must hold every trainable parameter by name")
        else:
            theta_k = {n: step.theta_k[n] for n in self.params}
        self._pending = (step.ro, theta_k)
        return {}

    def cancel(self) -> None:
        """Forget a recorded step (e.g. a skipped one)."""
        self._pending = None

    def after(self) -> SafeStepResult:
        """theta <- theta_k + a d with d = theta - theta_k; returns the rule's estimates and a."""
        if self._pending is None:
            raise RuntimeError("SafeStepController.after() called without a matching before()")
        (ro, theta_k), self._pending = self._pending, None
        d = {n: p.detach() - theta_k[n] for n, p in self.params.items()}
        rule = step_rule(self.model, ro, theta_k, d, c=self.c, delta=self.delta)  # x not finite: a = 0, no move
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(theta_k[n] + rule.a * d[n])
        norm = math.sqrt(sum(float((v.double() ** 2).sum()) for v in d.values()))
        return SafeStepResult(rule, norm, rule.a * norm)
