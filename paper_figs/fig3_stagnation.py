"""Figure 3: stagnation at fixed step sizes: plateaus against the bracket on J*, misalignment, controllers.

Data: ``bandits.experiments.stagnation`` (its rows, and its ``trajectories`` for the J-over-steps curves).
Run alone: ``python -m paper_figs.fig3_stagnation [--mode quick]``.
"""

from __future__ import annotations

from . import plots
from .data import Sources, stagnation_parts, stagnation_trajectories
from .style import label, new_figure, panel_label, save_figure

NAME = "fig3_stagnation"
TITLE = "Stagnation: single-context decay, plateaus against the best reachable J*, the adaptive controller"
CAPTION = (
    "Tests the stagnation claims (Suk & Duan, Theorem 3 discussion: a fixed eta stalls below J = 1; Theorem 1: "
    "learning is driven by the cumulative alignment M) on 100-arm log-linear bandits (stagnation experiment). "
    "(a) sampled GRPO (G = 8) on the controllers' instance: mean J over seeds at fixed eta (solid) and under the "
    "adaptive controller started at the same eta0 (dashed). "
    "(b) one context, exact REINFORCE at fixed eta: 1 - J at k = K/10, K/2, K and the experiment's tail fit "
    "1 - J ~ a k^-b (b = 1: no plateau, only slowing). "
    "(c) shared parameters (interference, shared tabular softmax, correct arms inside the feature hull): final J "
    "against the best reachable J*, bracketed from below (multi-start ascent, best run) and above (an LP "
    "relaxation; horizontal bar): points on the diagonal plateau at the optimum. "
    "(d) share of collapsed sampled runs against eta0 for a constant step and the adaptive controller. "
    "How to read it: in (a) a solid curve that flattens below 1 while the dashed one rises to 1 is a stall at that "
    "fixed eta that the controller escapes; in (b) a straight line of slope near -1 on log-log axes means 1 - J "
    "keeps falling like 1/k, slowing without a plateau; in (c) a point on the diagonal has stopped at the best "
    "reachable J* (a ceiling of the setting, not a stall), a point below it has stalled short of what is "
    "reachable, and a long bar means the bracket on J* is loose; in (d) the adaptive curve below the constant one "
    "is the controller preventing collapses at that eta0. A quick run has few instances: the verdicts are the "
    "stagnation rows of docs/claims.md (full runs)."
)

SCHEDULE_COLORS = {"constant": "#000000", "adaptive": "#009E73"}


def make(sources: Sources, out_dir=None):
    results = sources.experiment("stagnation").results
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
    if curve is not None and len(curve):
        plots.plot_failure_decay(curve, a, groups=("method", "eta"))
        a.set_title("one context, exact REINFORCE")
    else:
        plots.panel_unavailable(a, "no single-context runs in this mode")
    a = ax[1, 0]
    plat = parts.get("plateau")
    if plat is not None and len(plat):
        plots.plot_plateau_vs_optimum(plat, a)
        a.set_title("shared parameters: plateau vs J*")
    else:
        plots.panel_unavailable(a, "no shared-parameter runs in this mode")
    a = ax[1, 1]
    ctrl = parts.get("controllers")
    if ctrl is not None and len(ctrl):
        d = ctrl.assign(collapsed=lambda x: x["collapsed"].astype(float))
        plots.plot_method_curves(d, a, x="eta", y="collapsed", method="schedule", colors=SCHEDULE_COLORS)
        a.set_xlabel(r"initial step $\eta_0$")
        a.set_ylabel("P(collapse)")
        a.set_title("sampled GRPO: step-size controller")
    else:
        plots.panel_unavailable(a, "no controller runs in this mode")
    for a, letter in zip(ax.ravel(), "abcd"):
        panel_label(a, letter)
    fig.tight_layout()
    return save_figure(fig, NAME, caption=CAPTION, title=TITLE, out_dir=out_dir)


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli_main

    return cli_main(["--only", NAME, *(argv or [])])


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
