"""Reusable plotting functions: each draws one idea on a given matplotlib Axes from a tidy table.

Figure scripts and notebooks call these (STYLE.md rule 10): they only draw and, where a fit is
drawn, call gapdyn's fitting functions (``gapdyn.loglog_slope``, ``gapdyn.fit_logistic_accuracy``,
``gapdyn.logodds_lower_bound``). Column names follow the README glossary.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
from scipy.stats import binned_statistic_2d

import gapdyn

from .style import BIN_COLORS, label, method_color, method_label

__all__ = [
    "plot_binned_map",
    "plot_taxonomy_effect",
    "plot_taxonomy_misses",
    "plot_miss_share_vs_margin",
    "plot_expected_scalars",
    "plot_logodds_along_direction",
    "plot_first_order_vs_exact",
    "plot_dmu_samples",
    "bin_legend_handles",
    "plot_phase_diagram",
    "plot_loglog_fit",
    "plot_trajectories",
    "plot_logistic_fit",
    "plot_method_curves",
    "plot_run_curves",
    "plot_entropy_by_sign",
    "plot_prompt_alignment",
    "plot_bin_shares",
    "plot_alerts",
    "panel_unavailable",
    "plot_bound_violation",
    "plot_scalar_vs_collapse",
    "plot_failure_decay",
    "plot_plateau_vs_optimum",
]


def _require(df: pd.DataFrame, cols: Sequence[str], what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{what} needs columns {list(cols)}; missing {missing} (have {list(df.columns)})")


# --------------------------------------------------------------------------------------------------
# Generic


def plot_binned_map(df, x, y, value, ax, *, bins=40, statistic="mean", cmap="PuOr_r", center=None, vmax=None,
                    xlim=(0, 1), ylim=(0, 1)):
    """Mean (or other ``statistic``) of ``value`` over a 2-D grid of (x, y); empty cells stay blank.

    ``center`` (e.g. 0) makes the colour scale symmetric around it (diverging maps). Returns the image.
    """
    _require(df, [x, y, value], "plot_binned_map")
    stat, xe, ye, _ = binned_statistic_2d(
        df[x].to_numpy(float), df[y].to_numpy(float), df[value].to_numpy(float), statistic=statistic,
        bins=bins, range=[xlim, ylim],
    )
    kw = {}
    if center is not None:
        m = vmax if vmax is not None else np.nanmax(np.abs(stat - center))
        m = m if np.isfinite(m) and m > 0 else 1.0
        kw = {"vmin": center - m, "vmax": center + m}
    elif vmax is not None:
        kw = {"vmax": vmax}
    im = ax.pcolormesh(xe, ye, stat.T, cmap=cmap, shading="flat", rasterized=True, **kw)
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    return im


def _peak_valley_line(ax, *, text=True):
    t = np.linspace(0, 1, 50)
    ax.plot(t, t, color="black", lw=1.2, ls="--")
    if text:
        ax.text(0.8, 0.22, "peak\n$p_s \\geq C$", fontsize=9, ha="center", va="center")
        ax.text(0.42, 0.88, "valley\n$p_s < C$", fontsize=9, ha="center", va="center")


# --------------------------------------------------------------------------------------------------
# Figure 5: the WAPO taxonomy


def plot_taxonomy_effect(table: pd.DataFrame, ax, *, value: str = "dH", sign: float = 1.0, bins: int = 40, vmax=None):
    """Mean first-order effect (``dH`` or ``dp_s``, per unit eta) over (p_s, C) for advantages of one sign.

    ``table`` from :func:`paper_figs.data.taxonomy_table`; the dashed line is the peak/valley
    boundary p_s = C. Returns the colour mesh (for a colour bar).
    """
    _require(table, ["p_s", "C", "A", value], "plot_taxonomy_effect")
    sub = table[np.sign(table["A"]) == np.sign(sign)]
    im = plot_binned_map(sub, "p_s", "C", value, ax, bins=bins, center=0.0, vmax=vmax)
    _peak_valley_line(ax)
    ax.set_xlabel(label("p_s"))
    ax.set_ylabel(label("C"))
    what = r"$\Delta H$" if value == "dH" else r"$\Delta p_s$"
    ax.set_title(f"{what}, advantage $A {'>' if sign > 0 else '<'} 0$")
    ax.grid(False)
    return im


def plot_taxonomy_misses(table: pd.DataFrame, ax, *, bins: int = 40):
    """Share of tokens whose bin (peak/valley x sign A) mispredicts the exact sign of Delta H, over (p_s, C)."""
    _require(table, ["p_s", "C", "A", "mispredicted"], "plot_taxonomy_misses")
    sub = table[table["A"] > 0].assign(miss=lambda d: d["mispredicted"].astype(float))
    im = plot_binned_map(sub, "p_s", "C", "miss", ax, bins=bins, cmap="Greys", vmax=1.0)
    im.set_clim(0, 1)
    _peak_valley_line(ax, text=False)
    ax.set_xlabel(label("p_s"))
    ax.set_ylabel(label("C"))
    share = sub["miss"].mean()
    ax.set_title(f"bin misses sign of $\\Delta H$: {100 * share:.1f}%")
    ax.grid(False)
    return im


def plot_miss_share_vs_margin(table: pd.DataFrame, ax, *, bins: int = 100):
    """Histogram of p_s - C for all tokens and for the mispredicted ones (log counts)."""
    _require(table, ["p_s", "C", "A", "mispredicted", "bin"], "plot_miss_share_vs_margin")
    sub = table[table["A"] > 0]
    margin = (sub["p_s"] - sub["C"]).to_numpy()
    edges = np.linspace(-0.5, 0.5, bins + 1)
    ax.hist(margin, bins=edges, color="#999999", alpha=0.6, label="all sampled tokens")
    ax.hist(margin[sub["mispredicted"].to_numpy()], bins=edges, color="#D55E00", label="bin mispredicts")
    ax.axvline(0, color="black", ls="--", lw=1.2)
    ax.set_yscale("log")
    ax.set_xlabel(r"margin $p_s - C$ (valley $<0<$ peak)")
    ax.set_ylabel("tokens (count)")
    ax.legend(loc="upper left", frameon=False)
    return ax


# --------------------------------------------------------------------------------------------------
# Theory helpers used by the notebooks


def plot_expected_scalars(ax, *, group_size: int = 8, methods: Sequence[str] = ("reinforce", "grpo", "dr_grpo", "wapo"),
                          n: int = 199):
    """E[w] / Gap against J for each method (gapdyn.expected_scalar): how far each expected step goes."""
    J = np.linspace(0.005, 0.995, n)
    for m in methods:
        ax.plot(J, gapdyn.expected_scalar(m, J, group_size), color=method_color(m), label=method_label(m))
    ax.set_xlabel(label("J"))
    ax.set_ylabel(r"$\mathbb{E}[w] \,/\, (g^+ - g^-)$")
    ax.set_title(f"expected step along the Gap ($G = {group_size}$)")
    ax.legend(frameon=False)
    return ax


def plot_logodds_along_direction(ax, logodds_fn, theta, direction, *, etas=None, threshold=None):
    """Phi(theta + eta w) - Phi(theta) against eta (log axis), with the sharp threshold marked."""
    etas = np.geomspace(1e-3, 1e3, 200) if etas is None else np.asarray(etas, dtype=float)
    phi0 = logodds_fn(np.asarray(theta, float))
    dphi = np.array([logodds_fn(theta + e * np.asarray(direction, float)) - phi0 for e in etas])
    ax.plot(etas, dphi, color="#0072B2")
    ax.axhline(0, color="black", lw=0.8)
    if threshold is not None and np.isfinite(threshold):
        ax.axvline(threshold, color="#D55E00", ls="--", label=rf"sharp threshold $\eta = {threshold:.3g}$")
        ax.legend(frameon=False)
    ax.set_xscale("log")
    ax.set_xlabel(label("eta"))
    ax.set_ylabel(r"$\Phi(\theta + \eta w) - \Phi(\theta)$ (nats)")
    return ax


def bin_legend_handles():
    """Legend patches for the four WAPO bins."""
    from matplotlib.patches import Patch

    return [Patch(color=c, label=n) for n, c in BIN_COLORS.items()]


def plot_first_order_vs_exact(first_order, exact, ax, *, what: str = r"$\Delta H$"):
    """Exact finite-step change against the first-order prediction (same units), with the diagonal."""
    x, y = np.asarray(first_order, float).ravel(), np.asarray(exact, float).ravel()
    ax.scatter(x, y, s=4, alpha=0.4, color="#0072B2", rasterized=True)
    lim = float(np.nanmax(np.abs(np.r_[x, y]))) or 1.0
    ax.plot([-lim, lim], [-lim, lim], color="black", ls="--", lw=1)
    ax.set_xlabel(f"first order {what}")
    ax.set_ylabel(f"exact {what}")
    return ax


def plot_dmu_samples(dmus, expected, ax, *, method: str = "grpo"):
    """Histogram of sampled gap alignments Delta mu = <w, gap> with the closed-form mean E[w] . gap."""
    d = np.asarray(dmus, float).ravel()
    ax.hist(d, bins=60, color=method_color(method), alpha=0.7, label=f"sampled {method_label(method)} groups")
    ax.axvline(float(np.mean(d)), color="black", lw=1.5, label=f"Monte-Carlo mean {np.mean(d):.3g}")
    ax.axvline(float(expected), color="#E69F00", ls="--", lw=1.5, label=f"closed form {float(expected):.3g}")
    ax.axvline(0, color="#999999", lw=0.8)
    ax.set_xlabel(label("dmu"))
    ax.set_ylabel("groups (count)")
    ax.legend(frameon=False)
    return ax


# --------------------------------------------------------------------------------------------------
# Bandit experiments (figures 1-4, 6). Tidy inputs: one row per (cell, seed, step or summary).


def _log_edges(v: np.ndarray) -> np.ndarray:
    """Cell edges for sorted positive centres on a log axis (geometric midpoints)."""
    v = np.asarray(v, float)
    if v.size == 1:
        return np.array([v[0] / 1.5, v[0] * 1.5])
    mid = np.sqrt(v[1:] * v[:-1])
    return np.r_[v[0] ** 2 / mid[0], mid, v[-1] ** 2 / mid[-1]]


def _lin_edges(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, float)
    if v.size == 1:
        return np.array([v[0] - 0.5, v[0] + 0.5])
    mid = 0.5 * (v[1:] + v[:-1])
    return np.r_[2 * v[0] - mid[0], mid, 2 * v[-1] - mid[-1]]


def plot_phase_diagram(df: pd.DataFrame, ax, *, x: str = "eta", y: str = "K", value: str = "J", logx: bool = True,
                       logy: bool = False, cmap: str = "cividis", vmin: float = 0.0, vmax: float = 1.0,
                       curves: pd.DataFrame | None = None, curve_x: str = "eta_pred", curve_y: str | None = None,
                       curve_label: str = "predicted threshold", curve_hue: str | None = None,
                       curve_lines: bool = True, legend_below: bool = False):
    """Mean ``value`` (e.g. J after K steps) over the (x, y) grid, averaged over seeds.

    ``curves``: predicted-threshold curves to overlay, one row per point with columns ``curve_x``
    (the predicted critical x, e.g. eta) and ``curve_y`` (default ``y``); ``curve_hue`` splits several
    predictors (each its own line style); ``curve_lines=False`` draws markers only (categorical y,
    e.g. one row per instance). Returns the colour mesh.
    """
    _require(df, [x, y, value], "plot_phase_diagram")
    grid = df.groupby([y, x])[value].mean().unstack(x).sort_index()
    xs, ys = grid.columns.to_numpy(float), grid.index.to_numpy(float)
    xe = _log_edges(xs) if logx else _lin_edges(xs)
    ye = _log_edges(ys) if logy else _lin_edges(ys)
    im = ax.pcolormesh(xe, ye, grid.to_numpy(float), cmap=cmap, vmin=vmin, vmax=vmax, shading="flat", rasterized=True)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    if curves is not None and len(curves):
        cy = curve_y or y
        styles = ["-", "--", ":", "-.", "-"]
        markers = ["o", "s", "^", "D", "v"]
        colours = ["#D55E00", "#56B4E9", "#E69F00", "#CC79A7", "#FFFFFF"]
        groups = curves.groupby(curve_hue, sort=False) if curve_hue else [(curve_label, curves)]
        for i, (name, c) in enumerate(groups):
            c = c.sort_values(cy)
            ok = np.isfinite(c[curve_x].to_numpy(float)) & (c[curve_x].to_numpy(float) > 0)
            kw = dict(color=colours[i % 5], marker=markers[i % 5], label=str(name), mec="black", mew=0.5)
            if curve_lines:
                ax.plot(c[curve_x][ok], c[cy][ok], ls=styles[i % 5], lw=2, ms=3, **kw)
            else:
                ax.plot(c[curve_x][ok], c[cy][ok], ls="none", ms=6, **kw)
        if legend_below:
            ax.legend(frameon=False, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
        else:
            ax.legend(frameon=True, fontsize=7, loc="best")
        cx = curves[curve_x].to_numpy(float)
        cx = cx[np.isfinite(cx) & (cx > 0)]
        if cx.size:  # widen the x range so that predictors far off the grid stay visible
            lo = min(xe[0], cx.min() / 1.5) if logx else min(xe[0], cx.min())
            hi = max(xe[-1], cx.max() * 1.5) if logx else max(xe[-1], cx.max())
            xe = np.r_[lo, xe[1:-1], hi] if xe.size > 2 else np.array([lo, hi])
    ax.set_xlim(xe[0], xe[-1])
    ax.set_ylim(ye[0], ye[-1])
    ax.grid(False)
    return im


def plot_loglog_fit(df: pd.DataFrame, ax, *, x: str, y: str, hue: str | None = None, hue_labels: dict | None = None,
                    colors: Sequence[str] = ("#0072B2", "#D55E00", "#009E73", "#CC79A7"), reference: float | None = None):
    """Points y(x) on log-log axes (mean over seeds, bars = min-max), with the fitted slope per group.

    The fit is gapdyn.loglog_slope on all finite positive points of the group; the legend gives the
    slope +- its standard error. ``reference`` draws a guide line of that slope. Returns
    {group: LogLogFit}.
    """
    _require(df, [x, y] + ([hue] if hue else []), "plot_loglog_fit")
    fits = {}
    groups = df.groupby(hue, sort=True) if hue else [(None, df)]
    for i, (name, g) in enumerate(groups):
        g = g[np.isfinite(g[y].to_numpy(float)) & (g[y] > 0) & (g[x] > 0)]
        if g.empty:
            continue
        col = colors[i % len(colors)]
        st = g.groupby(x)[y].agg(["mean", "min", "max"])
        ax.errorbar(st.index, st["mean"], yerr=[st["mean"] - st["min"], st["max"] - st["mean"]], fmt="o", color=col,
                    ms=5, capsize=2)
        lab = (hue_labels or {}).get(name, str(name)) if hue else "measured"
        if g[x].nunique() >= 3:
            fit = gapdyn.loglog_slope(g[x].to_numpy(float), g[y].to_numpy(float))
            fits[name] = fit
            xx = np.geomspace(g[x].min(), g[x].max(), 50)
            ax.plot(xx, np.exp(fit.intercept) * xx**fit.slope, color=col,
                    label=f"{lab}: slope {fit.slope:.2f} ± {fit.slope_stderr:.2f}")
        else:
            ax.plot([], [], color=col, marker="o", label=f"{lab} (too few points to fit)")
    if reference is not None and len(df):
        x0 = float(df[x].min())
        y0 = float(df.loc[df[x] == x0, y].replace([np.inf, -np.inf], np.nan).dropna().median())
        if np.isfinite(y0) and y0 > 0:
            xx = np.geomspace(df[x].min(), df[x].max(), 20)
            ax.plot(xx, y0 * (xx / x0) ** reference, color="#999999", ls=":", label=f"slope {reference:g} guide")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_ticks(ax)
    ax.legend(frameon=False, fontsize=8)
    return fits


def _plain_log_ticks(ax, axes: str = "xy") -> None:
    """Log axes labelled 0.1, 1, 10, 3 ... instead of 10^-1, 3x10^0."""
    from matplotlib.ticker import FuncFormatter

    def minor(v, _):
        if v <= 0:
            return ""
        lead = round(v / 10 ** np.floor(np.log10(v)), 6)
        return f"{v:g}" if lead in (2.0, 5.0) else ""

    for axis in [a for n, a in (("x", ax.xaxis), ("y", ax.yaxis)) if n in axes]:
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(FuncFormatter(minor))


def plot_trajectories(df: pd.DataFrame, ax, *, x: str = "step", y: str = "J", hue: str = "eta", colors=None,
                      labels: dict | None = None, band: bool = True, logy: bool = False, lw: float = 1.8,
                      ls: str = "-"):
    """Mean ``y`` against ``x`` for each value of ``hue`` (e.g. eta), with an inter-quartile band over seeds."""
    _require(df, [x, y, hue], "plot_trajectories")
    keys = sorted(df[hue].unique(), key=lambda v: (isinstance(v, str), v))
    cols = colors or {k: c for k, c in zip(keys, ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7",
                                                  "#000000", "#999999"] * 4)}
    for k in keys:
        g = df[df[hue] == k].groupby(x)[y]
        m = g.mean()
        lab = (labels or {}).get(k, f"{hue} = {k:g}" if isinstance(k, (int, float, np.number)) else str(k))
        ax.plot(m.index, m.to_numpy(), color=cols.get(k, "#999999"), lw=lw, ls=ls, label=lab)
        if band:
            q1, q3 = g.quantile(0.25), g.quantile(0.75)
            ax.fill_between(m.index, q1.to_numpy(), q3.to_numpy(), color=cols.get(k, "#999999"), alpha=0.15, lw=0)
    if logy:
        ax.set_yscale("log")
    return ax


def plot_logistic_fit(df: pd.DataFrame, ax, *, M: str = "M", acc: str = "J", J0: float | None = None,
                      hue: str | None = None, max_points: int = 4000, seed: int = 0):
    """Accuracy against cumulative alignment M: points, the fitted logistic sigmoid(a M + b)
    (gapdyn.fit_logistic_accuracy) and Theorem 1's lower bound sigmoid(logit J0 + M/2)
    (gapdyn.logodds_lower_bound). Returns the LogisticFit."""
    _require(df, [M, acc] + ([hue] if hue else []), "plot_logistic_fit")
    d = df[np.isfinite(df[M]) & np.isfinite(df[acc])]
    show = d.sample(min(len(d), max_points), random_state=seed) if len(d) > max_points else d
    if hue:
        for i, (name, g) in enumerate(show.groupby(hue)):
            ax.scatter(g[M], g[acc], s=5, alpha=0.35, color=["#0072B2", "#E69F00", "#009E73", "#CC79A7"][i % 4],
                       label=f"{hue} = {name}", rasterized=True)
    else:
        ax.scatter(show[M], show[acc], s=5, alpha=0.35, color="#0072B2", label="runs (M, J)", rasterized=True)
    fit = gapdyn.fit_logistic_accuracy(d[M].to_numpy(float), d[acc].to_numpy(float))
    mm = np.linspace(0, float(d[M].max()), 200)
    ax.plot(mm, fit.predict(mm), color="#D55E00", lw=2,
            label=f"fit $\\sigma({fit.slope:.2f}M {fit.intercept:+.2f})$, $R^2$ = {fit.r2:.2f}")
    if J0 is not None:
        ax.plot(mm, gapdyn.logodds_lower_bound(J0, mm), color="black", ls="--", lw=1.5,
                label=f"Thm 1 bound $\\sigma(\\mathrm{{logit}}\\,J_0 + M/2)$, $J_0$ = {J0:.2f}")
    ax.set_xlabel(label("M"))
    ax.set_ylabel(label("accuracy"))
    ax.set_ylim(-0.02, 1.02)
    ax.legend(frameon=False, fontsize=8, loc="lower right")
    return fit


def plot_method_curves(df: pd.DataFrame, ax, *, x: str = "eta", y: str = "collapsed", method: str = "method",
                       logx: bool = True, band: bool = False, colors: dict | None = None):
    """Per method (or any grouping column): mean ``y`` (e.g. share of collapsed runs, final J) against ``x``.

    Colours: ``colors[group]`` if given, else the method's fixed colour (style.METHOD_COLORS)."""
    _require(df, [x, y, method], "plot_method_curves")
    markers = "osD^vP*X"
    for i, (m, g) in enumerate(df.groupby(method, sort=False)):
        st = g.groupby(x)[y].agg(["mean", "count", "std"])
        col = (colors or {}).get(m) or method_color(m)
        ax.plot(st.index, st["mean"], marker=markers[i % len(markers)], ms=6 - 0.6 * (i % 4), alpha=0.9,
                color=col, label=method_label(m), mec="white", mew=0.5)
        if band:
            se = st["std"].fillna(0) / np.sqrt(st["count"].clip(lower=1))
            ax.fill_between(st.index, st["mean"] - se, st["mean"] + se, color=col, alpha=0.15, lw=0)
    if logx:
        ax.set_xscale("log")
    ax.legend(frameon=False, fontsize=8)
    return ax


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
    """Mean token entropy of completions with A > 0 (solid) and A < 0 (dashed), per method, at one lr."""
    cols = ["entropy/pos_adv", "entropy/neg_adv"]
    _require(metrics, ["step", "method", "lr", *cols], "plot_entropy_by_sign")
    d = metrics if lr is None else metrics[np.isclose(metrics["lr"], lr)]
    for m, g in d.groupby("method", sort=True):
        for col, ls, sgn in zip(cols, ("-", "--"), (">", "<")):
            mean = _smooth(g.groupby("step")[col].mean(), smooth)
            ax.plot(mean.index, mean.to_numpy(), color=method_color(m), ls=ls, label=f"{method_label(m)}, $A {sgn} 0$")
    ax.set_xlabel(label("step"))
    ax.set_ylabel(label("H"))
    ax.legend(frameon=False, fontsize=8)
    return ax


