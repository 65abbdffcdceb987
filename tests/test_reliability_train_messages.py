"""`gapdyn train` refusals are exactly one line and leave no output folder behind: an unknown --method, a missing,
malformed or unknown --task (checked before any folder or announcement), --resume --resume-force onto another
model's checkpoint (the refusal alone, without the "continuing with changed settings" note before it), and a
finished run folder, which is not told to "continue it with --resume"."""

from __future__ import annotations

import shutil

import pytest

from llm_probe.checkpoint import CHECKPOINT_NAME
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
def finished(tmp_path_factory, warm):
    d = tmp_path_factory.mktemp("run")
    Trainer(TrainConfig(out_dir=str(d), init_from=str(warm), steps=STEPS, **RUN)).run()
    return d


def _train(capsys, *args: str) -> tuple[int, str, str]:
    from gapdyn.cli import main

    capsys.readouterr()
    rc = main(["train", *args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_bad_method_and_task_are_one_line_and_no_folder(tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text("not json\n")
    cases = {
        "--method gpro": (["--method", "gpro"], ["--method", "'gpro'", "grpo"]),
        "missing --task": (["--task", str(tmp_path / "missing.jsonl")], ["--task", "missing.jsonl"]),
        "malformed --task": (["--task", str(tmp_path / "bad.jsonl")], ["--task", "bad.jsonl", "line 1"]),
        "unknown --task": (["--task", "nonsense"], ["--task", "'nonsense'"]),
    }
    for case, (args, words) in cases.items():
        out = tmp_path / case.replace(" ", "_")
        rc, stdout, err = _train(capsys, "--out", str(out / "deeper"), "--steps", "1", *args)
        line = _one_line(err)
        assert rc == 2 and stdout == "", (case, rc, stdout)  # formerly "[gapdyn train] writing under ..." first
        assert line.startswith("gapdyn train: error: ") and all(w in line for w in words), (case, line)
        assert not out.exists(), case  # formerly an empty folder for the --task cases


def test_a_resume_forced_onto_another_model_is_only_its_refusal(tmp_path, finished, warm, capsys):
    """--resume --resume-force with a model of other shapes: exit 2 and the one refusal line (formerly the
    "[resume] ... continuing with changed settings" line first); with lr changed instead the run continues and
    the note is printed once."""
    from llm_probe.model import save_policy
    from tests.llm_helpers import SMALL, tiny

    other = tmp_path / "small"
    save_policy(*tiny(spec=SMALL), other)
    d = tmp_path / "run"
    shutil.copytree(finished, d)
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    rc, _, err = _train(capsys, "--out", str(d), "--init-from", str(other), "--steps", str(STEPS + 1), "--resume",
                        "--resume-force", *CLI_RUN)
    line = _one_line(err)
    assert rc == 2 and "does not fit this run" in line and str(d / CHECKPOINT_NAME) in line, line
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} == before
    other_lr = ["2e-3" if a == "1e-3" else a for a in CLI_RUN]
    rc, _, err = _train(capsys, "--out", str(d), "--init-from", str(warm), "--steps", str(STEPS + 1), "--resume",
                        "--resume-force", *other_lr)
    notes = [ln for ln in err.splitlines() if "continuing with changed settings" in ln]
    assert rc == 0 and len(notes) == 1 and "lr: 0.001 -> 0.002" in notes[0], err


def test_a_finished_run_is_not_told_to_continue(tmp_path, finished, warm, capsys):
    d = tmp_path / "run"
    shutil.copytree(finished, d)
    rc, _, err = _train(capsys, "--out", str(d), "--init-from", str(warm), "--steps", str(STEPS), *CLI_RUN)
    line = _one_line(err)
    assert rc == 2 and f"holds a finished {STEPS}-step run" in line, line
    assert "continue it with --resume" not in line and f"--steps above {STEPS}" in line, line
