"""Commands: exit codes, signals and outputs (RELIABILITY.md, "Commands: exit codes, signals, outputs").

Every output of a command is written atomically through gapdyn.io and never through a planted symlink; a
failing write (injected, or a real 64 KiB tmpfs filling up) is one line naming the file and exit 1, with what
was committed before kept; bad settings exit 2; SIGINT / SIGTERM of a training run or a sweep end with one line
(the last checkpoint, the command that resumes), exit 130 / 143 and no child process left; a rerun on a folder
with a checkpoint resumes or refuses; JSONL task files report file and line of every malformed row and give
numeric answers as the text a correct completion writes."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pandas as pd
import pytest

from gapdyn import io as gio
from gapdyn.cmdline import command

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "NUMBA_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "GAPDYN_TORCH_THREADS": "1"}
ENV.pop("GAPDYN_DEBUG", None)


def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, "No space left on device")


def _one_error_line(err: str, *words: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# --- exit codes -----------------------------------------------------------------------------------------------


@command("gapdyn probe")
def _raises(argv):
    raise {"value": ValueError("bad --x"), "missing": FileNotFoundError(errno.ENOENT, "No such file", "f.txt"),
           "enospc": OSError(errno.ENOSPC, "No space left on device"),
           "write": gio.WriteError(None, "cannot write out/a.json: TypeError", "out/a.json"),
           "eio": OSError(errno.EIO, "Input/output error")}[argv[0]]


@pytest.mark.parametrize("case, code", [("value", 2), ("missing", 2), ("enospc", 1), ("write", 1), ("eio", 1)])
def test_exit_code_2_for_bad_input_1_for_a_failing_write(case, code, capsys):
    assert _raises([case]) == code
    _one_error_line(capsys.readouterr().err, "gapdyn probe: error:")


@command("gapdyn probe")
def _interrupted(argv):
    from gapdyn.cmdline import on_interrupt

    on_interrupt(lambda: "last checkpoint X at step 3; resume with: gapdyn probe --resume")
    if argv[0] == "SIGINT":
        raise KeyboardInterrupt
    os.kill(os.getpid(), signal.SIGTERM)  # the handler installed by `command` raises here
    time.sleep(5)
    raise AssertionError("SIGTERM did not interrupt")


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_signals_end_as_one_line_with_the_registered_hint(sig, code, capsys):
    before = signal.getsignal(signal.SIGTERM)
    assert _interrupted([sig]) == code
    _one_error_line(capsys.readouterr().err, f"gapdyn probe: interrupted by {sig}; last checkpoint X at step 3",
                    "resume with: gapdyn probe --resume")
    assert signal.getsignal(signal.SIGTERM) == before  # restored after the command


# --- the atomic writers ---------------------------------------------------------------------------------------

WRITERS = {  # (path, v): the file for the integer v; another v writes other bytes
    "bytes": lambda p, v=1: gio.atomic_write_bytes(p, b"new%d" % v),
    "text": lambda p, v=1: gio.atomic_write_text(p, f"new{v}"),
    "json": lambda p, v=1: gio.atomic_write_json(p, {"a": v}),
    "parquet": lambda p, v=1: gio.write_parquet(p, pd.DataFrame({"a": [v, 2]})),
    "csv": lambda p, v=1: gio.write_with(p, lambda tmp: pd.DataFrame({"a": [v]}).to_csv(tmp, index=False)),
}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_failing_write_names_the_file_and_keeps_the_old_one(name, tmp_path, monkeypatch):
    """A full disk injected into every writer: WriteError (exit 1) naming the file, old bytes kept, no temp."""
    p = tmp_path / f"out.{name}"
    WRITERS[name](p)
    before = p.read_bytes()
    monkeypatch.setattr(os, "fsync", _enospc)  # every writer fsyncs its temporary before the rename
    with pytest.raises(gio.WriteError) as info:
        WRITERS[name](p, 2)
    assert str(p) in str(info.value) and "No space left" in str(info.value)
    assert p.read_bytes() == before and sorted(x.name for x in tmp_path.iterdir()) == [p.name]


def test_data_the_format_refuses_is_a_write_error(tmp_path):
    """JSON of a set, NaN with allow_nan=False, a parquet column of mixed types, safetensors' own error."""
    from safetensors import SafetensorError

    def raise_safetensor(tmp):
        raise SafetensorError("Error while serializing: IoError(No space left on device)")

    cases = {"set": lambda p: gio.atomic_write_json(p, {1, 2}),
             "nan": lambda p: gio.atomic_write_json(p, float("nan"), allow_nan=False),
             "mixed": lambda p: gio.write_parquet(p, pd.DataFrame({"a": [1, "x"]})),
             "safetensors": lambda p: gio.write_with(p, raise_safetensor)}
    for name, fn in cases.items():
        with pytest.raises(gio.WriteError, match=str(tmp_path / name)):
            fn(tmp_path / name)
    assert list(tmp_path.iterdir()) == []


