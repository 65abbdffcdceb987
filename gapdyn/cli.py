"""The ``gapdyn`` command: discovers the subcommands that installed packages register and dispatches.

A package adds a subcommand through the entry-point group ``gapdyn.commands`` of its pyproject.toml
(``<name> = "<package>.cli:main"``); the target is a ``main(argv) -> int``. This module knows no
subcommand by name, so the theory core never imports its siblings.

A ValueError or OSError escaping a subcommand prints one line and exits with code 2; set
GAPDYN_DEBUG=1 for the traceback. A subcommand whose package cannot be imported (a missing extra)
says which install brings it. SIGINT / SIGTERM at any moment, imports included, end the command with one line
``gapdyn <command>: interrupted by SIGINT`` and exit 130 / 143 (gapdyn.cmdline).

Standard library only: ``gapdyn --help`` reads each subcommand's summary from its source file without importing
its package, and a subcommand's module is imported only when it runs.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .cmdline import EXIT_SIGINT, EXIT_SIGTERM, Terminated, _raise_terminated, error_line, stop_children

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["GROUP", "commands", "main"]

GROUP = "gapdyn.commands"

_EXTRAS = {"torch": "llm", "transformers": "llm", "trl": "llm", "tokenizers": "llm", "accelerate": "llm",
           "ray": "cluster"}
"""Top-level module of a missing dependency -> the extra of pyproject.toml that installs it."""


def checkout_entry_points(group: str) -> dict[str, EntryPoint]:
    """An entry-point group as declared by the pyproject.toml of a source checkout this package runs from
    (so a checkout on PYTHONPATH whose installed metadata is older still sees its own entries)."""
    from importlib.metadata import EntryPoint  # here, not at the top: the console script starts before main()
    # installs the signal handling, and importlib.metadata is the slowest import on that path

    path = Path(__file__).resolve().parents[1] / "pyproject.toml"
    if not path.is_file():
        return {}
    try:
        import tomllib

        table = tomllib.loads(path.read_text(encoding="utf-8"))["project"]["entry-points"][group]
    except (ImportError, KeyError, TypeError, ValueError, OSError):
        return {}
    return {name: EntryPoint(name, value, group) for name, value in table.items()}


def commands() -> dict[str, EntryPoint]:
    """The registered subcommands, by name (sorted): the installed entry points of group
    ``gapdyn.commands``, updated by the declaration of the source checkout when there is one."""
    from importlib.metadata import entry_points

    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    found.update(checkout_entry_points(GROUP))
    return dict(sorted(found.items()))


def _source_file(module: str) -> Path | None:
    """The .py file of ``module`` (dotted), found without importing it or its parent packages (a package that
    imports torch at its top would cost seconds); None when it is not installed."""
    import importlib.util

    top, *rest = module.split(".")
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: located, not imported
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not rest:
        return Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    for location in spec.submodule_search_locations or ():
        for candidate in (Path(location, *rest[:-1], rest[-1] + ".py"), Path(location, *rest, "__init__.py")):
            if candidate.is_file():
                return candidate
    return None


def _summary(ep: EntryPoint) -> str:
    """The first docstring line of the target module, read from its source without importing it."""
    path = _source_file(ep.value.split(":")[0])
    if path is None:
        return ""
    import ast

    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    except (OSError, SyntaxError, ValueError):
        return ""
    first = doc.strip().splitlines()[0] if doc.strip() else ""
    return re.sub(r"^``[^`]*``:\s*", "", first).replace("``", "")


def _usage() -> str:
    lines = ["usage: gapdyn <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {_summary(ep)}" for name, ep in commands().items()]
    lines += ["", "Run `gapdyn <command> --help` for a command's options. Every command writes under",
              "./gapdyn_out/<command>/ of the working directory unless given --out DIR."]
    return "\n".join(lines)


def _missing_extra(exc: ImportError) -> str:
    top = (getattr(exc, "name", None) or "").split(".")[0]
    extra = _EXTRAS.get(top, "all")
    return f"pip install 'gapdyn[{extra}]'"


def _exit_now(signum, frame):
    os._exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``gapdyn``: dispatch to the subcommand; returns the exit code. SIGINT / SIGTERM before the
    subcommand takes them over (while its modules import) end it here: one line, exit 130 / 143."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: leave the signals alone
        previous = None
    previous_int = signal.getsignal(signal.SIGINT)
    try:
        return _dispatch(argv)
    except (KeyboardInterrupt, Terminated) as exc:
        if os.environ.get("GAPDYN_DEBUG"):
            raise
        if previous is not None:  # a second signal during the clean-up ends the process at once
            signal.signal(signal.SIGINT, _exit_now)
            signal.signal(signal.SIGTERM, _exit_now)
        name, code = ("SIGINT", EXIT_SIGINT) if isinstance(exc, KeyboardInterrupt) else ("SIGTERM", EXIT_SIGTERM)
        stop_children()
        command = f"gapdyn {argv[0]}" if argv and not argv[0].startswith("-") else "gapdyn"
        print(f"{command}: interrupted by {name}", file=sys.stderr, flush=True)
        return code
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    registered = commands()
    if name not in registered:
        known = ", ".join(registered) or "none (is gapdyn installed? pip install -e .)"
        from .cmdline import did_you_mean

        print(f"gapdyn: unknown command {name!r}; {did_you_mean(name, registered)}commands: {known}", file=sys.stderr)
        return 2
    try:
        func = registered[name].load()
    except ImportError as exc:
        print(f"gapdyn {name}: needs a dependency that is not installed ({exc}); {_missing_extra(exc)}",
              file=sys.stderr)
        return 2
    try:
        result = func(rest)
    except ModuleNotFoundError as exc:  # an extra imported lazily inside the command
        if os.environ.get("GAPDYN_DEBUG"):
            raise
        print(f"gapdyn {name}: needs a dependency that is not installed ({exc}); {_missing_extra(exc)}",
              file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:
        # Bad input reaching a library's boundary check (a ValueError naming the argument) or the file system.
        if os.environ.get("GAPDYN_DEBUG"):
            raise
        print(f"gapdyn {name}: error: {error_line(exc)}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
