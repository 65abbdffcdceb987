"""The same probes attached to a real ``trl.GRPOTrainer`` run through a ``transformers.TrainerCallback``.

Callbacks see the model and optimizer but not the batch (ANCHORS.md), so the callback wraps the reward
function: each call records the prompts, the completion token ids and the rewards of that generation batch
(grouped ``num_generations`` consecutive completions per prompt, TRL's order). Then, per optimizer step:

- ``on_pre_optimizer_step`` (gradients already clipped, parameters = theta_k): per-prompt gaps g_q of the
  recorded mixed groups (torch.autograd.grad, so ``p.grad`` is untouched), a copy of theta_k and of -grad;
- ``on_optimizer_step``: delta = theta_{k+1} - theta_k; dmu_q = <delta, g_q>, dmu_grad_q = <-grad, g_q>;
  M_batch += mean_q [dmu_q]_+. With ``optim="sgd"`` delta = -lr * grad exactly.

Our own forward pass scores the completions (TRL's fused LM head never builds logits). Exact per-prompt
bookkeeping needs ``num_iterations=1`` and ``steps_per_generation`` equal to the gradient-accumulation steps
(the default); other settings raise a ValueError at ``on_train_begin``. A reward > 0 counts as a success (O+).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
from transformers import TrainerCallback

from .probes import alignment_metrics, dot_alignment, flat, per_prompt_gaps, select_params
from .rollout import Rollout

__all__ = ["GapProbeCallback"]


class GapProbeCallback(TrainerCallback):
    """Per-step Gradient-Gap alignment of a TRL GRPO run. Wrap the reward function with :meth:`wrap_reward`."""

    def __init__(self, tokenizer, num_generations: int, *, params: str = "all", log_path: str | Path | None = None):
        if num_generations < 2:
            raise ValueError(f"num_generations must be >= 2, got {num_generations}")
        self.tok = tokenizer
        self.G = int(num_generations)
        self.params_spec = params
        self.log_path = Path(log_path) if log_path else None
        self.history: list[dict] = []
        self._calls: list[tuple] = []
        self._pending = None
        self.M_batch = 0.0

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
        if getattr(args, "num_iterations", 1) != 1:
            raise ValueError("GapProbeCallback needs num_iterations=1 (batches reused across steps otherwise)")
        spg = getattr(args, "steps_per_generation", None)
        if spg is not None and spg != args.gradient_accumulation_steps:
            raise ValueError("GapProbeCallback needs steps_per_generation == gradient_accumulation_steps")

    def _rollout(self, device) -> Rollout | None:
        if not self._calls:
            return None
        prompts, cids, rewards = [], [], []
        for p, c, r in self._calls:
            prompts += p
            cids += c
            rewards += r
        self._calls = []
        N = len(cids)
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
        params = select_params(model, self.params_spec)
        ro = self._rollout(next(model.parameters()).device)
        if ro is None:
            self._pending = None
            return
        was_training = model.training
        model.eval()  # no dropout in the probe's forward pass
        est = per_prompt_gaps(model, ro, params)
        model.train(was_training)
        names = list(params)
        grads = [params[n].grad for n in names]
        grad_dir = flat([-(g if g is not None else torch.zeros_like(params[n])) for g, n in zip(grads, names)])
        self._pending = (params, {n: params[n].detach().clone() for n in names}, grad_dir, est, ro)

    def on_optimizer_step(self, args, state, control, model=None, **kw):
        if self._pending is None:
            return
        params, old, grad_dir, est, ro = self._pending
        self._pending = None
        delta = flat([params[n].detach() - old[n] for n in old])
        dmu_u = dot_alignment(est.gaps, delta)
        dmu_g = dot_alignment(est.gaps, grad_dir)
        if len(dmu_u):
            self.M_batch += float(dmu_u.clamp(min=0).mean())
        row = {"step": int(state.global_step), "reward": float(ro.rewards.mean()),
               "frac_reward_zero_std": float((ro.rewards.std(-1) == 0).float().mean()),
               "update_norm": float(delta.norm()), "grad_norm_probe": float(grad_dir.norm()),
               **alignment_metrics("gap", dmu_u, dmu_g, est.gaps, delta, grad_dir), "gap/M_batch": self.M_batch,
               "gap/dmu_update": dmu_u.tolist(), "gap/dmu_grad": dmu_g.tolist()}
        self.history.append(row)
        if self.log_path is not None:
            with open(self.log_path, "a") as f:
                f.write(json.dumps(row) + "\n")
