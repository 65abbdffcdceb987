"""A batched sampler for the tiny Qwen with a static KV cache, and a shared-prompt forward for scoring.

The plain route (:func:`llm_probe.rollout.sample_groups` with ``fast=False``, and any model this module does
not support) re-runs the Hugging Face forward over the whole sequence for every new token. For an unmodified
``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` (:func:`supports_fast_path`) this module runs the same function of
the weights written out in plain torch ops:

- :func:`decode` (sampling, no grad): one prefill pass over the B distinct prompts (rows b*G .. b*G+G-1 share
  prompt b), keys and values of every layer in a static cache [N, H_kv, P + T, D] (each prompt's copied to
  its G rows); then one pass over the N newest tokens per position; the sampled tokens' log pi(o_t | q, o_<t)
  (temperature 1, the policy the loss scores) come out with them;
- :func:`fast_completion_logprobs` (the loss, differentiable): each prompt's pass shared by its G rows, so
  B P + N (T - 1) tokens run instead of N (P + T).

Keys of left padding (and tokens after <eos>) get the additive mask finfo(float32).min, as
:func:`llm_probe.model.forward_inputs` and HF's eager attention. Per layer (HF Qwen2 / Qwen3 modelling code):
x + o(attn(rope(q), rope(k), v)), q, k, v from RMSNorm(x) (Qwen3: RMSNorm of q and k over the head dim), then
h + down(silu(gate(h')) * up(h')), h' = RMSNorm(h). Departures, all within float rounding of the HF forward:
q/k/v and gate/up run as one stacked matmul each; float32 uses ``F.rms_norm`` and
``scaled_dot_product_attention`` (grouped-query, no repeated keys); float64 keeps HF's float32 norms and
softmax. LoRA-wrapped or hooked models, other architectures and sliding windows take the plain route.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["supports_fast_path", "decode", "fast_completion_logits", "fast_completion_logprobs"]

_MASKED = torch.finfo(torch.float32).min  # the additive mask of a padded key (llm_probe.model.forward_inputs)


def supports_fast_path(model) -> bool:
    """True for an unmodified Qwen2/Qwen3 causal LM in float32/float64 with eager or sdpa attention, full
    (not sliding-window) attention layers, plain ``nn.Linear`` projections and no module hooks."""
    try:
        from transformers import Qwen2ForCausalLM, Qwen3ForCausalLM
    except ImportError:  # pragma: no cover - transformers is a dependency of llm_probe
        return False
    if type(model) not in (Qwen2ForCausalLM, Qwen3ForCausalLM):
        return False
    cfg = model.config
    if getattr(cfg, "_attn_implementation", "eager") not in ("eager", "sdpa"):
        return False
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or []):
        return False
    if model.dtype not in (torch.float32, torch.float64):
        return False
    for m in model.modules():
        if m._forward_hooks or m._forward_pre_hooks:
            return False
        if isinstance(m, torch.nn.Linear) and type(m) is not torch.nn.Linear:
            return False
    return True


def _rms(x, norm):
    """HF Qwen RMSNorm: w * (x / sqrt(mean(x^2) + eps)), in float32 (``F.rms_norm``, one kernel) and, for a
    float64 model, computed in float32 and cast back exactly as HF does."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], norm.weight, norm.variance_epsilon)
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x32.to(x.dtype)


