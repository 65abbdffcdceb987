"""What every ``gapdyn`` subcommand shares: parsing, output folders, name look-up and error reporting.

Conventions (docs in README.md, "Command line"):

- options are parsed by tyro from a config dataclass with a docstring under each field; a setting whose
  ``None`` means "not given" shows the other type's metavar in help (``--out STR``, not tyro's ``{None}|STR``; the
  registry of :func:`parse`), and :func:`optional` names it (``--out DIR``) and drops ``(default: None)``;
- the shared flags are ``--mode test|quick|full``, ``--jobs N``, ``--out DIR``, ``--progress/--no-progress``
  and ``--seed``, each where it applies;
- a command writes under ``./gapdyn_out/<command>/`` of the working directory unless ``--out DIR`` is
  given, and says where at the start; sweep caches shared between commands live in ``./gapdyn_out/store``;
- exit codes: 0 done; 2 bad input or settings (a ValueError, a UsageError, an OSError of a bad path such
  as a file where a folder is needed), one line ``gapdyn <command>: error: ...`` on stderr; 1 a failing
  write to a valid path (:class:`gapdyn.io.WriteError`, or an OSError of a full disk / quota / I/O error),
  one line naming the file; 130 on SIGINT and 143 on SIGTERM, one line ``gapdyn <command>: interrupted
  by SIGINT ...`` with what the command registered through :func:`on_interrupt` (where its last
  checkpoint is, how to resume), after every child process it started has been stopped
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
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Literal

__all__ = ["Mode", "MODES", "OUT_ROOT", "UsageError", "Terminated", "command", "parse", "output_dir", "resolve_name",
           "did_you_mean",
           "check_jobs", "one_blas_thread", "say", "on_interrupt", "folder_setting", "optional", "exit_code", "error_line",
           "EXIT_BAD_INPUT", "EXIT_WRITE_FAILED", "EXIT_SIGINT",
           "EXIT_SIGTERM"]

EXIT_BAD_INPUT = 2
EXIT_WRITE_FAILED = 1
EXIT_SIGINT = 128 + signal.SIGINT  # 130, the shell's convention
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143

MODES = ("test", "quick", "full")
Mode = Literal["test", "quick", "full"]
OUT_ROOT = "gapdyn_out"
"""Folder, relative to the working directory, under which every command writes by default."""


class UsageError(ValueError):
    """A malformed command line (reported as one line, exit code 2)."""


class Terminated(BaseException):
    """SIGTERM, raised in the main thread by :func:`command` (a BaseException, like KeyboardInterrupt)."""


def exit_code(exc: BaseException) -> int:
    """The exit code of an exception ending a command (module doc): 1 for a failing write, 2 for bad input."""
    from gapdyn.io import WRITE_FAILURE_ERRNOS, WriteError

    if isinstance(exc, WriteError) or (isinstance(exc, OSError) and exc.errno in WRITE_FAILURE_ERRNOS):
        return EXIT_WRITE_FAILED
    return EXIT_BAD_INPUT


def error_line(exc: BaseException) -> str:
    """The one line a command prints for ``exc``: its message on one line; an OSError raised by the system
    (``[Errno 13] Permission denied: 'x'``) as ``Permission denied: x`` (``a -> b`` for a rename), the path named
    without the raw errno prefix (the errno's name where the system gave no path)."""
    if (isinstance(exc, OSError) and exc.strerror and str(exc).startswith("[Errno ")
            and str(exc) == OSError.__str__(exc)):  # the system's own rendering, not a message of ours
        import errno

        paths = [os.fsdecode(p) for p in (exc.filename, exc.filename2) if p is not None]
        where = " -> ".join(paths) if paths else f"no path given ({errno.errorcode.get(exc.errno, exc.errno)})"
        text = f"{exc.strerror}: {where}"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


_HINTS: list[Callable[[], str]] = []


def on_interrupt(hint: Callable[[], str] | str) -> None:
    """Register what an interrupted command says after ``interrupted by SIGINT;`` (a text, or a function called
    then: where the last checkpoint is, the command that resumes); the last registration of the command wins."""
    _HINTS.append(hint if callable(hint) else (lambda: hint))


def _descendants(pid: int) -> list[int]:
    """Pids of every live descendant of ``pid`` (Linux /proc; empty elsewhere), children first."""
    parents: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[0] != "Z":
            parents[int(e)] = int(fields[1])
    out, frontier = [], [pid]
    while frontier:
        kids = [c for c, p in parents.items() if p in frontier and c not in out]
        out += kids
        frontier = kids
    return out


def stop_children(grace: float = 3.0) -> None:
    """SIGTERM every descendant of this process, then SIGKILL what is left after ``grace`` seconds."""
    kids = _descendants(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for k in kids:
            try:
                os.kill(k, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace
        while kids and time.monotonic() < deadline:
            time.sleep(0.05)
            kids = [k for k in kids if _alive(k)]
        if not kids:
            return


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().decode(errors="replace").rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _raise_terminated(signum, frame):
    raise Terminated()


_BOX = re.compile(r"[│╭╮╰╯─]+")


def _one_line(text: str) -> str:
    """The first message of a tyro error box, as one line (the box drawn in Unicode, or in ASCII dashes and spaces
    where the output stream is not a UTF-8 terminal: a captured or redirected stderr)."""
    lines = []
    for raw in text.splitlines()[1:]:  # line 0 is the box title
        line = _BOX.sub(" ", raw).strip()
        if set(line) <= {"-"}:  # a rule of the ASCII box, like an empty line of the Unicode one
            line = ""
        if not line and lines or "helptext" in line:
            break
        if line:
            lines.append(line)
    msg = " ".join(lines) or _BOX.sub(" ", text).strip() or "invalid arguments"
    return re.sub(r"^Error parsing [\w.]+: ", "", msg)


def optional(metavar: str, default: str = ""):
    """The tyro marker of an optional setting whose ``None`` means "not given": its help line reads
    ``--flag METAVAR  <doc> (default: <default>)`` (no default text when ``default`` is empty) instead of
    ``--flag {None}|STR ... (default: None)``. Use as ``out: Annotated[str | None, optional("FILE")] = None``."""
    import tyro

    return tyro.conf.arg(metavar=metavar, help_behavior_hint=f"(default: {default})" if default else "")


_REGISTRY = None


def _registry():
    """A tyro registry whose one rule shows an optional setting (``X | None``) with X's metavar alone: tyro's own
    union rule builds the spec (parsing, ``None`` still accepted), only its ``{None}|`` prefix is dropped."""
    global _REGISTRY
    if _REGISTRY is not None:
        return _REGISTRY
    import dataclasses

    from tyro.constructors import ConstructorRegistry, PrimitiveConstructorSpec

    reg, inside = ConstructorRegistry(), [False]

    @reg.primitive_rule
    def optional_metavar(info):
        if inside[0] or type(None) not in getattr(info.type, "__args__", ()):
            return None
        inside[0] = True
        try:
            spec = ConstructorRegistry.get_primitive_spec(info)
        finally:
            inside[0] = False
        if not isinstance(spec, PrimitiveConstructorSpec) or not spec.metavar.startswith("{None}|"):
            return spec
        rest = spec.metavar[len("{None}|"):]
        if rest.startswith("{") and rest.endswith("}") and " " in rest:  # {INT [INT ...]}: tyro's braces of a union
            rest = rest[1:-1]
        return dataclasses.replace(spec, metavar=rest)

    _REGISTRY = reg
    return reg


def parse(cls, argv: Iterable[str], prog: str, description: str | None = None):
    """Parse ``argv`` into the dataclass ``cls`` with tyro; a parse error raises :class:`UsageError`."""
    import tyro

    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            return tyro.cli(cls, args=list(argv), prog=prog, description=description, registry=_registry())
    except SystemExit as exc:
        if exc.code in (0, None):  # --help
            raise
        msg = _flag_of_field(_name_the_option(_one_line(buf.getvalue()), list(argv)), cls)
        near = _perhaps_meant(buf.getvalue())
        if near and msg.startswith("Unrecognized option"):
            msg += f"; did you mean {' or '.join(near)}?"
        raise UsageError(msg) from None
    except ValueError as exc:  # a range check of a nested setting's dataclass names its field, not its flag
        raise ValueError(_flag_of_field(str(exc), cls)) from None


def _perhaps_meant(text: str) -> list[str]:
    """The flags of tyro's "Perhaps you meant:" section of an error box (``--seeds``, ``--progress``), in order."""
    lines = [_BOX.sub(" ", raw).strip() for raw in text.splitlines()]
    if "Perhaps you meant:" not in lines:
        return []
    flags = []
    for line in lines[lines.index("Perhaps you meant:") + 1:]:
        if not line or set(line) <= {"-"}:
            break
        if line.startswith("--"):
            flags.append(re.match(r"--[\w.-]+", line).group(0))
    return flags


def _flag_of_field(msg: str, cls) -> str:
    """``msg`` with a leading bare field name of a nested dataclass setting of ``cls`` said as its flag
    (``window must be >= 1`` of ``collapse: CollapseConfig`` -> ``--collapse.window must be >= 1``)."""
    import dataclasses

    m = re.match(r"([a-z]\w*) ", msg)
    if not m or not dataclasses.is_dataclass(cls):
        return msg
    for f in dataclasses.fields(cls):
        sub = f.default_factory  # a nested setting's dataclass is its default factory (field(default_factory=C))
        if (isinstance(sub, type) and dataclasses.is_dataclass(sub)
                and m.group(1) in {g.name for g in dataclasses.fields(sub)}):
            flag = f"--{f.name.replace('_', '-')}.{m.group(1).replace('_', '-')}"
            return flag + msg[m.end(1):]
    return msg


def _name_the_option(msg: str, argv: list[str]) -> str:
    """tyro's ``Unrecognized options: x`` for a stray value, said with the option it was meant for: a switch given a
    value (``--progress=no``: a switch takes none) or a value past an option's count (``--seed 1 2``)."""
    m = re.fullmatch(r"Unrecognized options?: (.+)", msg)
    if not m:
        return msg
    said = []
    for tok in m.group(1).split():
        if tok.startswith("-"):  # an unknown option: tyro's own words name it
            return msg
        for i, arg in reversed(list(enumerate(argv))):  # the last occurrence: a stray value comes late
            if arg.startswith("--") and arg.endswith("=" + tok):
                flag = arg.split("=", 1)[0]
                other = "--" + flag[5:] if flag.startswith("--no-") else "--no-" + flag[2:]
                said.append(f"{flag} is a switch and takes no value (give {flag} or {other}), got {arg}")
                break
            if arg == tok:
                start = next((j for j in range(i - 1, -1, -1) if argv[j].startswith("--")), None)
                if start is None:
                    return msg
                said.append(f"unexpected value {tok!r} after {' '.join(argv[start:i])}")
                break
        else:
            return msg
    return "; ".join(said)


def command(prog: str) -> Callable:
    """Decorator for a subcommand's ``main(argv) -> int``: argv defaults to sys.argv[1:]; exit codes and the
    one line on stderr as in the module doc (a ValueError or bad-path OSError: 2; a failing write: 1; SIGINT /
    SIGTERM: 130 / 143 after stopping the child processes). SIGTERM raises :class:`Terminated` in the main
    thread while the command runs."""

    def deco(fn):
        @functools.wraps(fn)
        def main(argv: list[str] | None = None) -> int:
            argv = list(sys.argv[1:] if argv is None else argv)
            n_hints = len(_HINTS)
            try:
                previous = signal.signal(signal.SIGTERM, _raise_terminated)
            except ValueError:  # not the main thread: leave SIGTERM alone
                previous = None
            try:
                return int(fn(argv) or 0)
            except SystemExit as exc:  # --help
                return exc.code if isinstance(exc.code, int) else 0
            except (KeyboardInterrupt, Terminated) as exc:
                if previous is not None:  # a second SIGTERM during the clean-up ends the process
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                name, code = (("SIGINT", EXIT_SIGINT) if isinstance(exc, KeyboardInterrupt)
                              else ("SIGTERM", EXIT_SIGTERM))
                stop_children()
                hint = ""
                if len(_HINTS) > n_hints:
                    try:
                        hint = _HINTS[-1]()
                    except Exception as err:  # the hint must never hide the interruption
                        hint = f"(no resume hint: {type(err).__name__}: {err})"
                print(f"{prog}: interrupted by {name}" + (f"; {' '.join(hint.split())}" if hint else ""),
                      file=sys.stderr, flush=True)
                return code
            except (ValueError, OSError) as exc:
                if os.environ.get("GAPDYN_DEBUG"):
                    raise
                print(f"{prog}: error: {error_line(exc)}", file=sys.stderr)
                return exit_code(exc)
            finally:
                del _HINTS[n_hints:]
                if previous is not None:
                    signal.signal(signal.SIGTERM, previous)

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


def folder_setting(path: str | os.PathLike, what: str) -> Path:
    """A folder setting (``--store``, ``$GAPDYN_STORE``, ...) as a Path; a ValueError naming ``what`` (exit 2)
    when it names an existing file or lies below one."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise ValueError(f"{what} must be a folder, but {p} is an existing file")
            break
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
    raise ValueError(f"unknown {what} {name!r}; {did_you_mean(name, choices)}choose from {list(choices)}")


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """"did you mean 'x'? " for the one choice closest to a mistyped ``name`` (difflib's similarity ratio >= 0.6,
    against the choice and against its part before the first '_': fig1 of fig1_phase_diagram), else "". Of choices
    equally close, one matched by its whole name wins over those matched by their part only (stagntion: stagnation,
    not stagnation_noisy); two still tied name none (fig9 names none of fig1..fig7)."""
    from difflib import SequenceMatcher

    whole = {c: SequenceMatcher(None, name, c).ratio() for c in choices}
    score = {c: max(whole[c], SequenceMatcher(None, name, c.split("_")[0]).ratio()) for c in whole}
    best = max(score.values(), default=0.0)
    if best < 0.6:
        return ""
    top = [c for c in score if score[c] == best]
    if len(top) > 1:
        top = [c for c in top if whole[c] == best]
    return f"did you mean {top[0]!r}? " if len(top) == 1 else ""


def check_jobs(jobs: int) -> int:
    """``--jobs``: a positive integer, or -1 for all cores."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs == 0 or jobs < -1:
        raise ValueError(f"--jobs must be a positive integer or -1 (all cores), got {jobs!r}")
    return jobs


def one_blas_thread():
    """Context manager: numpy's BLAS at one thread (threadpoolctl) for a command's experiments and figures. Their
    matrices are small and their parallelism is numba's and the worker processes'; OpenBLAS's own spinning
    threads cost 4-10x the CPU time of the stagnation J* searches on a shared machine (BENCHMARKS.md, "The quick
    reproduction"). The caller's setting is restored on exit."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def say(command: str, text: str) -> None:
    """One status line ``[gapdyn <command>] text`` on stdout."""
    print(f"[gapdyn {command}] {text}", flush=True)
