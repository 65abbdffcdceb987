"""The pinned warm checkpoints: the bytes every confirmation study starts from, committed with their sha256.

A warm model built on another machine, torch build or thread count differs in its low bits (a reduction adds in
another order), and a run's outcome can follow such bits. The confirmation studies therefore start from a
committed checkpoint, not from the warm-up cache: ``llm_probe/experiments/warm/<name>/`` (a saved tiny Qwen and
its char tokenizer, loaded with ``llm_probe.load_policy``), its ``model.safetensors`` checked against
:data:`PINNED_SHA256` on every use. Each was made once by :func:`pin` (llm_probe.warmup.warm_model with the
study's warm-up settings: split addition, 400 steps, batch 128, Adam 1e-3, seed 0, 1 torch thread, ATen's AVX2
kernels, :data:`PIN_CPU_CAPABILITY`)::

    python -c "from llm_probe.experiments.pinned import pin; pin('tiny')"   # prints the sha256 to commit

Shapes (:data:`SHAPES`): ``tiny`` is the ablation's default model (hidden 64, 2 layers, 125,632 parameters);
``wide`` is 4x wider (hidden 256, intermediate 1024, 8/4 heads, 2 layers) for the size check of the WAPO-vs-GRPO
primaries.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..config import WARMUP_BATCH, WARMUP_LR, WARMUP_STEPS
from ._study import SplitAddition, file_sha256

__all__ = ["SHAPES", "PINNED_SHA256", "PINNED_ROOT", "PIN_CPU_CAPABILITY", "pinned_warm", "pin", "file_sha256",
           "warm_spec_of", "checked_folder"]

PINNED_ROOT = Path(__file__).resolve().parent / "warm"
"""Where the pinned checkpoints live (one folder per shape name)."""

SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    "wide": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
                 num_key_value_heads=4),
}
"""Shape name -> llm_probe.TinyQwenSpec fields (the rest: TinyQwenSpec's defaults)."""

PINNED_SHA256 = {
    "tiny": "1e6157f69ae7d570bb8510c067e7b2b03f559617f27dec0734d81e144a79fdb9",
    "wide": "0fd9fdc2b5bc19ac143d56cbebe52fdbfcf8166ba33e6b7163dfc50a9b4cfb48",
}
"""Shape name -> sha256 of the committed ``model.safetensors`` (empty: not pinned yet)."""

WARM_SETTINGS = dict(steps=WARMUP_STEPS, batch_size=WARMUP_BATCH, lr=WARMUP_LR, seed=0)
"""The warm-up of every pinned checkpoint (llm_probe.warmup.warm_model's arguments)."""

PIN_CPU_CAPABILITY = "AVX2"
"""ATen's CPU kernel set (``torch.backends.cpu.get_cpu_capability()``) the pinned checkpoints were warmed with. On
an AVX-512 machine torch picks its AVX-512 kernels, which reduce in another order (the tiny warm-up then ends at
another loss and other bytes), so :func:`pin` warms under ``ATEN_CPU_CAPABILITY`` set to this value (tiny rebuilt
so bit for bit on an AVX-512 machine; wide, pinned on the same machine as tiny, not rebuilt)."""


def warm_spec_of(name: str):
    """The llm_probe.TinyQwenSpec of a shape name (:data:`SHAPES`)."""
    from ..model import TinyQwenSpec

    if name not in SHAPES:
        raise ValueError(f"name must be one of {sorted(SHAPES)}, got {name!r}")
    return TinyQwenSpec(**SHAPES[name])


def pinned_warm(name: str = "tiny") -> Path:
    """The folder of the pinned checkpoint ``name``, after checking its model.safetensors against
    :data:`PINNED_SHA256` (ValueError when it is missing, not pinned or differs)."""
    warm_spec_of(name)
    return checked_folder(PINNED_ROOT / name, PINNED_SHA256.get(name, ""), f"(make it with pin({name!r}))")


def checked_folder(d: Path, want: str, hint: str = "") -> Path:
    """``d`` after checking its model.safetensors against the sha256 ``want`` (ValueError when the file is missing,
    ``want`` is empty, or the bytes differ); ``hint`` ends the missing-file message."""
    f = d / "model.safetensors"
    if not want or not f.is_file():
        raise ValueError(f"no pinned checkpoint {d.name!r} under {d}" + (f" {hint}" if hint else ""))
    got = file_sha256(f)
    if got != want:
        raise ValueError(f"the pinned checkpoint {f} has sha256 {got}, not the committed {want}")
    return d


def pin(name: str = "tiny", *, root=None) -> str:
    """Warm the shape ``name`` (:data:`WARM_SETTINGS`, 1 torch thread, the split addition task of the ablation,
    ATen kernels :data:`PIN_CPU_CAPABILITY`: in a child process with ``ATEN_CPU_CAPABILITY`` set when this one
    runs another set) and copy the saved model into ``PINNED_ROOT/name`` (or ``root/name``); returns (and prints)
    its sha256."""
    import torch

    spec = warm_spec_of(name)
    root = PINNED_ROOT if root is None else Path(root)
    dest = root / name
    have = torch.backends.cpu.get_cpu_capability()
    if have != PIN_CPU_CAPABILITY:
        if os.environ.get("ATEN_CPU_CAPABILITY", "").upper() == PIN_CPU_CAPABILITY:
            raise ValueError(f"this machine runs ATen's {have} kernels with ATEN_CPU_CAPABILITY="
                             f"{os.environ['ATEN_CPU_CAPABILITY']}: the pinned checkpoints need {PIN_CPU_CAPABILITY}")
        return _pin_in_child(name, root)
    from ..warmup import warm_model

    with tempfile.TemporaryDirectory() as tmp:
        src = warm_model(spec, SplitAddition(), num_threads=1, root=tmp, progress=False, **WARM_SETTINGS)
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(src, dest)
    sha = file_sha256(dest / "model.safetensors")
    print(f"{name}: {dest / 'model.safetensors'} sha256 {sha}")
    return sha


def _pin_in_child(name: str, root: Path) -> str:
    """:func:`pin` in a fresh Python with ``ATEN_CPU_CAPABILITY`` = :data:`PIN_CPU_CAPABILITY` (torch reads it at
    its first kernel call) and this package first on its path; the sha256 of what it wrote."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, ATEN_CPU_CAPABILITY=PIN_CPU_CAPABILITY.lower(),
               PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p))
    code = f"from llm_probe.experiments.pinned import pin; pin({name!r}, root={str(root)!r})"
    rc = subprocess.run([sys.executable, "-c", code], env=env).returncode
    if rc != 0:
        raise RuntimeError(f"pin({name!r}) under ATEN_CPU_CAPABILITY={env['ATEN_CPU_CAPABILITY']} exited {rc}")
    return file_sha256(root / name / "model.safetensors")
