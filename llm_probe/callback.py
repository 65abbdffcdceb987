"""The Gradient-Gap probe (llm_probe.gap_probe) attached to a real ``trl.GRPOTrainer`` run through a
``transformers.TrainerCallback``; single process or data-parallel (DDP) across processes.

Callbacks see the model and optimizer but not the batch, so the callback wraps the reward function: each call
records the prompts, the completion token ids and the rewards of that generation batch (grouped
``num_generations`` consecutive completions per prompt, TRL's order). Then, per optimizer step:

- ``on_pre_optimizer_step`` (gradients already clipped, parameters = theta_k): :meth:`GapProbe.before`;
- ``on_optimizer_step`` (parameters = theta_{k+1}): :meth:`GapProbe.after`; one row per step in
  :attr:`GapProbeCallback.history` (and ``log_path``). With ``optim="sgd"`` delta = -lr * grad exactly;
- ``on_log``: the scalars of the rows since the last log (mean over them; the running sums ``gap/M_*``: the
  last value) are merged into TRL's ``logs`` and ``state.log_history[-1]``, so they reach every ``report_to``
  integration that runs after this callback: :meth:`GapProbeCallback.attach` puts it first. Keys TRL already
  logs (``reward``, ``frac_reward_zero_std``) keep TRL's values.

Our own forward pass scores the completions (TRL's fused LM head never builds logits). Per-prompt bookkeeping
needs ``steps_per_generation`` equal to the gradient-accumulation steps (the default: one generation batch per
optimizer step); another value raises a ValueError at ``on_train_begin``. With ``num_iterations = mu > 1`` TRL
reuses each generation batch for mu optimizer steps: the gaps are taken at theta_k, before the first of them
(``dmu_grad`` with that step's gradient), and ``dmu_update`` and ``update_norm`` measure the net change
theta_{k+mu} - theta_k; the row is written after the mu-th step and carries ``step`` = k. A reward > 0 counts as a success (O+).
TRL's sampler may emit the pad token inside a completion (ours never does, llm_probe.rollout); pass
``generation_kwargs={"suppress_tokens": [pad_id]}`` to GRPOConfig to rule it out.

Distributed (``accelerate launch --num_processes N`` / ``torchrun``, DDP): each process's reward function sees
only its own share of the generation batch, so at ``on_pre_optimizer_step`` the records of every rank are
gathered (``torch.distributed.all_gather_object``, rank order, which is the order TRL groups rewards in) and
every rank probes the whole batch; DDP has already averaged ``p.grad``, so every rank holds the same theta and
the same numbers; rank 0 alone writes ``log_path`` / ``rollout_path``. FSDP and DeepSpeed shard the parameters
(the probe needs each full parameter and its full gradient): ``on_train_begin`` refuses them.
"""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path

import torch
from transformers import TrainerCallback

from .gap_probe import ALIGNMENT_ROUTES, GapProbe
from .rollout import Rollout

__all__ = ["GapProbeCallback"]

_RUNNING_SUMS = ("gap/M_batch", "gap/M_mean")  # logged as their last value, not a mean over steps


