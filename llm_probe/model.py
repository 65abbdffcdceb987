"""The policy: a tiny Qwen2/Qwen3 built from a config, or any causal LM loaded from a local directory.

Nothing here downloads: :func:`build_tiny_qwen` constructs weights from a seeded config, and
:func:`load_policy` calls ``from_pretrained(local_dir, local_files_only=True)``. Also the two
forward helpers every other module uses:

- :func:`completion_logprobs`: per-token log pi(o_t | q, o_<t) of the completion tokens, [B, T];
- :func:`sequence_logprob`: log pi(o) = sum_t log pi(o_t | .) over the completion mask, [B].

All three score the policy at a temperature T: log pi_T(o_t | .) = log_softmax(z / T)[o_t] with z the model's
logits, the policy a sampler at temperature T draws from and TRL's GRPOTrainer trains (its LM head divides by
``args.temperature``). T is the ``temperature`` keyword, or, when it is None, the value set by
:func:`scoring_temperature` for the enclosing block (1 outside any block); at T = 1 nothing is divided.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

__all__ = [
    "TinyQwenSpec",
    "build_tiny_qwen",
    "load_policy",
    "PolicyPair",
    "check_model",
    "save_policy",
    "default_device",
    "resolve_dtype",
    "completion_logits",
    "completion_logprobs",
    "sequence_logprob",
    "position_ids_from_mask",
    "forward_inputs",
    "eval_mode",
    "scoring_temperature",
    "current_scoring_temperature",
]

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class TinyQwenSpec:
    """Shape of a tiny Qwen policy (default: hidden 64, intermediate 256, 2 layers, 4/2 heads)."""

    arch: str = "qwen2"  # "qwen2" or "qwen3" (Qwen3 sets head_dim explicitly and adds q/k norms)
    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16  # used by qwen3 only (qwen2 derives hidden/heads)
    max_position_embeddings: int = 128
    tie_word_embeddings: bool = False


class PolicyPair(NamedTuple):
    """What :func:`load_policy` returns: ``pair.model``, ``pair.tokenizer`` (or ``model, tok = pair``)."""

    model: Any  # a transformers causal LM (torch.nn.Module)
    tokenizer: Any  # its tokenizer


def check_model(model, name: str = "model") -> None:
    """ValueError when ``model`` is a tuple, e.g. the (model, tokenizer) pair of :func:`load_policy`."""
    if isinstance(model, tuple):
        kind = "the PolicyPair load_policy returns" if isinstance(model, PolicyPair) else "a tuple"
        raise ValueError(f"{name} is {kind}, not a model: pass pair.model (or unpack: model, tok = load_policy(dir))")


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A torch dtype from a name in {float32, float64, bfloat16, float16} (or a dtype)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def build_tiny_qwen(tokenizer, spec: TinyQwenSpec = TinyQwenSpec(), *, seed: int = 0, dtype="float32", device=None):
    """A randomly initialised Qwen2ForCausalLM / Qwen3ForCausalLM (eager attention) for ``tokenizer``.

    Weights come from ``torch.manual_seed``-free init: a local ``torch.Generator`` seeds a fork of the
    global RNG so the caller's random state is untouched.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    if spec.arch not in ("qwen2", "qwen3"):
        raise ValueError(f"spec.arch must be 'qwen2' or 'qwen3', got {spec.arch!r}")
    for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "max_position_embeddings"):
        value = getattr(spec, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"spec.{field} must be an integer >= 1, got {value!r}")
    if spec.num_attention_heads % spec.num_key_value_heads:
        raise ValueError("spec.num_attention_heads must be a multiple of spec.num_key_value_heads")
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        use_cache=False,
        attention_dropout=0.0,
    )
    if spec.arch == "qwen2":
        cfg, cls = Qwen2Config(**common), Qwen2ForCausalLM
    else:
        cfg, cls = Qwen3Config(head_dim=spec.head_dim, **common), Qwen3ForCausalLM
    cfg._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = cls(cfg)
    model.config._attn_implementation = "eager"
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.to(device=device or "cpu", dtype=resolve_dtype(dtype))


def save_policy(model, tokenizer, local_dir: str | Path) -> Path:
    """``save_pretrained`` of model and tokenizer into ``local_dir`` (created)."""
    p = Path(local_dir)
    p.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(p))
    tokenizer.save_pretrained(str(p))
    return p


