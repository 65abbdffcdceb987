"""Figure 2: the critical step eta* against response length T (with / without 1/|o|) and against J.

Data: ``bandits.experiments.length`` (sequence bandit) and ``bandits.experiments.success_rate``.
Run alone: ``python -m paper_figs.fig2_critical_eta [--mode quick]``.
"""

from __future__ import annotations


from . import plots
from .data import NotAvailable, Sources
from .style import label, new_figure, panel_label, save_figure
from .views import critical_vs_length, length_slopes, success_rate_view

NAME = "fig2_critical_eta"
TITLE = "Critical step eta* against response length T and success rate J"
CAPTION = (
    "Tests Theorem 3 (Suk & Duan; exact form open): the critical step shrinks like (1 - J)/T, and dividing the "
    "update by |o| cancels one T. (a-c) Token model with partial sharing rho (length experiment: rule MAJ, "
    "sampled GRPO, J0 placed for every T; eta* = gapdyn.find_eta_star per random stream: the first eta whose run "
    "ends collapsed). Points: the found eta*, relative to the value at the smallest T of the same (instance, "
    "stream) (bars: range); lines: the claims' slopes (censored fit that keeps streams without eta* in range) "
    "with their 90 % intervals (an equivalence test against [-1.25, -0.75]), drawn through the points' "
    "geometric mean; a claim with too few instances for a valid interval draws no line; the 1/|o| line is the "
    "raw slope plus the identity row. (a) full sharing, raw vs 1/|o|. "
    "(b) raw updates across rho. (c) raw updates at the second J0 placement. (d) local thresholds at "
    "checkpoints of J along exact-GRPO trajectories (success_rate experiment; T = 1: contextual 100-arm "
    "bandit, T = 8: token model rho = 0.5): the one-step threshold along E[w_GRPO] (filled) and eta* of GRPO "
    "restarted at the checkpoint (open), relative to the first checkpoint of the trajectory, against 1 - J "
    "(descriptive, no fitted line); the dotted reference has slope +1, the shape of Theorem 3's sufficient step "
    "(1 - J)/T; the legend gives the bound claim: the share of states where a step inside it ended collapsed. "
    "Each legend lists only what is drawn; a series without points is named in the legend's title (\"not drawn\")."
)

_RHO_COLOURS = ("#0072B2", "#56B4E9", "#009E73", "#E69F00", "#D55E00")
_SETTING_COLOURS = {"T=1": "#0072B2", "T=8": "#D55E00"}


def _panels(result, crit):
    """(title, rows, slopes) of panels a-c: full sharing raw vs 1/|o|, raw updates across the sharing rho,
    and the second J0 placement (the experiment's grid; slopes from its claims)."""
    from bandits.experiments.length import J0S, RHOS

    raw = crit[~crit["normalized"]]
    full = crit[(crit["J0"] == J0S[0]) & (crit["rho"] == max(RHOS))]
    return [
        (f"full sharing, raw vs 1/|o| (J0 = {J0S[0]:g})", full,
         length_slopes(result, J0S[0], [max(RHOS)], normalized=True)),
        (f"raw updates across sharing rho (J0 = {J0S[0]:g})", raw[raw["J0"] == J0S[0]],
         length_slopes(result, J0S[0], RHOS)),
        (f"raw updates across rho (J0 = {J0S[-1]:g})", raw[raw["J0"] == J0S[-1]], length_slopes(result, J0S[-1], RHOS)),
    ]


def draw(sources: Sources):
    """The figure (not saved): panels a-c from the ``length`` experiment, d from ``success_rate``."""
    fig, ax = new_figure(2, 2, width=4.8, height=4.3)
    try:
        result = sources.experiment("length")
        crit = critical_vs_length(result)
        panels = _panels(result, crit)
        Ts = sorted(crit["T"].unique())
    except NotAvailable as exc:
        panels = [(t, None, str(exc)) for t in ("full sharing", "raw updates across rho", "second J0")]
    for a, letter, (title, d, slopes) in zip(ax.ravel()[:3], "abc", panels):
        if d is None:
            plots.panel_unavailable(a, slopes)
        else:
            colours = {k: "#CC79A7" if "1/|o|" in k else _RHO_COLOURS[i % len(_RHO_COLOURS)]
                       for i, k in enumerate(slopes)}
            plots.plot_loglog_slopes(d, a, x="T", y="eta_star_rel", hue="label", slopes=slopes, colors=colours,
                                     reference=-1.0)
            a.set_xticks(Ts, [f"{T:g}" for T in Ts], minor=False)
            a.set_xticks([], minor=True)
            a.set_xlabel(label("T"))
            a.set_ylabel(r"$\eta^* / \eta^*(T_{\min})$")
        a.set_title(title)
        panel_label(a, letter)
    a = ax[1, 1]
    try:
        pts, slopes = success_rate_view(sources.experiment("success_rate"))
        colours = {k: _SETTING_COLOURS[k.split(",")[0].replace(" ", "")] for k in slopes}
        markers = {k: "o" if "one step" in k else "s" for k in slopes}
        styles = {k: "-" if "one step" in k else "--" for k in slopes}
        plots.plot_loglog_slopes(pts, a, x="one_minus_J", y="eta_rel", hue="series", slopes=slopes, colors=colours,
                                 markers=markers, linestyles=styles, bars=False, reference=1.0,
                                 legend_kw=dict(loc="upper left", bbox_to_anchor=(-0.15, -0.17), ncol=1))
        a.set_xlabel(r"failure rate $1 - J$ at the checkpoint")
        a.set_ylabel(r"$\eta_{\mathrm{local}} / \eta_{\mathrm{local}}(\mathrm{first\ checkpoint})$")
    except NotAvailable as exc:
        plots.panel_unavailable(a, str(exc))
    a.set_title(r"local threshold against $1 - J$")
    panel_label(a, "d")
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
