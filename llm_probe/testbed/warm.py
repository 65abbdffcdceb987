"""The testbed's warm start: supervised training of a small Qwen2 on the scratchpad task, selected on held-out
accuracy, then pinned (committed bytes + sha256, checked on every use).

Held-out accuracy rises fast and not monotonically during supervised training, so the warm-up evaluates a
checkpoint every ``eval_every`` steps (sampled at the RL temperature, both lengths) and keeps the first whose
accuracy at each length lies in :data:`TARGET` (room to learn, mixed groups). Both lengths train together (each
prompt's flag drawn 50/50), so one checkpoint serves both.

Sizes (:data:`SIZES`): ``small`` (about 1 M parameters) for the studies, ``large`` (about 4x) as a check.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..experiments.pinned import checked_folder, file_sha256
from ..model import TinyQwenSpec, build_tiny_qwen, load_policy, save_policy
from ..warmup import supervised_batch
from .evaluate import heldout_accuracy
from .task import LENGTHS, ScratchpadAddition, testbed_tokenizer

__all__ = ["SIZES", "TARGET", "WarmRecipe", "train_warm", "PINNED_ROOT", "PINNED_SHA256", "pinned_testbed",
           "load_testbed", "supervised_baseline", "file_sha256"]

SIZES = {
    "small": TinyQwenSpec(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=96),
    "large": TinyQwenSpec(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                          num_key_value_heads=4, max_position_embeddings=96),
}
"""Size name -> model shape (Qwen2, untied embeddings, eager attention, context 96 >= prompt 12 + completion 49)."""

TARGET = (0.2, 0.5)
"""Held-out sampled accuracy (temperature 1) that a warm checkpoint must have at every length."""

PINNED_ROOT = Path(__file__).resolve().parent / "warm"
PINNED_SHA256: dict[str, str] = {
    "small": "97211faf84aa89137a3aa08dac89de60c2aa6fc4bda718f21d1f9786a9bd9c63",
    "large": "8fdbf6b273631e043515c3ff64a76e752e7017efcf3bd331be47a11352f6a6f0",
}
"""Size name -> sha256 of the committed model.safetensors (filled when a size is pinned)."""


@dataclass(frozen=True)
class WarmRecipe:
    """The supervised warm start (AdamW, constant lr, no weight decay), evaluated every ``eval_every`` steps."""

    steps: int = 1500
    batch_size: int = 64
    lr: float = 1e-3
    seed: int = 0
    eval_every: int = 10
    n_eval: int = 256
    """Held-out problems per length at each evaluation (the first n_eval of the held-out set)."""


def _supervised_step(model, tok, task, rng, opt, batch_size: int) -> float:
    """One supervised step on ``batch_size`` fresh training problems (cross-entropy on answer + <eos>); its loss."""
    model.train()
    ids, mask, labels = supervised_batch(tok, task.sample(rng, batch_size))
    loss = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach())


def train_warm(size: str, out: str | Path, recipe: WarmRecipe = WarmRecipe(), *, log=print,
               candidates: str | Path | None = None) -> dict:
    """Train the warm start of ``size``; write the selected checkpoint to ``out`` (save_pretrained + warm.json with
    the recipe, the selected step, its accuracies and the whole accuracy curve); returns warm.json's dict.
    ``candidates``: a folder that keeps every evaluated checkpoint with some length in :data:`TARGET`.
    ValueError when no evaluated checkpoint reaches :data:`TARGET` within ``recipe.steps``."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    torch.set_num_threads(1)
    task = ScratchpadAddition(length="mixed")
    tok = testbed_tokenizer()
    model = build_tiny_qwen(tok, SIZES[size], seed=recipe.seed)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
    rng = np.random.default_rng([recipe.seed, 1])
    held = {ln: task.heldout(ln)[:recipe.n_eval] for ln in LENGTHS}
    max_new = task.max_completion_tokens() + 4
    curve, t0 = [], time.perf_counter()
    for k in range(1, recipe.steps + 1):
        loss = _supervised_step(model, tok, task, rng, opt, recipe.batch_size)
        if k % recipe.eval_every:
            continue
        accs = {ln: heldout_accuracy(model, tok, task, held[ln], max_new_tokens=max_new, seed=k)["acc"]
                for ln in LENGTHS}
        curve.append({"step": k, "loss": loss, **accs, "seconds": time.perf_counter() - t0})
        log(f"[warm {size}] step {k} loss {loss:.3f} acc {accs}")
        if candidates is not None and any(TARGET[0] <= a <= TARGET[1] for a in accs.values()):
            save_policy(model, tok, Path(candidates) / f"step{k:05d}")
        if all(TARGET[0] <= a <= TARGET[1] for a in accs.values()):
            info = {"size": size, "spec": asdict(SIZES[size]), "parameters": n_params, "recipe": asdict(recipe),
                    "selected_step": k, "selected_acc": accs, "curve": curve,
                    "seconds": time.perf_counter() - t0, "torch": torch.__version__}
            out = save_policy(model, tok, out)
            (out / "warm.json").write_text(json.dumps(info, indent=1))
            return info
        if all(a > TARGET[1] for a in accs.values()):
            break
    (Path(out) / "curve.json").parent.mkdir(parents=True, exist_ok=True)
    (Path(out) / "curve.json").write_text(json.dumps(curve, indent=1))
    raise ValueError(f"no checkpoint of {size} reached held-out accuracy {TARGET} at every length in "
                     f"{recipe.steps} steps (last: {curve[-1] if curve else None})")


def pinned_testbed(size: str = "small") -> Path:
    """The folder of the pinned warm checkpoint ``size``, after checking its sha256 (ValueError if it differs)."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    return checked_folder(PINNED_ROOT / size, PINNED_SHA256.get(size, ""))


def load_testbed(size: str = "small", *, device="cpu"):
    """(model, tokenizer) of the pinned warm checkpoint ``size`` (sha256 checked)."""
    return tuple(load_policy(pinned_testbed(size), device=device))


def supervised_baseline(size: str = "small", *, steps: int = 100, length: str = "long", eval_every: int = 10,
                        n_eval: int = 256, seed: int = 1, recipe: WarmRecipe = WarmRecipe(), log=print) -> list[dict]:
    """What more supervised training would have done from the pinned warm start: ``steps`` further steps of the
    warm-up's own recipe (fresh AdamW, same lr and batch, data seed ``seed``), held-out accuracy at ``length``
    (sampled at temperature 1, the RL evaluation's problems) every ``eval_every`` steps, with the seconds spent.
    The baseline an RL run's gain is read against (RL sees the task's reward only; this sees the reference)."""
    model, tok = load_testbed(size)
    torch.set_num_threads(1)
    task = ScratchpadAddition(length="mixed")
    held = ScratchpadAddition(length=length).heldout()[:n_eval]
    max_new = task.max_completion_tokens() + 4
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
    rng = np.random.default_rng([seed, 2])
    curve = [{"step": 0, "acc": heldout_accuracy(model, tok, task, held, max_new_tokens=max_new, seed=0)["acc"],
              "seconds": 0.0}]
    train_s = 0.0
    for k in range(1, steps + 1):
        t0 = time.perf_counter()
        _supervised_step(model, tok, task, rng, opt, recipe.batch_size)
        train_s += time.perf_counter() - t0
        if k % eval_every == 0:
            acc = heldout_accuracy(model, tok, task, held, max_new_tokens=max_new, seed=k)["acc"]
            curve.append({"step": k, "acc": acc, "seconds": train_s})
            log(f"[supervised baseline {size}] step {k} acc {acc:.3f} ({train_s:.0f} s of training)")
    return curve
