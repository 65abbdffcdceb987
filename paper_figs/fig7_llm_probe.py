"""Figure 7: the tiny-Qwen RLVR runs (GRPO vs WAPO at a normal and a large Adam lr) with their probes.

Data: :meth:`paper_figs.data.Sources.llm` (llm_probe.experiments.demo.run_demo; reused from its output folder).
Run alone: ``python -m paper_figs.fig7_llm_probe [--mode quick]``.
"""

from __future__ import annotations

from . import plots
from .data import Sources
from .llm import reward_outcomes
from .style import label, new_figure, panel_label, save_figure

NAME = "fig7_llm_probe"
TITLE = "Tiny-Qwen RLVR: reward, entropy by advantage sign, per-prompt M_q, WAPO bins, alerts and outcomes"
CAPTION = (
    "Tests, on a ~124k-parameter Qwen2 trained online on 2-digit addition (llm_probe), WAPO's stability claim "
    "and the gradient-gap probes: GRPO vs WAPO at a normal and a large Adam learning rate, several seeds. "
    "(a) mean reward per step (colour: method, line style: lr). (b, c) token entropy of completions with "
    "positive (solid) and negative (dashed) advantage at each lr; a series without such completions draws no line "
    "and is named in the legend's title (WAPO's advantage max(r - p_hat, 0) is never negative, so WAPO has no "
    "A < 0 line). (d) per probe prompt and probe step: accuracy against cumulative alignment M_q (colour: lr), "
    "the logistic fit on the normal-lr runs and, dashed, Theorem 1's lower bound J >= sigmoid(logit J0 + M/2) "
    "(Suk & Duan, arXiv 2510.08539, Thm 1) at their median initial accuracy J0, for reference only: it holds under "
    "the theorem's step condition eta_k <= [dmu_k]_+ / (2 (L_o + 8 G_o^2)), whose constants are unknown for a "
    "network, so the legend says the condition is unchecked and points below the line contradict nothing. "
    "(e) share of completion tokens in each WAPO bin. (f) each run's alerts of llm_probe's collapse rule: events, "
    "not collapses; the title counts the runs with an alert and the runs that end collapsed (run outcome: "
    "llm_probe.collapse.reward_outcome, mean reward of the last 25 steps below 0.25 of the first 10 steps'), and each "
    "row's label ends with its run's outcome. Reward, accuracy and shares are fractions, drawn on [0, 1]."
)
CONDITION = "unchecked here ($L_o$, $G_o$ unknown for a network)"
"""Where Theorem 1's step condition holds for panel (d)'s Adam steps (the bound's legend says it)."""


def draw(res):
    """The figure (not saved) from a :class:`paper_figs.llm.LLMResults`."""
    m = res.metrics
    lrs = sorted(m["lr"].unique())
    fig, ax = new_figure(2, 3, width=4.6, height=3.5)
    plots.plot_run_curves(m, ax[0, 0], y="reward")
    ax[0, 0].set_ylabel(label("reward"))
    ax[0, 0].set_ylim(0, 1)
    plots.plot_entropy_by_sign(m, ax[0, 1], lr=lrs[0])
    ax[0, 1].set_title(f"entropy by advantage sign, lr {lrs[0]:g}")
    plots.plot_entropy_by_sign(m, ax[0, 2], lr=lrs[-1])
    ax[0, 2].set_title(f"entropy by advantage sign, lr {lrs[-1]:g}")
    plots.plot_prompt_alignment(res.probes, ax[1, 0], condition=CONDITION)
    plots.plot_bin_shares(m, ax[1, 1])
    plots.plot_alerts(res.runs.assign(outcome=reward_outcomes(res)), res.alerts, ax[1, 2])
    for a, letter in zip(ax.ravel(), "abcdef"):
        panel_label(a, letter)
    fig.tight_layout()
    return fig


def make(sources: Sources, out_dir=None):
    return save_figure(draw(sources.llm()), NAME, caption=CAPTION, title=TITLE, out_dir=out_dir)


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli_main

    return cli_main(["--only", NAME, *(argv or [])])


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