def plot_prompt_alignment(probes: pd.DataFrame, ax, *, hue: str = "lr"):
    """Per probe prompt and probe step: accuracy J_hat against its cumulative alignment M_q (colour: ``hue``).

    The logistic fit (gapdyn.fit_logistic_accuracy) uses the smallest ``hue`` value only (the stable
    runs); Theorem 1's bound sigmoid(logit J0 + M/2) is drawn at the median initial J_hat of those
    prompts. Returns the fit, or None when no fit is possible (e.g. every accuracy 0)."""
    _require(probes, ["step", "J_hat", "M", hue], "plot_prompt_alignment")
    keys = sorted(probes[hue].unique())
    cols = ["#0072B2", "#D55E00", "#009E73", "#CC79A7"]
    for i, k in enumerate(keys):
        g = probes[probes[hue] == k]
        ax.scatter(g["M"], g["J_hat"], s=6, alpha=0.3, color=cols[i % 4], label=f"{hue} {k:g}", rasterized=True)
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
                label=f"Thm 1 bound at median $J_0$ = {J0:.2f}")
    except (RuntimeError, ValueError, TypeError) as exc:  # curve_fit failure on degenerate data
        ax.text(0.5, 0.5, f"no logistic fit:\n{exc}", transform=ax.transAxes, ha="center")
    ax.set_xlabel(label("M_q"))
    ax.set_ylabel(r"per-prompt accuracy $\hat J_q$ (fraction)")
    ax.set_ylim(-0.02, 1.5)
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.legend(frameon=False, fontsize=7, loc="upper center", ncol=2)
    return fit


