"""The ``gapdyn`` command line as a whole: subcommands come from entry points, every subcommand speaks the
shared flag vocabulary, bad values end as one line (exit code != 0, no traceback), short names resolve, and
commands write only under the working directory or ``--out``.

Bad-value cases stop at validation (before any sweep or model is built), so the walk is fast."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gapdyn import cmdline
from gapdyn.cli import commands, main

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(180)

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


def _run(argv, capsys):
    """(exit code, stdout, stderr) of ``gapdyn <argv>`` in-process."""
    try:
        rc = main(list(argv))
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out = capsys.readouterr()
    return rc, out.out, out.err


# --- discovery ------------------------------------------------------------------------------------------------


def test_subcommands_are_the_declared_entry_points():
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["gapdyn.commands"]
    found = commands()
    assert set(found) == set(declared)
    for name, ep in found.items():
        assert ep.value == declared[name]


def test_the_dispatcher_names_no_subcommand():
    """The theory core knows its subcommands only through the entry-point group."""
    text = (ROOT / "gapdyn" / "cli.py").read_text()
    for module in ("bandits", "llm_probe", "paper_figs"):
        assert module not in text


def test_a_missing_extra_is_a_clear_message(capsys, monkeypatch):
    from importlib.metadata import EntryPoint

    import gapdyn.cli as cli

    fake = {"train": EntryPoint("train", "no_such_package_xyz.cli:main", cli.GROUP)}
    monkeypatch.setattr(cli, "commands", lambda: fake)
    rc, _, err = _run(["train"], capsys)
    assert rc == 2 and "pip install" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# --- one flag vocabulary ----------------------------------------------------------------------------------------

SHARED = {  # subcommand argv -> the shared flags it must offer
    ("demo",): ("--out", "--progress", "--no-progress", "--seed"),
    ("bandit", "run"): ("--mode", "--jobs", "--out", "--progress", "--no-progress", "--seed"),
    ("figs",): ("--mode", "--jobs", "--out", "--progress", "--no-progress", "--seed"),
    ("reproduce",): ("--mode", "--jobs", "--out", "--progress", "--no-progress", "--seed"),
    ("train",): ("--out", "--progress", "--no-progress", "--seed"),
    ("train", "warmup"): ("--out", "--progress", "--no-progress", "--seed"),
    ("train", "demo"): ("--out", "--jobs", "--progress", "--no-progress"),
    ("claims",): ("--out", "--mode"),
    ("inspect",): ("--out",),
    ("train", "ablation"): ("--mode", "--jobs", "--out", "--progress", "--no-progress", "--seeds"),
    ("train", "safe-step"): ("--mode", "--jobs", "--out", "--progress", "--no-progress", "--seeds"),
    ("train", "early-warning"): ("--from",),
    ("train", "entropy"): ("--from",),
    ("train", "entropy-lemma"): ("--mode", "--out"),
    ("train", "offline"): ("--before", "--after", "--rollouts", "--out"),
    ("train", "testbed"): ("--out", "--progress", "--no-progress", "--seed"),
    ("lr-finder",): ("--out", "--progress", "--no-progress", "--seed"),
}
RETIRED = ("--n-jobs", "--out-dir")


@pytest.mark.parametrize("argv", sorted(SHARED), ids=" ".join)
def test_help_shows_the_shared_flags(argv, capsys):
    if argv[0] == "train" and not HAVE_TORCH:
        pytest.skip("needs the llm extra")
    rc, out, _ = _run([*argv, "--help"], capsys)
    assert rc == 0
    for flag in SHARED[argv]:
        assert flag in out, (argv, flag)
    if "--mode" in SHARED[argv]:
        assert "{test,quick,full}" in out
    for flag in RETIRED:
        assert flag not in out, (argv, flag)
    assert not any(w in out for w in tuple(n + ".md" for n in ("THEORY", "SIMULATIONS", "ANCHORS", "STYLE")) + ("issue ",))


def test_every_registered_command_is_in_the_table():
    assert {a[0] for a in SHARED} == set(commands())


# --- bad values: one line, non-zero exit, no traceback --------------------------------------------------------

BAD = [  # (argv, a word the message must contain)
    (["nope"], "unknown command"),
    (["train", "safe-step", "--jobs", "0"], "jobs"),
    (["train", "testbed", "--method", "gpro"], "--method"),
    (["train", "entropy", "--from", "no/such/study"], "--from"),
    (["train", "early-warning", "--from", "{file}"], "--from"),
    (["demo", "--arms", "1"], "arms"),
    (["demo", "--seeds", "0"], "seeds"),
    (["demo", "--correct", "100"], "correct"),
    (["demo", "--dim", "x"], "--dim"),
    (["demo", "--out", "{file}"], "--out"),
    (["bandit"], "list, run"),
    (["bandit", "explode"], "invalid choice"),
    (["bandit", "list", "extra"], "no arguments"),
    (["bandit", "run", "nope"], "unknown"),
    (["bandit", "run", "s"], "ambiguous"),
    (["bandit", "run", "length", "--mode", "huge"], "--mode"),
    (["bandit", "run", "length", "--jobs", "0"], "--jobs"),
    (["bandit", "run", "length", "--jobs", "-2"], "--jobs"),
    (["bandit", "run", "length", "--jobs", "two"], "--jobs"),
    (["bandit", "run", "length", "--backend", "dask"], "--backend"),
    (["bandit", "run", "length", "--out", "{file}"], "--out"),
    (["figs", "--out", "{file}"], "--out"),
    (["figs", "--only", "fig99"], "fig99"),
    (["figs", "--only", "fig"], "ambiguous"),
    (["figs", "--mode", "huge"], "--mode"),
    (["figs", "--jobs", "0"], "--jobs"),
    (["figs", "--seed", "1.5"], "--seed"),
    (["reproduce", "--out", "{file}"], "--out"),
    (["reproduce", "--jobs", "-3"], "--jobs"),
    (["reproduce", "--fast"], "unrecognized"),
]
TRAIN_BAD = [
    (["--max-grad-norm", "-1"], "--max-grad-norm"),
    (["--max-grad-norm", "0"], "--max-grad-norm"),
    (["--lr", "inf"], "--lr"),
    (["--lr", "nan"], "--lr"),
    (["--lr", "0"], "--lr"),
    (["--lr", "fast"], "--lr"),
    (["--eps-high", "-5"], "--eps-high"),
    (["--eps-low", "nan"], "--eps-low"),
    (["--eps-low", "1"], "--eps-low"),
    (["--temperature", "0"], "--temperature"),
    (["--weight-decay", "-1"], "--weight-decay"),
    (["--warmup-lr", "inf"], "--warmup-lr"),
    (["--num-threads", "0"], "--num-threads"),
    (["--steps", "0"], "--steps"),
    (["--steps", "1.5"], "--steps"),
    (["--group-size", "1"], "--group-size"),
    (["--prompts-per-step", "0"], "--prompts-per-step"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--probe-every", "-1"], "--probe-every"),
    (["--probe-group-size", "1"], "--probe-group-size"),
    (["--headroom-every", "0"], "--headroom-every"),
    (["--warn-forward-every", "1.5"], "--warn-forward-every"),
    (["--max-faults", "0"], "--max-faults"),
    (["--seed", "-1"], "--seed"),
    (["--device", "cuda:abc"], "--device"),
    (["--device", "tpu"], "--device"),
    (["--dtype", "float8"], "--dtype"),
    (["--out", "{file}"], "--out"),
    (["warmup", "--lr", "-1"], "--lr"),
    (["warmup", "--batch", "0"], "--batch"),
    (["demo", "--jobs", "0"], "--jobs"),
    (["demo", "--lrs", "inf"], "--lrs"),
    (["demo", "--group-size", "1"], "--group-size"),
    (["ablation", "--jobs", "0"], "--jobs"),
    (["ablation", "--mode", "huge"], "--mode"),
    (["ablation", "--out", "{file}"], "--out"),
    (["ablation", "--seeds", "-1"], "--seeds"),
    (["safe-step", "--seeds", "1", "1"], "--seeds"),
    (["--init-from", "no/such/model"], "--init-from"),
    (["offline", "--before", "no/k", "--after", "no/k1", "--rollouts", "{file}", "--out", "o"], "--before"),
]


def _bad_cases():
    cases = [pytest.param(a, w, id=" ".join(a)) for a, w in BAD]
    mark = pytest.mark.skipif(not HAVE_TORCH, reason="needs the llm extra")
    cases += [pytest.param(["train", *a], w, id="train " + " ".join(a), marks=mark) for a, w in TRAIN_BAD]
    return cases


@pytest.mark.parametrize("argv, word", _bad_cases())
def test_bad_values_end_as_one_line(argv, word, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing a refused command might create lands in the repository
    f = tmp_path / "a_file"
    f.write_text("x")
    argv = [a.replace("{file}", str(f)) for a in argv]
    rc, out, err = _run(argv, capsys)
    assert rc != 0, (argv, out[-300:])
    lines = err.strip().splitlines()
    assert len(lines) == 1, (argv, err)
    assert word.lower() in lines[0].lower(), (argv, lines[0])
    assert "traceback" not in (out + err).lower()


@pytest.mark.skipif(not HAVE_TORCH, reason="needs the llm extra")
def test_train_help_lists_every_subcommand_and_refusals_create_no_folder(capsys, tmp_path, monkeypatch):
    """`gapdyn train --help` names each subcommand main() dispatches; a refused input leaves no output folder."""
    from llm_probe.cli import SUBCOMMANDS

    assert set(SUBCOMMANDS) == {a[1] for a in SHARED if a[0] == "train" and len(a) == 2}
    rc, out, _ = _run(["train", "--help"], capsys)
    assert rc == 0 and all(f"gapdyn train {name}" in out for name in SUBCOMMANDS)
    monkeypatch.chdir(tmp_path)
    for argv in (["train", "--init-from", "no/model", "--out", "r1"], ["train", "entropy", "--from", "r2"],
                 ["train", "offline", "--before", "no", "--after", "no", "--rollouts", "f", "--out", "r3"],
                 ["train", "safe-step", "--analyse-only", "--out", "r4"]):
        assert _run(argv, capsys)[0] == 2, argv
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.skipif(not HAVE_TORCH, reason="needs the llm extra")
def test_cuda_on_a_machine_without_it_is_one_line(capsys, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    rc, _, err = _run(["train", "--device", "cuda"], capsys)
    assert rc == 2 and "CUDA is not available" in err and len(err.strip().splitlines()) == 1


def test_console_entry_point_bad_value_has_no_traceback(tmp_path):
    """The real process: stderr is one line and the exit code 2."""
    f = tmp_path / "a_file"
    f.write_text("x")
    p = subprocess.run([sys.executable, "-m", "gapdyn.cli", "figs", "--out", str(f)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_debug_variable_shows_the_traceback(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GAPDYN_DEBUG", "1")
    with pytest.raises(ValueError, match="--arms"):
        main(["demo", "--arms", "1"])


# --- names, output folders ------------------------------------------------------------------------------------

NAMES = [  # (name, choices, expected full name or None for an error)
    ("fig1", ("fig1_phase_diagram", "fig2_critical_eta"), "fig1_phase_diagram"),
    ("fig2_critical_eta", ("fig1_phase_diagram", "fig2_critical_eta"), "fig2_critical_eta"),
    ("fig", ("fig1_phase_diagram", "fig2_critical_eta"), None),
    ("", ("a",), None),
    ("succ", ("success_rate", "stagnation"), "success_rate"),
    ("st", ("success_rate", "stagnation"), "stagnation"),
    ("s", ("success_rate", "stagnation"), None),
    ("length", ("length", "length_long"), "length"),
]


@pytest.mark.parametrize("name, choices, want", NAMES)
def test_resolve_name(name, choices, want):
    if want is None:
        with pytest.raises(ValueError, match="choose from"):
            cmdline.resolve_name(name, choices, "thing")
    else:
        assert cmdline.resolve_name(name, choices, "thing") == want


def test_output_dir_defaults_under_the_working_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cmdline.output_dir("figs", None) == tmp_path / "gapdyn_out" / "figs"
    assert str(tmp_path / "gapdyn_out" / "figs") in capsys.readouterr().out
    assert cmdline.output_dir("figs", tmp_path / "x", announce=False) == tmp_path / "x"
    assert not (tmp_path / "gapdyn_out").exists()  # naming a folder creates nothing


def test_demo_writes_under_the_working_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--seeds", "1", "--arms", "6", "--correct", "2", "--dim", "3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["gapdyn_out/demo/demo.json"]
    assert "gapdyn_out/demo/demo.json" in out


def test_figs_short_name_writes_only_under_the_working_directory(tmp_path, monkeypatch, capsys):
    """`gapdyn figs --only fig5 --mode test` from an empty folder: the figure lands in ./gapdyn_out/figs and
    nothing is written elsewhere (the package folder included)."""
    import paper_figs

    pkg = Path(paper_figs.__file__).parent
    before = {p for p in pkg.rglob("*") if "__pycache__" not in p.parts}
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GAPDYN_STORE", raising=False)
    assert main(["figs", "--only", "fig5", "--mode", "test", "--no-progress"]) == 0
    files = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    figs = {f for f in files if f.startswith("gapdyn_out/figs/")}
    assert figs == {"gapdyn_out/figs/fig5_taxonomy.png", "gapdyn_out/figs/fig5_taxonomy.pdf"}
    assert all(f.startswith("gapdyn_out/store/") for f in files - figs)  # the taxonomy experiment's sweep cache
    after = {p for p in pkg.rglob("*") if "__pycache__" not in p.parts}
    assert after == before
