"""The pinned warm checkpoints: the committed bytes are checked by sha256 on use, load as a policy, and a rebuild
with the pinned settings on this machine reproduces them bit for bit (slow)."""

from __future__ import annotations

import shutil

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
    """pin('tiny') into a temporary root (the warm-up from scratch, ~30 s) gives the committed sha256."""
    assert pinned.pin("tiny", root=tmp_path) == pinned.PINNED_SHA256["tiny"]