def plot_bin_shares(metrics: pd.DataFrame, ax, *, smooth: int = 5):
    """Share of completion tokens in each WAPO bin over steps (colour: bin; line style: method)."""
    cols = [f"taxonomy/{b}" for b in BIN_COLORS]
    _require(metrics, ["step", "method", *cols], "plot_bin_shares")
    for i, (m, g) in enumerate(metrics.groupby("method", sort=True)):
        counts = g.groupby("step")[cols].sum()
        tot = counts.sum(axis=1).replace(0, np.nan)
        for b, col in zip(BIN_COLORS, cols):
            share = _smooth(counts[col] / tot, smooth)
            ax.plot(share.index, share.to_numpy(), color=BIN_COLORS[b], ls=_LR_STYLES[i % 4],
                    label=f"{b} ({method_label(m)})")
    ax.set_xlabel(label("step"))
    ax.set_ylabel("share of completion tokens")
    ax.set_ylim(0, 1.45)
    ax.legend(frameon=False, fontsize=7, ncol=2, loc="upper center")
    return ax


def plot_alerts(runs: pd.DataFrame, alerts: pd.DataFrame, ax):
    """One row per run (method, lr, seed): its steps as a bar, every collapse alert as a marker."""
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
    ax.set_yticklabels([f"{method_label(r.method)} lr {r.lr:g} s{r.seed}" for r in runs.itertuples()], fontsize=7)
    ax.set_xlabel(label("step"))
    ax.set_title(f"collapse alerts ({int(runs['collapsed'].sum()) if 'collapsed' in runs else '?'}"
                 f"/{len(runs)} runs collapsed)")
    if seen:
        ax.legend(frameon=False, fontsize=8, loc="lower right")
    ax.grid(False)
    return ax


