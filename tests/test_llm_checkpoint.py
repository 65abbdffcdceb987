"""Checkpoint files of the trainer (llm_probe.checkpoint): a damaged or planted checkpoint is one clear error
line at the CLI and never runs code; a resume with another configuration is refused, naming the fields;
prompts longer than the model context are an error unless truncation is asked for."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
import pytest
import torch

from llm_probe.checkpoint import (CHECKPOINT_NAME, LEGACY_NAME, RESUME_POLICY, config_differences, read_checkpoint,
                                  write_checkpoint)
from llm_probe.config import TrainConfig
from llm_probe.trainer import Trainer

pytestmark = [pytest.mark.llm, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[1]
RUN = dict(prompts_per_step=2, group_size=4, probe_prompts=2, probe_group_size=2, num_threads=1, progress=False,
           device="cpu", max_new_tokens=4, checkpoint_every=1, lr=1e-3, seed=3, probe_every=1)
CLI_RUN = ["--prompts-per-step", "2", "--group-size", "4", "--probe-prompts", "2", "--probe-group-size", "2",
           "--num-threads", "1", "--no-progress", "--device", "cpu", "--max-new-tokens", "4", "--checkpoint-every", "1",
           "--lr", "1e-3", "--seed", "3", "--probe-every", "1"]


def _cfg(out, warm, steps=2, **kw):
    return TrainConfig(out_dir=str(out), init_from=warm and str(warm), steps=steps, **{**RUN, **kw})


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    from tests.llm_helpers import saved_warm_model

    return saved_warm_model(tmp_path_factory.mktemp("warm"))


@pytest.fixture(scope="module")
def done(tmp_path_factory, warm):
    """A run folder with a checkpoint after 2 steps."""
    d = tmp_path_factory.mktemp("done")
    Trainer(_cfg(d, warm)).run()
    return d


class _Plant:
    """Unpickling this calls open(marker, 'w'): the marker file proves code ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _edit(d: Path, tensors=None, state=None):
    """Rewrite d's checkpoint as a valid safetensors file with edited tensors / state."""
    t, s = read_checkpoint(d / CHECKPOINT_NAME)
    (tensors or (lambda x: None))(t)
    (state or (lambda x: None))(s)
    write_checkpoint(d / CHECKPOINT_NAME, t, s)


def _bytes(d: Path, fn):
    p = d / CHECKPOINT_NAME
    p.write_bytes(fn(p.read_bytes()))


def _plant(d: Path, name=CHECKPOINT_NAME):
    torch.save({"model": _Plant(d / "PWNED")}, d / name)


def _legacy(d: Path):
    (d / CHECKPOINT_NAME).unlink()
    _plant(d, LEGACY_NAME)


def _foreign_safetensors(d: Path):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(3)}, str(d / CHECKPOINT_NAME))


def _state_not_json(d: Path):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(3)}, str(d / CHECKPOINT_NAME), metadata={"format": "gapdyn-llm-checkpoint/1",
                                                                        "state": "{not json"})


def _cut_log(d: Path):
    p = d / "metrics.jsonl"
    p.write_bytes(p.read_bytes()[:10])


def _edit_log(d: Path):
    p = d / "metrics.jsonl"
    b = p.read_bytes()
    p.write_bytes(b"x" * 20 + b[20:])


