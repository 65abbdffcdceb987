"""Figure 3: stagnation at fixed step sizes, plateaus below J = 1, and the adaptive controller.

Data: ``bandits.experiments.stagnation`` (summaries) and, for the J-over-steps curves, sampled GRPO on
its controller instance via ``paper_figs.data.stagnation_trajectories`` (bandits.run_grid).
Run alone: ``python -m paper_figs.fig3_stagnation [--mode quick]``.
"""

from __future__ import annotations

import numpy as np

from . import plots
from .data import Sources, stagnation_parts, stagnation_trajectories
from .style import label, new_figure, panel_label, save_figure

NAME = "fig3_stagnation"
TITLE = "Stagnation: J over steps at fixed eta and under the adaptive controller"
CAPTION = (
    "Tests the stagnation claim (Theorem 3 discussion: a fixed eta stalls below J = 1, J_max ~ 1 - c eta T; exact "
    "bound open) and the theory-driven controller on 100-arm log-linear bandits (stagnation experiment). "
    "(a) sampled GRPO (G = 8) on the controllers' instance: mean J over seeds and steps at fixed eta (solid) and "
    "under the adaptive controller started at the same eta0 (dashed; curves of equal eta0 can coincide). "
    "(b) single context, exact REINFORCE and GRPO at fixed "
    "eta: 1 - J at k = K/10, K/2, K and the fitted power law 1 - J ~ a k^-b (b = 1: no plateau, only slowing). "
    "(c) settings with a plateau below 1: final J against the best reachable J* (shared tabular softmax with "
    "disjoint correct arms; correct arms inside the feature hull): the plateau is the optimum, not stagnation. "
    "(d) share of collapsed sampled runs against eta0 for constant, decaying, line-search and adaptive steps."
)

SCHEDULE_COLORS = {"constant": "#000000", "decay": "#E69F00", "linesearch": "#0072B2", "adaptive_d1": "#56B4E9",
                   "adaptive_d2": "#009E73", "adaptive_d4": "#CC79A7", "adaptive_d8": "#D55E00"}


def make(sources: Sources, out_dir=None):
    results, _ = sources.experiment("stagnation")
    cfg = sources.config("stagnation")
    parts = stagnation_parts(results)
    fig, ax = new_figure(2, 2, width=5.0, height=3.8)
    a = ax[0, 0]
    traj = stagnation_trajectories(cfg)
    etas = sorted(traj["eta"].unique())
    cols = {e: c for e, c in zip(etas, ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#000000"])}
    for sched, ls, lw in zip(sorted(traj["schedule"].unique(), key=lambda s: s != "constant"), ("-", "--"), (2.4, 1.4)):
        d = traj[traj["schedule"] == sched]
        plots.plot_trajectories(d, a, x="step", y="J", hue="eta", colors=cols, ls=ls, lw=lw, band=False,
                                labels={e: f"$\\eta_0$ = {e:g}, {sched}" for e in etas})
    a.set_xscale("symlog", linthresh=1)
    a.set_xlabel(label("step"))
    a.set_ylabel(label("J"))
    a.legend(frameon=False, fontsize=7)
    a.set_title("sampled GRPO: fixed vs adaptive step")
    a = ax[0, 1]
    curve = parts.get("fail_curve")
    single = curve[(curve["part"] == "single") & (curve["mode"] == "exact")] if curve is not None else None
    if single is not None and len(single):
        plots.plot_failure_decay(single, a, groups=("method", "eta"))
        a.set_title("single context, exact updates")
    else:
        plots.panel_unavailable(a, "no single-context long runs in this mode")
    a = ax[1, 0]
    plat = results[results["part"].isin(["tabular_shared", "unreachable"])]
    if len(plat) and "J_star" in plat:
        plots.plot_plateau_vs_optimum(plat, a)
        a.set_title("plateaus below 1 are optima")
    else:
        plots.panel_unavailable(a, "no plateau settings in this mode")
    a = ax[1, 1]
    ctrl = parts.get("controllers")
    if ctrl is not None and len(ctrl):
        d = ctrl[ctrl["mode"] == "sampled"].assign(collapsed=lambda x: x["collapsed"].astype(float))
        plots.plot_method_curves(d, a, x="eta", y="collapsed", method="schedule", colors=SCHEDULE_COLORS)
        a.set_xlabel(r"initial step $\eta_0$")
        a.set_ylabel("P(collapse)")
        a.set_title("sampled GRPO: step-size controllers")
    else:
        plots.panel_unavailable(a, "no controller runs in this mode")
    for a, letter in zip(ax.ravel(), "abcd"):
        panel_label(a, letter)
    fig.tight_layout()
    return save_figure(fig, NAME, caption=CAPTION, title=TITLE, out_dir=out_dir)


def headline(sources: Sources) -> dict:
    """Tail exponents of 1 - J, the plateaus vs J*, and collapse rates per controller."""
    results, _ = sources.experiment("stagnation")
    parts = stagnation_parts(results)
    out: dict[str, object] = {}
    s = parts.get("single")
    if s is not None:
        for (m, mode), g in s.groupby(["method", "mode"]):
            out[f"single context, {mode} {m}: median tail exponent b of 1-J ~ k^-b"] = float(np.nanmedian(g["exponent"]))
            out[f"single context, {mode} {m}: median final 1-J"] = float(np.nanmedian(g["fail_final"]))
    for p in ("tabular_shared", "unreachable", "interference"):
        g = parts.get(p)
        if g is not None:
            out[f"{p}: median final J"] = float(np.nanmedian(g["J_final"]))
            if np.isfinite(g["J_star"].astype(float)).any():
                out[f"{p}: median J*"] = float(np.nanmedian(g["J_star"].astype(float)))
    c = parts.get("controllers")
    if c is not None:
        for (mode, sched), g in c.groupby(["mode", "schedule"]):
            out[f"controllers, {mode}: P(collapse) {sched}"] = float(g["collapsed"].astype(float).mean())
    return out


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli_main

    return cli_main(["--only", NAME, *(argv or [])])


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
