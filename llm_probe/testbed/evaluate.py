"""Held-out accuracy of a policy on the testbed task, sampled at the RL temperature and greedy.

Accuracy = mean reward over the held-out problems (never drawn by the training stream), one completion each:
sampled with a generator of its own (so evaluating never changes a run's training trajectory) or greedy
(temperature -> 0: the argmax token at every position).
"""

from __future__ import annotations

import numpy as np
import torch

from ..model import eval_mode
from ..rollout import encode_prompts

__all__ = ["heldout_accuracy", "Evaluation"]


class Evaluation(dict):
    """{'acc': sampled accuracy, 'acc_greedy': greedy accuracy (or absent), 'tokens_median': median completion
    tokens of the sampled completions (eos counted), 'n': problems}."""


@torch.no_grad()
def _complete(model, tok, problems, *, max_new_tokens: int, temperature: float, generator, greedy: bool,
              batch: int = 256):
    """Texts, terminated flags and token counts of one completion per problem."""
    texts, term, lengths = [], [], []
    dev = next(model.parameters()).device
    eos = tok.eos_token_id
    for i in range(0, len(problems), batch):
        chunk = problems[i:i + batch]
        ids, mask = encode_prompts(tok, [p.prompt for p in chunk], dev)
        c_ids, c_mask, done = _sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_id=eos, pad_id=tok.pad_token_id,
                    generator=generator, temperature=temperature, greedy=greedy)
        for row, m, t in zip(c_ids.tolist(), c_mask.tolist(), done.tolist()):
            texts.append(tok.decode([x for x, k in zip(row, m) if k > 0 and x != eos]))
            term.append(bool(t))
            lengths.append(int(sum(m)))
    return texts, term, lengths


def _sample(model, ids, mask, *, max_new_tokens, eos_id, pad_id, generator, temperature, greedy):
    """(completion ids, mask, terminated) of one completion per row: the KV-cache sampler, drawing or greedy
    (:func:`llm_probe.sampler.decode`), or, for a model it does not support, a greedy loop of full forwards."""
    if greedy:
        from ..sampler import decode, supports_fast_path

        if supports_fast_path(model):
            out = decode(model, ids, mask, group_size=1, max_new_tokens=max_new_tokens, eos_id=eos_id, pad_id=pad_id,
                         generator=None, temperature=1.0, check_finite=None, greedy=True)
            return out[0], out[1], out[2]
    else:
        from ..rollout import sample_groups

        out = sample_groups(model, ids, mask, G=1, max_new_tokens=max_new_tokens, eos_id=eos_id, pad_id=pad_id,
                            generator=generator, temperature=temperature)
        return out[0], out[1], out[2]
    return _greedy(model, ids, mask, max_new_tokens=max_new_tokens, eos_id=eos_id, pad_id=pad_id)


def _greedy(model, ids, mask, *, max_new_tokens, eos_id, pad_id):
    """Greedy decoding by full forwards (no cache: the reference for the KV-cache route, and any model)."""
    from ..model import forward_inputs

    B = ids.shape[0]
    out = torch.full((B, max_new_tokens), pad_id, dtype=ids.dtype, device=ids.device)
    cmask = torch.zeros((B, max_new_tokens), dtype=mask.dtype, device=ids.device)
    done = torch.zeros(B, dtype=torch.bool, device=ids.device)
    cur_ids, cur_mask = ids, mask
    for t in range(max_new_tokens):
        logits = model(**forward_inputs(model, cur_ids, cur_mask)).logits[:, -1, :]
        nxt = logits.argmax(-1)
        live = ~done
        out[:, t] = torch.where(live, nxt, torch.full_like(nxt, pad_id))
        cmask[:, t] = live.to(mask.dtype)
        done = done | (live & (nxt == eos_id))
        cur_ids = torch.cat([cur_ids, out[:, t:t + 1]], 1)
        cur_mask = torch.cat([cur_mask, cmask[:, t:t + 1]], 1)
        if bool(done.all()):
            out, cmask = out[:, :t + 1], cmask[:, :t + 1]
            break
    return out, cmask, done


def heldout_accuracy(model, tok, task, problems=None, *, max_new_tokens: int, temperature: float = 1.0, seed: int = 0,
                     greedy: bool = False) -> Evaluation:
    """Held-out accuracy (module doc) of ``model`` on ``problems`` (default: ``task.heldout()``).

    ``seed`` fixes the sampling generator (the same seed gives the same draws at the same weights)."""
    problems = task.heldout() if problems is None else problems
    if not problems:
        raise ValueError("problems must not be empty")
    gen = torch.Generator().manual_seed(int(seed))
    with eval_mode(model):
        texts, term, lengths = _complete(model, tok, problems, max_new_tokens=max_new_tokens,
                                         temperature=temperature, generator=gen, greedy=greedy)
    r = [task.reward(t, p, terminated=d) for t, p, d in zip(texts, problems, term)]
    return Evaluation(acc=float(np.mean(r)), tokens_median=float(np.median(lengths)), n=len(problems))