# case -> (damage, file named in the message, words of the message)
DAMAGE = {
    "empty": (lambda d: _bytes(d, lambda b: b""), CHECKPOINT_NAME, "is empty"),
    "truncated": (lambda d: _bytes(d, lambda b: b[: len(b) // 2]), CHECKPOINT_NAME, "not a readable safetensors"),
    "header only": (lambda d: _bytes(d, lambda b: b[:6]), CHECKPOINT_NAME, "not a readable safetensors"),
    "garbage": (lambda d: _bytes(d, lambda b: np.random.default_rng(0).bytes(4096)), CHECKPOINT_NAME,
                "not a readable safetensors"),
    "one flipped header byte": (lambda d: _bytes(d, lambda b: b[:8] + b"#" + b[9:]), CHECKPOINT_NAME,
                                "not a readable safetensors"),
    "planted pickle": (_plant, CHECKPOINT_NAME, "not a readable safetensors"),
    "planted legacy checkpoint.pt": (_legacy, LEGACY_NAME, "old pickle format"),
    "foreign safetensors": (_foreign_safetensors, CHECKPOINT_NAME, "not a training checkpoint"),
    "state not JSON": (_state_not_json, CHECKPOINT_NAME, "not JSON"),
    "no step": (lambda d: _edit(d, state=lambda s: s.pop("step")), CHECKPOINT_NAME, "lacks the entry 'step'"),
    "no log sizes": (lambda d: _edit(d, state=lambda s: s.pop("logs")), CHECKPOINT_NAME, "lacks the entry 'logs'"),
    "no config": (lambda d: _edit(d, state=lambda s: s.pop("config")), CHECKPOINT_NAME, "lacks the configuration"),
    "no RNG state": (lambda d: _edit(d, tensors=lambda t: t.pop("rng/gen")), CHECKPOINT_NAME, "lacks the entry 'rng/gen'"),
    "missing weight": (lambda d: _edit(d, tensors=lambda t: t.pop("model/lm_head.weight")), CHECKPOINT_NAME,
                       "lm_head.weight"),
    "wrong weight shape": (lambda d: _edit(d, tensors=lambda t: t.update({"model/lm_head.weight": torch.zeros(3, 3)})),
                           CHECKPOINT_NAME, "size mismatch"),
    "wrong Adam moment shape": (lambda d: _edit(d, tensors=lambda t: t.update({"optimizer/0/exp_avg": torch.zeros(2)})),
                                CHECKPOINT_NAME, "exp_avg of parameter 0 has shape (2,)"),
    "bad torch RNG state": (lambda d: _edit(d, tensors=lambda t: t.update({"rng/gen": torch.zeros(5, dtype=torch.uint8)})),
                            CHECKPOINT_NAME, "does not fit this run"),
    "bad numpy RNG state": (lambda d: _edit(d, state=lambda s: s.update(np_rng="x")), CHECKPOINT_NAME,
                            "does not fit this run"),
    "wrong M_probe shape": (lambda d: _edit(d, tensors=lambda t: t.update({"probe/M_probe": torch.zeros(5)})),
                            CHECKPOINT_NAME, "M_probe has shape (5,)"),
    "log sizes not numbers": (lambda d: _edit(d, state=lambda s: s["logs"]["metrics.jsonl"].update(bytes="x")),
                              CHECKPOINT_NAME, "does not fit this run"),
    "negative log size": (lambda d: _edit(d, state=lambda s: s["logs"]["metrics.jsonl"].update(rows=-1)),
                          CHECKPOINT_NAME, "negative log sizes"),
    "negative step": (lambda d: _edit(d, state=lambda s: s.update(step=-1)), CHECKPOINT_NAME, "step must be"),
    "metrics log cut": (_cut_log, "metrics.jsonl", "holds 10 bytes"),
    "metrics log edited": (_edit_log, "metrics.jsonl", "not the 2 rows"),
}


def test_damaged_checkpoint_is_one_error_line_at_the_cli(tmp_path, warm, done, capsys):
    """Every row of DAMAGE: `gapdyn train --resume` exits 2 with one error line naming the file and the damage,
    no traceback, no code run, the logs untouched."""
    from gapdyn.cli import main
    from tests.tables import check_table

    def row(case, damage, named, words):
        d = tmp_path / case.replace(" ", "_")
        shutil.copytree(done, d)
        damage(d)
        capsys.readouterr()
        rc = main(["train", "--out", str(d), "--init-from", str(warm), "--steps", "3", "--resume", *CLI_RUN])
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.startswith("gapdyn train: error:")]
        assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
        assert named in lines[0] and words in lines[0], lines[0]
        assert not (d / "PWNED").exists(), "the planted pickle ran"
        assert (d / "metrics.jsonl").stat().st_size in (10, (done / "metrics.jsonl").stat().st_size)  # untouched

    check_table(((case, (case, *spec)) for case, spec in DAMAGE.items()), row)


def test_the_planted_payload_does_run_when_unpickled(tmp_path):
    """The payload of the table is live: torch.load(weights_only=False), as the trainer once did, runs it."""
    _plant(tmp_path)
    (tmp_path / "same_bytes.pt").write_bytes((tmp_path / CHECKPOINT_NAME).read_bytes())  # torch.load by extension
    torch.load(tmp_path / "same_bytes.pt", weights_only=False)
    assert (tmp_path / "PWNED").exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_cli_subprocess_planted_pickle_exits_nonzero_with_one_line(tmp_path, warm, done):
    d = tmp_path / "run"
    shutil.copytree(done, d)
    _plant(d)
    p = subprocess.run([sys.executable, "-m", "gapdyn.cli", "train", "--out", str(d), "--init-from", str(warm),
                        "--steps", "3", "--resume", *CLI_RUN], cwd=ROOT, capture_output=True, text=True,
                       env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert [ln for ln in p.stderr.splitlines() if ln.strip()] == [ln for ln in p.stderr.splitlines()
                                                                   if ln.startswith("gapdyn train: error:")]
    assert len(p.stderr.strip().splitlines()) == 1 and CHECKPOINT_NAME in p.stderr
    assert not (d / "PWNED").exists()


# --- configuration on resume ----------------------------------------------------------------------------


def test_every_setting_has_a_resume_policy():
    assert set(RESUME_POLICY) == {f.name for f in fields(TrainConfig)}
    assert set(RESUME_POLICY.values()) <= {"trajectory", "control"}
    assert all(RESUME_POLICY[n] == "trajectory" for n in ("method", "lr", "seed", "group_size", "task", "init_from"))


CHANGED = [("lr", 2e-3), ("method", "wapo"), ("seed", 4), ("group_size", 2), ("probe_every", 2), ("temperature", 0.7),
           ("max_new_tokens", 5), ("optimizer", "sgd"), ("truncate_prompts", True)]


def test_resume_refuses_another_trajectory_naming_the_field(tmp_path, warm, done):
    from tests.tables import check_table

    d = tmp_path / "run"
    shutil.copytree(done, d)

    def row(field, value):
        with pytest.raises(ValueError, match=rf"{field}: {getattr(_cfg(d, warm), field)!r} -> {value!r}.*--resume-force"):
            Trainer(_cfg(d, warm, steps=3, resume=True, **{field: value}))

    check_table(((f, (f, v)) for f, v in CHANGED), row)


def test_resume_accepts_other_run_control_settings(tmp_path, warm, done):
    d = tmp_path / "run"
    shutil.copytree(done, d)
    for kw in (dict(steps=5), dict(checkpoint_every=0), dict(num_threads=2), dict(max_faults=9),
               dict(stop_on_alert=True), dict(progress=True), dict(device="auto")):
        tr = Trainer(_cfg(d, warm, resume=True, **kw))
        assert tr._resume_from is not None, kw
    assert Trainer(_cfg(str(d) + "/./", warm, resume=True))._resume_from is not None  # the folder spelled otherwise


def test_resume_force_continues_with_the_new_settings(tmp_path, warm, done, capsys):
    d = tmp_path / "run"
    shutil.copytree(done, d)
    Trainer(_cfg(d, warm, steps=3, resume=True, resume_force=True, lr=2e-3)).run()
    assert "lr: 0.001 -> 0.002" in capsys.readouterr().err
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["lr"]) for r in rows] == [(0, 1e-3), (1, 1e-3), (2, 2e-3)]


def test_resume_of_a_built_model_skips_the_warm_up_and_equals_the_uninterrupted_run(tmp_path, monkeypatch):
    """Without init_from the model is built and warmed up; a resume builds it without the warm-up (the
    checkpoint's weights replace it) and continues exactly as the uninterrupted run."""
    import llm_probe.trainer as trainer_mod

    from llm_probe.collapse import CollapseConfig

    kw = dict(warmup_steps=3, warmup_batch=4, probe_prompts=0, probe_every=0,
              collapse=CollapseConfig(baseline_entropy=0.5, baseline_reward=0.5))  # no baseline rollouts
    Trainer(_cfg(tmp_path / "a", None, steps=3, **kw)).run()
    Trainer(_cfg(tmp_path / "b", None, steps=2, **kw)).run()

    def no_warmup(*a, **k):
        raise AssertionError("warm-up ran on resume")

    monkeypatch.setattr(trainer_mod, "warmup", no_warmup)
    Trainer(_cfg(tmp_path / "b", None, steps=3, resume=True, **kw)).run()
    rows = [[{k: v for k, v in json.loads(x).items() if k != "step_time"} for x in (tmp_path / d / "metrics.jsonl")
             .read_text().splitlines()] for d in "ab"]
    assert rows[0] == rows[1] and len(rows[0]) == 3


def test_resume_compares_a_setting_missing_from_an_older_checkpoint_with_its_default(tmp_path):
    cfg = TrainConfig(out_dir=str(tmp_path))
    saved = {k: v for k, v in asdict(cfg).items() if k != "truncate_prompts"}
    assert config_differences(saved, cfg) == []
    cfg.truncate_prompts = True
    assert config_differences(saved, cfg) == ["truncate_prompts: False -> True"]


def test_checkpoint_round_trip_with_tied_weights_and_sgd_state(tmp_path):
    """Shared storage (tied embeddings) and non-tensor optimizer state survive the file, bit for bit."""
    from llm_probe.checkpoint import join_optimizer_state, split_optimizer_state
    from llm_probe.model import TinyQwenSpec, build_tiny_qwen
    from llm_probe.tokenizer import build_char_tokenizer

    model = build_tiny_qwen(build_char_tokenizer(), TinyQwenSpec(hidden_size=16, intermediate_size=32,
                                                                 tie_word_embeddings=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.0)
    model(torch.tensor([[3, 4, 5]])).logits.sum().backward()
    opt.step()
    ot, op = split_optimizer_state(opt.state_dict())
    write_checkpoint(tmp_path / "c.safetensors", {**{f"model/{k}": v for k, v in model.state_dict().items()}, **ot},
                     {"optimizer": op})
    t, s = read_checkpoint(tmp_path / "c.safetensors")
    for k, v in model.state_dict().items():
        assert torch.equal(t[f"model/{k}"], v), k
    assert join_optimizer_state(t, s["optimizer"]) == opt.state_dict()


# --- prompts longer than the model context -----------------------------------------------------------------


def _long_jsonl(path: Path, n_chars: int) -> Path:
    path.write_text(json.dumps({"question": "1+1=", "answer": "2"}) + "\n"
                    + json.dumps({"question": "1" * n_chars + "+1=", "answer": "2"}) + "\n")
    return path


def test_a_prompt_longer_than_the_context_fails_before_training(tmp_path):
    from tests.llm_helpers import tiny

    model, tok = tiny()  # context 128
    cfg = TrainConfig(out_dir=str(tmp_path), task=str(_long_jsonl(tmp_path / "t.jsonl", 200)), steps=1,
                      progress=False, device="cpu", max_new_tokens=4)
    with pytest.raises(ValueError, match=r"prompt 1 is 203 tokens.*needs 207 positions.*context is 128"):
        Trainer(cfg, model=model, tokenizer=tok)


def test_rollout_truncates_only_when_asked_keeping_the_prompt_end():
    from llm_probe.rollout import make_rollout
    from llm_probe.tasks import Problem
    from tests.llm_helpers import tiny

    model, tok = tiny()
    probs = [Problem("12+3=", "15"), Problem("9" * 150 + "+1=", "0")]
    kw = dict(G=2, max_new_tokens=4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"prompt 1 is 153 tokens.*context is 128.*--truncate-prompts"):
        make_rollout(model, tok, None, probs, **kw)

    class Task:
        def reward(self, text, problem, *, terminated):
            return 0.0

    ro = make_rollout(model, tok, Task(), probs, truncate_prompts=True, **kw)
    assert ro.prompt_ids.shape[1] == 124
    for b, p in enumerate(probs):
        ids = tok(p.prompt, add_special_tokens=False)["input_ids"][-124:]
        row = ro.prompt_ids[2 * b][ro.prompt_mask[2 * b] > 0].tolist()
        assert row == ids


@pytest.mark.parametrize("max_new_tokens", [128, 10**9])
def test_a_completion_cap_beyond_the_context_is_an_error_before_allocation(max_new_tokens):
    from llm_probe.rollout import make_rollout, sample_completions
    from llm_probe.tasks import Problem
    from tests.llm_helpers import tiny

    model, tok = tiny()
    with pytest.raises(ValueError, match=rf"max_new_tokens={max_new_tokens} leaves no room.*128"):
        make_rollout(model, tok, None, [Problem("1+1=", "2")], G=2, max_new_tokens=max_new_tokens,
                     generator=torch.Generator(), truncate_prompts=True)
    ids = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"4 tokens plus max_new_tokens=.*context of 128"):
        sample_completions(model, ids, torch.ones_like(ids), max_new_tokens=max_new_tokens, eos_id=1, pad_id=0,
                           generator=torch.Generator())
