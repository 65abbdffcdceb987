"""The state a probe's own forward passes run in on a model a trainer prepared (:func:`probe_forwards`).

A training run leaves the model in states that the probe's forward-mode and vmap'd passes (torch.func) cannot
run through, or that change nothing the probe measures:

- gradient checkpointing (TRL's GRPOConfig default) and the input-require-grads forward hook transformers adds
  with it (``make_inputs_require_grads``: ``requires_grad_()`` on the embedding output, refused inside a
  torch.func transform);
- an attention kernel without forward-mode / vmap rules (``sdpa``, flash): the probe's passes use the
  model's ``eager`` attention, the same function up to float rounding;
- mixed precision (``bf16=True`` / ``fp16=True``): accelerate wraps the model's forward in autocast; the probe
  calls the forward it wrapped (``_original_forward``), so a model with float32 weights is probed in float32
  (the policy its weights define; TRL's own half-precision forward differs from it by the rounding, about
  5e-4 relative in the gap norms on the tiny model).

Inside the block: eval mode (no dropout), ``eager`` attention on every configuration of the model, every
module's ``gradient_checkpointing`` flag off, those hooks detached, no autocast wrapper, and the completions scored at the
trainer's temperature (:func:`llm_probe.model.scoring_temperature`); everything is put back on exit, also when
the block raises.
"""

from __future__ import annotations

import contextlib

from .model import eval_mode, scoring_temperature

__all__ = ["probe_forwards", "REQUIRE_GRADS_HOOK"]

REQUIRE_GRADS_HOOK = "make_inputs_require_grads"  # the hook's name in transformers' enable_input_require_grads


def _configs(model) -> list:
    """Every distinct model configuration reachable from ``model``'s modules (sub-configurations included)."""
    seen, out = set(), []
    stack = [getattr(m, "config", None) for m in model.modules()]
    while stack:
        cfg = stack.pop()
        if cfg is None or id(cfg) in seen or not hasattr(cfg, "_attn_implementation_internal"):
            continue
        seen.add(id(cfg))
        out.append(cfg)
        for key in getattr(cfg, "sub_configs", {}) or {}:
            stack.append(getattr(cfg, key, None))
    return out


@contextlib.contextmanager
def probe_forwards(model, temperature: float = 1.0, *, attention: str = "eager"):
    """Run the block's forwards of ``model`` as the probe needs them (module docstring)."""
    configs = _configs(model)
    attn = [(c, c._attn_implementation_internal) for c in configs]
    ckpt = [(m, m.gradient_checkpointing) for m in model.modules()
            if isinstance(getattr(m, "gradient_checkpointing", None), bool)]
    amp = [(m, m.__dict__["forward"]) for m in model.modules()
           if "_original_forward" in m.__dict__ and "forward" in m.__dict__]  # accelerate's autocast wrapper
    hooked = []  # (module, its forward-hook dict before)
    for m in model.modules():
        hooks = getattr(m, "_forward_hooks", None)
        if hooks and any(getattr(h, "__name__", "") == REQUIRE_GRADS_HOOK for h in hooks.values()):
            hooked.append((m, dict(hooks)))
    try:
        for c, impl in attn:
            if impl is not None and impl != attention:
                c._attn_implementation_internal = attention
        for m, _ in ckpt:
            m.gradient_checkpointing = False
        for m, _ in amp:
            m.forward = m.__dict__["_original_forward"]
        for m, before in hooked:
            for key, h in before.items():
                if getattr(h, "__name__", "") == REQUIRE_GRADS_HOOK:
                    del m._forward_hooks[key]
        with eval_mode(model), scoring_temperature(temperature):
            yield model
    finally:
        for c, impl in attn:
            c._attn_implementation_internal = impl
        for m, flag in ckpt:
            m.gradient_checkpointing = flag
        for m, fwd in amp:
            m.forward = fwd
        for m, before in hooked:
            m._forward_hooks.clear()
            m._forward_hooks.update(before)
