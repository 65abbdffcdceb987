"""The pinned warm checkpoints: the committed bytes are checked by sha256 on use, load as a policy, and a rebuild
with the pinned settings (ATen's AVX2 kernels included) reproduces them bit for bit (slow); pin() warms in a child
process under ATEN_CPU_CAPABILITY when this process runs another kernel set (fast, the warm-up faked)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llm_probe.experiments import pinned

pytestmark = pytest.mark.llm


def test_pinned_tiny_checks_its_hash_and_loads(tmp_path, monkeypatch):
    from llm_probe.model import load_policy

    d = pinned.pinned_warm("tiny")
    assert pinned.file_sha256(d / "model.safetensors") == pinned.PINNED_SHA256["tiny"]
    model, tok = load_policy(d)
    assert sum(p.numel() for p in model.parameters()) == 125_632 and model.config.hidden_size == 64
    bad = tmp_path / "tiny"
    shutil.copytree(d, bad)
    with open(bad / "model.safetensors", "r+b") as f:  # flip one byte of the last weight
        f.seek(-1, 2)
        b = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([b[0] ^ 1]))
    monkeypatch.setattr(pinned, "PINNED_ROOT", tmp_path)
    with pytest.raises(ValueError, match="sha256"):
        pinned.pinned_warm("tiny")
    with pytest.raises(ValueError, match="name must be one of"):
        pinned.pinned_warm("huge")


@pytest.mark.slow
def test_pin_rebuilds_the_committed_bytes(tmp_path):
    """pin('tiny') into a temporary root (the warm-up from scratch: 28 s where it was pinned, 2-5 min on 2 shared
    cores) gives the committed sha256."""
    assert pinned.pin("tiny", root=tmp_path) == pinned.PINNED_SHA256["tiny"]


def _fake_warm_model(calls):
    def warm_model(spec, task, *, root, **kw):
        calls.append(("in-process", kw))
        d = Path(root) / "w"
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"in-process bytes")
        return d
    return warm_model


def test_pin_warms_under_the_pinned_kernels(tmp_path, monkeypatch):
    """Same kernel set: warmed here. Another: one child python with ATEN_CPU_CAPABILITY, this package first on its
    path, and the sha256 of what it wrote. A child still on other kernels: a one-line error, no grandchild."""
    import importlib

    import torch

    wu = importlib.import_module("llm_probe.warmup")  # the module (the package's name warmup is the function)
    calls = []
    monkeypatch.setattr(wu, "warm_model", _fake_warm_model(calls))

    def fake_run(cmd, env):
        calls.append(("child", cmd, env))
        (tmp_path / "tiny").mkdir(exist_ok=True)
        (tmp_path / "tiny" / "model.safetensors").write_bytes(b"child bytes")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(pinned.subprocess, "run", fake_run)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: pinned.PIN_CPU_CAPABILITY)
    assert pinned.pin("tiny", root=tmp_path) == hashlib.sha256(b"in-process bytes").hexdigest()
    assert [c[0] for c in calls] == ["in-process"] and calls[0][1]["num_threads"] == 1

    calls.clear()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert pinned.pin("tiny", root=tmp_path) == hashlib.sha256(b"child bytes").hexdigest()
    [(kind, cmd, env)] = calls
    assert kind == "child" and cmd[0] == sys.executable and f"pin('tiny', root={str(tmp_path)!r})" in cmd[2]
    assert env["ATEN_CPU_CAPABILITY"] == pinned.PIN_CPU_CAPABILITY.lower()
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(Path(pinned.__file__).resolve().parents[2])

    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # as in the child, on a machine without those kernels
    with pytest.raises(ValueError, match="runs ATen's AVX512 kernels with ATEN_CPU_CAPABILITY=avx2"):
        pinned.pin("tiny", root=tmp_path)
    assert len(calls) == 1

    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    monkeypatch.setattr(pinned.subprocess, "run", lambda cmd, env: subprocess.CompletedProcess(cmd, 3))
    with pytest.raises(RuntimeError, match="exited 3"):
        pinned.pin("tiny", root=tmp_path)
