"""Helpers shared by the plotting modules: input checks, plain log ticks, grid edges, missing panels."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

__all__ = ["panel_unavailable"]


def _require(df: pd.DataFrame, cols: Sequence[str], what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{what} needs columns {list(cols)}; missing {missing} (have {list(df.columns)})")


def _plain_log_ticks(ax, axes: str = "xy") -> None:
    """Log axes labelled 0.1, 1, 10 instead of 10^-1, 10^0; 2 and 5 between decades are labelled only
    when the axis spans less than two decades, every minor tick below half a decade."""
    from matplotlib.ticker import FuncFormatter

    def formatters(axis):
        def minor(v, _):
            lo, hi = sorted(axis.get_view_interval())
            if v <= 0 or lo <= 0 or np.log10(hi / lo) >= 2:
                return ""
            lead = round(v / 10 ** np.floor(np.log10(v)), 6)
            return f"{v:g}" if lead in (2.0, 5.0) or np.log10(hi / lo) < 0.5 else ""

        return FuncFormatter(lambda v, _: f"{v:g}"), FuncFormatter(minor)

    for axis in [a for n, a in (("x", ax.xaxis), ("y", ax.yaxis)) if n in axes]:
        major, minor = formatters(axis)
        axis.set_major_formatter(major)
        axis.set_minor_formatter(minor)


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


def panel_unavailable(ax, reason: str) -> None:
    """Mark a panel whose data source is missing (never draw made-up data)."""
    import textwrap

    head = "error:" if "failed:" in reason else "not available yet:"
    ax.text(0.5, 0.5, head + "\n" + "\n".join(textwrap.wrap(reason, 40)), transform=ax.transAxes,
            ha="center", va="center", fontsize=8, color="#D55E00")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
