"""The ``gapdyn`` command: one entry point that dispatches to each package's own CLI.

    gapdyn demo        a short theory demo (prints real numbers)
    gapdyn bandit ...  bandit sweeps and experiments       (bandits.cli)
    gapdyn train ...   tiny-Qwen RLVR runs with probes      (llm_probe.cli)
    gapdyn figs ...    regenerate the paper figures         (paper_figs.cli)
    gapdyn reproduce   the quick CPU reproduction: figures + report (paper_figs.reproduce)

A ValueError or OSError escaping a subcommand (bad input caught at a library boundary, a missing or
unusable path) is printed as one line and exits with code 2; set GAPDYN_DEBUG=1 for the traceback.

This module sits on top of the dependency graph (STYLE.md): it imports the other packages lazily,
only when their subcommand runs, so ``import gapdyn`` never imports bandits, llm_probe or torch.
"""

from __future__ import annotations

import importlib
import os
import sys

SUBCOMMANDS = {
    "demo": ("gapdyn.demo", "main", "a short theory demo on a 100-arm bandit"),
    "bandit": ("bandits.cli", "main", "bandit sweeps and experiments"),
    "train": ("llm_probe.cli", "main", "tiny-Qwen RLVR training with gradient-gap probes"),
    "figs": ("paper_figs.cli", "main", "regenerate the paper figures into paper_figs/out/"),
    "reproduce": ("paper_figs.reproduce", "main", "quick CPU reproduction: all figures and the report"),
}


def _usage() -> str:
    lines = ["usage: gapdyn <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {doc}" for name, (_, _, doc) in SUBCOMMANDS.items()]
    lines += ["", "Run `gapdyn <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"gapdyn: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module, func, _ = SUBCOMMANDS[name]
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        print(f"gapdyn {name}: cannot import {module} ({exc}); install the extras: pip install -e '.[all]'", file=sys.stderr)
        return 2
    try:
        result = getattr(mod, func)(rest)
    except (ValueError, OSError) as exc:
        # Bad input reaches the library's boundary checks (ValueError naming the argument) or the file
        # system (missing / unusable paths): a message and exit code 2, not a traceback.
        # GAPDYN_DEBUG=1 re-raises to get the traceback.
        if os.environ.get("GAPDYN_DEBUG"):
            raise
        print(f"gapdyn {name}: error: {exc}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
