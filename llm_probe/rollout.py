"""Online rollouts: tokenise prompts, sample G completions per prompt, score them.

Sampling is an explicit loop over new tokens with a ``torch.Generator`` (no global RNG). An unmodified
Qwen2/Qwen3 takes the batched route of :mod:`llm_probe.sampler` (static KV cache, each distinct prompt
prefilled once, the sampled tokens' log-probs returned); any other model the plain loop, which re-runs the
full forward for every new token. Both draw with the same ``torch.multinomial`` calls, so they give the same
tokens up to float rounding of the probabilities. A completion ends at the first <eos>, which is kept and
scored; later positions are padding with mask 0. The sampler never emits <pad> (its logit is masked,
unless <pad> is <eos>): a sampled <pad> would be an input whose embedding row gets no gradient
(``padding_idx``), so the scored function and the gap would differ there. Rows are ordered prompt-major: row b*G + g is
completion g of prompt b.
"""

from __future__ import annotations

import math

from dataclasses import dataclass

import torch

from typing import NamedTuple

from .model import forward_inputs
from .sampler import decode, supports_fast_path

__all__ = ["Rollout", "Samples", "left_pad", "encode_prompts", "sample_completions", "sample_groups", "make_rollout",
           "context_size", "check_prompts_fit"]


@dataclass
class Rollout:
    """One step's groups. B prompts, G completions each, N = B*G rows, T = max new tokens."""

    problems: list  # [B] Problem
    prompt_ids: torch.Tensor  # [N, P] left-padded
    prompt_mask: torch.Tensor  # [N, P]
    completion_ids: torch.Tensor  # [N, T] right-padded with pad id
    completion_mask: torch.Tensor  # [N, T] float, 1 up to and including <eos>
    terminated: torch.Tensor  # [N] bool, an <eos> was emitted
    texts: list  # [N] decoded completion (without <eos>)
    rewards: torch.Tensor  # [B, G] float in {0, 1}
    logp: torch.Tensor | None = None  # [N, T] the sampler's log pi(o_t | q, o_<t) (temperature 1), 0 where masked

    @property
    def G(self) -> int:
        return self.rewards.shape[1]

    @property
    def B(self) -> int:
        return self.rewards.shape[0]


class NonFinitePolicyError(ValueError):
    """The policy produced NaN/inf probabilities while sampling (e.g. after an update that blew up its logits)."""


def context_size(model) -> int | None:
    """The model's context length (``config.max_position_embeddings``); None when the model does not say."""
    n = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def _room(context: int, max_new_tokens: int) -> int:
    """Prompt tokens that fit in ``context`` next to ``max_new_tokens``; a ValueError when none do."""
    if max_new_tokens >= context:
        raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the model context of "
                         f"{context} positions (config.max_position_embeddings)")
    return context - max_new_tokens


def _too_long(lengths, room: int, context: int, max_new_tokens: int) -> ValueError:
    i = max(range(len(lengths)), key=lambda j: lengths[j])
    return ValueError(f"prompt {i} is {lengths[i]} tokens: with max_new_tokens={max_new_tokens} it needs "
                      f"{lengths[i] + max_new_tokens} positions, the model context is {context} "
                      f"(config.max_position_embeddings); shorten it, lower max_new_tokens, or pass "
                      f"truncate_prompts (--truncate-prompts) to keep its last {room} tokens")


def check_prompts_fit(tokenizer, prompts: list[str], context: int | None, max_new_tokens: int) -> None:
    """A ValueError naming the longest prompt when a prompt plus ``max_new_tokens`` exceeds ``context``."""
    if context is None or not prompts:
        return
    room = _room(context, max_new_tokens)
    lengths = [len(x) for x in tokenizer(list(prompts), add_special_tokens=False)["input_ids"]]
    if max(lengths) > room:
        raise _too_long(lengths, room, context, max_new_tokens)


