"""A file-system error ending a command is one line naming the path (gapdyn.cmdline.error_line), and
``gapdyn bandit run`` makes its output folder as every command does (gapdyn.io.make_folder).

The system's OSError reads ``[Errno 13] Permission denied: 'x'``; a command prints ``Permission denied: x``: the path
without the raw errno prefix, exit 2 for a bad path and 1 for a failing write (gapdyn.cmdline.exit_code). Real
errors of the system (opening a folder, a file under a missing folder) are compared with the errno's own text
(``os.strerror``), an independent route to the words.
"""

from __future__ import annotations

import errno
import os
import types

import pytest

from gapdyn import io as gio
from gapdyn.cmdline import command, error_line


@command("gapdyn probe")
def _raises(argv):
    raise argv[0]


@command("gapdyn probe")
def _opens(argv):
    with open(argv[0], "w"):
        pass


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


CASES = [  # (exception, its line after "gapdyn probe: error: ", exit code)
    (PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/data/out/claims.json"),
     f"{os.strerror(errno.EACCES)}: /data/out/claims.json", 2),
    (OSError(errno.EROFS, os.strerror(errno.EROFS), "/ro/out"), f"{os.strerror(errno.EROFS)}: /ro/out", 1),
    (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/full/results.parquet"),
     f"{os.strerror(errno.ENOSPC)}: /full/results.parquet", 1),
    (OSError(errno.EXDEV, os.strerror(errno.EXDEV), "/a/x.tmp", None, "/b/x"),
     f"{os.strerror(errno.EXDEV)}: /a/x.tmp -> /b/x", 2),
    (OSError(errno.EIO, os.strerror(errno.EIO)), f"{os.strerror(errno.EIO)}: no path given (EIO)", 1),
    (gio.WriteError(errno.ENOSPC, "cannot write /full/x.json: No space left on device", "/full/x.json"),
     "cannot write /full/x.json: No space left on device", 1),
    (FileExistsError("refusing: /x is in the way"), "refusing: /x is in the way", 2),  # a message of ours: kept
]


@pytest.mark.parametrize("exc, line, code", CASES, ids=[type(c[0]).__name__ + "-" + str(c[0].errno) for c in CASES])
def test_an_os_error_is_one_line_naming_the_path(exc, line, code, capsys):
    assert _raises([exc]) == code
    said = _one_line(capsys.readouterr().err)
    assert said == f"gapdyn probe: error: {line}", said
    assert "[Errno" not in said


def test_real_system_errors_name_the_path(tmp_path, capsys):
    """The system's own OSErrors: writing to a folder, and to a file under a missing folder (exit 2: bad paths)."""
    folder, missing = tmp_path, tmp_path / "no" / "such" / "file.json"
    assert _opens([str(folder)]) == 2
    assert _one_line(capsys.readouterr().err) == f"gapdyn probe: error: {os.strerror(errno.EISDIR)}: {folder}"
    assert _opens([str(missing)]) == 2
    assert _one_line(capsys.readouterr().err) == f"gapdyn probe: error: {os.strerror(errno.ENOENT)}: {missing}"


def test_the_dispatcher_uses_the_same_line(capsys, monkeypatch):
    """gapdyn.cli.main's own guard (a subcommand without the `command` wrapper) prints the same line."""
    import gapdyn.cli as cli

    exc = PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/data/x")
    monkeypatch.setattr(cli, "commands", lambda: {"bare": types.SimpleNamespace(load=lambda: _bare)})

    def _bare(argv):
        raise exc

    assert cli.main(["bare"]) == 2
    assert _one_line(capsys.readouterr().err) == f"gapdyn bare: error: {error_line(exc)}"


# --- gapdyn bandit run: the output folder --------------------------------------------------------------------


@pytest.fixture
def planted_experiment(monkeypatch, tmp_path):
    """A registered experiment `planted` whose run calls ``on_run(store)`` and returns nothing usable: the command
    fails at its output folder or not at all (then at the result)."""
    import bandits.experiments as E

    hooks = {}

    class Config:
        @classmethod
        def quick(cls):
            return cls()

    def run(config, *, store, backend, n_jobs, progress):
        hooks["on_run"](store)
        return None

    module = types.SimpleNamespace(__name__="planted", Config=Config, run=run,
                                   EXPERIMENT=types.SimpleNamespace(name="planted"))
    monkeypatch.setitem(E.EXPERIMENTS, "planted", "planted")
    monkeypatch.setattr(E, "load", lambda name: module if name == "planted" else pytest.fail(name))
    monkeypatch.chdir(tmp_path)
    return hooks


def test_bandit_run_output_folder_with_a_file_in_the_way(planted_experiment, tmp_path, capsys):
    """A file appearing at <out>/<experiment>-<mode> during the sweep: exit 2, the line make_folder gives for it
    (formerly the raw '[Errno 17] File exists')."""
    from bandits.cli import main

    store = tmp_path / "store"
    target = store / "planted-quick"
    planted_experiment["on_run"] = lambda s: (s.mkdir(parents=True), target.write_text("in the way"))
    assert main(["run", "planted", "--out", str(store), "--backend", "serial"]) == 2
    said = _one_line(capsys.readouterr().err)
    with pytest.raises(gio.OutputPathError) as same:
        gio.make_folder(target)
    assert said == f"gapdyn bandit: error: {same.value}" and str(target) in said
    assert target.read_text() == "in the way"


def test_bandit_run_output_folder_on_a_read_only_file_system(planted_experiment, tmp_path, capsys, monkeypatch):
    """mkdir refused with EROFS (injected at os.mkdir, as a read-only mount gives it): exit 1, one line naming the
    folder, as make_folder says it (formerly the raw '[Errno 30] Read-only file system')."""
    from bandits.cli import main

    store = tmp_path / "store"
    target = store / "planted-quick"
    real_mkdir = os.mkdir

    def read_only(path, *a, **k):
        if os.fspath(path) == os.fspath(target):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
        return real_mkdir(path, *a, **k)

    planted_experiment["on_run"] = lambda s: monkeypatch.setattr(os, "mkdir", read_only)
    assert main(["run", "planted", "--out", str(store), "--backend", "serial"]) == 1
    said = _one_line(capsys.readouterr().err)
    with pytest.raises(gio.WriteError) as same:
        gio.make_folder(target)
    assert said == f"gapdyn bandit: error: {same.value}" and str(target) in said and "[Errno" not in said
    assert not target.exists()
