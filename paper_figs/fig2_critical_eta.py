"""Figure stub (integration pending)."""

from __future__ import annotations

from .data import NotAvailable, Sources

NAME = "fig2_critical_eta"
TITLE = "fig2_critical_eta"
CAPTION = "pending"


def make(sources: Sources, out_dir=None):
    raise NotAvailable("pending integration of length")


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli_main

    return cli_main(["--only", NAME, *(argv or [])])


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
