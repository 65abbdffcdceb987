"""A checkpoint whose tensors hold a NaN or an infinity is refused at load, whatever its digest says: re-sealed
through write_checkpoint (a valid digest), `gapdyn train --resume` exits 2 with one line naming the tensor and
the file, and changes no file (formerly: exit 0, rows of 'non-finite loss' until --max-faults stopped it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from llm_probe.checkpoint import CHECKPOINT_NAME, CheckpointError, read_checkpoint, write_checkpoint
from llm_probe.collapse import CollapseConfig
from llm_probe.config import TrainConfig
from llm_probe.trainer import Trainer

pytestmark = [pytest.mark.llm, pytest.mark.timeout(300)]

STEPS = 2
RUN = dict(prompts_per_step=2, group_size=4, probe_prompts=0, probe_every=1, num_threads=1, progress=False,
           device="cpu", max_new_tokens=4, checkpoint_every=1, lr=1e-3, seed=3,
           collapse=CollapseConfig(baseline_entropy=0.5, baseline_reward=0.5))
CLI_RUN = ["--prompts-per-step", "2", "--group-size", "4", "--probe-prompts", "0", "--probe-every", "1",
           "--num-threads", "1", "--no-progress", "--device", "cpu", "--max-new-tokens", "4", "--checkpoint-every", "1",
           "--lr", "1e-3", "--seed", "3", "--collapse.baseline-entropy", "0.5", "--collapse.baseline-reward", "0.5"]


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    from tests.llm_helpers import saved_warm_model

    return saved_warm_model(tmp_path_factory.mktemp("warm"))


@pytest.fixture(scope="module")
def run(tmp_path_factory, warm):
    d = tmp_path_factory.mktemp("run")
    Trainer(TrainConfig(out_dir=str(d), init_from=str(warm), steps=STEPS, **RUN)).run()
    return d


def _plant(d: Path, name: str, value: float, where: str = "first") -> None:
    """Set one element of tensor ``name`` to ``value`` and re-seal: the digest matches the planted file."""
    t, s = read_checkpoint(d / CHECKPOINT_NAME)
    x = t[name].clone()
    flat = x.view(-1)
    flat[0 if where == "first" else flat.numel() - 1] = value
    t[name] = x
    write_checkpoint(d / CHECKPOINT_NAME, t, s)


def _adam_moment(d: Path, moment: str) -> str:
    t, _ = read_checkpoint(d / CHECKPOINT_NAME)
    return next(k for k in t if k.startswith("optimizer/") and k.endswith("/" + moment))


CASES = {  # case -> (tensor, value, which element)
    "NaN in a weight": ("model/lm_head.weight", float("nan"), "first"),
    "inf in a weight, last element": ("model/model.embed_tokens.weight", float("inf"), "last"),
    "-inf in Adam's second moment": ("exp_avg_sq", float("-inf"), "first"),
    "NaN in Adam's first moment": ("exp_avg", float("nan"), "last"),
    "NaN in the final norm": ("model/model.norm.weight", float("nan"), "last"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_resealed_non_finite_tensor_is_one_error_line(tmp_path, warm, run, capsys, case):
    from gapdyn.cli import main

    name, value, where = CASES[case]
    d = tmp_path / "run"
    shutil.copytree(run, d)
    name = name if "/" in name else _adam_moment(d, name)
    _plant(d, name, value, where)
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != "train.lock"}
    capsys.readouterr()
    rc = main(["train", "--out", str(d), "--init-from", str(warm), "--steps", str(STEPS + 2), "--resume", *CLI_RUN])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (rc, err)
    assert name in err and str(d / CHECKPOINT_NAME) in err and "non-finite" in err, err
    after = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != "train.lock"}
    assert after == before  # no row appended, nothing cut, the checkpoint as planted


def test_the_library_refuses_it_too_and_the_digest_alone_would_not(tmp_path, run):
    d = tmp_path / "run"
    shutil.copytree(run, d)
    _plant(d, "model/lm_head.weight", float("nan"))
    with pytest.raises(CheckpointError, match=r"model/lm_head\.weight holds 1 non-finite"):
        read_checkpoint(d / CHECKPOINT_NAME)
    from llm_probe.checkpoint import verify_checkpoint

    # the digest vouches for the planted bytes: verification alone passes
    from safetensors import safe_open

    with safe_open(str(d / CHECKPOINT_NAME), framework="pt", device="cpu") as f:
        s = json.loads(f.metadata()["state"])
        w = f.get_tensor("model/lm_head.weight")
    verify_checkpoint(d / CHECKPOINT_NAME, s)
    assert torch.isnan(w).sum() == 1


def test_the_finite_copy_resumes(tmp_path, warm, run):
    """The control: the same folder unplanted resumes and appends the new steps."""
    d = tmp_path / "run"
    shutil.copytree(run, d)
    Trainer(TrainConfig(out_dir=str(d), init_from=str(warm), steps=STEPS + 1, resume=True, **RUN)).run()
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(STEPS + 1))
    assert all(r.get("fault") in (None, "") for r in rows)
