"""Plots of the theory: WAPO's token taxonomy over (p_s, C), expected step scalars, one-step log-odds, Delta mu.

Drawn from gapdyn's outputs (``bandits.experiments.taxonomy.taxonomy_table`` or direct gapdyn calls).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
from scipy.stats import binned_statistic_2d

import gapdyn

from ._plot_common import _require
from .style import BIN_COLORS, label, method_color, method_label

__all__ = [
    "plot_binned_map",
    "plot_taxonomy_effect",
    "plot_taxonomy_misses",
    "plot_miss_share_vs_margin",
    "plot_expected_scalars",
    "plot_logodds_along_direction",
    "bin_legend_handles",
    "plot_first_order_vs_exact",
    "plot_dmu_samples",
]


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
