"""Read-only file systems and failing writes: a finished store is only read (a rerun on a read-only copy succeeds
and changes no byte), every write that the file system refuses is one line naming the file with exit 1, a refused
command leaves no empty output folder, $GAPDYN_WARM_CACHE naming a file is one line, and train.lock is removed
while still locked (a process that locked the removed file finds out and opens it again).

The read-only rows mount a tmpfs and remount it read-only (root only; skipped with the reason elsewhere)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import gapdyn.io as gio
from gapdyn.evidence.sweep import example_cell, run_sweep
from llm_probe.checkpoint import LOCK_NAME, RunFolderLockedError, lock_run_folder

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def read_only(tmp_path):
    """``fill(path)`` copies ``path`` (a folder or nothing) into a fresh tmpfs and remounts it read-only; returns
    the mount point. Root only (mount); skipped where mount is refused."""
    mounts = []

    def fill(src: Path | None = None) -> Path:
        d = tmp_path / f"ro{len(mounts)}"
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(d)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {r.stderr.strip()}")
        mounts.append(d)
        if src is not None:
            shutil.copytree(src, d, dirs_exist_ok=True)
        (d / "empty").mkdir()
        r = subprocess.run(["mount", "-o", "remount,ro", str(d)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return d

    yield fill
    for d in mounts:
        subprocess.run(["umount", str(d)], check=False)


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).digest() for p in sorted(d.rglob("*")) if p.is_file()}


def _one_line(err: str, *words: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


CELLS = [{"seed": s, "n": 3} for s in range(4)]


def test_a_finished_store_is_only_read(tmp_path, read_only):
    """A finished sweep store copied onto a read-only file system: run_sweep loads every cell and returns the same
    frame, no file written (formerly a WriteError rewriting results.parquet); a changed result is still refused."""
    done = run_sweep(example_cell, CELLS, name="s", store=tmp_path / "store", backend="serial", progress=False)
    ro = read_only(tmp_path / "store")
    before = _tree(ro)
    again = run_sweep(example_cell, CELLS, name="s", store=ro, backend="serial", progress=False)
    assert again.attrs["n_loaded"] == len(CELLS) and again.attrs["n_computed"] == 0
    pd.testing.assert_frame_equal(again, done)
    assert _tree(ro) == before
    with pytest.raises(gio.WriteError, match="results.parquet: Read-only file system"):
        run_sweep(example_cell, CELLS[:3], name="s", store=ro, backend="serial", progress=False)


def test_writers_leave_an_identical_file_alone(tmp_path, read_only):
    """Each writer of gapdyn.io on a read-only file holding its exact content returns without writing; other
    content is a WriteError naming the file (exit 1 at the command line)."""
    from gapdyn.cmdline import exit_code

    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    df.attrs["how"] = "computed"  # pandas attrs (a DataFrame's provenance) do not count as content
    src = tmp_path / "src"
    src.mkdir()
    writers = {
        "f.bin": (lambda p, v: gio.atomic_write_bytes(p, b"data%d" % v)),
        "f.txt": (lambda p, v: gio.atomic_write_text(p, f"text{v}")),
        "f.json": (lambda p, v: gio.atomic_write_json(p, {"v": v})),
        "f.parquet": (lambda p, v: gio.write_parquet(p, df.assign(a=[v, 2]))),
        "f.csv": (lambda p, v: gio.write_with(p, lambda tmp: df.assign(a=[v, 2]).to_csv(tmp, index=False))),
    }
    for name, w in writers.items():
        w(src / name, 1)
    ro = read_only(src)
    before = _tree(ro)
    df.attrs["how"] = "loaded"
    for name, w in writers.items():
        w(ro / name, 1)
        with pytest.raises(gio.WriteError) as e:
            w(ro / name, 2)
        assert str(ro / name) in str(e.value) and "Read-only file system" in str(e.value)
        assert exit_code(e.value) == 1
    assert _tree(ro) == before


def test_folders_on_a_read_only_file_system(tmp_path, read_only):
    """make_folder / check_writable_folder: WriteError naming the folder; a file in the way: OutputPathError;
    output_folder removes the folders it made when its block fails, never one that existed."""
    ro = read_only()
    with pytest.raises(gio.WriteError, match=f"cannot create output folder {ro / 'new' / 'x'}: Read-only"):
        gio.make_folder(ro / "new" / "x")
    with pytest.raises(gio.WriteError, match=f"cannot write in output folder {ro / 'empty'}: Read-only"):
        gio.check_writable_folder(ro / "empty")
    (tmp_path / "file").write_text("x")
    with pytest.raises(gio.OutputPathError, match="is an existing file"):
        gio.make_folder(tmp_path / "file" / "sub")
    (tmp_path / "kept").mkdir()
    with pytest.raises(ValueError, match="refused"):
        with gio.output_folder(tmp_path / "kept" / "a" / "b"):
            raise ValueError("refused")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == []
    with pytest.raises(ValueError, match="refused"):
        with gio.output_folder(tmp_path / "kept" / "c"):
            (tmp_path / "kept" / "c" / "partial").write_text("x")
            raise ValueError("refused")
    assert (tmp_path / "kept" / "c" / "partial").exists()  # not empty: kept


def _cli(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gapdyn.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
                                            **(env or {})})


def test_commands_on_a_read_only_out(tmp_path, read_only):
    """`gapdyn bandit run` (an empty folder there) and `gapdyn train` (a folder to create there) with --out on a
    read-only file system: exit 1, one line naming the folder, before any work (formerly exit 2 with a raw
    '[Errno 30]'; train only after its warm-up). `gapdyn train` into an existing read-only folder: the rows of
    the folder functions above (check_writable_folder)."""
    ro = read_only()
    r = _cli(["bandit", "run", "threshold", "--mode", "test", "--backend", "serial", "--no-progress", "--out",
              str(ro / "empty")], tmp_path)
    assert r.returncode == 1, r
    _one_line(r.stderr, "gapdyn bandit: error: cannot create result store folder", str(ro / "empty"), "Read-only")
    r = _cli(["train", "--out", str(ro / "new"), "--steps", "1", "--no-progress"], tmp_path)
    assert r.returncode == 1 and r.stdout == "", r
    _one_line(r.stderr, f"gapdyn train: error: cannot create --out folder {ro / 'new'}: Read-only file system")
    for argv, work in ((["demo", "--seeds", "1"], "arm log-linear bandit"),  # its first line of work
                       (["figs", "--mode", "test", "--only", "fig1"], "sweep store")):
        for target in (ro / "new", ro / "empty"):
            r = _cli([*argv, "--no-progress", "--out", str(target)], tmp_path)
            assert r.returncode == 1 and work not in r.stdout, (argv, target, r)  # refused before any work
            _one_line(r.stderr, str(target), "Read-only file system")


def test_a_warm_cache_setting_naming_a_file(tmp_path, monkeypatch):
    """$GAPDYN_WARM_CACHE naming a file: warm_root raises one ValueError naming the variable; `gapdyn train`
    exits 2 with that one line and no output folder (formerly '[Errno 17] File exists')."""
    from llm_probe.warmup import warm_root

    f = tmp_path / "cache-file"
    f.write_text("x")
    monkeypatch.setenv("GAPDYN_WARM_CACHE", str(f))
    with pytest.raises(ValueError, match=r"\$GAPDYN_WARM_CACHE must be a folder, but .*cache-file is an existing"):
        warm_root()
    r = _cli(["train", "--out", str(tmp_path / "out"), "--steps", "1", "--no-progress"], tmp_path,
             {"GAPDYN_WARM_CACHE": str(f)})
    assert r.returncode == 2 and r.stdout == "", r
    _one_line(r.stderr, "$GAPDYN_WARM_CACHE must be a folder", str(f))
    assert not (tmp_path / "out").exists()


# ---- train.lock ---------------------------------------------------------------------------------------------


def test_the_lock_file_is_removed_when_the_run_ends(tmp_path):
    """lock_run_folder removes train.lock on the way out, also after an exception (formerly left after every
    run); a lock file left by a killed holder (no lock on it) is locked, then removed, by the next run."""
    with lock_run_folder(tmp_path) as path:
        assert path.read_text().strip() == str(os.getpid())
    assert not (tmp_path / LOCK_NAME).exists()
    with pytest.raises(KeyError):
        with lock_run_folder(tmp_path):
            raise KeyError("x")
    assert not (tmp_path / LOCK_NAME).exists()
    (tmp_path / LOCK_NAME).write_text("999999999\n")  # a holder that died: the file stays, unlocked
    with lock_run_folder(tmp_path):
        pass
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_lock_on_a_removed_file_is_not_a_lock(tmp_path, monkeypatch):
    """The race the removal opens: a process opened train.lock, the holder removed it and a third process made a
    new train.lock and locked it, then the first process's flock succeeds on the removed file. lock_run_folder
    re-checks the inode after locking, opens again, and is refused by the third process's lock (without the
    re-check both would write the folder)."""
    third = {}
    real_flock = fcntl.flock

    def racing_flock(fd, op):
        if not third:  # between our open and our flock: the holder removes the file, a third process locks anew
            os.unlink(tmp_path / LOCK_NAME)
            third["f"] = open(tmp_path / LOCK_NAME, "w")
            real_flock(third["f"].fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", racing_flock)
    try:
        with pytest.raises(RunFolderLockedError, match="being written by another process"):
            with lock_run_folder(tmp_path):
                pass
        assert (tmp_path / LOCK_NAME).exists()  # the third process's file, untouched by the refused opener
    finally:
        third["f"].close()


def test_a_lock_file_the_file_system_refuses(tmp_path, read_only):
    ro = read_only()
    with pytest.raises(gio.WriteError, match=f"cannot write the lock file {ro / 'empty' / LOCK_NAME}: Read-only"):
        with lock_run_folder(ro / "empty"):
            pass
