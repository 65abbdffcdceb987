"""The one interface every per-step probe implements: a hook around the optimizer step.

A host (:class:`llm_probe.Trainer`, :class:`llm_probe.GapProbeCallback`, :class:`llm_probe.SafeStepCallback`)
calls, for each step k it probes, with theta_k the parameters before the step:

    hook.before(Step(ro, ...))   # at theta_k: after backward and gradient clipping, before optimizer.step()
    optimizer.step()             # (mu of them on a reused batch: the hook sees their net change)
    result = hook.after()        # at theta_{k+1}; result.metrics: the step's scalars (docs/llm_probe.md, "Metrics")
    # or hook.cancel()           # the step was skipped (a fault, a failed probe): nothing is measured or summed

``before`` returns the metrics measured at theta_k ({} when there are none); ``pending`` is True between
``before`` and ``after`` / ``cancel``. Implementations: :class:`llm_probe.gap_probe.GapProbe` (gap vectors or JVPs:
the ``gap/*`` metrics), :class:`llm_probe.sharding.ForwardProbe` (forward passes only, for sharded parameters) and
:class:`llm_probe.safe_step_rule.SafeStepController` (rescales the step; ``safe/*``).

Swapping a probe route: a new route (e.g. a cheaper every-step probe) is a class with this interface whose
``__init__`` takes the model first; a host builds its gap probe in one place (``Trainer._init_probes``,
``GapProbeCallback._make_probe``), so the route is chosen there and the host's step code is unchanged. A route
standing in for :class:`~llm_probe.gap_probe.GapProbe` in the trainer also keeps its running sums ``M_batch``
(float) and ``M_probe`` ([n_probe_prompts] array), which the checkpoint saves and restores, and its
``after()`` result carries ``prompts`` (the rows of probe_prompts.jsonl; [] without probe prompts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

__all__ = ["Step", "StepHook", "HookResult", "check_step"]


@dataclass(frozen=True)
class Step:
    """What a host knows at theta_k, just before the optimizer step (the argument of every ``before``)."""

    ro: object  # the step's batch (a llm_probe.rollout.Rollout); under DDP prompt sharding this rank's share
    theta_k: dict | None = None  # name -> tensor at theta_k the host already holds (reused, not copied); None: the
    #                              hook copies what it needs
    probe_ro: object = None  # Rollout of the fixed probe prompts at theta_k, or None
    seq_logp: torch.Tensor | None = None  # [B*G] log pi_k(o_n) from the training forward, or None
    shard_index: torch.Tensor | None = None  # [B] global group of each of ro's groups (DDP share), or None


@dataclass(frozen=True)
class HookResult:
    """A step's measurements when a hook has nothing beyond its scalars."""

    metrics: dict


@runtime_checkable
class StepHook(Protocol):
    """The step hook (module docstring)."""

    @property
    def pending(self) -> bool: ...

    def before(self, step: Step) -> dict: ...

    def after(self): ...  # an object with a ``metrics`` dict

    def cancel(self) -> None: ...


def check_step(step, owner: str) -> Step:
    """``step`` when it is a :class:`Step`; else a one-line ValueError naming ``owner``'s ``before``."""
    if not isinstance(step, Step):
        raise ValueError(f"{owner}.before takes a llm_probe.step_hook.Step (e.g. Step(rollout)), got "
                         f"{type(step).__name__}")
    return step