def _rope(x, cos, sin):
    """x cos + rotate_half(x) sin, x [n, L, h, D], cos/sin [n, L, 1, D]."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _cat(*ts):
    return None if ts[0] is None else torch.cat(ts)


def _fused(model) -> list:
    """Per layer (qkv weight, qkv bias, gate|up weight): the three attention projections and the two MLP input
    projections stacked, one matmul each (differentiable: the gradient of the stack is split back)."""
    out = []
    for lyr in model.model.layers:
        a, m = lyr.self_attn, lyr.mlp
        out.append((torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                    _cat(a.q_proj.bias, a.k_proj.bias, a.v_proj.bias),
                    torch.cat([m.gate_proj.weight, m.up_proj.weight])))
    return out


def _attend(a, q, K, V, bias):
    """softmax(q K^T * scaling + bias) V, q [n, H, L, D], K/V [n, H_kv, S, D], bias [n, 1, L or 1, S].
    float32: one ``scaled_dot_product_attention`` call (grouped-query); float64: HF's eager route, softmax in
    float32, query heads grouped by their key head instead of repeating the keys."""
    n, H, L, D = q.shape
    Hk, rep = K.shape[1], a.num_key_value_groups
    if q.dtype == torch.float32:
        return F.scaled_dot_product_attention(q, K, V, attn_mask=bias, scale=a.scaling, enable_gqa=rep > 1)
    w = torch.matmul(q.reshape(n, Hk, rep * L, D), K.transpose(2, 3)).view(n, H, L, -1) * a.scaling + bias
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w.view(n, Hk, rep * L, -1), V).view(n, H, L, D)


def _layer(lyr, fw, x, cos, sin, bias, kv=None, start: int = 0, past=None):
    """One decoder layer on x [n, L, d] (``fw``: its :func:`_fused` weights). Keys and values: ``kv`` = a
    static cache (K, V) [n, H_kv, S, D] (this call's are written at slots start..start+L-1, attention over
    slots 0..start+L-1), or ``past`` = (K0, V0) [n, H_kv, S0, D] put before this call's, or neither.
    ``bias``: additive mask [n, 1, L or 1, keys]. Returns (x', k, v) with this call's k, v [n, H_kv, L, D]."""
    a = lyr.self_attn
    n, L, _ = x.shape
    D = a.head_dim
    H, Hk = a.q_proj.out_features // D, a.k_proj.out_features // D
    qkv = F.linear(_rms(x, lyr.input_layernorm), fw[0], fw[1]).view(n, L, H + 2 * Hk, D)
    if hasattr(a, "q_norm"):  # Qwen3: q and k normed apart, then rotated
        q, k, v = qkv.split([H, Hk, Hk], dim=2)
        q, k = _rope(_rms(q, a.q_norm), cos, sin), _rope(_rms(k, a.k_norm), cos, sin)
    else:  # Qwen2: q and k rotated in one pass (the same elementwise operations)
        q, k = _rope(qkv[:, :, :H + Hk], cos, sin).split([H, Hk], dim=2)
        v = qkv[:, :, H + Hk:]
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if kv is not None:
        kv[0][:, :, start:start + L] = k
        kv[1][:, :, start:start + L] = v
        K, V = kv[0][:, :, :start + L], kv[1][:, :, :start + L]
    elif past is not None:
        K, V = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
    else:
        K, V = k, v
    o = _attend(a, q, K, V, bias)
    x = x + F.linear(o.transpose(1, 2).reshape(n, L, -1), a.o_proj.weight, a.o_proj.bias)
    m = lyr.mlp
    gate, up = F.linear(_rms(x, lyr.post_attention_layernorm), fw[2]).chunk(2, dim=-1)
    return x + F.linear(m.act_fn(gate) * up, m.down_proj.weight), k, v


def _rows(x, G: int):
    """x [B, ...] -> [B*G, ...], row b repeated on rows b*G..b*G+G-1 (an expand: its gradient sums the G rows)."""
    return x[:, None].expand(x.shape[0], G, *x.shape[1:]).reshape(x.shape[0] * G, *x.shape[1:])


def _embed(model, ids):
    e = model.model.embed_tokens  # padding_idx as the module: the <pad> row gets no gradient
    return F.embedding(ids, e.weight, e.padding_idx)


def _rotary_table(model, x, n_pos: int):
    """(cos, sin) [n_pos, D] of positions 0..n_pos-1 from the model's own rotary module (one call)."""
    cos, sin = model.model.rotary_emb(x, torch.arange(n_pos, device=x.device)[None])
    return cos[0], sin[0]


def _rotary(table, pos):
    """(cos, sin) [n, L, 1, D] at positions ``pos`` [n, L], looked up in a :func:`_rotary_table`."""
    return table[0][pos][:, :, None], table[1][pos][:, :, None]


def _trunk(model, fused, table, ids, pos, bias, caches, start: int):
    """Final-norm hidden states [n, L, d] of the token ids [n, L] at positions ``pos`` [n, L] (static caches)."""
    x = _embed(model, ids)
    cos, sin = _rotary(table, pos)
    for lyr, fw, kv in zip(model.model.layers, fused, caches):
        x = _layer(lyr, fw, x, cos, sin, bias, kv, start)[0]
    return _rms(x, model.model.norm)


def _causal_bias(mask, dtype):
    """Additive mask [n, 1, L, L]: 0 where key j <= query i and mask[j] = 1, else finfo(float32).min."""
    L = mask.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=mask.device).tril()
    allowed = causal[None] & (mask[:, None, :] > 0)
    return torch.where(allowed, 0.0, _MASKED).to(dtype)[:, None]


