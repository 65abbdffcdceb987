"""Figure: Phase diagram: J after K steps over step size eta and initial success rate.

Data: ``bandits.experiments.threshold`` (via :class:`paper_figs.data.Sources`).
Run alone: ``python -m paper_figs.fig1_phase_diagram [--mode quick]``.
"""

from __future__ import annotations

from .data import NotAvailable, Sources

NAME = "fig1_phase_diagram"
TITLE = "Phase diagram: J after K steps over step size eta and initial success rate"
CAPTION = (
    "Tests Theorem 2 (Suk & Duan: above a step-size threshold even an aligned step makes J fall, to 0) on the "
    "100-arm log-linear contextual bandit (d = 16, 10 correct arms): mean J after K steps over (eta, J0) or (eta,"
    " K), with the computable thresholds overlaid (the sharp one-step line-search threshold, the local curvature "
    "threshold and Theorem 1's step condition; gapdyn.thresholds)."
)


def make(sources: Sources, out_dir=None):
    sources.experiment("threshold")
    raise NotAvailable("the threshold experiment's results are not integrated into this figure yet")


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli_main

    return cli_main(["--only", NAME, *(argv or [])])


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
