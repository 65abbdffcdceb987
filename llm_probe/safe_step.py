"""The safe step controller for a torch policy: the rule of ``gapdyn.theory.safe_step`` applied after an optimizer step.

docs/theory.md, section 11 (derived model, heuristic constants). One optimizer step k proposes theta'; with
d = theta' - theta_k and, for each completion o_n of the step's batch,

    x_n = d/ds log pi_{theta_k + s d}(o_n) |_{s=0}        (one forward-mode pass, torch.func.jvp, at theta_k)

the multiplier a = min(1, h) of :func:`gapdyn.safe_step_multiplier` (groups = prompts), with the headroom
h = min(delta / sd_hat, c dmu_hat / kappa_hat) (:func:`gapdyn.theory.safe_step.safe_step_headroom`), sets
theta_{k+1} = theta_k + a d in place. :func:`step_rule` computes x and the rule for one step; the controller and
:class:`llm_probe.GapProbeCallback`'s headroom meter (``gap/headroom``, which measures without rescaling) both
call it, with the same defaults c = ``SAFE_STEP_C`` = 1 and delta = ``SAFE_STEP_DELTA`` = 2. The optimizer's own state (Adam's moments) is
left as the optimizer wrote it. The same :class:`SafeStepController` serves ``gapdyn train --safe-step``
(:class:`llm_probe.Trainer`) and a real ``trl.GRPOTrainer`` (:class:`llm_probe.safe_step_callback.SafeStepCallback`,
also importable from here and from ``llm_probe``).

Cost per step: one copy of the trainable parameters and one JVP over the step's completions (about two to
three forwards of the batch); measured in docs/llm_probe.md ("Safe step").
"""

from __future__ import annotations

from .safe_step_rule import SafeStepController, SafeStepResult, completion_logprob_jvp, rule_from_x, step_rule

__all__ = ["SafeStepController", "SafeStepResult", "completion_logprob_jvp", "step_rule", "rule_from_x"]


def __getattr__(name):  # the TRL callback (llm_probe.safe_step_callback) imports transformers: load it on first use
    if name == "SafeStepCallback":
        from .safe_step_callback import SafeStepCallback

        return SafeStepCallback
    raise AttributeError(name)