def fast_completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, *, G: int = 1):
    """:func:`llm_probe.model.completion_logits` [N, T, V] by this module's forward (differentiable), with
    each prompt's forward shared by its G rows: the prompts ``prompt_ids[::G]`` [B, P] run once, their keys
    and values (and the last position's state, which scores token 0) are repeated to the G rows, and only
    the completion tokens 0..T-2 run per row. The same function of the weights as the full forward over
    [N, P + T] (causal attention: prompt states never see the completion), B P + N (T - 1) tokens instead
    of N (P + T); the gradient through the shared prompt sums its G rows. Needs rows b*G..b*G+G-1 to
    share their prompt (ValueError otherwise)."""
    N, P = prompt_ids.shape
    T = completion_ids.shape[1]
    if G < 1 or N % G:
        raise ValueError(f"G must divide the {N} rows, got {G}")
    p_ids, p_mask = prompt_ids[::G], prompt_mask[::G].long()
    if G > 1 and not (torch.equal(p_ids.repeat_interleave(G, 0), prompt_ids)
                      and torch.equal(p_mask.repeat_interleave(G, 0), prompt_mask.long())):
        raise ValueError("prompt_ids must repeat each prompt on G consecutive rows (prompt-major)")
    dt = model.dtype
    base = model.model
    pos_p = (p_mask.cumsum(-1) - 1).clamp(min=0)
    xp = _embed(model, p_ids)  # [B, P, d]
    table = _rotary_table(model, xp, P + T)
    cp, sp = _rotary(table, pos_p)
    bias_p = _causal_bias(p_mask, dt)
    Tc = T - 1  # completion tokens that are inputs (the last one scores nothing)
    c_mask = completion_mask[:, :Tc].long()
    if Tc:
        xc = _embed(model, completion_ids[:, :Tc])  # [N, Tc, d]
        pos_c = p_mask.sum(-1).repeat_interleave(G, 0)[:, None] - 1 + c_mask.cumsum(-1)
        pos_c = torch.maximum(pos_c, torch.zeros_like(pos_c))  # as cumsum(mask) - 1 clamped at 0
        cc, sc = _rotary(table, pos_c)
        keys = torch.cat([p_mask.repeat_interleave(G, 0), c_mask], dim=1)  # [N, P + Tc]
        allowed = torch.ones(Tc, P + Tc, dtype=torch.bool, device=keys.device).tril(P)[None] & (keys[:, None] > 0)
        bias_c = torch.where(allowed, 0.0, _MASKED).to(dt)[:, None]  # [N, 1, Tc, P + Tc]
    for lyr, fw in zip(base.layers, _fused(model)):
        xp, kp, vp = _layer(lyr, fw, xp, cp, sp, bias_p)
        if Tc:
            past = (_rows(kp, G), _rows(vp, G))
            xc = _layer(lyr, fw, xc, cc, sc, bias_c, past=past)[0]
    h = _rows(_rms(xp[:, -1:], base.norm), G)  # [N, 1, d]: scores completion token 0
    if Tc:
        h = torch.cat([h, _rms(xc, base.norm)], dim=1)  # [N, T, d]
    return F.linear(h, model.lm_head.weight)


def fast_completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, *, G: int = 1,
                             return_entropy: bool = False, return_all: bool = False):
    """:func:`llm_probe.model.completion_logprobs` (log pi(o_t | q, o_<t) [N, T], 0 where masked; with
    ``return_entropy`` (logp, entropies, log pi(. | q, o_<t) [N, T, V]); with ``return_all`` (logp, log pi(. | q,
    o_<t)), no entropy computed) by :func:`fast_completion_logits` when :func:`supports_fast_path`, else by the
    model's own forward."""
    from .model import completion_logprobs

    if not supports_fast_path(model):
        out = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                  return_entropy=return_entropy or return_all)
        return (out[0], out[2]) if return_all and not return_entropy else out
    logits = fast_completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, G=G)
    logp_all = torch.log_softmax(logits, dim=-1)  # [N, T, V]
    logp = logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1) * completion_mask
    if not return_entropy:
        return (logp, logp_all) if return_all else logp
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp, ent, logp_all


