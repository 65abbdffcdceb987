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
    "update by |o| cancels one T. Token model with partial sharing rho (length experiment: rule MAJ, sampled "
    "GRPO, J0 placed for every T; eta* = gapdyn.find_eta_star per random stream). Points: eta* relative to its "
    "value at the smallest T, per (instance, stream) (bars: range); lines: log-log fits with slope +- s.e. for "
    "display (the claims carry the experiment's slope intervals). (a) full sharing, raw vs 1/|o|-normalised. "
    "(b) raw updates across rho. (c) raw updates at the second J0 placement. (d) eta* against 1 - J0 "
    "(contextual 100-arm bandit, theta0 placed at J0; exact GRPO eta* and the sampled-GRPO collapse onset, "
    "relative to the smallest J0; success_rate experiment): the (1 - J) law predicts slope +1."
)


def _panels(crit):
    """(title, rows) of panels a-c: full sharing raw vs 1/|o|, raw updates across the sharing rho, and the
    second J0 placement (the experiment's own grid; empty panels say what was not run)."""
    J0s = sorted(crit["J0"].unique())
    first = crit[crit["J0"] == J0s[0]] if J0s else crit
    full = first[first["rho"] == first["rho"].max()] if len(first) else first
    return [
        (f"full sharing, raw vs 1/|o| (J0 = {J0s[0]:g})" if J0s else "full sharing", full),
        ("raw updates across sharing rho", first[~first["normalized"]]),
        (f"raw updates, J0 = {J0s[-1]:g}" if J0s else "second J0",
         crit[(crit["J0"] == J0s[-1]) & ~crit["normalized"]] if len(J0s) > 1 else crit.iloc[0:0]),
    ]


def make(sources: Sources, out_dir=None):
    results = sources.experiment("length").results
    crit = critical_vs_length(results)
    fig, ax = new_figure(2, 2, width=4.8, height=3.7)
    for a, letter, (title, d) in zip(ax.ravel()[:3], "abc", _panels(crit)):
        if d.empty:
            plots.panel_unavailable(a, f"no found eta* for this panel in mode {sources.mode!r}")
        else:
            plots.plot_loglog_fit(d, a, x="T", y="eta_star_rel", hue="label", reference=-1.0)
            a.set_xlabel(label("T"))
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
