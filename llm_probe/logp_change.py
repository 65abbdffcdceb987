"""The change of each completion's log-probability along an optimizer step, x_n, by its three routes; the one
module where x is computed (the safe step rule, the headroom meter, the forward-only probe and the ``warn/*``
curvature statistics read it from here).

For a step d = theta_{k+1} - theta_k and a completion o_n of prompt q_n, with log pi(o | q) the sum of the
completion's token log-probs (llm_probe.model.completion_logprobs):

- first order, exact (:func:`completion_logprob_jvp`): x_n = d/ds log pi_{theta_k + s d}(o_n) |_{s=0} = <d, s(o_n)>,
  s the sequence score; one forward-mode pass (torch.func.jvp) at theta_k, the rule of docs/theory.md section 11;
  on request (``shared_prompt``, for a model llm_probe.sampler's forward supports) through that forward: each
  prompt's pass shared by its group's rows, the same function of the weights (forward-mode tangents of a shared
  prompt are the prompt's own), else through the model's own forward;
- realised (:func:`logp_change`): x_n = log pi_{theta_{k+1}}(o_n) - log pi_{theta_k}(o_n) from two forwards, equal to
  the first-order value up to (1/2) d^T H_n d + O(||d||^3); :func:`completion_forward` is the forward that works
  with parameters sharded by FSDP2 / ZeRO-3, :func:`forward_difference_logprobs` the two forwards at given states.
"""

from __future__ import annotations

import contextlib

import torch
from torch.func import functional_call, jvp

from .model import completion_logits, completion_logprobs, eval_mode, current_scoring_temperature

__all__ = ["completion_logprob_jvp", "prompt_group", "logp_change", "completion_forward", "forward_difference_logprobs"]


class _AtValues(torch.nn.Module):
    """``model`` evaluated with the parameter values ``values`` (name -> tensor; the rest: the module's)."""

    def __init__(self, model, values: dict):
        super().__init__()
        self._model = (model,)  # a tuple: not registered as a submodule
        self.values = values
        self.dtype = getattr(model, "dtype", None)

    def forward(self, **kw):
        return functional_call(self._model[0], self.values, args=(), kwargs=kw, strict=False)


class _SharedPromptForward(torch.nn.Module):
    """log pi_T(o_t | q, o_<t) [N, T] by llm_probe.sampler's forward (each prompt's pass shared by its ``G`` rows),
    scored at temperature ``T`` as llm_probe.model.completion_logprobs; ``model`` a submodule, so
    torch.func.functional_call can put other parameter values ("m." + name) into it."""

    def __init__(self, model, G: int, T: float):
        super().__init__()
        self.m, self.G, self.T = model, G, T

    def forward(self, prompt_ids, prompt_mask, completion_ids, completion_mask):
        from .sampler import fast_completion_logits

        logits = fast_completion_logits(self.m, prompt_ids, prompt_mask, completion_ids, completion_mask, G=self.G)
        if self.T != 1.0:
            logits = logits / self.T
        logp_all = torch.log_softmax(logits, dim=-1)
        return logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1) * completion_mask


def prompt_group(ro) -> int:
    """G when rows b*G .. b*G+G-1 of ``ro`` share their prompt (prompt-major rows), else 1."""
    G = int(getattr(ro, "G", 1) or 1)
    N = ro.prompt_ids.shape[0]
    if G < 2 or N % G:
        return 1
    same = (torch.equal(ro.prompt_ids[::G].repeat_interleave(G, 0), ro.prompt_ids)
            and torch.equal(ro.prompt_mask[::G].repeat_interleave(G, 0), ro.prompt_mask))
    return G if same else 1