class GapProbeCallback(TrainerCallback):
    """Per-step Gradient-Gap alignment of a TRL GRPO run. Wrap the reward function with :meth:`wrap_reward`;
    :meth:`attach` it so the metrics land in TRL's logs."""

    def __init__(self, tokenizer, num_generations: int, *, params: str = "all", alignment: str = "dot",
                 log_path: str | Path | None = None, rollout_path: str | Path | None = None):
        """``log_path``: one JSON row of metrics per step; ``rollout_path``: the step's gathered rollout, one line
        per completion {step, prompt, completion, completion_ids, reward} (the input of ``llm_probe.offline``)."""
        if num_generations < 2:
            raise ValueError(f"num_generations must be >= 2, got {num_generations}")
        if alignment not in ALIGNMENT_ROUTES:
            raise ValueError(f"alignment must be one of {ALIGNMENT_ROUTES}, got {alignment!r}")
        self.tok = tokenizer
        self.G = int(num_generations)
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

    @property
    def M_batch(self) -> float:
        return self.probe.M_batch if self.probe is not None else 0.0

    def attach(self, trainer) -> GapProbeCallback:
        """Register with ``trainer`` ahead of every other callback (the ``report_to`` integrations read the
        logs this callback extends); returns self."""
        cbs = trainer.callback_handler.callbacks
        if self in cbs:
            cbs.remove(self)
        cbs.insert(0, self)
        return self

    def wrap_reward(self, fn):
        """A reward function with the same behaviour that also records each call's groups."""

        @functools.wraps(fn)
        def wrapped(prompts, completions, completion_ids=None, **kw):
            r = fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **kw)
            if completion_ids is None:
                raise ValueError("the trainer did not pass completion_ids to the reward function")
            self._calls.append((list(prompts), [list(c) for c in completion_ids], [float(x) for x in r]))
            return r

        return wrapped

    def on_train_begin(self, args, state, control, **kw):
        _refuse_sharded(args)
        mu = getattr(args, "num_iterations", 1)
        if isinstance(mu, bool) or not isinstance(mu, int) or mu < 1:
            raise ValueError(f"num_iterations must be an integer >= 1, got {mu!r}")
        self._mu = mu
        spg = getattr(args, "steps_per_generation", None)
        if spg is not None and spg != args.gradient_accumulation_steps:
            raise ValueError("GapProbeCallback needs steps_per_generation == gradient_accumulation_steps")

    def take_rollout(self, device) -> Rollout | None:
        """The completions recorded since the last call (gathered from every rank under DDP) as a Rollout;
        None when nothing new was generated."""
        if not self._calls and _world_size() == 1:
            return None
        prompts, cids, rewards = [], [], []
        for p, c, r in self._calls:
            prompts += p
            cids += c
            rewards += r
        self._calls = []
        if _world_size() > 1:  # every rank's share, in rank order
            shares = [None] * _world_size()
            torch.distributed.all_gather_object(shares, (prompts, cids, rewards))
            prompts = [x for sh in shares for x in sh[0]]
            cids = [x for sh in shares for x in sh[1]]
            rewards = [x for sh in shares for x in sh[2]]
        self._gathered = (prompts, cids, rewards)
        N = len(cids)
        if N == 0:
            return None
        if N % self.G:
            raise ValueError(f"recorded {N} completions, not a multiple of num_generations={self.G}")
        enc = self.tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        T = max(1, max(len(c) for c in cids))
        pad = self.tok.pad_token_id
        c_ids = torch.tensor([c + [pad] * (T - len(c)) for c in cids])
        c_mask = torch.tensor([[1.0] * len(c) + [0.0] * (T - len(c)) for c in cids])
        r = (torch.tensor(rewards).view(N // self.G, self.G) > 0).float()
        term = torch.tensor([bool(c) and c[-1] == self.tok.eos_token_id for c in cids])
        return Rollout([None] * (N // self.G), enc["input_ids"].to(device), enc["attention_mask"].to(device),
                       c_ids.to(device), c_mask.to(device), term, [""] * N, r)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        if self.probe is None:
            self.probe = GapProbe(model, self.params_spec, alignment=self.alignment)
        ro = self.take_rollout(next(model.parameters()).device)  # every rank gathers at every step (lockstep)
        if ro is None:  # no new generation: the probed batch is being reused (num_iterations > 1)
            return
        self.probe.cancel()
        self._steps_left, self._step_k = self._mu, int(state.global_step)
        self._batch = {"reward": float(ro.rewards.mean()),
                       "frac_reward_zero_std": float((ro.rewards.std(-1) == 0).float().mean())}
        self.probe.before(ro)
        if self.rollout_path is not None and _rank() == 0:
            p, c, r = self._gathered
            with open(self.rollout_path, "a") as f:
                for pi, ci, ri in zip(p, c, r):
                    f.write(json.dumps({"step": int(state.global_step), "prompt": pi,
                                        "completion": self.tok.decode(ci), "completion_ids": ci, "reward": ri}) + "\n")

    def on_optimizer_step(self, args, state, control, model=None, **kw):
        if self.probe is None or not self.probe.pending:
            return
        self._steps_left -= 1
        if self._steps_left > 0:  # the net update of the mu steps on this batch is measured after the last
            return
        res = self.probe.after()
        row = {"step": self._step_k, **self._batch, "update_norm": res.update_norm,
               "grad_norm_probe": res.grad_norm, **res.metrics,
               "gap/dmu_update": [] if res.dmu_update is None else res.dmu_update.tolist(),
               "gap/dmu_grad": [] if res.dmu_grad is None else res.dmu_grad.tolist(),
               "gap/norm": [] if res.gap_norms is None else res.gap_norms.tolist()}
        self.history.append(row)
        self._unlogged.append(row)
        if self.log_path is not None and _rank() == 0:
            with open(self.log_path, "a") as f:
                f.write(json.dumps(row) + "\n")

    def on_log(self, args, state, control, logs=None, **kw):
        if logs is None or not self._unlogged:
            return
        merged = _summarise(self._unlogged)
        self._unlogged = []
        new = {k: v for k, v in merged.items() if k not in logs}
        logs.update(new)
        if state.log_history:
            for k, v in new.items():
                state.log_history[-1].setdefault(k, v)


def _world_size() -> int:
    d = torch.distributed
    return d.get_world_size() if d.is_available() and d.is_initialized() else 1


def _rank() -> int:
    d = torch.distributed
    return d.get_rank() if d.is_available() and d.is_initialized() else 0


def _refuse_sharded(args) -> None:
    """ValueError for FSDP or DeepSpeed: they shard parameters and gradients; the probe supports DDP only."""
    kind = None
    if getattr(args, "deepspeed", None) or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true"):
        kind = "DeepSpeed"
    elif getattr(args, "fsdp", None) or os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true"):
        kind = "FSDP"
    else:
        dist_type = str(getattr(getattr(args, "distributed_state", None), "distributed_type", ""))
        kind = "FSDP" if "FSDP" in dist_type else "DeepSpeed" if "DEEPSPEED" in dist_type else None
    if kind is not None:
        raise ValueError(f"GapProbeCallback supports single-process and DDP training only, not {kind}: {kind} shards "
                         "parameters and gradients, and the gap probe needs each full parameter and gradient. "
                         "Run with plain data parallelism (accelerate launch --num_processes N, no FSDP/DeepSpeed "
                         "config), or probe offline from saved checkpoints (gapdyn train offline).")


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
