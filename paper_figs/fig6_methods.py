"""Figure: Bandit stability of GRPO, Dr. GRPO, WAPO and REINFORCE at equal eta.

Data: ``bandits.experiments.methods`` (via :class:`paper_figs.data.Sources`).
Run alone: ``python -m paper_figs.fig6_methods [--mode quick]``.
"""

from __future__ import annotations

from .data import NotAvailable, Sources

NAME = "fig6_methods"
TITLE = "Bandit stability of GRPO, Dr. GRPO, WAPO and REINFORCE at equal eta"
CAPTION = (
    "Tests the method comparisons implied by the expected directions E[w] = c(J, G) Gap (THEORY.md §2; WAPO = (1 "
    "- J) x Dr. GRPO) on the contextual bandit with sampled groups (G = 8): share of collapsed runs and final J "
    "against eta for GRPO, Dr. GRPO, WAPO and REINFORCE at equal eta."
)


def make(sources: Sources, out_dir=None):
    sources.experiment("methods")
    raise NotAvailable("the methods experiment's results are not integrated into this figure yet")


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli_main

    return cli_main(["--only", NAME, *(argv or [])])


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