def test_writers_refuse_symlinks_they_did_not_create(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "link.json").symlink_to(victim)
    (tmp_path / "real").mkdir()
    (tmp_path / "linked_dir").symlink_to(tmp_path / "real")
    for name, fn in WRITERS.items():
        with pytest.raises(gio.OutputPathError, match="symbolic link"):
            fn(tmp_path / "link.json")
        with pytest.raises(gio.OutputPathError, match="linked_dir"):
            fn_root = {"root": tmp_path}
            gio.atomic_write_text(tmp_path / "linked_dir" / "x", "x", **fn_root)
    assert victim.read_text() == "keep" and list((tmp_path / "real").iterdir()) == []


def test_the_store_refuses_a_planted_cell_symlink(tmp_path):
    from gapdyn.evidence.store import CellStore, tidy_rows
    from gapdyn.evidence.sweep import example_cell

    cs = CellStore(tmp_path, "s")
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    cs.cell_path("k").symlink_to(victim)
    with pytest.raises(gio.OutputPathError, match="symbolic link"):
        cs.save("k", "{}", tidy_rows(example_cell(0), {"seed": 0}, "k"))
    assert victim.read_bytes() == b"keep"


@pytest.fixture
def tmpfs(tmp_path):
    """A 64 KiB tmpfs (root only; skipped where mount is refused)."""
    d = tmp_path / "tmpfs"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a 64 KiB tmpfs here (needs root / CAP_SYS_ADMIN): {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=False)


def test_a_real_full_disk_writes_nothing_and_keeps_what_was_committed(tmpfs, capsys):
    torch = pytest.importorskip("torch")
    from llm_probe.checkpoint import read_checkpoint, write_checkpoint

    small = write_checkpoint(tmpfs / "checkpoint.safetensors", {"x": torch.arange(4.0)}, {"step": 1})
    with pytest.raises(gio.WriteError, match="checkpoint.safetensors"):  # safetensors raises SafetensorError
        write_checkpoint(small, {"x": torch.zeros(40_000)}, {"step": 2})
    tensors, state = read_checkpoint(small)
    assert state == {"step": 1} and tensors["x"].tolist() == [0.0, 1.0, 2.0, 3.0]

    @command("gapdyn probe")
    def writes(argv):
        gio.atomic_write_bytes(tmpfs / "big.bin", b"x" * 200_000)

    gio.atomic_write_text(tmpfs / "big.bin", "old")
    assert writes([]) == 1
    _one_error_line(capsys.readouterr().err, str(tmpfs / "big.bin"), "No space left")
    assert (tmpfs / "big.bin").read_text() == "old"
    assert not [p for p in tmpfs.iterdir() if ".tmp" in p.name]


# --- gapdyn train: a failing checkpoint, a rerun, signals --------------------------------------------------------


def _train_argv(out, steps, *extra):
    return ["--out", str(out), "--warmup-steps", "0", "--device", "cpu", "--no-progress", "--num-threads", "1",
            "--steps", str(steps), "--prompts-per-step", "2", "--group-size", "2", "--probe-prompts", "0",
            "--max-new-tokens", "3", "--checkpoint-every", "1", *extra]


