"""The safe step controller on a real ``trl.GRPOTrainer``: :class:`SafeStepCallback` (a transformers callback).

The rule and the controller are :mod:`llm_probe.safe_step`'s (docs/theory.md, section 11: theta_{k+1} =
theta_k + a (theta' - theta_k), a = min(1, h)); this module only feeds them TRL's batches. It imports
transformers, so ``llm_probe`` loads it on first use of ``llm_probe.SafeStepCallback``.
"""

from __future__ import annotations

import logging
import math

from transformers import TrainerCallback

from gapdyn.theory.safe_step import SAFE_STEP_C, SAFE_STEP_DELTA

from .callback import GapProbeCallback
from .probe_forward import probe_forwards
from .safe_step_rule import SafeStepController
from .step_hook import Step

__all__ = ["SafeStepCallback"]

logger = logging.getLogger(__name__)


class SafeStepCallback(TrainerCallback):
    """The safe step controller on a ``trl.GRPOTrainer`` (works with gradient accumulation).

    Wrap the reward function with :meth:`wrap_reward` (it records each generation batch's prompts, completion
    ids and rewards, TRL's order: ``num_generations`` consecutive completions per prompt; a reward > 0 counts
    as a success; several reward functions: :meth:`wrap_rewards`). Per optimizer step:
    ``on_pre_optimizer_step`` builds the step's Rollout from the records and calls
    :meth:`SafeStepController.before` (theta_k); ``on_optimizer_step`` calls :meth:`SafeStepController.after`
    (theta = theta_k + a d).
    One row per step in :attr:`history` (``step``, ``reward`` and the ``safe/*`` metrics, ``safe/headroom`` = h
    with ``safe/a`` = min(1, h)). Needs
    ``num_iterations=1`` and ``steps_per_generation`` equal to the gradient-accumulation steps (checked at
    ``on_train_begin``). Register it with :meth:`attach` (after any callback that must see the optimizer's own
    step): it captures the prompt and completion ids TRL trains on, as :class:`GapProbeCallback` does, and the
    rule is computed at ``args.temperature`` with the probe's forward state (llm_probe.probe_forward). A step
    whose rule cannot be computed is left as the optimizer made it, logged and counted in
    :attr:`skipped_steps`.
    """

    def __init__(self, tokenizer, num_generations: int, *, c: float = SAFE_STEP_C,
                 delta: float = SAFE_STEP_DELTA):
        if isinstance(num_generations, bool) or not isinstance(num_generations, int) or num_generations < 2:
            raise ValueError(f"num_generations must be an integer >= 2, got {num_generations!r}")
        for name, v in (("c", c), ("delta", delta)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        self.c, self.delta = float(c), float(delta)
        # reward recording and Rollout building only (its own probe never runs)
        self._recorder = GapProbeCallback(tokenizer, num_generations, probe_every=1)
        self.controller: SafeStepController | None = None
        self.history: list[dict] = []
        self._reward = math.nan  # the mean reward of the step the controller holds
        self.skipped_steps: list[dict] = []  # {"step", "reason"}: steps left unscaled because the rule failed

    def attach(self, trainer) -> SafeStepCallback:
        """Capture ``trainer``'s batches (:meth:`GapProbeCallback.capture_batches`) and register this callback
        last among ``trainer``'s callbacks; returns self."""
        funcs = getattr(trainer, "reward_funcs", None)
        mine = [] if self._recorder._rewards is None else self._recorder._rewards.wrapped
        if funcs is not None and (len(funcs) != len(mine) or any(f is not g for f, g in zip(funcs, mine))):
            raise ValueError(f"trainer: its {len(funcs)} reward function(s) are not the {len(mine)} this callback "
                             "wrapped: pass reward_funcs=cb.wrap_rewards([f1, f2, ...])")
        self.capture_batches(trainer)
        cbs = trainer.callback_handler.callbacks
        if self in cbs:
            cbs.remove(self)
        cbs.append(self)
        return self

    def capture_batches(self, trainer) -> None:
        """Record the token ids of ``trainer``'s batches (:meth:`GapProbeCallback.capture_batches`) without
        registering this callback (for one registered through ``callbacks=[...]``)."""
        self._recorder.capture_batches(trainer)

    def wrap_reward(self, fn):
        """A reward function with the same behaviour that also records each call's groups."""
        return self._recorder.wrap_reward(fn)

    def wrap_rewards(self, funcs, weights=None, *, success=None) -> list:
        """Several reward functions, recorded once per batch: :meth:`GapProbeCallback.wrap_rewards`."""
        return self._recorder.wrap_rewards(funcs, weights, success=success)

    def on_train_begin(self, args, state, control, **kw):
        self._recorder.on_train_begin(args, state, control, **kw)
        mu = getattr(args, "num_iterations", 1)
        if mu != 1:
            raise ValueError(f"SafeStepCallback needs num_iterations == 1, got num_iterations={mu}: TRL then "
                             f"takes {mu} optimizer steps on each generation batch, the multiplier a is derived "
                             "for one step on fresh completions, and the steps after the first would be applied "
                             "unscaled")

    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        if self.controller is None:
            self.controller = SafeStepController(model, c=self.c, delta=self.delta)
        self.controller.cancel()
        try:
            ro = self._recorder.take_rollout(next(model.parameters()).device)
        except ValueError as exc:  # a batch the rule cannot score: the optimizer's step stands
            self.skipped_steps.append({"step": int(state.global_step), "reason": str(exc).splitlines()[0][:300]})
            logger.warning("SafeStepCallback: step %d left unscaled (%s)", state.global_step, exc)
            return
        if ro is None:  # no recorded batch: leave the optimizer's step as it is
            return
        self.controller.before(Step(ro))  # theta_k and the step's rollout (the step hook, llm_probe.step_hook)
        self._reward = float(ro.rewards.mean())

    def on_optimizer_step(self, args, state, control, model=None, **kw):
        if self.controller is None or not self.controller.pending:
            return
        try:
            with probe_forwards(model, self._recorder.temperature):
                res = self.controller.after()
        except Exception as exc:  # noqa: BLE001 - the optimizer's step stands; training goes on
            self.controller.cancel()
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            self.skipped_steps.append({"step": int(state.global_step), "reason": reason})
            logger.warning("SafeStepCallback: step %d left unscaled (%s)", state.global_step, reason)
            return
        self.history.append({"step": int(state.global_step), "reward": self._reward, **res.metrics})
