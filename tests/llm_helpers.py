"""Shared helpers of the tests/test_llm_*.py modules: a tiny Qwen, a warmed copy (cached per session),
and hand-made rollouts with chosen rewards (the gap identities need labels, not a good model)."""

from __future__ import annotations

import copy
import functools

import numpy as np
import torch

from llm_probe.model import TinyQwenSpec, build_tiny_qwen, completion_logprobs
from llm_probe.probes import flat, mixed_groups
from llm_probe.rollout import Rollout, make_rollout
from llm_probe.tasks import AdditionTask
from llm_probe.tokenizer import build_char_tokenizer
from llm_probe.warmup import warmup

torch.set_num_threads(1)
SMALL = TinyQwenSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=8)


def tiny(arch: str = "qwen2", seed: int = 0, spec: TinyQwenSpec = SMALL, dtype="float32"):
    tok = build_char_tokenizer()
    spec = TinyQwenSpec(**{**spec.__dict__, "arch": arch})
    return build_tiny_qwen(tok, spec, seed=seed, dtype=dtype), tok


WARM = dict(steps=250, batch_size=128, lr=1e-3, seed=0)


@functools.lru_cache(maxsize=1)
def _warm_state():
    """Warmed weights; cached on disk (temp dir, keyed by versions and settings): deterministic, ~10 s to rebuild."""
    import os
    import tempfile

    import transformers

    key = f"warm_{torch.__version__}_{transformers.__version__}_{WARM['steps']}_{WARM['batch_size']}_{WARM['lr']}_{WARM['seed']}"
    path = os.path.join(tempfile.gettempdir(), "gapdyn_llm_tests", key.replace("+", "_") + ".pt")
    if os.path.exists(path):
        try:
            return torch.load(path, weights_only=True)
        except Exception:  # a corrupt cache is rebuilt
            pass
    model, tok = tiny(spec=TinyQwenSpec())
    warmup(model, tok, AdditionTask(), **WARM)
    state = copy.deepcopy(model.state_dict())
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + f".{os.getpid()}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)
    return state


def warm_model():
    """A fresh copy of the session's warmed default-size tiny Qwen2 (250 supervised steps)."""
    model, tok = tiny(spec=TinyQwenSpec())
    model.load_state_dict(_warm_state())
    return model, tok


def saved_warm_model(folder):
    """:func:`warm_model` saved with ``llm_probe.save_policy`` into ``folder`` (a from_pretrained directory)."""
    from llm_probe.model import save_policy

    save_policy(*warm_model(), folder)
    return folder


def sampled_rollout(model, tok, *, B=3, G=4, T=5, seed=0, rewards=None):
    """Sample completions from ``model`` and overwrite the rewards with a mixed pattern (or ``rewards``)."""
    task = AdditionTask()
    ro = make_rollout(model, tok, task, task.sample(np.random.default_rng(seed), B), G=G, max_new_tokens=T,
                      generator=torch.Generator().manual_seed(seed))
    if rewards is None:
        g = torch.Generator().manual_seed(seed + 1)
        rewards = (torch.rand(B, G, generator=g) < 0.5).float()
        rewards[:, 0], rewards[:, 1] = 1.0, 0.0  # every group mixed
    ro.rewards = rewards
    return ro


__all__ = ["tiny", "warm_model", "sampled_rollout", "SMALL", "Rollout"]


def sequence_score(model, ro, n: int, params: dict) -> torch.Tensor:
    """s(o_n) = d log pi(o_n) / d params, flattened: one backward through completion n of ``ro`` alone."""
    sl = slice(n, n + 1)
    lp = completion_logprobs(model, ro.prompt_ids[sl], ro.prompt_mask[sl], ro.completion_ids[sl],
                             ro.completion_mask[sl]).sum()
    return flat(torch.autograd.grad(lp, list(params.values())))


def reference_gaps(model, ro, params: dict) -> torch.Tensor:
    """[Q, P]: g+ - g- per mixed group (llm_probe.probes.mixed_groups order), the mean score over O+ minus the mean
    over O-, from one backward per sequence: the independent route every probe is tested against."""
    out = []
    for b in mixed_groups(ro.rewards).tolist():
        r = ro.rewards[b]
        g = torch.stack([sequence_score(model, ro, b * ro.G + i, params) for i in range(ro.G)])
        out.append(g[r > 0].mean(0) - g[r <= 0].mean(0))
    return torch.stack(out)


def without_padding_idx(model):
    """A copy of ``model`` whose embeddings have no padding_idx, so every row (<pad>'s included) gets the plain
    gradient of the function."""
    ref = copy.deepcopy(model)
    for mod in ref.modules():
        if isinstance(mod, torch.nn.Embedding):
            mod.padding_idx = None
    return ref
