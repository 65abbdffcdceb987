"""Figure 2: the critical step eta* against response length T (with / without 1/|o|) and against J.

Data: ``bandits.experiments.length`` (sequence bandit) and ``bandits.experiments.success_rate``.
Run alone: ``python -m paper_figs.fig2_critical_eta [--mode quick]``.
"""

from __future__ import annotations


from . import plots
from .data import NotAvailable, Sources, critical_vs_length, success_rate_view
from .style import label, new_figure, panel_label, save_figure

NAME = "fig2_critical_eta"
TITLE = "Critical step eta* against response length T and success rate J"
CAPTION = (
    "Tests Theorem 3 (Suk & Duan; exact form open): the critical step shrinks like (1 - J)/T, and dividing the "
    "update by |o| cancels one T. Token-level sequence bandit (shared log-linear token policy, rule MAJ, sampled "
    "GRPO, J0 fixed for every T; eta* = smallest eta with P(collapse) >= 0.5). Points: eta* relative to its value "
    "at the smallest T, per instance (bars: range over instances); lines: least-squares log-log fits with slope "
    "+- s.e. (a) fixed length T, raw vs 1/|o|-normalised. (b) variable length (end token), against the mean "
    "length E|o| at theta0. (c) exact log-odds ascent and the AC negative control. (d) eta* against 1 - J0 "
    "(contextual 100-arm bandit, theta0 placed at J0; exact GRPO eta* and the sampled-GRPO collapse onset, "
    "relative to the smallest J0; success_rate experiment): the (1 - J) law predicts slope +1."
)

_PANELS = {
    "a": (("shared_MAJ_grpo", "shared_MAJ_grpo_norm"), "T", -1.0, "fixed length T"),
    "b": (("var_MAJ_grpo", "var_MAJ_grpo_norm"), "mean_length0", -1.0, "variable length (end token)"),
    "c": (("shared_MAJ_logodds", "shared_AC_grpo"), "T", -1.0, "log-odds ascent; AC control"),
}
_LABELS = {
    "shared_MAJ_grpo": "GRPO, raw", "shared_MAJ_grpo_norm": "GRPO, 1/|o|", "var_MAJ_grpo": "GRPO, raw",
    "var_MAJ_grpo_norm": "GRPO, 1/|o|", "shared_MAJ_logodds": r"$w = \nabla\Phi$ (MAJ)",
    "shared_AC_grpo": "GRPO, rule AC (control)",
}


def make(sources: Sources, out_dir=None):
    results = sources.experiment("length").results
    crit = critical_vs_length(results, sources.config("length"))
    fig, ax = new_figure(2, 2, width=4.8, height=3.7)
    for a, (letter, (settings, x, ref, title)) in zip(ax.ravel()[:3], _PANELS.items()):
        d = crit[crit["setting"].isin(settings)]
        if d.empty:
            plots.panel_unavailable(a, f"settings {settings} were not run in mode {sources.mode!r}")
        else:
            plots.plot_loglog_fit(d, a, x=x, y="eta_star_rel", hue="setting", hue_labels=_LABELS, reference=ref)
            a.set_xlabel(label("T") if x == "T" else r"mean length $\mathbb{E}|o|$ at $\theta_0$ (tokens)")
            a.set_ylabel(r"$\eta^* / \eta^*(T_{\min})$")
        a.set_title(title)
        panel_label(a, letter)
    a = ax[1, 1]
    try:
        sr = success_rate_view(sources.experiment("success_rate").results)
        plots.plot_loglog_fit(sr, a, x="one_minus_J", y="eta_star_rel", hue="series", reference=1.0)
        a.set_xlabel(r"initial failure rate $1 - J_0$ (fraction)")
        a.set_ylabel(r"$\eta^* / \eta^*(\mathrm{smallest}\ J_0)$")
    except NotAvailable as exc:
        plots.panel_unavailable(a, str(exc))
    a.set_title(r"$\eta^*$ against $J$")
    panel_label(a, "d")
    fig.tight_layout()
    return save_figure(fig, NAME, caption=CAPTION, title=TITLE, out_dir=out_dir)


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli_main

    return cli_main(["--only", NAME, *(argv or [])])


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
