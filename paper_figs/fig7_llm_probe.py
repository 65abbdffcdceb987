"""Figure stub (integration pending)."""

from __future__ import annotations

from .data import NotAvailable, Sources

NAME = "fig7_llm_probe"
TITLE = "fig7_llm_probe"
CAPTION = "pending"


def make(sources: Sources, out_dir=None):
    raise NotAvailable("pending integration of llm")


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli_main

    return cli_main(["--only", NAME, *(argv or [])])


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