@torch.no_grad()
def decode(model, prompt_ids, prompt_mask, *, group_size: int, max_new_tokens: int, eos_id: int, pad_id,
           generator: torch.Generator | None, temperature: float, check_finite, greedy: bool = False):
    """Sample up to ``max_new_tokens`` after the left-padded prompts [B, P] (each sampled ``group_size`` times,
    rows prompt-major); returns (completion_ids [N, T], completion_mask [N, T], terminated [N], logp [N, T]).

    Draws: ``torch.multinomial(probs, 1, generator)`` per position on the CPU, exactly as the plain route
    (same calls, same random stream); probs = softmax(logits / temperature) with <pad> masked (unless it is
    <eos>). ``check_finite(probs, t)`` raises for non-finite probabilities. logp is log softmax(logits) of
    the sampled token (temperature 1), 0 where masked. ``greedy``: the argmax of the raw logits at every position
    instead of a draw (no <pad> mask, no generator, temperature unused), as a loop of full forwards would pick."""
    B, P = prompt_ids.shape
    G, T = group_size, max_new_tokens
    N, dev, dt = B * G, prompt_ids.device, model.dtype
    cfg = model.config
    D = model.model.layers[0].self_attn.head_dim
    S = P + T
    caches = [(torch.zeros(N, cfg.num_key_value_heads, S, D, dtype=dt, device=dev),
               torch.zeros(N, cfg.num_key_value_heads, S, D, dtype=dt, device=dev)) for _ in model.model.layers]
    pos = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
    fused = _fused(model)
    table = _rotary_table(model, prompt_ids.new_zeros((), dtype=dt), S)
    pre = [(torch.empty(B, cfg.num_key_value_heads, P, D, dtype=dt, device=dev),
            torch.empty(B, cfg.num_key_value_heads, P, D, dtype=dt, device=dev)) for _ in model.model.layers]
    h = _trunk(model, fused, table, prompt_ids, pos, _causal_bias(prompt_mask, dt), pre, 0)[:, -1]  # [B, d]
    for (K, V), (k, v) in zip(caches, pre):  # each prompt's cache entries copied to its G rows
        K[:, :, :P] = k.repeat_interleave(G, 0)
        V[:, :, :P] = v.repeat_interleave(G, 0)
    logits = F.linear(h, model.lm_head.weight).float().repeat_interleave(G, 0)  # [N, V]
    key_ok = torch.ones(N, S, dtype=torch.bool, device=dev)
    key_ok[:, :P] = prompt_mask.repeat_interleave(G, 0) > 0
    bias = torch.where(key_ok, 0.0, _MASKED).to(dt)[:, None, None, :]  # [N, 1, 1, S]: padded keys masked
    next_pos = prompt_mask.long().sum(-1).repeat_interleave(G, 0)[:, None]  # [N, 1]: prompt length
    done = torch.zeros(N, dtype=torch.bool, device=dev)
    out = torch.full((N, T), pad_id, dtype=torch.long, device=dev)
    mask = torch.zeros((N, T), dtype=torch.float32, device=dev)
    logp = torch.zeros((N, T), dtype=torch.float32, device=dev)
    mask_pad = pad_id is not None and pad_id != eos_id
    for t in range(T):
        if greedy:
            nxt = logits.argmax(-1)
        else:
            scores = logits.clone() if mask_pad else logits
            if mask_pad:  # <pad> is never sampled: it only fills the rows after <eos>
                scores[:, pad_id] = -float("inf")
            probs = torch.softmax(scores if temperature == 1 else scores / temperature, dim=-1)  # x / 1 is x
            check_finite(probs, t)
            nxt = torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(dev)
        live = ~done
        logp[:, t] = torch.log_softmax(logits, dim=-1).gather(-1, nxt[:, None]).squeeze(-1) * live
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        out[:, t], mask[:, t] = nxt, live.float()
        done = done | (nxt == eos_id)
        if bool(done.all()):
            return out[:, :t + 1], mask[:, :t + 1], done, logp[:, :t + 1]
        if t + 1 < T:  # the next position's logits from the cache
            bias[:, 0, 0, P + t] = torch.where(live, 0.0, _MASKED).to(dt)  # tokens after <eos> masked, as the
            # plain route's attention mask
            h = _trunk(model, fused, table, nxt[:, None], next_pos + t, bias[..., :P + t + 1], caches,
                       P + t)[:, -1]
            logits = F.linear(h, model.lm_head.weight).float()
    return out, mask, done, logp