def load_policy(local_dir: str | Path, *, dtype="float32", device=None, attn_implementation: str = "eager") -> PolicyPair:
    """PolicyPair(model, tokenizer) from a local directory: any HF causal LM, never downloaded (unpackable:
    ``model, tok = load_policy(dir)``)."""
    from transformers import AutoModelForCausalLM

    from .tokenizer import load_tokenizer

    p = Path(local_dir)
    if not (p / "config.json").is_file():
        raise ValueError(f"local_dir must hold a saved model (config.json), got {str(local_dir)!r}")
    model = AutoModelForCausalLM.from_pretrained(
        str(p), local_files_only=True, dtype=resolve_dtype(dtype), attn_implementation=attn_implementation
    )
    tok = load_tokenizer(p)
    return PolicyPair(model.to(device or default_device()), tok)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that ignore left padding: cumsum(mask) - 1, clamped at 0.  [B, L]"""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def forward_inputs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
    """Keyword arguments of a causal-LM forward over left-padded rows ``input_ids`` [B, L]: position ids that
    follow the mask and, for a float64 model, a 4D additive mask [B, 1, L, L] whose minimum is float32's.
    (The eager attention of Qwen and most HF models takes its softmax in float32, where float64's minimum
    becomes -inf: a row of left padding, masked everywhere, then turns NaN and the NaN reaches every row.)
    Any other dtype gets the 2D mask as it is."""
    kw = dict(input_ids=input_ids, position_ids=position_ids_from_mask(attention_mask), use_cache=False)
    if getattr(model, "dtype", None) != torch.float64:
        return {**kw, "attention_mask": attention_mask}
    L = input_ids.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=input_ids.device).tril()
    allowed = causal[None, :, :] & (attention_mask[:, None, :] > 0)  # [B, L(query), L(key)]
    mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min).to(torch.float64)
    return {**kw, "attention_mask": mask[:, None, :, :]}


_TEMPERATURE: contextvars.ContextVar[float] = contextvars.ContextVar("llm_probe_scoring_temperature", default=1.0)


def _check_temperature(temperature) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) \
            or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    return float(temperature)


@contextlib.contextmanager
def scoring_temperature(temperature: float):
    """Inside the block, :func:`completion_logits` and the functions built on it score log_softmax(z / T) with
    T = ``temperature`` wherever they are called without a ``temperature`` of their own (the probes of
    llm_probe.probes included); the previous value is restored on exit."""
    token = _TEMPERATURE.set(_check_temperature(temperature))
    try:
        yield
    finally:
        _TEMPERATURE.reset(token)


def current_scoring_temperature() -> float:
    """The temperature :func:`completion_logits` uses when called without one (1 outside a block)."""
    return _TEMPERATURE.get()


def completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, *, temperature=None):
    """Logits that score each completion token, [B, T, V] (position t predicts completion token t), divided by
    the temperature (``temperature``, or :func:`scoring_temperature`'s; float32 for a half-precision model when
    T != 1)."""
    T_ = _TEMPERATURE.get() if temperature is None else _check_temperature(temperature)
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # [B, P+T]
    attn = torch.cat([prompt_mask, completion_mask], dim=1)
    out = model(**forward_inputs(model, input_ids, attn))
    T = completion_ids.shape[1]
    logits = out.logits[:, -T - 1 : -1, :]
    if T_ != 1.0:
        if logits.dtype not in (torch.float32, torch.float64):
            logits = logits.float()
        logits = logits / T_
    return logits


def completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, *, return_entropy=False,
                        temperature=None):
    """log pi_T(o_t | q, o_<t) of each completion token, [B, T] (0 where masked); optionally entropies [B, T].
    T: ``temperature``, or :func:`scoring_temperature`'s (module docstring)."""
    logits = completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                               temperature=temperature)
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    logp_all = torch.log_softmax(logits, dim=-1)  # [B, T, V]
    logp = logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1) * completion_mask
    if not return_entropy:
        return logp
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp, ent, logp_all


def sequence_logprob(model, prompt_ids, prompt_mask, completion_ids, completion_mask, *, temperature=None):
    """log pi_T(o | q) = sum_t log pi_T(o_t | q, o_<t) over the completion mask, [B]."""
    return completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                               temperature=temperature).sum(-1)


@contextlib.contextmanager
def eval_mode(model):
    """``model.eval()`` inside the block (no dropout in a probe's forwards); the previous train/eval mode is
    restored on exit, also when the block raises."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
