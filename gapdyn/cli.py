"""The ``gapdyn`` command: discovers the subcommands that installed packages register and dispatches.

A package adds a subcommand through the entry-point group ``gapdyn.commands`` of its pyproject.toml
(``<name> = "<package>.cli:main"``); the target is a ``main(argv) -> int``. This module knows no
subcommand by name, so the theory core never imports its siblings.

A ValueError or OSError escaping a subcommand prints one line and exits with code 2; set
GAPDYN_DEBUG=1 for the traceback. A subcommand whose package cannot be imported (a missing extra)
says which install brings it.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from importlib.metadata import EntryPoint, entry_points

__all__ = ["GROUP", "commands", "main"]

GROUP = "gapdyn.commands"

_EXTRAS = {"torch": "llm", "transformers": "llm", "trl": "llm", "tokenizers": "llm", "accelerate": "llm",
           "ray": "cluster"}
"""Top-level module of a missing dependency -> the extra of pyproject.toml that installs it."""


def checkout_entry_points(group: str) -> dict[str, EntryPoint]:
    """An entry-point group as declared by the pyproject.toml of a source checkout this package runs from
    (so a checkout on PYTHONPATH whose installed metadata is older still sees its own entries)."""
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
    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    found.update(checkout_entry_points(GROUP))
    return dict(sorted(found.items()))


def _summary(ep: EntryPoint) -> str:
    """The first docstring line of the target module, without importing it when it is not installed."""
    import importlib.util

    module = ep.value.split(":")[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return ""
    import ast

    try:
        doc = ast.get_docstring(ast.parse(open(spec.origin, encoding="utf-8").read())) or ""
    except (OSError, SyntaxError):
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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    registered = commands()
    if name not in registered:
        known = ", ".join(registered) or "none (is gapdyn installed? pip install -e .)"
        print(f"gapdyn: unknown command {name!r}; commands: {known}", file=sys.stderr)
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
        print(f"gapdyn {name}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
