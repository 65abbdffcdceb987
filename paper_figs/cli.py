"""``gapdyn figs``: regenerate the paper figures into ``paper_figs/out/`` (PNG + PDF).

    gapdyn figs                       all figures, quick mode (CPU, minutes)
    gapdyn figs --mode full           paper-scale sweeps (hours; use a cluster via the sweep store)
    gapdyn figs --only fig5_taxonomy  one figure (same as python -m paper_figs.fig5_taxonomy)
    gapdyn figs --list                the figures and their captions

Data come from the sweep store (``--store``, default ``paper_figs/out/store`` or ``$GAPDYN_STORE``)
when the cells were computed before, and are computed otherwise. A figure whose data source is not
built yet is skipped with a "not available yet: <why>" line. Exit codes: 0 all figures written,
3 some not available, 1 an error.
"""

from __future__ import annotations

import argparse
import importlib
import time
import traceback
from pathlib import Path

from .data import MODES, NotAvailable, SourceFailed, Sources
from .style import OUT_DIR, SAVE_DPI

__all__ = ["FIGURES", "figure_module", "make_figures", "main"]

FIGURES: tuple[str, ...] = (
    "fig1_phase_diagram",
    "fig2_critical_eta",
    "fig3_stagnation",
    "fig4_logistic",
    "fig5_taxonomy",
    "fig6_methods",
    "fig7_llm_probe",
)


def figure_module(name: str):
    """The module ``paper_figs.<name>`` (ValueError for unknown names)."""
    if name not in FIGURES:
        raise ValueError(f"figure must be one of {FIGURES}, got {name!r}")
    return importlib.import_module(f"paper_figs.{name}")


def make_figures(sources: Sources, names=FIGURES, *, out_dir=None, log=print) -> dict[str, list[Path] | str]:
    """Make each named figure; returns name -> written paths, or name -> "not available yet: <why>" /
    "error: <message>" for figures that could not be made."""
    out: dict[str, list[Path] | str] = {}
    SAVE_DPI["png"] = 80 if sources.mode == "test" else 200
    for name in names:
        mod = figure_module(name)
        t0 = time.perf_counter()
        try:
            out[name] = mod.make(sources, out_dir=out_dir)
            log(f"[figs] {name}: wrote {', '.join(p.name for p in out[name])} ({time.perf_counter() - t0:.1f} s)")
        except SourceFailed as exc:
            out[name] = f"error: {exc}"
            log(f"[figs] {name}: {out[name]}")
        except NotAvailable as exc:
            out[name] = f"not available yet: {exc}"
            log(f"[figs] {name}: {out[name]}")
        except Exception as exc:  # one broken figure must not hide the others
            out[name] = f"error: {type(exc).__name__}: {exc}"
            log(f"[figs] {name}: {out[name]}\n{traceback.format_exc()}")
    return out


def parser(prog: str = "gapdyn figs") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Regenerate the paper figures (PNG + PDF).")
    p.add_argument("--mode", choices=MODES, default="quick", help="sizes: test (seconds), quick (CPU minutes), full")
    p.add_argument("--only", nargs="+", choices=FIGURES, metavar="FIG", help=f"figures to make, of {list(FIGURES)}")
    p.add_argument("--out", type=Path, default=None, help=f"output folder (default {OUT_DIR})")
    p.add_argument("--store", type=Path, default=None, help="sweep store of cached results")
    p.add_argument("--llm-dir", type=Path, default=None, help="tiny-Qwen run outputs (default <store>/llm_probe/<mode>)")
    p.add_argument("--jobs", type=int, default=1, help="local processes for sweeps (default 1)")
    p.add_argument("--seed", type=int, default=None,
                   help="base seed for the runs that take one (length experiment, taxonomy table, tiny-Qwen "
                        "seeds); the contextual experiments use fixed instance seeds")
    p.add_argument("--progress", action="store_true", help="show the sweeps' progress bars")
    p.add_argument("--list", action="store_true", help="list the figures and their captions, then exit")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.list:
        for name in FIGURES:
            mod = figure_module(name)
            print(f"{name}: {mod.TITLE}\n    {mod.CAPTION}\n")
        return 0
    sources = Sources(args.mode, store=args.store, llm_dir=args.llm_dir, n_jobs=args.jobs, seed=args.seed,
                      progress=args.progress)
    made = make_figures(sources, args.only or FIGURES, out_dir=args.out)
    print(f"[figs] outputs in {args.out or OUT_DIR}")
    if any(isinstance(v, str) and v.startswith("error") for v in made.values()):
        return 1
    return 3 if any(isinstance(v, str) for v in made.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
