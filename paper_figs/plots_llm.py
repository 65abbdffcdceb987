"""Plots of the tiny-Qwen runs (paper_figs.llm.LLMResults tables): reward, entropy by advantage sign,
per-prompt M_q vs accuracy, WAPO bin shares, collapse alerts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

import gapdyn

from ._plot_common import _plain_log_ticks, _require
from .style import BIN_COLORS, label, method_color, method_label

__all__ = [
    "plot_run_curves",
    "plot_entropy_by_sign",
    "plot_prompt_alignment",
    "plot_bin_shares",
    "plot_alerts",
    "plot_logged_curve",
]


# --------------------------------------------------------------------------------------------------
# Tiny-Qwen runs (figure 7). Inputs: paper_figs.data.LLMResults tables.

_LR_STYLES = ["-", "--", ":", "-."]


def _smooth(s: pd.Series, window: int) -> pd.Series:
    return s.rolling(window, min_periods=1).mean() if window > 1 else s


def plot_run_curves(metrics: pd.DataFrame, ax, *, y: str = "reward", smooth: int = 5):
    """Mean over seeds of a per-step metric, one line per (method: colour, lr: line style)."""
    _require(metrics, ["step", "method", "lr", y], "plot_run_curves")
    lrs = sorted(metrics["lr"].unique())
    for (m, lr), g in metrics.groupby(["method", "lr"], sort=True):
        mean = _smooth(g.groupby("step")[y].mean(), smooth)
        ax.plot(mean.index, mean.to_numpy(), color=method_color(m), ls=_LR_STYLES[lrs.index(lr) % 4],
                label=f"{method_label(m)}, lr {lr:g}")
    ax.set_xlabel(label("step"))
    ax.legend(frameon=False, fontsize=8)
    return ax


def plot_entropy_by_sign(metrics: pd.DataFrame, ax, *, lr: float | None = None, smooth: int = 5):
    """Mean token entropy of completions with A > 0 (solid) and A < 0 (dashed), per method, at one lr.

    A series with no finite value (no completion of that sign, e.g. WAPO's A = max(r - p_hat, 0) is never
    negative) draws no line: the legend lists the drawn lines and names the others in its title. Returns
    the labels of the series not drawn."""
    cols = ["entropy/pos_adv", "entropy/neg_adv"]
    _require(metrics, ["step", "method", "lr", *cols], "plot_entropy_by_sign")
    d = metrics if lr is None else metrics[np.isclose(metrics["lr"], lr)]
    missing = []
    for m, g in d.groupby("method", sort=True):
        for col, ls, sgn in zip(cols, ("-", "--"), (">", "<")):
            mean = _smooth(g.groupby("step")[col].mean(), smooth)
            name = f"{method_label(m)}, $A {sgn} 0$"
            if not np.isfinite(mean.to_numpy(float)).any():
                missing.append(name)
                continue
            ax.plot(mean.index, mean.to_numpy(), color=method_color(m), ls=ls, label=name)
    ax.set_xlabel(label("step"))
    ax.set_ylabel(label("H"))
    title = f"no completions: {', '.join(missing)}" if missing else None
    if ax.get_lines():
        ax.legend(frameon=False, fontsize=8, title=title, title_fontsize=7)
    elif title:
        ax.text(0.5, 0.5, title.replace(": ", ":\n", 1), transform=ax.transAxes, ha="center", va="center", fontsize=8)
    return missing


def plot_prompt_alignment(probes: pd.DataFrame, ax, *, hue: str = "lr",
                          condition: str = "not checked for these steps"):
    """Per probe prompt and probe step: accuracy J_hat against its cumulative alignment M_q (colour: ``hue``).

    The logistic fit (gapdyn.fit_logistic_accuracy) uses the smallest ``hue`` value only (the stable
    runs); Theorem 1's bound J >= sigmoid(logit J0 + M/2) (Suk & Duan, arXiv 2510.08539, Thm 1; proved
    under its step condition) is drawn at the median initial J_hat of those prompts, labelled with its
    formula and with ``condition``: where that step condition holds for the steps drawn. Accuracy is a
    fraction: the y axis is [0, 1]. Returns the fit, or None when no fit is possible (e.g. every accuracy 0)."""
    _require(probes, ["step", "J_hat", "M", hue], "plot_prompt_alignment")
    keys = sorted(probes[hue].unique())
    cols = ["#0072B2", "#D55E00", "#009E73", "#CC79A7"]
    for i, k in enumerate(keys):
        g = probes[probes[hue] == k]
        ax.scatter(g["M"], g["J_hat"], s=6, alpha=0.3, color=cols[i % 4], label=f"{hue} {k:g}", rasterized=True,
                   clip_on=False)
    base = probes[probes[hue] == keys[0]] if keys else probes
    fit = None
    try:
        if len(base) < 3 or np.ptp(base["J_hat"].to_numpy(float)) == 0:
            raise ValueError("accuracies without variation")
        fit = gapdyn.fit_logistic_accuracy(base["M"].to_numpy(float), base["J_hat"].to_numpy(float))
        mm = np.linspace(0, float(probes["M"].max()) or 1.0, 200)
        ax.plot(mm, fit.predict(mm), color="black", lw=2,
                label=f"fit ({hue} {keys[0]:g}): $\\sigma({fit.slope:.2f}M {fit.intercept:+.2f})$")
        J0 = float(np.clip(base[base["step"] == base["step"].min()]["J_hat"].median(), 0.01, 0.99))
        ax.plot(mm, gapdyn.logodds_lower_bound(J0, mm), color="black", ls="--", lw=1.5,
                label=f"Suk & Duan Thm 1 bound $\\sigma(\\mathrm{{logit}}\\,J_0 + M/2)$, $J_0$ = {J0:.2f}:\n"
                      f"holds only under Thm 1's step condition, {condition}")
    except (RuntimeError, ValueError, TypeError) as exc:  # curve_fit failure on degenerate data
        ax.text(0.5, 0.5, f"no logistic fit:\n{exc}", transform=ax.transAxes, ha="center")
    ax.set_xlabel(label("M_q"))
    ax.set_ylabel(r"per-prompt accuracy $\hat J_q$ (fraction)")
    ax.set_ylim(0, 1)
    ax.legend(frameon=False, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    return fit


def plot_bin_shares(metrics: pd.DataFrame, ax, *, smooth: int = 5):
    """Share of completion tokens in each WAPO bin over steps (colour: bin; line style: method); a share
    is a fraction, the y axis is [0, 1]. A (bin, method) without tokens at any step draws no line."""
    cols = [f"taxonomy/{b}" for b in BIN_COLORS]
    _require(metrics, ["step", "method", *cols], "plot_bin_shares")
    for i, (m, g) in enumerate(metrics.groupby("method", sort=True)):
        counts = g.groupby("step")[cols].sum()
        tot = counts.sum(axis=1).replace(0, np.nan)
        for b, col in zip(BIN_COLORS, cols):
            share = _smooth(counts[col] / tot, smooth)
            if not np.isfinite(share.to_numpy(float)).any():
                continue
            ax.plot(share.index, share.to_numpy(), color=BIN_COLORS[b], ls=_LR_STYLES[i % 4],
                    label=f"{b} ({method_label(m)})")
    ax.set_xlabel(label("step"))
    ax.set_ylabel("share of completion tokens")
    ax.set_ylim(0, 1)
    if ax.get_lines():
        ax.legend(frameon=False, fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    else:
        ax.text(0.5, 0.5, "no tokens with A != 0 to bin", transform=ax.transAxes, ha="center", va="center", fontsize=8)
    return ax


def plot_alerts(runs: pd.DataFrame, alerts: pd.DataFrame, ax):
    """One row per run (method, lr, seed): its steps as a bar, every alert of the collapse rule as a marker.

    An alert is an event, not a collapse: the title counts the runs with an alert and, when ``runs`` has an
    ``outcome`` column (paper_figs.llm.reward_outcomes), the runs that end collapsed; each row's label then ends
    with its outcome."""
    _require(runs, ["method", "lr", "seed", "steps_run"], "plot_alerts")
    runs = runs.sort_values(["lr", "method", "seed"]).reset_index(drop=True)
    markers = {"entropy_blowup": "^", "entropy_collapse": "v", "reward_collapse": "x", "identical_rollouts": "s"}
    seen = set()
    for i, r in runs.iterrows():
        ax.plot([0, r["steps_run"]], [i, i], color=method_color(r["method"]), lw=3, alpha=0.35)
        a = alerts[(alerts["method"] == r["method"]) & np.isclose(alerts["lr"], r["lr"]) & (alerts["seed"] == r["seed"])]
        for _, al in a.iterrows():
            lab = al["rule"] if al["rule"] not in seen else None
            seen.add(al["rule"])
            ax.plot(al["step"], i, marker=markers.get(al["rule"], "o"), color="black", ms=7, ls="none", label=lab)
    ax.set_yticks(range(len(runs)))
    ends = runs["outcome"] if "outcome" in runs else None
    ax.set_yticklabels([f"{method_label(r.method)} lr {r.lr:g} s{r.seed}" + (f": {ends.iloc[i]}" if ends is not None
                                                                           else "")
                        for i, r in enumerate(runs.itertuples())], fontsize=7)
    ax.set_xlabel(label("step"))
    alerted = len({(r.method, float(r.lr), r.seed) for r in alerts.itertuples()} &
                  {(r.method, float(r.lr), r.seed) for r in runs.itertuples()}) if len(alerts) else 0
    title = f"alerts (events): {alerted}/{len(runs)} runs alerted"
    if ends is not None:
        title += f"\n{int((ends == 'collapsed').sum())}/{len(runs)} end collapsed (run outcome)"
    ax.set_title(title, fontsize=10)
    if seen:
        ax.legend(frameon=False, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    ax.grid(False)
    return ax


# --------------------------------------------------------------------------------------------------
# One run's logged curves (gapdyn inspect).

def plot_logged_curve(ax, x, y, *, ylabel: str, xlabel: str = "step", logy: bool = False, refs=(),
                      markers: bool = False):
    """One logged metric of one run against its steps: a line (``markers``: a point per logged value, for
    metrics logged on probed steps only), ``refs`` [(y, label)] as dashed horizontal lines named in the legend.
    Non-finite values are not drawn (on a log axis, values <= 0 neither); the axis limits are those of the
    values drawn and of the reference lines."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y) & ((y > 0) if logy else True)
    ax.plot(x[ok], y[ok], marker="o" if markers else None, ms=3.5, lw=1.0 if markers else 1.4, color="#0072B2")
    for (v, name), ls in zip(refs, ("--", ":", "-.")):
        if np.isfinite(v) and (v > 0 or not logy):
            ax.axhline(v, color="#D55E00", ls=ls, lw=1.0, label=name)
    if logy:
        ax.set_yscale("log")
        _plain_log_ticks(ax, "y")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if refs:
        ax.legend(frameon=False, fontsize=7)
    dropped = int((~ok).sum())
    if dropped:
        ax.text(0.99, 0.01, f"{dropped} value(s) not drawn (non-finite{' or <= 0' if logy else ''})",
                transform=ax.transAxes, ha="right", va="bottom", fontsize=7, color="#999999")
    return ax
