"""Supervised warm-up so a random tiny model starts RL with 0 < J < 1, and the one cache of warmed models.

Cross-entropy on the answer tokens and <eos> of "prompt + answer + <eos>" (prompt tokens unscored).
400 steps, batch 128, Adam 1e-3 (~13 s on a laptop CPU) gives ~27% sampled accuracy on two-digit
addition (69% greedy), so groups of G = 8 have mixed rewards.

:func:`warm_model` is the one way a study or a run gets a warmed tiny Qwen: built and warmed once per
settings (model shape, tokenizer alphabet, task, steps, batch, lr, seed, dtype, torch threads, torch
version; :func:`warm_settings`), cached in ``<out root>/warm/<key>/`` (``./gapdyn_out`` unless given;
key = :func:`warm_key`), written into a temporary folder and renamed into place once complete (the
completion marker ``warm.json`` inside), under a lock so that two processes never warm the same model at
once. A folder without the marker is rebuilt. ``--init-from DIR`` skips it with one's own model.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from .config import WARMUP_BATCH, WARMUP_LR, WARMUP_STEPS
from .threads import use_threads

__all__ = ["supervised_batch", "warmup", "warmup_progress", "sampled_accuracy", "warm_model", "warm_settings",
           "warm_key", "warm_root", "task_key", "WARM_MARKER"]

WARM_MARKER = "warm.json"
"""Written last into a warm-model folder: its settings, final loss and wall time (no marker: incomplete)."""

_SHOW_PROGRESS: contextvars.ContextVar[bool] = contextvars.ContextVar("warmup_progress", default=False)


@contextlib.contextmanager
def warmup_progress(enabled: bool = True):
    """Within the block, :func:`warmup` calls that do not say otherwise show a progress bar (lets a
    command line show the warm-up that a trainer runs internally)."""
    token = _SHOW_PROGRESS.set(bool(enabled))
    try:
        yield
    finally:
        _SHOW_PROGRESS.reset(token)


def supervised_batch(tokenizer, problems, device=None):
    """(input_ids [B, L], attention_mask [B, L], labels [B, L]) with labels -100 except answer + <eos>.
    Right-padded, so position ids are plain 0..L-1 for the real tokens."""
    eos = tokenizer.eos_token_id
    rows, labs = [], []
    for p in problems:
        q = tokenizer(p.prompt, add_special_tokens=False)["input_ids"]
        a = tokenizer(p.answer, add_special_tokens=False)["input_ids"] + [eos]
        rows.append(q + a)
        labs.append([-100] * len(q) + a)
    L = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (L - len(r)) for r in rows], device=device)
    mask = torch.tensor([[1] * len(r) + [0] * (L - len(r)) for r in rows], device=device)
    labels = torch.tensor([lb + [-100] * (L - len(lb)) for lb in labs], device=device)
    return ids, mask, labels


def warmup(model, tokenizer, task, *, steps: int = WARMUP_STEPS, batch_size: int = WARMUP_BATCH, lr: float = WARMUP_LR,
           seed: int = 0,
           progress: bool | None = None, callback=None) -> list[float]:
    """Train ``model`` in place on the task's reference answers; returns the loss per step.

    progress: a tqdm bar (None: as set by :func:`warmup_progress`, off by default);
    callback: called as ``callback(step, loss)`` after each step.
    Torch threads: :func:`llm_probe.threads.use_threads` (same count -> bit-identical weights)."""
    if steps < 0 or batch_size < 1 or lr <= 0:
        raise ValueError(f"need steps >= 0, batch_size >= 1, lr > 0; got {steps}, {batch_size}, {lr}")
    use_threads()  # the process's torch threads (1 unless configured): the warmed bits depend on the count
    rng = np.random.default_rng(seed)
    dev = next(model.parameters()).device
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses = []
    it = range(steps)
    if _SHOW_PROGRESS.get() if progress is None else progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="warm-up", unit="step", leave=False)
    for k in it:
        ids, mask, labels = supervised_batch(tokenizer, task.sample(rng, batch_size), dev)
        out = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        losses.append(float(out.loss.detach()))
        if callback is not None:
            callback(k, losses[-1])
    return losses


@torch.no_grad()
def sampled_accuracy(model, tokenizer, task, *, n: int = 256, G: int = 1, max_new_tokens: int = 6, seed: int = 0,
                     temperature: float = 1.0) -> float:
    """Mean reward of sampled completions on n fresh problems (an estimate of J)."""
    from .rollout import make_rollout
    from .seeds import derive_seed

    rng = np.random.default_rng(derive_seed(seed, "accuracy_prompts"))
    gen = torch.Generator().manual_seed(seed)
    ro = make_rollout(model, tokenizer, task, task.sample(rng, n), G=max(G, 2), max_new_tokens=max_new_tokens,
                      generator=gen, temperature=temperature)
    return float(ro.rewards.mean())



# ---- the one warm-up cache -----------------------------------------------------------------------------------
def task_key(task) -> str:
    """What identifies a task's training problems in the cache key: its ``cache_key`` attribute, else
    ``addition:<lo>-<hi>`` (AdditionTask) or ``jsonl:<sha256 of its problems>`` (JsonlTask)."""
    from .tasks import AdditionTask, JsonlTask

    key = getattr(task, "cache_key", None)
    if isinstance(key, str) and key:
        return key
    if isinstance(task, AdditionTask):
        return f"addition:{task.lo}-{task.hi}"
    if isinstance(task, JsonlTask):
        blob = json.dumps([[p.prompt, p.answer] for p in task.problems])
        return "jsonl:" + hashlib.sha256(blob.encode()).hexdigest()
    raise ValueError(f"task must be an AdditionTask, a JsonlTask or define a string cache_key, got "
                     f"{type(task).__name__}")


def warm_settings(spec=None, task=None, *, steps: int = WARMUP_STEPS, batch_size: int = WARMUP_BATCH, lr: float = WARMUP_LR,
                  seed: int = 0, alphabet: str | None = None, dtype: str = "float32", device="cpu",
                  num_threads: int | None = None) -> dict:
    """Everything the warmed bits depend on, as a JSON-able dict (spec: a TinyQwenSpec, default shape;
    task: default AdditionTask; alphabet: the tokenizer's, default the arithmetic one; device: where it trains
    (its type); num_threads: the torch thread count, None: the process's): a reduction over another thread
    count or device adds in another order."""
    from .model import TinyQwenSpec
    from .tasks import AdditionTask
    from .tokenizer import ARITHMETIC_ALPHABET

    spec = TinyQwenSpec() if spec is None else spec
    if not isinstance(spec, TinyQwenSpec):
        raise ValueError(f"spec must be a TinyQwenSpec, got {type(spec).__name__}")
    if isinstance(steps, bool) or int(steps) != steps or steps < 0:
        raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if not (isinstance(lr, (int, float)) and 0 < lr < float("inf")):
        raise ValueError(f"lr must be finite and > 0, got {lr!r}")
    threads = torch.get_num_threads() if num_threads is None else int(num_threads)
    return {"model": asdict(spec), "alphabet": ARITHMETIC_ALPHABET if alphabet is None else str(alphabet),
            "task": task_key(AdditionTask() if task is None else task), "steps": int(steps),
            "batch_size": int(batch_size), "lr": float(lr), "seed": int(seed), "dtype": str(dtype),
            "device": torch.device(device).type, "threads": threads, "torch": torch.__version__}


def warm_key(settings: dict) -> str:
    """SHA-256 (first 16 hex digits) of the canonical JSON of :func:`warm_settings`."""
    if not isinstance(settings, dict) or "model" not in settings:
        raise ValueError("settings must be a dict from warm_settings")
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


WARM_CACHE_ENV = "GAPDYN_WARM_CACHE"
"""Environment variable naming the warm-model cache folder itself (overrides ``<root>/warm`` when no root is
given; the test suite points it at one temporary folder per session)."""


def warm_root(root=None) -> Path:
    """``<root>/warm`` with root ``./gapdyn_out`` of the working directory unless given (gapdyn.cmdline);
    ``$GAPDYN_WARM_CACHE`` names the folder instead when set and no root is given."""
    import os

    from gapdyn.cmdline import OUT_ROOT, folder_setting

    if root in (None, "") and os.environ.get(WARM_CACHE_ENV):  # a file there: one ValueError naming the variable
        return folder_setting(os.environ[WARM_CACHE_ENV], f"${WARM_CACHE_ENV}")
    return Path(Path.cwd() / OUT_ROOT if root in (None, "") else root) / "warm"


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive advisory lock on ``path`` (created with its folder), held for the block (gapdyn.io.hold_lock)."""
    from gapdyn.io import hold_lock

    path.parent.mkdir(parents=True, exist_ok=True)
    with hold_lock(path, wait=True):
        yield


def _seconds_per_step(folder: Path, settings: dict) -> float | None:
    """Measured seconds per warm-up step of a finished warm model of the same shape, batch and threads."""
    same = ("model", "batch_size", "threads", "dtype", "device")
    rates = []
    for f in folder.glob(f"*/{WARM_MARKER}"):
        try:
            m = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        s = m.get("settings", {})
        if all(s.get(k) == settings[k] for k in same) and s.get("steps") and m.get("wall_s"):
            rates.append(m["wall_s"] / s["steps"])
    return float(np.median(rates)) if rates else None


def _complete(d: Path) -> bool:
    return (d / WARM_MARKER).is_file() and (d / "config.json").is_file()


def warm_model(spec=None, task=None, *, steps: int = WARMUP_STEPS, batch_size: int = WARMUP_BATCH, lr: float = WARMUP_LR,
               seed: int = 0,
               alphabet: str | None = None, dtype: str = "float32", device="cpu", num_threads: int | None = None,
               root=None, progress: bool | None = None, announce: bool = True) -> Path:
    """The folder of the warmed tiny Qwen of these settings (:func:`warm_settings`): ``<root>/warm/<key>/``
    (:func:`warm_root`, :func:`warm_key`), built and warmed (:func:`warmup`) on first use, reused after.
    Load it with ``load_policy`` / ``--init-from``. announce: say which (cached or warming, with the time
    expected at the measured rate of earlier warm-ups)."""
    from gapdyn.cmdline import say
    from gapdyn.io import atomic_write_json

    from .model import TinyQwenSpec, build_tiny_qwen, save_policy
    from .tasks import AdditionTask
    from .tokenizer import build_char_tokenizer

    use_threads(num_threads)
    spec = TinyQwenSpec() if spec is None else spec
    task = AdditionTask() if task is None else task
    settings = warm_settings(spec, task, steps=steps, batch_size=batch_size, lr=lr, seed=seed, alphabet=alphabet,
                             dtype=dtype, device=device)
    folder = warm_root(root)
    d = folder / warm_key(settings)
    if not _complete(d):
        with _locked(folder / f"{d.name}.lock"):
            if not _complete(d):  # another process may have finished it while this one waited
                if d.exists():  # incomplete (no marker): never used, rebuilt
                    shutil.rmtree(d)
                rate = _seconds_per_step(folder, settings)
                if announce:
                    eta = f": ~{rate * settings['steps']:.0f} s" if rate is not None else ""
                    say("train", f"warming up once{eta}; cached at {d}")
                tok = build_char_tokenizer(settings["alphabet"])
                model = build_tiny_qwen(tok, spec, seed=seed, dtype=dtype, device=torch.device(device))
                t0 = time.perf_counter()
                losses = warmup(model, tok, task, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                                progress=progress)
                wall = time.perf_counter() - t0
                tmp = d.with_name(f"{d.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
                try:
                    save_policy(model, tok, tmp)
                    atomic_write_json(tmp / WARM_MARKER, {"settings": settings, "wall_s": wall,
                                                          "final_loss": losses[-1] if losses else None}, indent=1)
                    os.rename(tmp, d)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                return d
    if announce:
        say("train", f"using the cached warm model at {d}")
    return d