def left_pad(seqs: list[list[int]], pad_id: int | None, device=None):
    """(ids [B, P], mask [B, P]) of the token-id lists ``seqs``, left-padded with ``pad_id`` (0 when None: a masked
    position's id never reaches a scored log-prob), P the longest."""
    pad = 0 if pad_id is None else int(pad_id)
    P = max((len(s) for s in seqs), default=0)
    ids = torch.tensor([[pad] * (P - len(s)) + list(s) for s in seqs], dtype=torch.long).view(len(seqs), P)
    mask = torch.tensor([[0] * (P - len(s)) + [1] * len(s) for s in seqs], dtype=torch.long).view(len(seqs), P)
    return ids.to(device), mask.to(device)


def encode_prompts(tokenizer, prompts: list[str], device=None):
    """(ids [B, P], mask [B, P]) left-padded whatever ``tokenizer.padding_side`` (TRL pads prompts on the left;
    :func:`sample_completions` and every scored forward read the last column as the prompt's last token), no
    special tokens. The padding is done here, never by the tokenizer."""
    ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return left_pad(ids, pad, device)


class Samples(NamedTuple):
    """What :func:`sample_groups` returns (N = B*G rows, prompt-major; T <= max_new_tokens)."""

    completion_ids: torch.Tensor  # [N, T] right-padded with the pad id
    completion_mask: torch.Tensor  # [N, T] float, 1 up to and including <eos>
    terminated: torch.Tensor  # [N] bool
    logp: torch.Tensor  # [N, T] log pi(o_t | q, o_<t) at temperature 1, 0 where masked


def _check_sampling(model, prompt_ids, max_new_tokens, temperature) -> None:
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be finite and > 0, got {temperature}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    context = context_size(model)
    if context is not None and prompt_ids.shape[1] + max_new_tokens > context:  # before anything is allocated
        raise ValueError(f"prompts of {prompt_ids.shape[1]} tokens plus max_new_tokens={max_new_tokens} exceed the "
                         f"model context of {context} positions (config.max_position_embeddings)")


def _check_finite(probs, t: int) -> None:
    if not bool(torch.isfinite(probs).all()):
        raise NonFinitePolicyError(f"the policy's next-token probabilities are not finite at position {t}")


@torch.no_grad()
def _sample_plain(model, ids, attn, *, max_new_tokens: int, eos_id: int, pad_id, generator, temperature):
    """The plain route: the model's full forward over the whole sequence for each new token (any model)."""
    N = ids.shape[0]
    dev = ids.device
    done = torch.zeros(N, dtype=torch.bool, device=dev)
    out = torch.full((N, max_new_tokens), pad_id, dtype=torch.long, device=dev)
    mask = torch.zeros((N, max_new_tokens), dtype=torch.float32, device=dev)
    logp = torch.zeros((N, max_new_tokens), dtype=torch.float32, device=dev)
    for t in range(max_new_tokens):
        logits = model(**forward_inputs(model, ids, attn)).logits[:, -1, :].float()
        raw = logits.clone()
        if pad_id is not None and pad_id != eos_id:  # <pad> is never sampled: it only fills the rows after <eos>
            logits[:, pad_id] = -float("inf")
        probs = torch.softmax(logits / temperature, dim=-1)
        _check_finite(probs, t)
        nxt = torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(dev)
        logp[:, t] = torch.log_softmax(raw, dim=-1).gather(-1, nxt[:, None]).squeeze(-1) * (~done)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        out[:, t] = nxt
        mask[:, t] = (~done).float()
        done = done | (nxt == eos_id)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        attn = torch.cat([attn, (mask[:, t : t + 1] > 0).long()], dim=1)
        if bool(done.all()):
            return out[:, : t + 1], mask[:, : t + 1], done, logp[:, : t + 1]
    return out, mask, done, logp


