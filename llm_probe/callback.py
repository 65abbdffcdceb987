"""The Gradient-Gap probe (llm_probe.gap_probe) attached to a real ``trl.GRPOTrainer`` run through a
``transformers.TrainerCallback``; single process or data-parallel (DDP) across processes.

Callbacks see the model and optimizer but not the batch, so the callback wraps the reward function: each call
records the prompts, the completion token ids and the rewards of that generation batch (grouped
``num_generations`` consecutive completions per prompt, TRL's order). Then, per probed optimizer step
(k % ``probe_every`` == 0, k = ``state.global_step`` before the step, counted from 0):

- ``on_pre_optimizer_step`` (gradients already clipped, parameters = theta_k): :meth:`GapProbe.before`;
- ``on_optimizer_step`` (parameters = theta_{k+1}): :meth:`GapProbe.after`; one row per probed step in
  :attr:`GapProbeCallback.history` (and ``log_path``). With ``optim="sgd"`` delta = -lr * grad exactly;
- ``on_log``: the scalars of the rows since the last log (mean over them; the running sums ``gap/M_*``: the
  last value) are merged into TRL's ``logs`` and ``state.log_history[-1]``, so they reach every ``report_to``
  integration that runs after this callback: :meth:`GapProbeCallback.attach` puts it first. Keys TRL already
  logs (``reward``, ``frac_reward_zero_std``) keep TRL's values.

Cadence: on the other steps nothing is measured or recorded (no history row, no ``log_path`` or
``rollout_path`` line, no ``gap/*`` key in that step's log row); the step's recorded completions are dropped.
The running sums are sums over the probed steps only: ``gap/M_batch`` = sum_{probed k} mean_q [dmu_q,k]_+, so
s * ``gap/M_batch`` with s = lcm(probe_every, mu) / mu (``summary()["M_batch_scaled"]``; s = probe_every at mu = 1)
is a sampled estimate (one generation batch in s) of the every-step sum M of Suk & Duan (arXiv 2510.08539), and
probe_every = 1 gives M itself.

Headroom (``gap/headroom``, probed steps): the safe step rule before its cap, h = min(delta / sd_hat,
c dmu_hat / kappa_hat) of :func:`gapdyn.theory.safe_step.safe_step_headroom` for the step actually taken
d = theta_{k+1} - theta_k over every trainable parameter, by :func:`llm_probe.headroom.step_headroom` (the code the
trainer runs) from :func:`llm_probe.safe_step.step_rule` (the function and defaults c = 1, delta = 2 of
:class:`llm_probe.safe_step.SafeStepCallback`, whose multiplier is a = min(1, h); docs/theory.md, section 11).
The step is not changed. h < 1: the rule would shrink this step by h; h > 1: it could grow h-fold before a cap
binds. ``gap/headroom_lr`` = lr_k h_k (the step's learning rate times h: the
learning rate at which the cap would just bind, since d scales with lr for SGD and Adam alike), and
:meth:`GapProbeCallback.summary` / the logged ``gap/suggested_lr`` = the lr finder's rule (llm_probe.suggest): the
median of lr_k h_k over the run's first 20 probed steps with a value. A zero update (e.g. lr 0 during warm-up) has
no direction: h is NaN and left out.
lr_k is the learning rate shared by every optimizer parameter group holding a trainable parameter; groups with
different ones leave ``gap/headroom_lr`` NaN (one log line). A group with an unscorable completion enters no term
of h.
With a SafeStepCallback on the same trainer, register it after this callback: h is then the controller's own
pre-cap quantity on the optimizer's proposal.

Our own forward pass scores the completions (TRL's fused LM head never builds logits), on the token ids TRL trains
on: :meth:`GapProbeCallback.attach` captures each generation batch's ``prompt_ids`` / ``prompt_mask`` /
``completion_ids`` / ``completion_mask`` (so special tokens, chat templates and truncation are TRL's), and every
probe forward scores log softmax(z / T) at T = ``args.temperature`` in the state of
:func:`llm_probe.probe_forward.probe_forwards` (eager attention, gradient checkpointing and its input-require-grads
hook off, float32 under mixed precision; restored after). A probed step the probe cannot measure is logged, skipped
and counted (``skipped_steps``); training goes on. Per-prompt bookkeeping
needs ``steps_per_generation`` equal to the gradient-accumulation steps (the default: one generation batch per
optimizer step); another value raises a ValueError at ``on_train_begin``. With ``num_iterations = mu > 1`` TRL
reuses each generation batch for mu optimizer steps: the gaps are taken at theta_k, before the first of them
(``dmu_grad`` with that step's gradient), and ``dmu_update`` and ``update_norm`` measure the net change
theta_{k+mu} - theta_k; the row is written after the mu-th step and carries ``step`` = k.

Rewards: :meth:`GapProbeCallback.wrap_rewards` wraps all of a trainer's reward functions together, so each
generation batch is recorded once, with TRL's aggregate R_n = nansum_i w_i r_{n,i} (``reward_weights`` w, None
-> NaN; trl 1.16 ``GRPOTrainer._calculate_rewards``). Success (O+) is R_n > 0 by default, or the rule passed as
``success``. A completion TRL cannot score (every reward None: TRL gives it advantage 0) is neither a success
nor a failure: its group is left out of the step's gap measurement (and of ``rollout_path``). Batches scored
while the model is in eval mode (TRL's evaluation) are not recorded. ``on_train_begin`` refuses a group size,
or reward weights, that differ from the trainer's, and ``attach`` a trainer whose reward functions are not the
wrapped ones.
TRL's sampler may emit the pad token inside a completion (ours never does, llm_probe.rollout); pass
``generation_kwargs={"suppress_tokens": [pad_id]}`` to GRPOConfig to rule it out.

Distributed (``accelerate launch --num_processes N`` / ``torchrun``, DDP): each process's reward function sees
only its own share of the generation batch, so at ``on_pre_optimizer_step`` the records of every rank are
gathered (``torch.distributed.all_gather_object``, rank order, which is the order TRL groups rewards in); then
each rank probes only the groups b with b % N == rank (whole groups: a group that straddled ranks is whole after
the gather) and the per-prompt scalars (dmu_q, ||g_q||, Phi_hat_q changes; the headroom's per-completion x_n)
are gathered back in the one-process order (llm_probe.collectives). DDP has already averaged ``p.grad``, so every
rank holds the same theta and logs the one-process numbers; rank 0 alone writes ``log_path`` / ``rollout_path``.
FSDP (FSDP2 ``fully_shard`` included) and DeepSpeed (ZeRO-3) shard parameters and gradients: the callback then
measures only what forward passes give (:class:`llm_probe.sharding.ForwardProbe`: ``gap/dphi`` per prompt, the
realised Phi_hat change, a forward-difference estimate of dmu with O(||delta||^2) error; ``gap/M_dphi``;
``gap/headroom`` from forward-difference x_n; ``entropy*``, ``taxonomy/*``, ``warn/cov_logp_adv`` at theta_k) and
names the skipped metrics (gap norms, cosines, dmu, JVP checks: :data:`llm_probe.sharding.NEEDS_FULL_PARAMETERS`)
once in a warning and in :attr:`GapProbeCallback.skipped`. Under DeepSpeed accelerate steps the engine inside
``accelerator.backward``, before ``on_pre_optimizer_step``; read from the attached trainer's accelerator at
``on_train_begin``, the theta_k part of the probe then runs at the start of the engine's ``step``
(:func:`llm_probe.sharding.deepspeed_engine_stepped_in_backward`; ``ACCELERATE_USE_CPU=true`` makes accelerate drop
DeepSpeed and run DDP: one log line, the DDP route).

Alarm (``alarm=``; none by default, and then nothing here changes): each alarm (name, statistic, detector with its
cutoff; llm_probe.online_alarm) reads its statistic from every log row that carries it (TRL's ``reward``,
``entropy``, ``frac_reward_zero_std``, or this callback's ``gap/*`` / ``warn/*`` keys on probed steps) and is fed
online, so its score at step t uses only the values logged up to t. On those rows it logs ``alarm/<name>`` (1 when
the score reaches the cutoff, else 0) and ``alarm/<name>_score`` (NaN while the score is not defined). At its first
firing (step = ``state.global_step``): one log line, ``on_alarm(name, step, value)`` (value: the statistic's logged
value) when given, and with ``stop_on_alarm`` ``control.should_training_stop = True`` (transformers ends training
after that step). The cutoffs of :func:`llm_probe.online_alarm.load_alarm_specs` (an ``alarm_specs.json``) are
calibrated on the testbed at a fixed false-alarm rate and not yet validated on a held-out block. Under DDP every rank
sees the same logged values (TRL gathers its metrics; the probe's are the one-process numbers), so every rank fires
and stops at the same step; the hook runs on every rank (``state.is_world_process_zero`` picks one).

"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import math
import threading
import weakref
from pathlib import Path

import numpy as np
import torch
from transformers import TrainerCallback

from gapdyn.theory.safe_step import SAFE_STEP_C, SAFE_STEP_DELTA

from .gap_probe import ALIGNMENT_ROUTES, GapProbe
from .ghost import GhostProbe
from .model import check_model
from .probe_forward import probe_forwards
from .rollout import Rollout, encode_prompts, left_pad
from .collectives import RankFailure, agree, all_gather_objects, owned_groups, sub_rollout
from .collectives import rank as _rank
from .collectives import world_size as _world_size
from .headroom import headroom_metrics, step_headroom
from .online_alarm import as_alarms
from .sharding import NEEDS_FULL_PARAMETERS, ForwardProbe, deepspeed_engine_stepped_in_backward, sharded_kind
from .step_hook import Step
from .suggest import first_probed, lr_suggestion

logger = logging.getLogger(__name__)

__all__ = ["GapProbeCallback"]

_ROUTES = ALIGNMENT_ROUTES + ("ghost",)  # "ghost": llm_probe.ghost.GhostProbe (gram matrix, no gap vectors)
_RUNNING_SUMS = ("gap/M_batch", "gap/M_mean")  # logged as their last value, not a mean over steps


class GapProbeCallback(TrainerCallback):
    """Per-step Gradient-Gap alignment of a TRL GRPO run. Wrap the reward function(s) with :meth:`wrap_reward`
    (:meth:`wrap_rewards`); :meth:`attach` it so the metrics land in TRL's logs."""

    def __init__(self, tokenizer, num_generations: int | None = None, *, probe_every: int = 10, params: str = "all",
                 alignment: str = "dot", headroom: bool = True, c: float = SAFE_STEP_C, delta: float = SAFE_STEP_DELTA,
                 log_path: str | Path | None = None, rollout_path: str | Path | None = None, alarm=None,
                 stop_on_alarm: bool = False, on_alarm=None):
        """``num_generations``: TRL's group size G (None: read from the trainer's args at ``on_train_begin``;
        given, it must equal them). ``probe_every``: probe the optimizer steps k with k % probe_every == 0
        (module docstring, "Cadence"). ``headroom``: log ``gap/headroom`` (one copy of the trainable parameters
        and one forward-mode pass over the batch per probed step), with the safe step rule's ``c`` and ``delta``.
        ``log_path``: one JSON row of metrics per probed step; ``rollout_path``: the probed step's gathered
        rollout, one line per completion {step, prompt, completion, completion_ids, reward} (the input of
        ``llm_probe.offline``; ``reward`` > 0 is the probe's success, see :meth:`wrap_rewards`). ``alarm``: None, or
        alarms watched online (:func:`llm_probe.online_alarm.as_alarms`: an AlarmSpec, a (name, statistic, detector
        [, cutoff]) tuple, a path to a calibrated ``alarm_specs.json`` (its primary alarms; cutoffs calibrated on the
        testbed, not yet validated on a held-out block), or a list); ``stop_on_alarm``: stop training at an alarm's
        first firing; ``on_alarm(name, step, value)``: called once per alarm at its first firing (module doc)."""
        if isinstance(tokenizer, tuple):
            raise ValueError("tokenizer is a tuple (e.g. the PolicyPair load_policy returns), not a tokenizer: "
                             "pass pair.tokenizer")
        if num_generations is not None and (isinstance(num_generations, bool) or not isinstance(num_generations, int)
                                            or num_generations < 2):
            raise ValueError(f"num_generations must be an integer >= 2 or None, got {num_generations!r}")
        if isinstance(probe_every, bool) or not isinstance(probe_every, int) or probe_every < 1:
            raise ValueError(f"probe_every must be a positive integer, got {probe_every!r}")
        if alignment not in _ROUTES:
            raise ValueError(f"alignment must be one of {_ROUTES}, got {alignment!r}")
        if not isinstance(headroom, bool):
            raise ValueError(f"headroom must be a bool, got {headroom!r}")
        for name, v in (("c", c), ("delta", delta)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        self.alarms = as_alarms(alarm)
        if not isinstance(stop_on_alarm, bool):
            raise ValueError(f"stop_on_alarm must be a bool, got {stop_on_alarm!r}")
        if on_alarm is not None and not callable(on_alarm):
            raise ValueError(f"on_alarm must be None or a callable (name, step, value), got {on_alarm!r}")
        if (stop_on_alarm or on_alarm is not None) and not self.alarms:
            raise ValueError("stop_on_alarm / on_alarm need an alarm: pass alarm=...")
        self.stop_on_alarm, self.on_alarm = stop_on_alarm, on_alarm
        self.tok = tokenizer
        self.probe_every = probe_every
        self.headroom = headroom
        self.c, self.delta = float(c), float(delta)
        self.G = None if num_generations is None else int(num_generations)
        self.params_spec = params
        self.alignment = alignment
        self.log_path = Path(log_path) if log_path else None
        self.rollout_path = Path(rollout_path) if rollout_path else None
        self.history: list[dict] = []
        self.probe: GapProbe | None = None
        self._calls: list[tuple] = []
        self._batch: dict | None = None
        self._unlogged: list[dict] = []
        self._gathered: tuple | None = None
        self._mu = 1  # TRL's num_iterations: optimizer steps per generation batch
        self._steps_left = 0  # optimizer steps still to come on the probed batch
        self._step_k: int | None = None
        self._rewards: _RewardGroup | None = None  # the wrapped reward functions
        self._model = None  # the trainer's model (on_train_begin): eval-mode batches are not recorded
        self._theta_k: dict | None = None  # trainable parameters at theta_k of the probed step (headroom)
        self._ro: Rollout | None = None  # the probed step's rollout (headroom)
        self._lr = math.nan  # the probed step's learning rate
        self._owned: torch.Tensor | None = None  # DDP: the groups this rank probes (llm_probe.collectives)
        self._sharded: str | None = None  # "FSDP" / "DeepSpeed": forward-only probe (llm_probe.sharding)
        self._fwd_stats: dict = {}  # ForwardProbe.before's token statistics of the probed step
        self.skipped: tuple[str, ...] = ()  # metrics not measured in this run (sharded parameters)
        self.skipped_steps: list[dict] = []  # probed steps the probe could not measure: {"step", "reason"}
        self.temperature = 1.0  # TRL's args.temperature (on_train_begin): the scored policy is softmax(z / T)
        self._attached = False  # attach() installed the batch capture
        self._trainer = None  # weakref to the attached trainer (on_train_begin reads its accelerator)
        self._kind_known = False  # on_train_begin settled the route from the trainer's accelerator
        self._step_in_backward = False  # DeepSpeed under accelerate: the pre-step part runs in engine.step
        self._captured: list[tuple] = []  # per recorded batch: the ids TRL trains on (attach)
        self._notes: set[str] = set()  # one-line warnings already logged

    @property
    def M_batch(self) -> float:
        """sum over probed steps of mean_q [dmu_q]_+; NaN under FSDP / DeepSpeed (forward only: ``gap/M_dphi``)."""
        if self._sharded is not None:
            return math.nan
        return self.probe.M_batch if self.probe is not None else 0.0

    def attach(self, trainer) -> GapProbeCallback:
        """Register with ``trainer`` ahead of every other callback (the ``report_to`` integrations read the
        logs this callback extends); returns self. A ValueError when the trainer's ``reward_funcs`` are not
        exactly the functions this callback wrapped (in one :meth:`wrap_rewards` call)."""
        funcs = getattr(trainer, "reward_funcs", None)
        if funcs is not None:
            mine = [] if self._rewards is None else self._rewards.wrapped
            if len(funcs) != len(mine) or any(f is not g for f, g in zip(funcs, mine)):
                raise ValueError(f"trainer: its {len(funcs)} reward function(s) are not the {len(mine)} this callback "
                                 "wrapped: pass reward_funcs=cb.wrap_rewards([f1, f2, ...]) with all of them (one "
                                 "call), so each generation batch is recorded once with TRL's aggregate reward")
        self.capture_batches(trainer)
        self._trainer = weakref.ref(trainer)
        cbs = trainer.callback_handler.callbacks
        if self in cbs:
            cbs.remove(self)
        cbs.insert(0, self)
        return self

    def capture_batches(self, trainer) -> None:
        """Record the prompt and completion ids of every generation batch ``trainer`` trains on (the output of
        trl's ``GRPOTrainer._generate_and_score_completions``: ``prompt_ids`` / ``prompt_mask`` left-padded,
        ``completion_ids`` / ``completion_mask``), so the probe scores exactly those tokens: the tokenizer's
        special tokens, a chat template and truncation are then TRL's by construction. Called by
        :meth:`attach`. A ValueError (one line naming the cause) for a trainer whose batches the probe cannot
        score: no such method, tool calls or environments (tokens masked out of the loss), a vision model."""
        gen = getattr(trainer, "_generate_and_score_completions", None)
        if gen is None or not callable(gen):
            raise ValueError(f"trainer: {type(trainer).__name__} has no _generate_and_score_completions (trl "
                             "GRPOTrainer's batch builder): the probe cannot capture the token ids it trains on")
        if getattr(trainer, "tools", None) or getattr(trainer, "environment_factories", None):
            raise ValueError("trainer: tools / environment_factory are set: tool-output tokens are masked out of "
                             "TRL's loss (tool_mask) and the probe scores whole completions; refused")
        if getattr(gen, "_gapdyn_capture", None) is self:
            self._attached = True
            return

        @functools.wraps(gen)
        def capture(*a, **kw):
            out = gen(*a, **kw)
            self._capture(out)
            return out

        capture._gapdyn_capture = self
        trainer._generate_and_score_completions = capture
        self._attached = True

    def _capture(self, out) -> None:
        """The token ids of one generation batch (this rank's rows, TRL's order), as unpadded lists."""
        if not self._recording():
            return
        mm = sorted(k for k in ("pixel_values", "image_grid_thw", "token_type_ids", "mm_token_type_ids",
                                "image_position_ids", "tool_mask") if out.get(k) is not None)
        pm = out["prompt_mask"].detach().bool().cpu()
        prompts = [row[m].tolist() for row, m in zip(out["prompt_ids"].detach().cpu(), pm)]
        self._captured.append((prompts, out["completion_ids"].detach().cpu().tolist(),
                               out["completion_mask"].detach().cpu().tolist(),
                               f"the batch carries {mm}, which the probe's forward does not take" if mm else None))

    def wrap_reward(self, fn):
        """A reward function with the same behaviour that also records each call's groups: the trainer's only
        reward function (several: :meth:`wrap_rewards`). ``wrap_rewards([fn])[0]``."""
        return self.wrap_rewards([fn])[0]

    def wrap_rewards(self, funcs, weights=None, *, success=None) -> list:
        """All of a trainer's reward functions, wrapped together: pass the returned list as ``reward_funcs``
        (same order, same behaviour; sync and async functions). Each generation batch is recorded once, when
        every function has scored it, with TRL's aggregate (trl 1.16 ``GRPOTrainer``: a None reward -> NaN)

            R_n = nansum_i w_i r_{n,i},   w = ``reward_weights`` (ones when the trainer has none).

        weights: None: the trainer's ``reward_weights``, read at ``on_train_begin``; given: checked equal to them.
        success: which completions are successes (O+; Suk & Duan's binary reward): None: R_n > 0; the name of one
        of ``funcs`` (its ``__name__``): that function's reward > 0; a callable ``success(r [N, F] float64, NaN for
        None, R [N]) -> [N] bool``. A completion whose success is undecided (every reward None, which TRL scores
        as unscorable and gives advantage 0; or the named function's reward None) is neither a success nor a
        failure: its whole group is left out of the step's gap measurement (Phi_hat_q is not defined on the
        rest of a group in a batch of equal group sizes) and of ``rollout_path``. The success rule reads the raw
        weighted sum whatever ``multi_objective_aggregation`` (TRL logs the same sum as ``reward``).
        """
        if self._rewards is not None:
            raise ValueError("funcs: this callback already wraps reward functions; wrap all of a trainer's reward "
                             "functions in one call: cb.wrap_rewards([f1, f2, ...])")
        self._rewards = _RewardGroup(funcs, weights, success, self)
        return list(self._rewards.wrapped)

    def _recording(self) -> bool:
        """False while the trainer's model is in eval mode (TRL scores its evaluation batches then)."""
        return self._model is None or bool(getattr(self._model, "training", True))

    def on_train_begin(self, args, state, control, **kw):
        if kw.get("model") is not None:
            self._model = kw["model"]
        if "train_dataloader" in kw and not self._attached:  # a trainer runs this callback
            raise ValueError(f"{type(self).__name__} is not attached: call cb.attach(trainer) before "
                             "trainer.train(), so the probe scores the prompt and completion ids TRL trains on")
        T = getattr(args, "temperature", 1.0)
        if T is None:
            T = 1.0
        if isinstance(T, bool) or not isinstance(T, (int, float)) or not math.isfinite(T) or T <= 0:
            raise ValueError(f"args.temperature must be a finite number > 0, got {T!r}")
        self.temperature = float(T)
        if kw.get("train_dataloader") is not None:
            self._note_sampling(args)
        self._set_sharded(self._accelerated_kind(args, kw.get("model")))
        if self.alignment == "ghost" and self._sharded is None and _world_size() > 1:
            raise ValueError(f"alignment='ghost' probes one process only ({_world_size()} here): use alignment='dot' "
                             "under DDP")
        G = getattr(args, "num_generations", None)
        if G is not None:
            if self.G is None:
                if isinstance(G, bool) or not isinstance(G, int) or G < 2:
                    raise ValueError(f"args.num_generations must be an integer >= 2, got {G!r}")
                self.G = G
            elif G != self.G:
                raise ValueError(f"GapProbeCallback was built with num_generations={self.G}, the trainer's args "
                                 f"have num_generations={G}: TRL groups {G} completions per prompt; pass "
                                 f"num_generations={G} (or None to read it from the args)")
        if self._rewards is not None:
            self._rewards.check_weights(getattr(args, "reward_weights", None))
        mu = getattr(args, "num_iterations", 1)
        if isinstance(mu, bool) or not isinstance(mu, int) or mu < 1:
            raise ValueError(f"num_iterations must be an integer >= 1, got {mu!r}")
        self._mu = mu
        spg = getattr(args, "steps_per_generation", None)
        if spg is not None and spg != args.gradient_accumulation_steps:
            raise ValueError("GapProbeCallback needs steps_per_generation == gradient_accumulation_steps")

    def _accelerated_kind(self, args, model) -> str | None:
        """The probe route's sharding (:func:`llm_probe.sharding.sharded_kind`) as the attached trainer's accelerator
        runs it. Under DeepSpeed accelerate steps the engine inside ``accelerator.backward``, before
        ``on_pre_optimizer_step`` (:func:`llm_probe.sharding.deepspeed_engine_stepped_in_backward`): the pre-step
        part of the probe (the theta_k forward) then runs at the start of the engine's ``step``, after the backward
        and before the update, and ``on_pre_optimizer_step`` does nothing. ``args.deepspeed`` set while accelerate
        runs without DeepSpeed (``ACCELERATE_USE_CPU=true`` drops the plugin): one log line, the DDP route."""
        kind = sharded_kind(args, model)
        trainer = self._trainer() if self._trainer is not None else None
        acc = getattr(trainer, "accelerator", None)
        self._step_in_backward = False
        if acc is None:
            return kind
        self._kind_known = True
        engine = deepspeed_engine_stepped_in_backward(acc)
        if engine is not None:
            self._before_engine_step(engine)
            return "DeepSpeed"
        if kind == "DeepSpeed" and sharded_kind(model=model, env=False) is None:
            self._note(f"args.deepspeed is set but accelerate runs without DeepSpeed (distributed_type "
                       f"{acc.distributed_type}; ACCELERATE_USE_CPU=true drops accelerate's DeepSpeed plugin): the "
                       "parameters are not sharded and the probe takes the DDP / one-process route")
            return None
        return kind

    def _before_engine_step(self, engine) -> None:
        """Run the pre-step part of the probe at the start of DeepSpeed's ``engine.step`` (once per engine)."""
        step = engine.step
        if getattr(step, "_gapdyn_probe", None) is self:
            self._step_in_backward = True
            return

        @functools.wraps(step)
        def probed_step(*a, **kw):
            trainer = self._trainer()
            self._pre_step(trainer.state, trainer.model, trainer.optimizer)
            return step(*a, **kw)

        probed_step._gapdyn_probe = self
        engine.step = probed_step
        self._step_in_backward = True

    def _note_sampling(self, args) -> None:
        """One log line when TRL samples from another policy than the one it trains (docs/llm_probe.md)."""
        diff = []
        for name, neutral in (("top_p", 1.0), ("top_k", 0), ("min_p", None), ("repetition_penalty", 1.0)):
            v = getattr(args, name, neutral)
            if v is not None and v != neutral:
                diff.append(f"{name}={v}")
        if getattr(args, "generation_kwargs", None):
            diff.append(f"generation_kwargs={args.generation_kwargs}")
        if diff:
            self._note(f"TRL samples with {', '.join(diff)} but trains log_softmax(logits / {self.temperature:g}): "
                       "the probe scores the trained policy")

    def _note(self, msg: str) -> None:
        if msg not in self._notes:
            self._notes.add(msg)
            logger.warning("GapProbeCallback: %s", msg)

    def _skip(self, step: int, exc: BaseException) -> None:
        """A probed step the probe could not measure: logged, counted, training goes on."""
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        self.skipped_steps.append({"step": int(step), "reason": reason})
        logger.warning("GapProbeCallback: step %d not probed (%s)", step, reason)
        if self.probe is not None:
            self.probe.cancel()
        self._theta_k = self._ro = None
        self._steps_left = 0

    def take_rollout(self, device) -> Rollout | None:
        """The completions recorded since the last call (gathered from every rank under DDP) as a Rollout;
        None when nothing new was generated."""
        if self._rewards is not None:
            self._rewards.check_complete()
        if not self._calls and _world_size() == 1:
            return None
        if self.G is None:
            raise ValueError("num_generations is unknown: pass it to GapProbeCallback or register the callback "
                             "with the trainer (on_train_begin reads args.num_generations)")
        # prompts, completion ids, success (1 / 0 / NaN undecided), rollout_path lines, then (attached) the prompt
        # ids and completion masks TRL trains on, and a reason the batch cannot be scored (or None)
        cols = [[], [], [], [], [], [], []]
        calls, caps, self._calls, self._captured = self._calls, self._captured, [], []
        problem = None
        if self._attached and len(caps) != len(calls):
            problem = f"{len(calls)} batch(es) scored by the reward functions, {len(caps)} captured from the trainer"
        for i, call in enumerate(calls):
            for col, v in zip(cols, call):
                col += v
            if not self._attached or problem is not None:
                continue
            p_ids, c_full, m_full, why = caps[i]
            problem = problem or why
            for n, c in enumerate(call[1]):
                if c_full[n][:len(c)] != c or any(m_full[n][len(c):]):
                    problem = problem or ("the completion ids TRL trains on differ from those its reward functions "
                                          "scored")
                cols[4].append(p_ids[n])
                cols[5].append(m_full[n][:len(c)])
        cols[6] = [problem] if problem else []
        if _world_size() > 1:  # every rank's share, in rank order
            shares = all_gather_objects(tuple(cols))
            cols = [[x for sh in shares for x in sh[i]] for i in range(7)]
        prompts, cids, won, lines, p_lists, m_lists, problems = cols
        if problems:
            raise ValueError(f"this batch cannot be probed: {problems[0]}")
        N = len(cids)
        if N == 0:
            self._gathered = None
            return None
        if N % self.G:
            raise ValueError(f"recorded {N} completions, not a multiple of num_generations={self.G}")
        r = torch.tensor(won, dtype=torch.float32).view(N // self.G, self.G)
        r[torch.isnan(r).any(-1)] = math.nan  # a group with an undecided completion: no O+/O- split (not mixed)
        keep = ~torch.isnan(r).reshape(-1)
        captured = self._attached and len(p_lists) == N
        self._gathered = [{**ln, "prompt_ids": p, "temperature": self.temperature} if captured else
                          {**ln, "temperature": self.temperature}
                          for ln, p, k in zip(lines, p_lists if captured else lines, keep.tolist()) if k]
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id
        T = max(1, max(len(c) for c in cids))
        if captured:  # the ids TRL trains on (capture_batches)
            p_ids, p_mask = left_pad(p_lists, pad, device)
            c_mask = torch.tensor([[float(x) for x in m] + [0.0] * (T - len(m)) for m in m_lists])
        else:  # driven without a trainer: the recorded prompts tokenized as they are (no special tokens)
            if not all(isinstance(p, str) for p in prompts):
                raise ValueError("the recorded prompts are not strings (conversational message lists?): attach the "
                                 "callback to the trainer (cb.attach(trainer)) so it scores the ids TRL built")
            p_ids, p_mask = encode_prompts(self.tok, prompts, device)  # left-padded whatever tok.padding_side
            c_mask = torch.tensor([[1.0] * len(c) + [0.0] * (T - len(c)) for c in cids])
        pad = 0 if pad is None else pad
        c_ids = torch.tensor([c + [pad] * (T - len(c)) for c in cids])
        term = torch.tensor([bool(c) and c[-1] == self.tok.eos_token_id for c in cids])
        return Rollout([None] * (N // self.G), p_ids, p_mask, c_ids.to(device), c_mask.to(device), term, [""] * N, r)

    def _set_sharded(self, kind: str | None) -> None:
        """FSDP / DeepSpeed: the forward-only probe, and the metrics it skips named once (log and ``skipped``)."""
        if kind is None or self._sharded is not None:
            return
        self._sharded = kind
        self.skipped = NEEDS_FULL_PARAMETERS
        logger.warning("GapProbeCallback under %s: parameters are sharded, so only forward-pass metrics are "
                       "measured (gap/dphi, gap/M_dphi, gap/headroom from forward differences, entropy/*, taxonomy/*,"
                       " warn/cov_logp_adv); skipped (they need full parameters or gradients): %s", kind,
                       ", ".join(self.skipped))

    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        if not self._step_in_backward:  # else it ran at the start of DeepSpeed's step (_accelerated_kind)
            self._pre_step(state, model, kw.get("optimizer"))

    def _pre_step(self, state, model, opt) -> None:
        """At theta_k with the step's gradient in place: the rollout gathered and the probe's before-part run."""
        if self.probe is None:
            self.probe = self._make_probe(model)
        if int(state.global_step) % self.probe_every:  # not probed (same decision on every rank): drop the records
            if self._rewards is not None:
                self._rewards.check_complete()
            self._calls, self._captured = [], []
            return
        failure = None
        try:
            self._before(state, model, opt)
        except Exception as exc:  # noqa: BLE001 - a probe that cannot run never stops the training
            failure = exc
        if _world_size() > 1 and self._sharded is None:  # DDP: every rank skips when any rank's part failed
            try:
                agree(None if failure is None else f"{type(failure).__name__}: {failure}".splitlines()[0][:300])
            except RankFailure as exc:
                failure = failure or exc
        if failure is not None:
            self._skip(int(state.global_step), failure)

    def _make_probe(self, model):
        """The step hook (llm_probe.step_hook) this callback probes with: the forward-only probe when the parameters
        are sharded (FSDP / DeepSpeed), else the gap probe; the one place a probe route is chosen."""
        check_model(model)
        if not self._kind_known:  # no trainer's accelerator said how the run is sharded
            self._set_sharded(sharded_kind(None, model))
        if self._sharded:
            return ForwardProbe(model, c=self.c, delta=self.delta, headroom=self.headroom)
        if self.alignment == "ghost":
            return GhostProbe(model, self.params_spec)
        return GapProbe(model, self.params_spec, alignment=self.alignment)

    def _before(self, state, model, opt) -> None:
        ro = self.take_rollout(next(model.parameters()).device)  # every rank gathers at every probed step
        if ro is None:  # no new generation: the probed batch is being reused (num_iterations > 1)
            return
        self.probe.cancel()
        self._steps_left, self._step_k = self._mu, int(state.global_step)
        self._lr = self._step_lr(opt, model)
        if self._sharded is None and self.headroom:
            self._theta_k = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
            self._ro = ro
        scored = ~torch.isnan(ro.rewards[:, 0])  # groups without an undecided completion
        r_s = ro.rewards[scored]
        self._batch = {"reward": float(r_s.mean()) if len(r_s) else math.nan,
                       "frac_reward_zero_std": float((r_s.std(-1) == 0).float().mean()) if len(r_s) else math.nan}
        world = _world_size()
        # one snapshot of theta_k for the probe and the headroom meter (a second copy of the weights at real size
        # otherwise); frozen parameters do not move between here and the update, so they enter uncopied
        theta_k = None if self._theta_k is None else {n: self._theta_k.get(n, p.detach())
                                                      for n, p in model.named_parameters()}
        with probe_forwards(model, self.temperature):
            if self._sharded is not None:  # every rank forwards the whole batch (each forward is collective)
                self._fwd_stats = self.probe.before(Step(ro))
            elif world > 1:  # DDP: this rank probes the groups b with b % world == rank (llm_probe.collectives)
                self._owned = owned_groups(ro.B, _rank(), world)
                self.probe.before(Step(sub_rollout(ro, self._owned), theta_k=theta_k, shard_index=self._owned))
            else:
                self.probe.before(Step(ro, theta_k=theta_k))
        if self.rollout_path is not None and _rank() == 0:
            with open(self.rollout_path, "a") as f:
                for line in self._gathered:
                    f.write(json.dumps({"step": int(state.global_step), "prompt": line["prompt"],
                                        "completion": self.tok.decode(line["completion_ids"]), **line}) + "\n")

    def _step_lr(self, opt, model) -> float:
        """The learning rate of the step: that of every optimizer parameter group holding a trainable parameter;
        NaN (and one logged line) when they differ, as lr h then names no single learning rate."""
        if opt is None:
            return math.nan
        trainable = {id(p) for p in model.parameters() if p.requires_grad}
        # DeepSpeed's groups are built from trainable parameters only, and ZeRO-3 empties their lists outside its
        # step (in it they hold flat fp32 partitions): every group counts
        zero = self._sharded == "DeepSpeed"
        lrs = sorted({float(g["lr"]) for g in opt.param_groups
                      if zero or "params" not in g or any(id(p) in trainable for p in g["params"])})
        if len(lrs) == 1:
            return lrs[0]
        if len(lrs) > 1:
            self._note(f"gap/headroom_lr and suggested_lr not measured: the optimizer's parameter groups have "
                       f"learning rates {lrs} (lr x headroom needs one)")
        return math.nan

    def on_optimizer_step(self, args, state, control, model=None, **kw):
        if self.probe is None or not self.probe.pending:
            return
        self._steps_left -= 1
        if self._steps_left > 0:  # the net update of the mu steps on this batch is measured after the last
            return
        sums = {k: np.copy(getattr(self.probe, k)) if k == "M_probe" else getattr(self.probe, k)
                for k in ("M_batch", "M_dphi", "M_probe") if hasattr(self.probe, k)}
        try:
            with probe_forwards(model, self.temperature):
                row = self._after(model)
        except Exception as exc:  # noqa: BLE001 - a probe that cannot run never stops the training
            for k, v in sums.items():  # a skipped step adds nothing to the running sums
                setattr(self.probe, k, v)
            self._skip(self._step_k, exc)
            return
        self._record(row)

    def _after(self, model) -> dict:
        if self._sharded is not None:
            row = {"step": self._step_k, **self._batch, **self._fwd_stats, **self.probe.after().metrics}
            if "gap/headroom" in row:
                row["gap/headroom_lr"] = self._lr * row["gap/headroom"]
            self._fwd_stats = {}
            return row
        res = self.probe.after()
        return {"step": self._step_k, **self._batch, "update_norm": res.update_norm,
                "grad_norm_probe": res.grad_norm, **res.metrics, **self._headroom(model),
                "gap/dmu_update": [] if res.dmu_update is None else res.dmu_update.tolist(),
                "gap/dmu_grad": [] if res.dmu_grad is None else res.dmu_grad.tolist(),
                "gap/norm": [] if res.gap_norms is None else res.gap_norms.tolist()}

    def _record(self, row: dict) -> None:
        self.history.append(row)
        self._unlogged.append(row)
        if self.log_path is not None and _rank() == 0:
            with open(self.log_path, "a") as f:
                f.write(json.dumps(row) + "\n")

    def _headroom(self, model) -> dict:
        """``gap/headroom`` h and ``gap/headroom_lr`` = lr h of the step theta_k -> now (module docstring)."""
        if self._theta_k is None:
            return {}
        theta_k, ro, self._theta_k, self._ro = self._theta_k, self._ro, None, None
        # DDP (owned): x_n of this rank's groups, gathered; a zero update: NaN (llm_probe.headroom)
        h = step_headroom(model, ro, theta_k, c=self.c, delta=self.delta, owned=self._owned)
        return headroom_metrics(h, self._lr)

    def summary(self) -> dict:
        """Run-level summary of the probed steps so far: ``probed_steps`` (rows measured), ``skipped_steps`` (probed
        steps the probe could not measure; ``skip_reasons``: reason -> count), ``M_batch`` (sum over the probed
        batches), ``M_batch_scaled`` = s M_batch with s = lcm(probe_every, mu) / mu, mu = num_iterations (one
        generation batch in s is probed, each row the net change over its mu steps: a sampled estimate of the sum
        over every batch), ``suggested_lr`` (the lr finder's rule, llm_probe.suggest: the median of lr_k h_k over
        the first 20 probed steps with a value, +inf left out of the median; NaN when none, e.g. the parameter
        groups' learning rates differ), ``suggested_lr_interval`` (its order-statistic interval, unbounded below 6
        steps) and ``suggested_lr_steps`` (the count it rests on). ``alarms``: name -> its first firing {step,
        value, score}, or None (with ``alarm=``)."""
        sug = lr_suggestion(first_probed(self.history))
        scale = math.lcm(self.probe_every, self._mu) // self._mu
        reasons: dict[str, int] = {}
        for s in self.skipped_steps:
            reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
        return {"probed_steps": len(self.history), "skipped_steps": len(self.skipped_steps), "skip_reasons": reasons,
                "M_batch": self.M_batch, "M_batch_scaled": scale * self.M_batch, "M_batch_steps": len(self.history),
                "suggested_lr": sug["suggested_lr"], "suggested_lr_interval": (sug["lo"], sug["hi"]),
                "suggested_lr_steps": sug["steps"],
                **({"alarms": {a.name: a.fired for a in self.alarms}} if self.alarms else {})}

    def on_log(self, args, state, control, logs=None, **kw):
        if logs is None:
            return
        if self._unlogged:
            merged = _summarise(self._unlogged)
            if any("gap/headroom" in r for r in self._unlogged):
                merged["gap/suggested_lr"] = lr_suggestion(first_probed(self.history))["suggested_lr"]
            self._unlogged = []
            self._add_logs(state, logs, merged)
        if self.alarms:
            self._watch(state, control, logs)

    def _add_logs(self, state, logs: dict, merged: dict) -> None:
        """Merge ``merged`` into TRL's ``logs`` and the last ``state.log_history`` row (keys TRL logs: TRL's)."""
        new = {k: v for k, v in merged.items() if k not in logs}
        logs.update(new)
        if state.log_history:
            for k, v in new.items():
                state.log_history[-1].setdefault(k, v)

    def _watch(self, state, control, logs: dict) -> None:
        """Feed each alarm its statistic from this log row; ``alarm/<name>``, ``alarm/<name>_score``; a first
        firing: log line, hook, stop (module doc, "Alarm")."""
        step, out, fired = int(state.global_step), {}, []
        for a in self.alarms:
            v = logs.get(a.statistic)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                continue
            res = a.update(step, float(v))
            if res is None:
                continue
            score, fires = res
            out[f"alarm/{a.name}"] = int(fires)
            out[f"alarm/{a.name}_score"] = score if score > -math.inf else math.nan
            if fires and a.fired is None:
                a.fired = {"step": step, "value": float(v), "score": score}
                fired.append(a)
        self._add_logs(state, logs, out)
        for a in fired:
            logger.warning("GapProbeCallback: alarm %s fired at step %d (%s = %.4g, score %.4g >= cutoff %.4g)%s",
                           a.name, step, a.statistic, a.fired["value"], a.fired["score"], a.detector.cutoff,
                           "; stopping training" if self.stop_on_alarm else "")
            if self.on_alarm is not None:
                self.on_alarm(a.name, step, a.fired["value"])
        if fired and self.stop_on_alarm:
            control.should_training_stop = True


class _RewardGroup:
    """The reward functions of one trainer, wrapped by :meth:`GapProbeCallback.wrap_rewards`: each function's
    rewards of a generation batch wait in ``pending`` until every function has scored it; then the batch is
    recorded once in the callback's ``_calls`` as (prompts, completion ids, success, rollout_path lines)."""

    def __init__(self, funcs, weights, success, owner):
        if callable(funcs) or isinstance(funcs, (str, bytes)):
            funcs = [funcs]
        funcs = list(funcs)
        if not funcs:
            raise ValueError("funcs must hold at least one reward function")
        for i, f in enumerate(funcs):
            if isinstance(f, (str, torch.nn.Module)) or not callable(f):
                raise ValueError(f"funcs[{i}] must be a reward function (a callable); a reward model (name or "
                                 f"nn.Module) is scored inside TRL where the callback cannot see it, got {f!r}")
        self.names = [getattr(f, "__name__", type(f).__name__) for f in funcs]
        self.weights = None if weights is None else _as_weights(weights, len(funcs), "weights")
        self.explicit = weights is not None
        if success is not None and not callable(success):
            if not isinstance(success, str) or success not in self.names:
                raise ValueError(f"success must be None, a callable or the name of one of funcs {self.names}, "
                                 f"got {success!r}")
            if self.names.count(success) > 1:
                raise ValueError(f"success names {success!r}, which {self.names.count(success)} of funcs share")
        self.success = success
        self.owner = owner
        self.pending: dict[int, tuple] = {}
        self.lock = threading.Lock()  # TRL runs async reward functions on an event-loop thread
        self.wrapped = [self._wrap(i, f) for i, f in enumerate(funcs)]

    def _wrap(self, i, fn):
        if _is_async(fn):
            @functools.wraps(fn)
            async def wrapped(prompts, completions, completion_ids=None, **kw):
                r = await fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **kw)
                self.got(i, prompts, completion_ids, r)
                return r
        else:
            @functools.wraps(fn)
            def wrapped(prompts, completions, completion_ids=None, **kw):
                r = fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **kw)
                self.got(i, prompts, completion_ids, r)
                return r
        return wrapped

    def check_weights(self, trainer_weights) -> None:
        """Adopt (weights None) or check the trainer's ``reward_weights`` (None there: TRL weights each by 1)."""
        F = len(self.names)
        if trainer_weights is None:
            if self.explicit and not np.all(self.weights == 1.0):
                raise ValueError(f"weights {self.weights.tolist()} were given to wrap_rewards, the trainer's "
                                 "reward_weights are None (TRL weights every function by 1): pass them to "
                                 "GRPOConfig(reward_weights=...) too")
            self.weights = np.ones(F)
            return
        tw = _as_weights(trainer_weights, None, "args.reward_weights")
        if len(tw) != F:
            raise ValueError(f"the trainer has {len(tw)} reward weights, this callback wraps {F} reward function(s) "
                             f"{self.names}: wrap all of the trainer's reward functions in one wrap_rewards call")
        if self.explicit and not np.array_equal(tw, self.weights):
            raise ValueError(f"weights {self.weights.tolist()} given to wrap_rewards differ from the trainer's "
                             f"reward_weights {tw.tolist()}")
        self.weights = tw

    def check_complete(self) -> None:
        """A ValueError when some wrapped functions scored a batch the others never did."""
        with self.lock:
            if self.pending:
                missing = [n for i, n in enumerate(self.names) if i not in self.pending]
                done = [self.names[i] for i in self.pending]
                raise ValueError(f"reward functions {missing} were wrapped with {done} but never scored the batch: "
                                 "pass every wrapped function to the trainer")

    def got(self, i: int, prompts, completion_ids, r) -> None:
        if not self.owner._recording():
            return
        if completion_ids is None:
            raise ValueError("the trainer did not pass completion_ids to the reward function")
        vals = [math.nan if x is None else float(x) for x in r]  # TRL: None -> NaN
        vals = [v if math.isfinite(v) else math.nan for v in vals]  # +-inf: unscorable, as None and NaN
        if len(vals) != len(completion_ids):
            raise ValueError(f"reward function {self.names[i]!r} returned {len(vals)} rewards for "
                             f"{len(completion_ids)} completions")
        with self.lock:
            if i in self.pending:
                raise ValueError(f"reward function {self.names[i]!r} scored a second batch before "
                                 f"{[n for j, n in enumerate(self.names) if j not in self.pending]} scored the first")
            self.pending[i] = (list(prompts), [list(c) for c in completion_ids], vals)
            if len(self.pending) < len(self.names):
                return
            calls, self.pending = [self.pending[j] for j in range(len(self.names))], {}
        prompts, cids = calls[0][0], calls[0][1]
        if any(c[1] != cids for c in calls[1:]):
            raise ValueError(f"the reward functions {self.names} scored different completions in one batch")
        self.owner._calls.append(self.record(prompts, cids, np.array([c[2] for c in calls]).T))

    def record(self, prompts, cids, r) -> tuple:
        """(prompts, completion ids, success [N] 1 / 0 / NaN, rollout_path lines) of one batch, r [N, F]."""
        w = np.ones(r.shape[1]) if self.weights is None else self.weights
        scored = ~np.isnan(r).all(1)
        R = np.where(scored, np.nansum(r * w, axis=1), np.nan)  # trl 1.16: nansum, NaN where unscorable
        if self.success is None:
            won, decided = R > 0, scored
        elif isinstance(self.success, str):
            ri = r[:, self.names.index(self.success)]
            won, decided = ri > 0, ~np.isnan(ri)
        else:
            won = np.asarray(self.success(r.copy(), R.copy()))
            if won.shape != (len(cids),):
                raise ValueError(f"success returned shape {won.shape}, expected ({len(cids)},)")
            won, decided = won.astype(bool), scored
        s = np.where(decided, won.astype(float), np.nan)
        lines = []
        for n in range(len(cids)):
            line = {"prompt": prompts[n], "completion_ids": cids[n],
                    "reward": float(R[n]) if self.success is None else float(s[n])}  # offline: success <=> > 0
            if r.shape[1] > 1 or self.success is not None:
                line["rewards"] = [None if math.isnan(x) else float(x) for x in r[n]]
            lines.append(line)
        return list(prompts), [list(c) for c in cids], s.tolist(), lines


def _as_weights(w, F: int | None, name: str) -> np.ndarray:
    try:
        a = np.asarray(w, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a sequence of finite numbers, got {w!r}") from exc
    if not np.all(np.isfinite(a)) or (F is not None and len(a) != F):
        raise ValueError(f"{name} must hold one finite number per reward function{'' if F is None else f' ({F})'}, "
                         f"got {w!r}")
    return a


def _is_async(fn) -> bool:
    """Whether calling ``fn`` returns a coroutine (trl's ``is_async_callable``: functions, partials, instances)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _summarise(rows: list[dict]) -> dict:
    """Scalar metrics of the rows since the last log: the mean over the rows that hold a finite value (running
    sums: the last value); lists and ``step`` are left out."""
    out = {}
    keys = [k for r in rows[::-1] for k in r if k != "step"]
    for k in dict.fromkeys(keys):
        vals = [r[k] for r in rows if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)]
        if not vals:
            continue
        if k in _RUNNING_SUMS:
            out[k] = vals[-1]
            continue
        finite = [v for v in vals if math.isfinite(v)]
        out[k] = sum(finite) / len(finite) if finite else float("nan")
    return out
