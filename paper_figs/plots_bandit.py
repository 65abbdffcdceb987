"""Plots of the bandit experiments: phase diagrams, log-log slopes, trajectories, logistic fits, method
and controller comparisons, Theorem-1 checks. Slopes are given (the experiments' claims); other fits call
gapdyn (fit_logistic_accuracy, logodds_lower_bound).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
from scipy.special import expit

import gapdyn

from ._plot_common import _lin_edges, _log_edges, _plain_log_ticks, _require
from .style import label, method_color, method_label

__all__ = [
    "plot_phase_diagram",
    "plot_loglog_slopes",
    "plot_trajectories",
    "plot_logistic_fit",
    "plot_method_curves",
    "plot_bound_violation",
    "plot_scalar_vs_collapse",
    "plot_failure_decay",
    "plot_plateau_vs_optimum",
]


def plot_phase_diagram(df: pd.DataFrame, ax, *, x: str = "eta", y: str = "K", value: str = "J", logx: bool = True,
                       logy: bool = False, cmap: str = "cividis", vmin: float = 0.0, vmax: float = 1.0,
                       curves: pd.DataFrame | None = None, curve_x: str = "eta_pred", curve_y: str | None = None,
                       curve_label: str = "predicted threshold", curve_hue: str | None = None,
                       curve_lines: bool = True, legend_below: bool = False,
                       under: tuple[float, str, str] | None = None, clip_curves: bool = False):
    """Mean ``value`` (e.g. J after K steps) over the (x, y) grid, averaged over seeds.

    ``curves``: predicted-threshold curves to overlay, one row per point with columns ``curve_x``
    (the predicted critical x, e.g. eta) and ``curve_y`` (default ``y``); ``curve_hue`` splits several
    predictors (each its own line style); ``curve_lines=False`` draws markers only (categorical y,
    e.g. one row per instance). Cells of the grid without a run are hatched grey and named in the legend.
    ``under`` = (level, colour, label): cells below ``level`` are drawn in ``colour`` (e.g. the collapse level;
    the colour bar then needs ``extend="min"``) and named in the legend. The x axis spans the grid;
    predictors off it widen it, or with ``clip_curves`` are drawn at its edge as triangles pointing to their
    side, their range given in the legend. Returns the colour mesh.
    """
    import matplotlib
    from matplotlib.patches import Patch, Rectangle

    _require(df, [x, y, value], "plot_phase_diagram")
    grid = df.groupby([y, x])[value].mean().unstack(x).sort_index()
    xs, ys = grid.columns.to_numpy(float), grid.index.to_numpy(float)
    xe = _log_edges(xs) if logx else _lin_edges(xs)
    ye = _log_edges(ys) if logy else _lin_edges(ys)
    values = grid.to_numpy(float)
    cm = matplotlib.colormaps[cmap]
    extra = []
    if under is not None:
        level, colour, text = under
        cm = cm.with_extremes(under=colour)
        vmin = level
        if np.any(values < level):
            extra.append(Patch(facecolor=colour, edgecolor="black", lw=0.5, label=text))
    im = ax.pcolormesh(xe, ye, np.ma.masked_invalid(values), cmap=cm, vmin=vmin, vmax=vmax, shading="flat",
                       rasterized=True)
    if np.isnan(values).any():  # no run in these cells: hatched, named in the legend
        hatch = dict(facecolor="white", edgecolor="#999999", hatch="////", lw=0)
        ax.add_patch(Rectangle((xe[0], ye[0]), xe[-1] - xe[0], ye[-1] - ye[0], zorder=0.5, **hatch))
        extra.append(Patch(label="no run at this grid point", **hatch))
    if logx:
        ax.set_xscale("log")
        _plain_log_ticks(ax, axes="x")
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
            cx = c[curve_x].to_numpy(float)
            ok = np.isfinite(cx) & (cx > 0)
            label = str(name)
            if clip_curves and not curve_lines:
                lo, hi = ok & (cx < xe[0]), ok & (cx > xe[-1])
                for side, at, mk in ((lo, xe[0], "<"), (hi, xe[-1], ">")):
                    if side.any():
                        vals = cx[side]
                        where = "left" if mk == "<" else "right"
                        label += (f" ({vals.min():.2g}" + (f"-{vals.max():.2g}" if vals.max() > vals.min() else "")
                                  + f", off the {where} edge)")
                        ax.plot(np.full(side.sum(), at), c[cy].to_numpy(float)[side], ls="none", marker=mk, ms=7,
                                color=colours[i % 5], mec="black", mew=0.5, clip_on=False, zorder=3)
                ok = ok & ~lo & ~hi
            kw = dict(color=colours[i % 5], marker=markers[i % 5], label=label, mec="black", mew=0.5)
            if curve_lines:
                ax.plot(c[curve_x][ok], c[cy][ok], ls=styles[i % 5], lw=2, ms=3, **kw)
            else:
                ax.plot(c[curve_x][ok], c[cy][ok], ls="none", ms=6, **kw)
        cx = curves[curve_x].to_numpy(float)
        cx = cx[np.isfinite(cx) & (cx > 0)]
        if cx.size and not clip_curves:  # widen the x range so that predictors far off the grid stay visible
            lo = min(xe[0], cx.min() / 1.5) if logx else min(xe[0], cx.min())
            hi = max(xe[-1], cx.max() * 1.5) if logx else max(xe[-1], cx.max())
            xe = np.r_[lo, xe[1:-1], hi] if xe.size > 2 else np.array([lo, hi])
    if (curves is not None and len(curves)) or extra:
        handles = ax.get_legend_handles_labels()[0] + extra
        if legend_below:
            ax.legend(handles=handles, frameon=False, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2),
                      ncol=2)
        else:
            ax.legend(handles=handles, frameon=True, fontsize=7, loc="best")
    ax.set_xlim(xe[0], xe[-1])
    ax.set_ylim(ye[0], ye[-1])
    ax.grid(False)
    return im


def plot_loglog_slopes(df: pd.DataFrame, ax, *, x: str, y: str, hue: str, slopes: dict,
                       colors: dict | Sequence[str] = ("#0072B2", "#D55E00", "#009E73", "#CC79A7"),
                       markers: dict | None = None, linestyles: dict | None = None, bars: bool = True,
                       reference: float | None = None, legend_kw: dict | None = None):
    """Points y(x) on log-log axes per ``hue`` group, each with a GIVEN slope (no fitting here).

    ``slopes``: {group: (slope or None, legend text)}, e.g. an experiment's claim. A slope is drawn
    through the group's geometric-mean point and labelled with the text; without a line the group's
    points carry the text. The legend lists exactly the drawn artists: a group without points is named
    in the legend's title ("not drawn: <text>"), never with a marker. ``bars``: mean over rows sharing an
    x with min-max bars, else every row as a point. ``reference`` draws a guide of that slope;
    ``legend_kw`` goes to ``ax.legend``. Returns {group: legend text}.
    """
    _require(df, [x, y, hue], "plot_loglog_slopes")
    df = df[np.isfinite(df[y].to_numpy(float)) & (df[y] > 0) & (df[x] > 0)]
    names = list(slopes) + [k for k in sorted(df[hue].unique(), key=str) if k not in slopes]
    shown, not_drawn = {}, []
    for i, name in enumerate(names):
        g = df[df[hue] == name]
        col = colors.get(name, "#000000") if isinstance(colors, dict) else colors[i % len(colors)]
        mk = (markers or {}).get(name, "o")
        ls = (linestyles or {}).get(name, "-")
        slope, text = slopes.get(name, (None, str(name)))
        shown[name] = text
        if not len(g):
            not_drawn.append(text)
            continue
        line = slope is not None and g[x].nunique() >= 2
        point_label = None if line else text
        if bars:
            st = g.groupby(x)[y].agg(["mean", "min", "max"])
            ax.errorbar(st.index, st["mean"], yerr=[st["mean"] - st["min"], st["max"] - st["mean"]], fmt=mk,
                        color=col, ms=5, capsize=2, mfc="white" if mk != "o" else col, label=point_label)
        else:
            ax.plot(g[x], g[y], mk, color=col, ms=3.5, alpha=0.6, mfc="white" if mk != "o" else col, ls="none",
                    label=point_label)
        if line:
            lx, ly = np.log(g[x].to_numpy(float)), np.log(g[y].to_numpy(float))
            xx = np.geomspace(g[x].min(), g[x].max(), 50)
            ax.plot(xx, np.exp(ly.mean() + slope * (np.log(xx) - lx.mean())), color=col, ls=ls, label=text)
    if reference is not None and len(df):
        x0 = float(df[x].min())
        y0 = float(df.loc[df[x] == x0, y].median())
        xx = np.geomspace(x0, df[x].max(), 20)
        ax.plot(xx, y0 * (xx / x0) ** reference, color="#999999", ls=":", label=f"slope {reference:+g} guide")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_ticks(ax)
    title = "\n".join(f"not drawn: {t}" for t in not_drawn) or None
    ax.legend(**({"frameon": False, "fontsize": 7, "title": title, "title_fontsize": 7, "alignment": "left"}
                 | (legend_kw or {})))
    return shown


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
                      hue: str | None = None, max_points: int = 4000, seed: int = 0, curve=None,
                      curve_label: str | None = None, condition: str | None = None):
    """Accuracy against cumulative alignment M: points, the logistic sigmoid(a M + b) and Theorem 1's lower
    bound sigmoid(logit J0 + M/2) (gapdyn.logodds_lower_bound; Suk & Duan, arXiv 2510.08539, Thm 1), its label
    ending with ``condition`` (where the theorem's step condition holds for the points) when given. The curve
    is ``curve`` = (a, b) when given (e.g. an experiment's estimate, labelled ``curve_label``), else
    gapdyn.fit_logistic_accuracy on the points. Returns the LogisticFit, or None when ``curve`` was given."""
    _require(df, [M, acc] + ([hue] if hue else []), "plot_logistic_fit")
    d = df[np.isfinite(df[M]) & np.isfinite(df[acc])]
    show = d.sample(min(len(d), max_points), random_state=seed) if len(d) > max_points else d
    if hue:
        for i, (name, g) in enumerate(show.groupby(hue)):
            ax.scatter(g[M], g[acc], s=5, alpha=0.35, color=["#0072B2", "#E69F00", "#009E73", "#CC79A7"][i % 4],
                       label=f"{hue} = {name}", rasterized=True)
    else:
        ax.scatter(show[M], show[acc], s=5, alpha=0.35, color="#0072B2", label="runs (M, J)", rasterized=True)
    mm = np.linspace(0, float(d[M].max()), 200)
    if curve is None:
        fit = gapdyn.fit_logistic_accuracy(d[M].to_numpy(float), d[acc].to_numpy(float))
        ax.plot(mm, fit.predict(mm), color="#D55E00", lw=2,
                label=f"fit $\\sigma({fit.slope:.2f}M {fit.intercept:+.2f})$, $R^2$ = {fit.r2:.2f}")
    else:
        fit = None
        a, b = curve
        ax.plot(mm, expit(a * mm + b), color="#D55E00", lw=2,
                label=curve_label or f"$\\sigma({a:.2f}M {b:+.2f})$")
    if J0 is not None:
        ax.plot(mm, gapdyn.logodds_lower_bound(J0, mm), color="black", ls="--", lw=1.5,
                label=f"Thm 1 bound $\\sigma(\\mathrm{{logit}}\\,J_0 + M/2)$, $J_0$ = {J0:.2f}"
                      + (f":\n{condition}" if condition else ""))
    ax.set_xlabel(label("M"))
    ax.set_ylabel(label("accuracy"))
    ax.set_ylim(-0.02, 1.02)
    ax.legend(frameon=False, fontsize=8, loc="lower right")
    return fit


def plot_method_curves(df: pd.DataFrame, ax, *, x: str = "eta", y: str = "collapsed", method: str = "method",
                       logx: bool = True, band: bool = False, colors: dict | None = None):
    """Per method (or any grouping column): mean ``y`` (e.g. share of collapsed runs, final J) against ``x``.

    Colours: ``colors[group]`` if given, else the method's fixed colour (style.METHOD_COLORS); each group has
    its own marker size and line style, so curves that coincide (Dr. GRPO and REINFORCE) stay visible."""
    _require(df, [x, y, method], "plot_method_curves")
    markers, styles = "osD^vP*X", ("-", "--", "-.", ":")
    for i, (m, g) in enumerate(df.groupby(method, sort=False)):
        st = g.groupby(x)[y].agg(["mean", "count", "std"])
        col = (colors or {}).get(m) or method_color(m)
        ax.plot(st.index, st["mean"], marker=markers[i % len(markers)], ms=6 - 0.6 * (i % 4), alpha=0.9,
                ls=styles[i % len(styles)], color=col, label=method_label(m), mec="white", mew=0.5)
        if band:
            se = st["std"].fillna(0) / np.sqrt(st["count"].clip(lower=1))
            ax.fill_between(st.index, st["mean"] - se, st["mean"] + se, color=col, alpha=0.15, lw=0)
    if logx:
        ax.set_xscale("log")
        _plain_log_ticks(ax, axes="x")
    ax.legend(frameon=False, fontsize=8)
    return ax


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
    _plain_log_ticks(ax, axes="x")
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
    _plain_log_ticks(ax, axes="x")
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
    _plain_log_ticks(ax)
    ax.set_xlabel(label("step"))
    ax.set_ylabel(r"failure rate $1 - J$")
    ax.legend(frameon=False, fontsize=7)
    return ax


def plot_plateau_vs_optimum(df: pd.DataFrame, ax, *, group: str = "setting"):
    """Final J against the best reachable J* per run, one marker per setting: the marker sits at the lower
    bound J*_lo, a horizontal bar reaches the upper bound J*_hi (both computed by the experiment); points on
    the diagonal plateau at the optimum, points below it stall."""
    _require(df, ["J_final", "J_star_lo", "J_star_hi", group], "plot_plateau_vs_optimum")
    for (name, g), mk, col in zip(df.groupby(group), "oDs^", ["#0072B2", "#D55E00", "#009E73", "#CC79A7"]):
        ax.errorbar(g["J_star_lo"], g["J_final"], xerr=[0 * g["J_star_lo"], g["J_star_hi"] - g["J_star_lo"]],
                    fmt="none", ecolor=col, elinewidth=0.8, alpha=0.6)
        ax.scatter(g["J_star_lo"], g["J_final"], marker=mk, s=40, color=col, edgecolors="black", linewidths=0.5,
                   label=str(name).replace("_", " "))
    ax.plot([0, 1], [0, 1], color="black", ls="--", lw=1, label="$J = J^*$")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(r"best reachable $J^*$ ($J^*_{lo}$, bar to $J^*_{hi}$)")
    ax.set_ylabel("final " + label("J"))
    ax.legend(frameon=False, fontsize=8, loc="upper left")
    return ax