def panel_unavailable(ax, reason: str) -> None:
    """Mark a panel whose data source is missing (never draw made-up data)."""
    import textwrap

    head = "error:" if "failed:" in reason else "not available yet:"
    ax.text(0.5, 0.5, head + "\n" + "\n".join(textwrap.wrap(reason, 40)), transform=ax.transAxes,
            ha="center", va="center", fontsize=8, color="#D55E00")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)


def plot_bound_violation(thm1: pd.DataFrame, ax):
    """Theorem-1 runs: worst violation max_k (bound_k - J_k) against the step factor f, per direction
    (method, sampling); filled markers where every step met the step condition, open otherwise."""
    _require(thm1, ["factor", "worst_violation", "meets", "method", "sampling"], "plot_bound_violation")
    for i, ((m, s), g) in enumerate(thm1.groupby(["method", "sampling"], sort=False)):
        col = method_color(m) if m != "gap" else "#000000"
        lab = f"{'log-odds ascent' if m == 'gap' else method_label(m)} ({s})"
        for meets, gg in g.groupby(g["meets"].astype(bool)):
            ax.scatter(gg["factor"], gg["worst_violation"], s=30, marker="os^D"[i % 4], color=col if meets else "none",
                       edgecolors=col, label=lab if meets or not g["meets"].astype(bool).any() else None)
    ax.axhline(0, color="black", lw=1, ls="--")
    ax.set_xscale("log")
    top = float(np.nanmax(thm1["worst_violation"])) if len(thm1) else 0.0
    ax.set_ylim(-0.05, max(0.05, 1.15 * top))
    ax.set_xlabel(r"step factor $f$: $\eta = f \times$ Thm 1 bound at $\theta_0$")
    ax.set_ylabel(r"worst violation $\max_k(\mathrm{bound}_k - J_k)$")
    ax.legend(frameon=False, fontsize=7)
    return ax


