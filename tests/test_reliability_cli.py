"""Reliability of the ``gapdyn`` command: malformed arguments (unknown commands, experiments, methods and
choices, eta <= 0, group size < 2, steps 0, missing/malformed JSONL tasks, missing model directories,
bad --jobs, an unusable output path) end with exit code 2 and a one-line message naming the problem --
never a Python traceback. Most cases run ``gapdyn.cli.main`` in-process (what the console script calls;
tyro exits are caught as their exit code); a few run the real console entry point in a
subprocess to check stderr for tracebacks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gapdyn.cli import main

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(120)


def _run(argv, capsys):
    """(exit code, stdout, stderr) of ``gapdyn <argv>`` in-process; an escaping exception is a traceback."""
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse / tyro: the process would exit with this code
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out = capsys.readouterr()
    return rc, out.out, out.err


def _expect_usage_error(argv, capsys, *words):
    rc, out, err = _run(argv, capsys)
    assert rc == 2, (rc, err[-500:])
    text = (err + out).lower()
    assert "traceback" not in text
    for w in words:
        assert w.lower() in text, (w, err[-500:])


# --- top level and `gapdyn bandit` -------------------------------------------------------------------------

BANDIT_USAGE = {
    "unknown_command": (["frobnicate"], ["unknown command"]),
    "bandit_no_subcommand": (["bandit"], ["required"]),
    "bandit_unknown_subcommand": (["bandit", "explode"], ["invalid choice"]),
    "unknown_experiment": (["bandit", "run", "nope"], ["unknown experiment", "nope"]),
    "bad_mode": (["bandit", "run", "length", "--mode", "huge"], ["--mode"]),
    "bad_backend": (["bandit", "run", "length", "--backend", "dask"], ["--backend"]),
    "jobs_not_int": (["bandit", "run", "length", "--jobs", "two"], ["--jobs"]),
    "unknown_flag": (["bandit", "run", "length", "--eta", "-1"], ["unrecognized"]),
    "demo_arms_1": (["demo", "--arms", "1"], ["arms"]),
    "demo_seeds_0": (["demo", "--seeds", "0"], ["seeds"]),
    "demo_correct_too_many": (["demo", "--correct", "500"], ["correct"]),
    "demo_dim_0": (["demo", "--dim", "0"], ["dim"]),
    "demo_unknown_flag": (["demo", "--foo"], ["unrecognized"]),
}


@pytest.mark.parametrize("case", sorted(BANDIT_USAGE))
def test_bandit_cli_usage_errors_exit_2(case, capsys):
    argv, words = BANDIT_USAGE[case]
    _expect_usage_error(argv, capsys, *words)


def test_top_level_help_and_empty_exit_0(capsys):
    assert _run([], capsys)[0] == 0
    rc, out, _ = _run(["--help"], capsys)
    assert rc == 0 and "bandit" in out and "train" in out


OPEN_BANDIT = {
    "jobs_zero": (["bandit", "run", "length", "--jobs", "0", "--no-progress"], ["--jobs"]),
    "jobs_negative": (["bandit", "run", "length", "--jobs", "-5", "--no-progress"], ["--jobs"]),
}


@pytest.mark.parametrize("case", sorted(OPEN_BANDIT))
def test_bandit_cli_bad_values_exit_2(case, capsys, tmp_path):
    argv, words = OPEN_BANDIT[case]
    _expect_usage_error(argv + ["--out", str(tmp_path)], capsys, *words)


def test_bandit_cli_unusable_store_is_a_message_not_a_traceback(capsys, tmp_path):
    f = tmp_path / "a_file"
    f.write_text("x")
    rc, out, err = _run(["bandit", "run", "length", "--out", str(f), "--no-progress", "--backend", "serial"], capsys)
    assert rc != 0 and "a_file" in err


# --- `gapdyn train` -------------------------------------------------------------------------------------------


def _train(tmp_path, *extra):
    return ["train", "--out", str(tmp_path / "run"), "--warmup-steps", "0", "--device", "cpu", "--no-progress",
            "--num-threads", "1", "--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--probe-prompts", "0",
            *extra]


TRAIN_TYRO = {
    "optimizer": (["--optimizer", "lion"], ["optimizer"]),
    "lr_not_float": (["--lr", "fast"], ["lr"]),
    "arch": (["--arch", "llama"], ["arch"]),
    "unknown_flag": (["--eta", "0.1"], ["eta"]),
    "probe_alignment": (["--probe-alignment", "hessian"], ["probe-alignment"]),
}


@pytest.mark.llm
@pytest.mark.parametrize("case", sorted(TRAIN_TYRO))
def test_train_cli_parse_errors_exit_2(case, capsys, tmp_path):
    extra, words = TRAIN_TYRO[case]
    _expect_usage_error(_train(tmp_path, *extra), capsys, *words)


def _bad_jsonl(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"question": "1+1", "answer": "2"}\n{oops\n')
    return str(p)


def _empty_jsonl(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("\n")
    return str(p)


TRAIN_VALUES = {
    "method": (lambda t: ["--method", "ppo"], ["method"]),
    "lr_zero": (lambda t: ["--lr", "0"], ["lr"]),
    "lr_negative": (lambda t: ["--lr", "-0.001"], ["lr"]),
    "lr_nan": (lambda t: ["--lr", "nan"], ["--lr"]),
    "group_size_1": (lambda t: ["--group-size", "1"], ["--group-size"]),
    "steps_0": (lambda t: ["--steps", "0"], ["steps"]),
    "missing_task_file": (lambda t: ["--task", str(t / "missing.jsonl")], ["missing.jsonl"]),
    "malformed_task_file": (lambda t: ["--task", _bad_jsonl(t)], ["line 2"]),
    "empty_task_file": (lambda t: ["--task", _empty_jsonl(t)], ["empty"]),
    "unknown_task": (lambda t: ["--task", "chess"], ["task"]),
    "missing_model_dir": (lambda t: ["--init-from", str(t / "no_model")], ["no_model"]),
    "empty_model_dir": (lambda t: ["--init-from", str(t)], ["config.json"]),
    "dtype": (lambda t: ["--dtype", "float8"], ["dtype"]),
    "device": (lambda t: ["--device", "tpu"], ["device"]),
    "probe_params": (lambda t: ["--probe-params", "no_such_param_.*"], ["no_such_param"]),
}


@pytest.mark.llm
@pytest.mark.parametrize("case", sorted(TRAIN_VALUES))
def test_train_cli_bad_values_exit_2_with_message(case, capsys, tmp_path):
    extra, words = TRAIN_VALUES[case]
    _expect_usage_error(_train(tmp_path, *extra(tmp_path)), capsys, *words)


@pytest.mark.llm
def test_train_cli_repeated_faults_exit_1_with_message(capsys, tmp_path, monkeypatch):
    """A run stopped by repeated non-finite steps: exit code 1 and the FaultError message (documented)."""
    import torch

    from llm_probe.trainer import Trainer

    orig = Trainer.compute_loss

    def nan_loss(self, ro):
        res, logp, logp_all = orig(self, ro)
        res.loss = res.loss * torch.tensor(float("nan"))
        return res, logp, logp_all

    monkeypatch.setattr(Trainer, "compute_loss", nan_loss)
    rc, out, err = _run(_train(tmp_path, "--steps", "5", "--max-faults", "2"), capsys)
    assert rc == 1 and "2 consecutive steps with a non-finite loss" in err and "traceback" not in err.lower()


# --- `gapdyn figs` / `gapdyn reproduce` -------------------------------------------------------------------------

FIGS_USAGE = {
    "figs_only": (["figs", "--only", "fig99"], ["--only"]),
    "figs_mode": (["figs", "--mode", "huge"], ["--mode"]),
    "figs_jobs": (["figs", "--jobs", "many"], ["--jobs"]),
    "reproduce_mode": (["reproduce", "--mode", "huge"], ["--mode"]),
    "reproduce_unknown": (["reproduce", "--fast"], ["unrecognized"]),
}


@pytest.mark.parametrize("case", sorted(FIGS_USAGE))
def test_figs_and_reproduce_usage_errors_exit_2(case, capsys):
    argv, words = FIGS_USAGE[case]
    _expect_usage_error(argv, capsys, *words)


def test_figs_jobs_zero_is_refused_up_front():
    """Formerly open: `gapdyn figs --jobs 0` failed inside every sweep; now refused up front."""
    from paper_figs.data import Sources

    with pytest.raises(ValueError, match="n_jobs"):
        Sources("test", n_jobs=0)


# --- the real console entry point: exit codes and no traceback on stderr ----------------------------------------


def _console(*argv, timeout=100):
    return subprocess.run([sys.executable, "-m", "gapdyn.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_console_bandit_errors_have_no_traceback(tmp_path):
    for argv in (["nope"], ["bandit", "run", "nope"], ["bandit", "run", "length", "--jobs", "0", "--out", str(tmp_path)]):
        p = _console(*argv)
        assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.strip(), (argv, p.returncode, p.stderr[-600:])


@pytest.mark.llm
def test_console_train_errors_have_no_traceback(tmp_path):
    p = _console(*_train(tmp_path, "--task", str(tmp_path / "missing.jsonl")))
    assert p.returncode == 2 and "Traceback" not in p.stderr and "missing.jsonl" in p.stderr, (p.returncode, p.stderr[-600:])
