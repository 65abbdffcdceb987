"""One shared look for every figure: fonts, a colour-blind-safe palette, glossary axis labels, saving.

- Backend: Agg (set before pyplot is imported anywhere in this package).
- Palette: Okabe & Ito (2008), safe for the common colour-vision deficiencies; methods get fixed
  colours so that GRPO is the same colour in every figure.
- Axis labels use the README glossary's symbols (J, Phi, g+, g-, gap, dmu, M, eta, G, T, C, H) with
  their units, through :data:`LABELS` / :func:`label`.
- :func:`save_figure` writes PNG and PDF (default folder ``./gapdyn_out/figs``) with the caption in the files'
  metadata (PNG "Title"/"Description", PDF "Title"/"Subject").
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import matplotlib

# Scripts render off-screen with Agg; inside a Jupyter kernel the inline backend is kept.
if not os.environ.get("MPLBACKEND") and "ipykernel" not in sys.modules:
    matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from gapdyn.io import check_output_path, write_with  # noqa: E402

__all__ = [
    "OUT_DIR",
    "PALETTE",
    "METHOD_COLORS",
    "BIN_COLORS",
    "LABELS",
    "label",
    "method_color",
    "set_style",
    "new_figure",
    "save_figure",
    "panel_label",
    "method_label",
]

OUT_DIR = Path("gapdyn_out") / "figs"
"""Default folder of :func:`save_figure`, relative to the working directory (never inside the package)."""

SAVE_DPI: dict[str, int] = {"png": 200}
"""Resolution of the PNG files (the tiny test mode lowers it: rendering dominates its run time)."""

# Okabe-Ito: black, orange, sky blue, bluish green, yellow, blue, vermillion, reddish purple, grey.
PALETTE: tuple[str, ...] = (
    "#000000",
    "#E69F00",
    "#56B4E9",
    "#009E73",
    "#F0E442",
    "#0072B2",
    "#D55E00",
    "#CC79A7",
    "#999999",
)

METHOD_COLORS: dict[str, str] = {
    "reinforce": "#000000",
    "rloo": "#999999",
    "grpo": "#D55E00",
    "dr_grpo": "#0072B2",
    "wapo": "#009E73",
    "psr": "#E69F00",
    "nsr": "#CC79A7",
    "w_reinforce": "#56B4E9",
    "adaptive": "#CC79A7",
}

METHOD_NAMES_PRETTY: dict[str, str] = {
    "reinforce": "REINFORCE",
    "rloo": "RLOO",
    "grpo": "GRPO",
    "dr_grpo": "Dr. GRPO",
    "wapo": "WAPO",
    "psr": "PSR",
    "nsr": "NSR",
    "w_reinforce": "W-REINFORCE",
}

BIN_COLORS: dict[str, str] = {
    "pos_peak": "#0072B2",
    "pos_valley": "#56B4E9",
    "neg_peak": "#D55E00",
    "neg_valley": "#E69F00",
}

# Glossary symbol -> axis label (mathtext) with its unit. Keys are the glossary names used in code.
LABELS: dict[str, str] = {
    "J": r"success rate $J$ (fraction)",
    "J0": r"initial success rate $J_0$ (fraction)",
    "Phi": r"log-odds $\Phi = \log\frac{J}{1-J}$ (nats)",
    "g+": r"$g^+ = \mathbb{E}_{\pi^+}[s]$",
    "g-": r"$g^- = \mathbb{E}_{\pi^-}[s]$",
    "gap": r"Gradient Gap $\|g^+ - g^-\|$",
    "dmu": r"gap alignment $\Delta\mu$ (nats per unit step)",
    "M": r"cumulative alignment $M$ (nats)",
    "eta": r"step size $\eta$",
    "eta_star": r"critical step $\eta^*$",
    "G": r"group size $G$ (samples)",
    "T": r"response length $T$ (tokens)",
    "C": r"collision probability $C = \sum_k p_k^2$",
    "H": r"entropy $H$ (nats)",
    "dH": r"$\Delta H / \eta$ (nats per unit step)",
    "dp": r"$\Delta p_s / \eta$ (per unit step)",
    "p_s": r"sampled-token probability $p_s$",
    "K": r"steps $K$",
    "step": r"step $k$",
    "accuracy": r"accuracy (fraction)",
    "reward": r"mean reward (fraction)",
    "M_q": r"per-prompt cumulative alignment $M_q$ (nats)",
}


def label(name: str) -> str:
    """The axis label of a glossary symbol (ValueError for unknown names)."""
    if name not in LABELS:
        raise ValueError(f"name must be one of {sorted(LABELS)}, got {name!r}")
    return LABELS[name]


def method_color(method: str) -> str:
    """Fixed colour of a method (grey for unknown names)."""
    return METHOD_COLORS.get(method, "#999999")


def method_label(method: str) -> str:
    """Display name of a method (GRPO, Dr. GRPO, ...)."""
    return METHOD_NAMES_PRETTY.get(method, method)


_STYLE = {
    "figure.dpi": 110,
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "legend.fontsize": 9,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "lines.linewidth": 1.8,
    "image.cmap": "cividis",
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
}


def set_style() -> None:
    """Apply the shared style (seaborn 'ticks' + the Okabe-Ito cycle + readable font sizes)."""
    try:
        import seaborn as sns

        sns.set_theme(style="ticks", palette=list(PALETTE), rc=_STYLE)
    except ImportError:  # seaborn is a core dependency; keep matplotlib-only use working anyway
        plt.rcParams.update(_STYLE)
        plt.rcParams["axes.prop_cycle"] = matplotlib.cycler(color=list(PALETTE))


def new_figure(nrows: int = 1, ncols: int = 1, *, width: float = 4.2, height: float = 3.4, **kw):
    """A styled figure with ``nrows x ncols`` panels of ``width x height`` inches each."""
    set_style()
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, **kw)
    return fig, axes


def panel_label(ax, text: str) -> None:
    """A bold panel letter in the top-left corner, outside the axes."""
    ax.text(-0.12, 1.04, text, transform=ax.transAxes, fontsize=13, fontweight="bold", va="bottom")


def save_figure(fig, name: str, *, caption: str, title: str | None = None, out_dir=None) -> list[Path]:
    """Write ``<out_dir>/<name>.png`` and ``.pdf`` with the caption as metadata; close the figure.

    PNG: tEXt "Title" and "Description"; PDF: "Title" and "Subject". Returns the two paths.
    """
    if not name or "/" in name:
        raise ValueError(f"name must be a plain file stem, got {name!r}")
    if not caption:
        raise ValueError("caption must be a non-empty string")
    out = Path(out_dir) if out_dir is not None else OUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    title = title or name
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    for p in paths:  # refuse a planted symlink before either file is written
        check_output_path(p)
    write_with(paths[0], lambda tmp: fig.savefig(tmp, format="png", dpi=SAVE_DPI["png"], metadata={
        "Title": title, "Description": caption, "Software": "gapdyn paper_figs"}), what="figure")
    write_with(paths[1], lambda tmp: fig.savefig(tmp, format="pdf", metadata={
        "Title": title, "Subject": caption, "Creator": "gapdyn paper_figs"}), what="figure")
    plt.close(fig)
    return paths