def plot_scalar_vs_collapse(summary: pd.DataFrame, ax):
    """Per method and sampling: P(collapse) against the expected scalar E[w]/Gap at J0 (labelled points)."""
    _require(summary, ["sampling", "method", "scalar_at_J0", "P_collapse"], "plot_scalar_vs_collapse")
    for s, marker in (("sampled", "o"), ("exact", "s")):
        g = summary[summary["sampling"] == s]
        for r in g.itertuples():
            ax.scatter(r.scalar_at_J0, r.P_collapse, marker=marker, s=45, color=method_color(r.method),
                       edgecolors="black", linewidths=0.5)
            if s == "sampled":
                ax.annotate(method_label(r.method), (r.scalar_at_J0, r.P_collapse), fontsize=7,
                            xytext=(4, 3), textcoords="offset points")
    ax.scatter([], [], marker="o", color="#999999", label="sampled (G = 8)")
    ax.scatter([], [], marker="s", color="#999999", label="exact")
    ax.set_xscale("log")
    ax.set_xlabel(r"expected scalar $\mathbb{E}[w] / (g^+ - g^-)$ at $J_0$")
    ax.set_ylabel("P(collapse), all etas")
    ax.legend(frameon=False, fontsize=8)
    return ax


def plot_failure_decay(curve: pd.DataFrame, ax, *, groups=("method", "eta"), reference: float = -1.0):
    """1 - J against step k on log-log axes: the recorded points (mean over instances) and the power law
    coef * k^-exponent fitted by the experiment (its tail fit), one colour per group."""
    _require(curve, ["step", "fail", "exponent", "coef", *groups], "plot_failure_decay")
    cols = ["#000000", "#D55E00", "#0072B2", "#009E73", "#CC79A7", "#E69F00"]
    for i, (key, g) in enumerate(curve.groupby(list(groups), sort=True)):
        key = key if isinstance(key, tuple) else (key,)
        col = method_color(key[0]) if key[0] in ("reinforce", "grpo", "dr_grpo", "wapo") else cols[i % len(cols)]
        pts = g.groupby("step")["fail"].mean()
        pts = pts[pts > 0]
        lab = ", ".join(f"{method_label(k) if n == 'method' else f'{n} {k:g}' if isinstance(k, float) else k}"
                        for n, k in zip(groups, key))
        ax.plot(pts.index, pts.to_numpy(), "o", color=col, ms=6)
        fit = g.drop_duplicates(["instance"] if "instance" in g else None)
        b, a = float(np.nanmedian(fit["exponent"])), float(np.nanmedian(fit["coef"]))
        if np.isfinite(a) and np.isfinite(b) and a > 0 and len(pts):
            kk = np.geomspace(max(1.0, pts.index.min() / 2), pts.index.max() * 1.5, 50)
            ax.plot(kk, a * kk ** (-b), color=col, label=f"{lab}: $1-J \\approx {a:.3g}\\,k^{{-{b:.2f}}}$")
        else:
            ax.plot([], [], "o", color=col, label=lab)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(label("step"))
    ax.set_ylabel(r"failure rate $1 - J$")
    ax.legend(frameon=False, fontsize=7)
    return ax


def plot_plateau_vs_optimum(df: pd.DataFrame, ax, *, part: str = "part"):
    """Final J against the best reachable J* (computed by the experiment) per run, one marker per setting;
    points on the diagonal plateau at the optimum, points below it stagnate."""
    _require(df, ["J_final", "J_star", part], "plot_plateau_vs_optimum")
    d = df[np.isfinite(df["J_star"].astype(float))]
    for (name, g), mk, col in zip(d.groupby(part), "oDs^", ["#0072B2", "#D55E00", "#009E73", "#CC79A7"]):
        ax.scatter(g["J_star"], g["J_final"], marker=mk, s=40, color=col, edgecolors="black", linewidths=0.5,
                   label=str(name).replace("_", " "))
    ax.plot([0, 1], [0, 1], color="black", ls="--", lw=1, label="$J = J^*$")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(r"best reachable $J^*$ (fraction)")
    ax.set_ylabel("final " + label("J"))
    ax.legend(frameon=False, fontsize=8, loc="upper left")
    return ax
