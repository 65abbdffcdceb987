"""Figure: Stagnation: J over steps at fixed step sizes and under the adaptive controller.

Data: ``bandits.experiments.stagnation`` (via :class:`paper_figs.data.Sources`).
Run alone: ``python -m paper_figs.fig3_stagnation [--mode quick]``.
"""

from __future__ import annotations

from .data import NotAvailable, Sources

NAME = "fig3_stagnation"
TITLE = "Stagnation: J over steps at fixed step sizes and under the adaptive controller"
CAPTION = (
    "Tests the stagnation claim of Theorem 3 (a fixed eta stalls below J = 1, J_max ~ 1 - c eta T; exact bound "
    "open) and the theory-driven adaptive controller on the contextual bandit: J (and 1 - J on a log scale) over "
    "steps for several fixed eta and for the adaptive / line-search-safe schedule (mean over seeds, band = inter-"
    "quartile range)."
)


def make(sources: Sources, out_dir=None):
    sources.experiment("stagnation")
    raise NotAvailable("the stagnation experiment's results are not integrated into this figure yet")


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli_main

    return cli_main(["--only", NAME, *(argv or [])])


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