def completion_logprob_jvp(model, ro, theta: dict[str, torch.Tensor], direction: dict[str, torch.Tensor], *,
                           shared_prompt: bool = False) -> torch.Tensor:
    """x_n = d/ds log pi_{theta + s d}(o_n | q_n) at s = 0 for every completion of ``ro``, [N] (float64, CPU).

    ``theta`` and ``direction`` map parameter names (as ``model.named_parameters()`` gives them) to tensors;
    parameters not named keep the module's values. log pi(o | q) = sum of the completion's token log-probs
    (llm_probe.model.completion_logprobs). One forward-mode pass (torch.func.jvp) through the model's own
    forward; with ``shared_prompt`` (a host that scores with llm_probe.sampler's forward, as
    :class:`llm_probe.Trainer`), through that shared-prompt forward where
    :func:`llm_probe.sampler.supports_fast_path` (attention by the math kernel, which forward mode
    differentiates; module docstring).
    """
    from .sampler import supports_fast_path

    keys = [k for k in theta]
    if set(direction) != set(keys):
        raise ValueError("direction must have the keys of theta")
    args = (ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    if shared_prompt and supports_fast_path(model):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        shared = _SharedPromptForward(model, prompt_group(ro), current_scoring_temperature())

        def f(*vals):
            return functional_call(shared, {"m." + k: v for k, v in zip(keys, vals)}, args, strict=False).sum(-1)

        attention = sdpa_kernel(SDPBackend.MATH)
    else:
        def f(*vals):
            return completion_logprobs(_AtValues(model, dict(zip(keys, vals))), *args).sum(-1)

        attention = contextlib.nullcontext()
    primals = tuple(theta[k].detach() for k in keys)
    tangents = tuple(direction[k].detach().to(theta[k].dtype) for k in keys)
    with torch.no_grad(), attention:
        _, x = jvp(f, primals, tangents)
    return x.detach().to(torch.float64).cpu()


def logp_change(after: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """x_n = log pi_{k+1}(o_n) - log pi_k(o_n), [N]: ``after`` and ``before`` are sequence log-probs [N], or token
    log-probs [N, T] (masked positions 0), whose differences are then summed over the tokens."""
    if after.shape != before.shape or after.ndim not in (1, 2):
        raise ValueError(f"after and before must share an [N] or [N, T] shape, got {tuple(after.shape)}, "
                         f"{tuple(before.shape)}")
    return after - before if after.ndim == 1 else (after - before).sum(-1)


def _reshard(model) -> None:
    """Free every FSDP2 module's unsharded parameters: a no-grad forward leaves the root's gathered (it expects a
    backward), and the next forward would reuse them after the optimizer changed the shards."""
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def completion_forward(model, ro):
    """(seq log pi(o_n) [N] float64 CPU, token log-probs [N, T, V], token log pi [N, T]) at the current
    parameters (no grad, eval; FSDP2: gathered afresh and resharded after)."""
    with eval_mode(model):
        _reshard(model)
        try:
            with torch.no_grad():
                logits = completion_logits(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                           ro.completion_mask)
                if logits.dtype not in (torch.float32, torch.float64):
                    logits = logits.float()
                logp_all = torch.log_softmax(logits, -1)
        finally:
            _reshard(model)
    tok = logp_all.gather(-1, ro.completion_ids.unsqueeze(-1)).squeeze(-1) * ro.completion_mask
    return tok.sum(-1).double().cpu(), logp_all, tok


def forward_difference_logprobs(model, ro, theta_a: dict, theta_b: dict) -> torch.Tensor:
    """x_n = log pi_{theta_b}(o_n) - log pi_{theta_a}(o_n) [N] (float64): two forwards, loading each state into
    ``model`` (restored after). An estimate of the directional derivative along d = theta_b - theta_a with error
    (1/2) d^T H_n d + O(||d||^3) (module docstring)."""
    own = {n: p for n, p in model.named_parameters() if n in theta_a}
    keep = {n: p.detach().clone() for n, p in own.items()}
    try:
        with torch.no_grad():
            for n, p in own.items():
                p.copy_(theta_a[n])
        a = completion_forward(model, ro)[0]
        with torch.no_grad():
            for n, p in own.items():
                p.copy_(theta_b[n])
        b = completion_forward(model, ro)[0]
    finally:
        with torch.no_grad():
            for n, p in own.items():
                p.copy_(keep[n])
    return logp_change(b, a)