@pytest.mark.llm
def test_train_full_disk_while_checkpointing_is_one_line_exit_1(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    import safetensors.torch
    from safetensors import SafetensorError

    from llm_probe.checkpoint import read_checkpoint
    from llm_probe.cli import main

    out = tmp_path / "run"
    assert main(_train_argv(out, 2)) == 0
    capsys.readouterr()
    before = (out / "checkpoint.safetensors").read_bytes()

    def full(*a, **k):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    assert main(_train_argv(out, 4, "--resume")) == 1
    _one_error_line(capsys.readouterr().err, "gapdyn train: error: cannot write checkpoint",
                    str(out / "checkpoint.safetensors"))
    assert (out / "checkpoint.safetensors").read_bytes() == before and read_checkpoint(out / "checkpoint.safetensors")
    monkeypatch.undo()
    assert main(_train_argv(out, 3, "--resume")) == 0  # the committed checkpoint resumes
    assert "resumed at step 2" in capsys.readouterr().out


def _wait_for(pred, proc, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def _descendants(pid):
    from gapdyn.cmdline import _descendants as d

    return d(pid)


def _alive(pids):
    from gapdyn.cmdline import _alive as a

    return [p for p in pids if a(p)]


@pytest.mark.llm
@pytest.mark.parametrize("sig, code", [pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow), (signal.SIGTERM, 143)])
def test_train_interrupted_says_where_the_checkpoint_is_and_resumes(sig, code, tmp_path, capsys):
    pytest.importorskip("torch")
    from llm_probe.cli import main

    out = tmp_path / "run"
    argv = _train_argv(out, 500)
    proc = subprocess.Popen([sys.executable, "-m", "gapdyn.cli", "train", *argv], cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert _wait_for(lambda: (out / "checkpoint.sha256").exists(), proc), proc.communicate()[1]
        proc.send_signal(sig)
        err = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()
    assert proc.returncode == code, err
    line = _one_error_line(err, f"interrupted by {sig.name}", "last checkpoint", "resume with: gapdyn train",
                           "--resume")
    step = int(line.split(" at step ")[1].split(";")[0])
    assert main(argv) == 2  # the same command again: refused, never a silent restart at step 0
    _one_error_line(capsys.readouterr().err, "holds a checkpoint", f"at step {step}", "--resume")
    assert main(_train_argv(out, step + 1, "--resume")) == 0
    said = capsys.readouterr().out
    assert f"1 steps in" in said and f"resumed at step {step}; run total {step + 1} of {step + 1}" in said
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(step + 1))


# --- sweeps: signals, children, outputs -------------------------------------------------------------------------


class Config:
    """A tiny experiment for the sweep tests (registered as `sleepy` in bandits.experiments); its cells sleep
    $GAPDYN_TEST_CELL_SLEEP seconds (not a cell parameter: a resume with no sleep reuses the same keys)."""

    n = 16

    @classmethod
    def test(cls):
        return cls()

    quick = test


def sleepy_cell(seed: int) -> pd.DataFrame:
    time.sleep(float(os.environ.get("GAPDYN_TEST_CELL_SLEEP", "0")))
    return pd.DataFrame({"x": [float(seed)]})


def run(config, *, store, backend, n_jobs, progress):
    from bandits.experiments._common import ExperimentResult
    from gapdyn.evidence.sweep import run_sweep

    df = run_sweep(sleepy_cell, [{"seed": s} for s in range(config.n)], name="sleepy-test-cells",
                   store=store, backend=backend, n_jobs=n_jobs, progress=progress)
    return ExperimentResult("sleepy", "test", df.assign(block="discovery"), (), "0")


_SWEEP = """
import sys
import bandits.experiments as E
E.EXPERIMENTS["sleepy"] = "tests.test_reliability_io"
from bandits.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("sig, code, backend", [(signal.SIGTERM, 143, "joblib"),
                                                pytest.param(signal.SIGINT, 130, "serial", marks=pytest.mark.slow)])
def test_sweep_interrupted_leaves_no_child_and_says_how_to_resume(sig, code, backend, tmp_path, monkeypatch, capsys):
    cells = tmp_path / "sleepy-test-cells" / "cells"
    argv = ["run", "sleepy", "--mode", "test", "--out", str(tmp_path), "--no-progress", "--backend", backend,
            "--jobs", "2"]
    proc = subprocess.Popen([sys.executable, "-c", _SWEEP, *argv], cwd=ROOT, env={**ENV, "GAPDYN_TEST_CELL_SLEEP": "0.3"},
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    kids = []
    try:
        assert _wait_for(lambda: len(list(cells.glob("*.parquet"))) >= 2, proc), proc.communicate()[1]
        kids = _descendants(proc.pid)
        assert backend == "serial" or len(kids) >= 2  # loky workers (and their resource tracker)
        proc.send_signal(sig)
        err = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()
    assert proc.returncode == code, err
    _one_error_line(err, f"gapdyn bandit: interrupted by {sig.name}", str(tmp_path), "rerun the same command",
                    "gapdyn bandit run sleepy")
    deadline = time.monotonic() + 10
    while _alive(kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(kids), f"children left running: {_alive(kids)}"
    done = len(list(cells.glob("*.parquet")))
    assert 2 <= done < Config.n
    # resume in-process (short cells): only the missing cells run, every output written once
    import bandits.experiments as E
    from bandits.cli import main

    monkeypatch.setitem(E.EXPERIMENTS, "sleepy", __name__)
    monkeypatch.delenv("GAPDYN_TEST_CELL_SLEEP", raising=False)
    assert main([*argv[:-4], "--backend", "serial"]) == 0
    got = pd.read_parquet(tmp_path / "sleepy-test" / "results.parquet")
    assert sorted(got["x"]) == [float(s) for s in range(Config.n)]


def test_bandit_run_outputs_are_atomic_and_refuse_planted_symlinks(tmp_path, monkeypatch, capsys):
    import bandits.experiments as E
    from bandits.cli import main

    monkeypatch.setitem(E.EXPERIMENTS, "sleepy", __name__)
    monkeypatch.delenv("GAPDYN_TEST_CELL_SLEEP", raising=False)
    monkeypatch.setattr(Config, "n", 3)
    argv = ["run", "sleepy", "--mode", "test", "--out", str(tmp_path), "--no-progress", "--backend", "serial"]
    assert main(argv) == 0
    out = tmp_path / "sleepy-test"
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(files) == ["claims.csv", "claims.json", "claims.md", "results.parquet"]
    capsys.readouterr()
    # a full disk at the CSV: exit 1, one line naming it, every file as before, no temporary
    monkeypatch.setattr(pd.DataFrame, "to_csv", _enospc)
    assert main(argv) == 1
    _one_error_line(capsys.readouterr().err, "gapdyn bandit: error: cannot write", str(out / "claims.csv"))
    assert sorted(p.name for p in out.iterdir()) == sorted(files)  # no temporary left
    assert (out / "claims.csv").read_bytes() == files["claims.csv"]
    assert pd.read_parquet(out / "results.parquet").equals(pd.read_parquet(pd.io.common.BytesIO(files["results.parquet"])))
    monkeypatch.undo()
    monkeypatch.setitem(E.EXPERIMENTS, "sleepy", __name__)
    # a planted symlink (each output, and the output folder itself): exit 2, nothing written through it
    victim = tmp_path / "victim"
    for name in sorted(files):
        victim.write_text("keep")
        (out / name).unlink()
        (out / name).symlink_to(victim)
        assert main(argv) == 2
        _one_error_line(capsys.readouterr().err, "refusing to write", name, "symbolic link")
        assert victim.read_text() == "keep"
        (out / name).unlink()
    (tmp_path / "elsewhere").mkdir()
    for p in out.iterdir():
        p.unlink()
    out.rmdir()
    out.symlink_to(tmp_path / "elsewhere")
    assert main(argv) == 2
    _one_error_line(capsys.readouterr().err, "refusing to write", "sleepy-test", "symbolic link")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_store_setting_naming_a_file_is_exit_2(tmp_path, capsys, monkeypatch):
    from bandits.cli import main

    f = tmp_path / "a_file"
    f.write_text("x")
    assert main(["run", "length", "--out", str(f), "--no-progress", "--backend", "serial"]) == 2
    _one_error_line(capsys.readouterr().err, "a_file")
    pytest.importorskip("matplotlib")
    from paper_figs.cli import main as figs

    monkeypatch.setenv("GAPDYN_STORE", str(f))
    assert figs(["--mode", "test", "--out", str(tmp_path / "figs"), "--no-progress", "--only", "fig1"]) == 2
    _one_error_line(capsys.readouterr().err, "gapdyn figs: error: $GAPDYN_STORE must be a folder", "a_file")


# --- JSONL task files -----------------------------------------------------------------------------------------


def _jsonl(tmp_path, lines: list[bytes]) -> Path:
    p = tmp_path / "probs.jsonl"
    p.write_bytes(b"\n".join(lines) + b"\n")
    return p


BAD_ROWS = {
    "invalid UTF-8": b'{"question": "2+2\xff", "answer": "4"}',
    "beyond the digit limit": b'{"question": "big", "answer": ' + b"7" * 5000 + b"}",
    "NaN": b'{"question": "q", "answer": NaN}',
    "Infinity": b'{"question": "q", "answer": -Infinity}',
    "1e400": b'{"question": "q", "answer": 1e400}',
    "not JSON": b'{"question": "q", "answer": ',
    "no answer": b'{"question": "q"}',
}


def test_every_malformed_row_is_reported_with_file_and_line(tmp_path):
    from llm_probe.tasks import load_jsonl_problems

    good = b'{"question": "1+1", "answer": 2}'
    lines = [x for bad in BAD_ROWS.values() for x in (good, bad)]
    p = _jsonl(tmp_path, lines)
    with pytest.raises(ValueError) as info:
        load_jsonl_problems(p)
    msg = str(info.value)
    assert str(p) in msg and f"{len(BAD_ROWS)} malformed rows" in msg
    for i, name in enumerate(BAD_ROWS):
        assert f"line {2 * i + 2}" in msg, (name, msg)
        assert f"line {2 * i + 1}:" not in msg and f"line {2 * i + 1} " not in msg
    for name, bad in BAD_ROWS.items():  # each alone, also through iter_jsonl_objects
        one = _jsonl(tmp_path, [good, bad])
        with pytest.raises(ValueError, match=r"probs\.jsonl: (1 malformed row: )?line 2"):
            load_jsonl_problems(one)
        if name != "no answer":
            from llm_probe.tasks import iter_jsonl_objects

            with pytest.raises(ValueError, match=r"probs\.jsonl: line 2"):
                list(iter_jsonl_objects(one))


NUMBERS = ["1e16", "10000000000000000", "12.50", "-0", "-0.0", "2.5e-3", "1E+2", "3", "-1.25e1", "0.1",
           "123456789012345678901234567890", "1.7976931348623157e308", "7" * 4000]


def test_numeric_answers_are_the_text_a_correct_completion_writes(tmp_path):
    """The loaded reference equals the literal as an exact fraction (independent route: Fraction of the
    literal), has no exponent, and the completion that writes those digits is rewarded."""
    from llm_probe.tasks import check_answer, load_jsonl_problems

    p = _jsonl(tmp_path, [f'{{"question": "q{i}", "answer": {x}}}'.encode() for i, x in enumerate(NUMBERS)])
    for x, prob in zip(NUMBERS, load_jsonl_problems(p)):
        ref = prob.answer
        assert "e" not in ref.lower() and Fraction(Decimal(ref)) == Fraction(Decimal(x)), (x, ref)
        assert ref == ref.rstrip("0") or "." not in ref
        assert check_answer(f"so the answer is {ref}", ref) or len(ref) > 64  # long: compared as text
    assert load_jsonl_problems(p)[0].answer == "10000000000000000"
    assert check_answer("#### 10000000000000000", load_jsonl_problems(p)[0].answer)


def test_reports_figures_and_demo_refuse_a_planted_symlink(tmp_path, capsys):
    """The report writer, the figure save helper and ``gapdyn demo`` refuse a symlink at their output path (one
    line, its target untouched, nothing else written); with the link gone the same call writes the file (the
    demo's own run is tested elsewhere: here it is refused before its work)."""
    import matplotlib.pyplot as plt

    from gapdyn.demo import main as demo_main
    from paper_figs import report, style

    victim = tmp_path / "victim"
    victim.write_text("keep")
    res = tmp_path / "results"
    res.mkdir()
    (res / "claims.json").symlink_to(victim)
    with pytest.raises(gio.OutputPathError, match="claims.json: it is a symbolic link"):
        report.write_results(res, [])
    assert victim.read_text() == "keep" and sorted(p.name for p in res.iterdir()) == ["claims.json"]
    (res / "claims.json").unlink()
    assert report.write_results(res, []) == [res / "claims.json", res / "claims.csv"]
    assert report.read_claims(res) == [] and not (res / "claims.json").is_symlink()

    figs = tmp_path / "figs"
    figs.mkdir()
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    (figs / "f.pdf").symlink_to(victim)  # the second file: the first must not be written either
    with pytest.raises(gio.OutputPathError, match="f.pdf: it is a symbolic link"):
        style.save_figure(fig, "f", caption="c", out_dir=figs)
    assert victim.read_text() == "keep" and sorted(p.name for p in figs.iterdir()) == ["f.pdf"]
    (figs / "f.pdf").unlink()
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    style.save_figure(fig, "f", caption="c", out_dir=figs)
    assert (figs / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (figs / "f.pdf").read_bytes()[:5] == b"%PDF-"

    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "demo.json").symlink_to(victim)
    argv = ["--seeds", "1", "--out", str(demo), "--no-progress"]
    capsys.readouterr()
    assert demo_main(argv) == 2
    _one_error_line(capsys.readouterr().err, "refusing to write", "demo.json", "symbolic link")
    assert victim.read_text() == "keep" and sorted(p.name for p in demo.iterdir()) == ["demo.json"]


def test_hold_lock_excludes_a_second_holder_until_released(tmp_path):
    """gapdyn.io.hold_lock, the project's one lock: a second open of the same file (its own open file description,
    as another process would have) cannot take the lock while the first holds it, and can after release."""
    from gapdyn.io import hold_lock

    p = tmp_path / "cell.lock"
    with hold_lock(p) as first:
        with hold_lock(p, wait=False) as second:
            assert first is True and second is False
    with hold_lock(p, wait=False) as again:
        assert again is True
