"""Figure 5: WAPO's token taxonomy — Delta H and Delta p_s over (p_s, C), and where the bin errs.

Data: the ``taxonomy`` experiment (bandits.experiments.taxonomy: gapdyn.token_step_effects on random positions).
Run alone: ``python -m paper_figs.fig5_taxonomy [--mode quick]``.
"""

from __future__ import annotations

from . import plots
from .data import Sources
from .style import new_figure, panel_label, save_figure

NAME = "fig5_taxonomy"
TITLE = "WAPO token taxonomy: entropy and probability changes over (p_s, C)"
CAPTION = (
    "Tests WAPO's token taxonomy (arXiv 2606.16154; taxonomy experiment, exact first-order formulas from "
    "gapdyn.token_step_effects). "
    "Random positions (V = 32, logit scale log-uniform in [0.05, 8], token sampled from p), one update of size "
    "eta*A on the sampled token. (a, b) mean Delta H per unit step over (p_s, C) for A > 0 and A < 0: the dashed "
    "line p_s = C separates peak tokens (entropy falls for A > 0, rises for A < 0) from valley tokens (the "
    "reverse). (c, d) Delta p_s: always up for A > 0, down for A < 0. (e) share of tokens whose bin mispredicts "
    "the exact sign of Delta H; (f) the misses all sit just above p_s = C (valley tokens never disagree). "
    "How to read it: the taxonomy holds where each side of the dashed line has one colour in (a, b), orange "
    "(Delta H > 0) on the valley side and purple (Delta H < 0) on the peak side for A > 0, the reverse for A < 0; "
    "(c, d) have one colour throughout, since the sampled token's probability follows the sign of A whatever its "
    "bin; the grey cells of (e) and the orange bars of (f) show where and by how much the bin rule fails: a thin "
    "band along p_s = C on the peak side. Verdicts: the taxonomy rows of docs/claims.md "
    "(taxonomy.bin_predicts_sign, taxonomy.misses_near_boundary, taxonomy.valley_never_disagrees)."
)


def make(sources: Sources, out_dir=None):
    table = sources.taxonomy()
    fig, ax = new_figure(2, 3, width=4.0, height=3.4)
    ims = [
        plots.plot_taxonomy_effect(table, ax[0, 0], value="dH", sign=+1),
        plots.plot_taxonomy_effect(table, ax[1, 0], value="dH", sign=-1),
        plots.plot_taxonomy_effect(table, ax[0, 1], value="dp_s", sign=+1),
        plots.plot_taxonomy_effect(table, ax[1, 1], value="dp_s", sign=-1),
    ]
    units = [r"$\Delta H/\eta$ (nats)", r"$\Delta H/\eta$ (nats)", r"$\Delta p_s/\eta$", r"$\Delta p_s/\eta$"]
    for im, a, u in zip(ims, [ax[0, 0], ax[1, 0], ax[0, 1], ax[1, 1]], units):
        fig.colorbar(im, ax=a, label=u)
    im = plots.plot_taxonomy_misses(table, ax[0, 2])
    fig.colorbar(im, ax=ax[0, 2], label="share mispredicted")
    plots.plot_miss_share_vs_margin(table, ax[1, 2])
    for a, letter in zip([ax[0, 0], ax[1, 0], ax[0, 1], ax[1, 1], ax[0, 2], ax[1, 2]], "abcdef"):
        panel_label(a, letter)
    fig.tight_layout()
    return save_figure(fig, NAME, caption=CAPTION, title=TITLE, out_dir=out_dir)


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli_main

    return cli_main(["--only", NAME, *(argv or [])])


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
