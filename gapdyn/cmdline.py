"""What every ``gapdyn`` subcommand shares: parsing, output folders, name look-up and error reporting.

Conventions (docs in README.md, "Command line"):

- options are parsed by tyro from a config dataclass with a docstring under each field;
- the shared flags are ``--mode test|quick|full``, ``--jobs N``, ``--out DIR``, ``--progress/--no-progress``
  and ``--seed``, each where it applies;
- a command writes under ``./gapdyn_out/<command>/`` of the working directory unless ``--out DIR`` is
  given, and says where at the start; sweep caches shared between commands live in ``./gapdyn_out/store``;
- a bad value ends as one line ``gapdyn <command>: error: ...`` on stderr and exit code 2
  (``GAPDYN_DEBUG=1`` shows the traceback).

Standard library only at import time (tyro is imported when a command parses), so ``import gapdyn``
stays light.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import sys
from pathlib import Path
from typing import Callable, Iterable, Literal

__all__ = ["Mode", "MODES", "OUT_ROOT", "UsageError", "command", "parse", "output_dir", "resolve_name",
           "check_jobs", "say"]

MODES = ("test", "quick", "full")
Mode = Literal["test", "quick", "full"]
OUT_ROOT = "gapdyn_out"
"""Folder, relative to the working directory, under which every command writes by default."""


class UsageError(ValueError):
    """A malformed command line (reported as one line, exit code 2)."""


_BOX = re.compile(r"[│╭╮╰╯─]+")


def _one_line(text: str) -> str:
    """The first message of a tyro error box, as one line."""
    lines = []
    for raw in text.splitlines()[1:]:  # line 0 is the box title
        line = _BOX.sub(" ", raw).strip()
        if not line and lines or "helptext" in line:
            break
        if line:
            lines.append(line)
    msg = " ".join(lines) or _BOX.sub(" ", text).strip() or "invalid arguments"
    return re.sub(r"^Error parsing [\w.]+: ", "", msg)


def parse(cls, argv: Iterable[str], prog: str, description: str | None = None):
    """Parse ``argv`` into the dataclass ``cls`` with tyro; a parse error raises :class:`UsageError`."""
    import tyro

    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            return tyro.cli(cls, args=list(argv), prog=prog, description=description)
    except SystemExit as exc:
        if exc.code in (0, None):  # --help
            raise
        raise UsageError(_one_line(buf.getvalue())) from None


def command(prog: str) -> Callable:
    """Decorator for a subcommand's ``main(argv) -> int``: argv defaults to sys.argv[1:]; a UsageError,
    ValueError or OSError prints ``<prog>: error: <message>`` on stderr and returns 2."""

    def deco(fn):
        @functools.wraps(fn)
        def main(argv: list[str] | None = None) -> int:
            argv = list(sys.argv[1:] if argv is None else argv)
            try:
                return int(fn(argv) or 0)
            except SystemExit as exc:  # --help
                return exc.code if isinstance(exc.code, int) else 0
            except (ValueError, OSError) as exc:
                if os.environ.get("GAPDYN_DEBUG"):
                    raise
                print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
                return 2

        return main

    return deco


def output_dir(command: str, out: str | os.PathLike | None, *, announce: bool = True) -> Path:
    """``out`` or ``./gapdyn_out/<command>``; refuses an existing non-folder; prints it when announce."""
    path = Path(out) if out not in (None, "") else Path.cwd() / OUT_ROOT / command
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out must be a folder, but {path} is an existing file")
    if announce:
        say(command, f"writing under {path.resolve()}")
    return path


def resolve_name(name: str, choices: Iterable[str], what: str) -> str:
    """``name`` itself, the one choice it is a prefix of, or the choice named ``<name>_...``
    (``fig1`` -> ``fig1_phase_diagram``); a ValueError listing the choices otherwise."""
    choices = tuple(choices)
    if name in choices:
        return name
    hits = [c for c in choices if c.startswith(name)] if name else []
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise ValueError(f"ambiguous {what} {name!r} (matches {hits}); choose from {list(choices)}")
    raise ValueError(f"unknown {what} {name!r}; choose from {list(choices)}")


def check_jobs(jobs: int) -> int:
    """``--jobs``: a positive integer, or -1 for all cores."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs == 0 or jobs < -1:
        raise ValueError(f"--jobs must be a positive integer or -1 (all cores), got {jobs!r}")
    return jobs


def say(command: str, text: str) -> None:
    """One status line ``[gapdyn <command>] text`` on stdout."""
    print(f"[gapdyn {command}] {text}", flush=True)
