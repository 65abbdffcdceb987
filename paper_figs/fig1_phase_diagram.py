"""Figure 1: phase diagram of final J over the step size, with the computable thresholds overlaid.

Data: ``bandits.experiments.threshold`` (per-instance exact and sampled GRPO on eta grids); the threshold
against J is figure 2 (d), from the success_rate experiment's local thresholds. Run alone: ``python -m paper_figs.fig1_phase_diagram``.
"""

from __future__ import annotations


import numpy as np

import gapdyn

from . import plots
from .data import Sources, threshold_views
from .style import label, new_figure, panel_label, save_figure

NAME = "fig1_phase_diagram"
COLLAPSED_COLOUR = "#000000"
"""Panel (a)'s colour of the cells below the collapse level (the colour bar's extension)."""
TITLE = "Phase diagram: J after K steps over the step size eta, with predicted thresholds"
CAPTION = (
    "Tests Theorem 2 (Suk & Duan: above a step-size threshold even an aligned step makes J fall, to 0) on "
    "single-context log-linear bandits (100 arms, d = 16, 10 correct arms, theta0 = 0; one row per instance: "
    "below the dashed line the instances with a measured eta*, ordered by it; above it, in instance order, those "
    "without one in the scanned range). (a) exact GRPO: J after K steps over (eta, instance), black where it is "
    "below the collapse level 1e-3 (the colour bar's extension), with the measured critical eta* and the "
    "computable predictors at theta0 overlaid (one-step sharp line-search threshold, local curvature threshold, "
    "Theorem 1's step condition, the Phi-monotone edge; gapdyn.theory.thresholds). (b) sampled GRPO (G = 8): share of "
    "runs ending collapsed (J < 1e-3 over the last quarter of the horizon) over (eta, instance). The x axes span "
    "the scanned etas: a predictor outside them is a triangle at the edge, its values in the legend; grid points "
    "not run for an instance (each instance refines its own scan) are hatched grey. The threshold against J "
    "(Theorem 3's (1 - J) law) is figure 2 (d)."
)


def draw(sources: Sources):
    """The figure (not saved) from the ``threshold`` experiment's results."""
    results = sources.experiment("threshold").results
    cfg = sources.config("threshold")
    v = threshold_views(results)
    K = getattr(cfg, "steps", None)
    fig, ax = new_figure(1, 2, width=5.2, height=4.6)
    ex = v.exact[v.exact["method"] == "grpo"]
    under = (gapdyn.COLLAPSE_J, COLLAPSED_COLOUR, f"J < {gapdyn.COLLAPSE_J:g} after K steps (the collapse level)")
    im = plots.plot_phase_diagram(ex, ax[0, 0], x="eta", y="row", value="J_final",
                                  curves=v.predictors[v.predictors["method"] == "grpo"], curve_x="eta_pred",
                                  curve_y="row", curve_hue="predictor", curve_lines=False,
                                  legend_below=True, under=under, clip_curves=True)
    bar = fig.colorbar(im, ax=ax[0, 0], label=f"J after K = {K} steps" if K else "final J", extend="min")
    bar.ax.text(0.5, -0.03, f"< {gapdyn.COLLAPSE_J:g}", transform=bar.ax.transAxes, ha="center", va="top",
                fontsize=7)
    ax[0, 0].set_title("exact GRPO")
    im = plots.plot_phase_diagram(v.sampled, ax[0, 1], x="eta", y="row", value="p_collapse", cmap="YlOrBr",
                                  curves=v.predictors[(v.predictors["method"] == "grpo")
                                                      & (v.predictors["predictor"] == "measured eta*")],
                                  curve_x="eta_pred", curve_y="row", curve_hue="predictor", curve_lines=False,
                                  legend_below=True, clip_curves=True)
    fig.colorbar(im, ax=ax[0, 1], label="P(collapse)")
    ax[0, 1].set_title(f"sampled GRPO, {getattr(cfg, 'n_seeds', '?')} seeds per eta")
    rows = v.critical[v.critical["method"] == "grpo"].drop_duplicates("instance").sort_values("row")
    without = rows[~np.isfinite(rows["eta_star"].to_numpy(float))]
    for a in ax[0]:
        a.set_xlabel(label("eta"))
        a.set_ylabel("instance (by measured $\\eta^*$)")
        a.set_yticks(rows["row"].to_numpy())
        a.set_yticklabels([str(i) for i in rows["instance"]], fontsize=7)
        if len(without):  # rows without an eta* in the scanned range sit on top, in instance order
            edge = float(without["row"].min()) - 0.5
            a.axhline(edge, color="black", lw=0.8, ls="--")
            a.text(0.01, (edge + float(without["row"].max()) + 0.5) / 2, "no $\\eta^*$ in the\nscanned range",
                   transform=a.get_yaxis_transform(), fontsize=7, va="center", ha="left",
                   bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=1))
    for a, letter in zip(ax[0], "ab"):
        panel_label(a, letter)
    fig.tight_layout()
    return fig


def make(sources: Sources, out_dir=None):
    return save_figure(draw(sources), NAME, caption=CAPTION, title=TITLE, out_dir=out_dir)


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli_main

    return cli_main(["--only", NAME, *(argv or [])])


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