def sample_groups(model, prompt_ids, prompt_mask, *, G: int, max_new_tokens: int, eos_id: int, pad_id: int,
                  generator: torch.Generator, temperature: float = 1.0, fast: bool | None = None) -> Samples:
    """G completions of each left-padded prompt [B, P], rows prompt-major (row b*G + g: completion g of prompt b).

    Each position draws ``torch.multinomial(softmax(logits / temperature), 1, generator)`` over all N rows
    (<pad> masked unless it is <eos>); a row ends at its first <eos>. ``fast``: None picks the batched KV-cache
    route of :mod:`llm_probe.sampler` when :func:`llm_probe.sampler.supports_fast_path`, False forces the
    plain loop (the reference), True requires the batched route."""
    _check_sampling(model, prompt_ids, max_new_tokens, temperature)
    if isinstance(G, bool) or not isinstance(G, int) or G < 1:
        raise ValueError(f"G must be an integer >= 1, got {G!r}")
    ok = supports_fast_path(model)
    if fast and not ok:
        raise ValueError("fast=True needs an unmodified Qwen2/Qwen3 causal LM (llm_probe.sampler.supports_fast_path)")
    if ok and fast is not False:
        return Samples(*decode(model, prompt_ids, prompt_mask, group_size=G, max_new_tokens=max_new_tokens,
                               eos_id=eos_id, pad_id=pad_id, generator=generator, temperature=temperature,
                               check_finite=_check_finite))
    return Samples(*_sample_plain(model, prompt_ids.repeat_interleave(G, 0), prompt_mask.repeat_interleave(G, 0),
                                  max_new_tokens=max_new_tokens, eos_id=eos_id, pad_id=pad_id, generator=generator,
                                  temperature=temperature))


def sample_completions(model, prompt_ids, prompt_mask, *, max_new_tokens: int, eos_id: int, pad_id: int,
                       generator: torch.Generator, temperature: float = 1.0):
    """Sample one completion per row token by token; returns (completion_ids [N, T], completion_mask [N, T],
    terminated [N]) (:func:`sample_groups` with G = 1)."""
    s = sample_groups(model, prompt_ids, prompt_mask, G=1, max_new_tokens=max_new_tokens, eos_id=eos_id,
                      pad_id=pad_id, generator=generator, temperature=temperature)
    return s.completion_ids, s.completion_mask, s.terminated


def make_rollout(model, tokenizer, task, problems, *, G: int, max_new_tokens: int, generator: torch.Generator,
                 temperature: float = 1.0, truncate_prompts: bool = False, fast: bool | None = None) -> Rollout:
    """Sample G completions for each problem (:func:`sample_groups`; ``fast`` picks its route) and score them
    with ``task.reward``. A prompt that does not fit in the model context next to ``max_new_tokens`` is a
    ValueError, or is cut to its last tokens when ``truncate_prompts``."""
    if G < 2:
        raise ValueError(f"G must be >= 2, got {G}")
    if len(problems) == 0:
        raise ValueError("problems must not be empty (nothing to roll out)")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    dev = next(model.parameters()).device
    context = context_size(model)
    room = None if context is None else _room(context, max_new_tokens)
    p_ids, p_mask = encode_prompts(tokenizer, [p.prompt for p in problems], dev)
    if room is not None and p_ids.shape[1] > room:  # checked before the model sees the batch
        if not truncate_prompts:
            raise _too_long(p_mask.sum(-1).tolist(), room, context, max_new_tokens)
        p_ids, p_mask = p_ids[:, -room:], p_mask[:, -room:]  # left-padded: the last columns end each prompt
    fast = supports_fast_path(model) if fast is None else fast
    was_training = model.training
    if not fast:  # the plain route runs the model's own forward: in eval mode (the batched route has no dropout)
        model.eval()
    c_ids, c_mask, term, logp = sample_groups(model, p_ids, p_mask, G=G, max_new_tokens=max_new_tokens,
                                              eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                                              generator=generator, temperature=temperature, fast=fast)
    if not fast:
        model.train(was_training)
    p_ids, p_mask = p_ids.repeat_interleave(G, 0), p_mask.repeat_interleave(G, 0)
    texts, eos = [], tokenizer.eos_token_id  # eos looked up once (a tokenizer attribute is a dict lookup chain)
    for row, m in zip(c_ids.tolist(), c_mask.tolist()):
        texts.append(tokenizer.decode([t for t, k in zip(row, m) if k > 0 and t != eos]))
    r = [task.reward(texts[i], problems[i // G], terminated=bool(term[i])) for i in range(len(texts))]
    rewards = torch.tensor(r, dtype=torch.float32).view(len(problems), G)
    return Rollout(problems, p_ids, p_mask, c_ids, c_mask, term.cpu(), texts, rewards, logp)
