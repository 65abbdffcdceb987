"""``gapdyn figs``: regenerate the paper figures (PNG + PDF) into ``./gapdyn_out/figs`` or ``--out``.

    gapdyn figs                       all figures, quick mode (CPU)
    gapdyn figs --mode full           paper-scale sweeps (use a cluster via the sweep store)
    gapdyn figs --only fig5           one figure (same as python -m paper_figs.fig5_taxonomy)
    gapdyn figs --list                the figures and their captions

Data come from the sweep store (see :func:`resolve_store`)
when the cells were computed before, and are computed otherwise. A figure whose data source is not
built yet is skipped with a "not available yet: <why>" line. Exit codes: 0 all figures written,
3 some not available, 1 an error.
"""

from __future__ import annotations

import importlib
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from gapdyn.cmdline import (Mode, check_jobs, command, folder_setting, one_blas_thread, optional, output_dir, parse,
                            resolve_name, say)

# The data sources (pandas) and the style (matplotlib) are imported where a figure is made, so that --help and
# a bad argument answer without them.

__all__ = ["FIGURES", "FigsConfig", "figure_module", "figure_names", "make_figures", "resolve_store", "main"]

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
    from .data import NotAvailable, SourceFailed
    from .style import SAVE_DPI

    out: dict[str, list[Path] | str] = {}
    SAVE_DPI["png"] = 80 if sources.mode == "test" else 200
    for name in names:
        mod = figure_module(name)
        t0 = time.perf_counter()
        try:
            out[name] = mod.make(sources, out_dir=out_dir)
            log(f"[gapdyn figs] {name}: wrote {', '.join(p.name for p in out[name])} ({time.perf_counter() - t0:.1f} s)")
        except SourceFailed as exc:
            out[name] = f"error: {exc}"
            log(f"[gapdyn figs] {name}: {out[name]}")
        except NotAvailable as exc:
            out[name] = f"not available yet: {exc}"
            log(f"[gapdyn figs] {name}: {out[name]}")
        except Exception as exc:  # one broken figure must not hide the others
            out[name] = f"error: {type(exc).__name__}: {exc}"
            log(f"[gapdyn figs] {name}: {out[name]}\n{traceback.format_exc()}")
    return out


def resolve_store(store, out) -> Path:
    """The sweep store: ``store``; else ``$GAPDYN_STORE``; else ``<out>/store`` when an output folder was
    given; else ``./gapdyn_out/store`` (shared by ``gapdyn figs`` and ``gapdyn reproduce``)."""
    from .data import default_store

    if store is not None:
        return folder_setting(store, "--store")
    if out is not None and not os.environ.get("GAPDYN_STORE"):
        return folder_setting(Path(out) / "store", "--out")
    return folder_setting(default_store(), "$GAPDYN_STORE" if os.environ.get("GAPDYN_STORE") else "the store")


@dataclass
class RunArgs:
    """The flags `gapdyn figs` and `gapdyn reproduce` share."""

    mode: Mode = "quick"
    """Sizes: test (the smallest, what the test suite runs), quick (CPU), full (paper scale; resumable)."""
    out: Annotated[str | None, optional("DIR")] = None
    """Output folder (default ./gapdyn_out/<command>)."""
    store: Annotated[str | None, optional("DIR")] = None
    """Sweep store of cached results (default $GAPDYN_STORE, <out>/store with --out, else ./gapdyn_out/store)."""
    jobs: int = 1
    """Local processes for the sweeps; -1 = all cores."""
    seed: Annotated[int | None, optional("INT")] = None
    """Base seed of the runs that take one (length experiment, taxonomy table, tiny-Qwen seeds); the
    contextual experiments use fixed instance seeds."""
    progress: bool = True
    """Show the sweeps' progress bars."""


@dataclass
class FigsConfig(RunArgs):
    """Regenerate the paper figures (PNG + PDF)."""

    only: Annotated[tuple[str, ...] | None, optional("NAME [NAME ...]", "all")] = None
    """Figures to make, one or more: a name or an unambiguous prefix (fig1, fig5, fig7_llm)."""
    llm_dir: Annotated[str | None, optional("DIR")] = None
    """Tiny-Qwen run outputs (default <store>/llm_probe/<mode>)."""
    list: bool = False
    """List the figures and their captions, then exit."""


def figure_names(names) -> tuple[str, ...]:
    """Full figure names of ``names`` (each a name or an unambiguous prefix); all figures when None; an empty
    ``--only`` is an error (it would otherwise make every figure)."""
    if names is None:
        return FIGURES
    if not names:
        raise ValueError(f"--only needs at least one figure name (one of {', '.join(FIGURES)})")
    return tuple(resolve_name(n, FIGURES, "figure (--only)") for n in names)


@command("gapdyn figs")
def main(argv: list[str]) -> int:
    args = parse(FigsConfig, argv, prog="gapdyn figs")
    if args.list:
        for name in FIGURES:
            mod = figure_module(name)
            print(f"{name}: {mod.TITLE}\n    {mod.CAPTION}\n")
        return 0
    names = figure_names(args.only)
    check_jobs(args.jobs)
    out = output_dir("figs", args.out)
    from gapdyn.io import output_folder

    with output_folder(out):  # a folder it cannot write is one line before any figure (exit 1), none left behind
        pass
    store = resolve_store(args.store, args.out)
    say("figs", f"sweep store {store.resolve()}")
    from .data import Sources

    sources = Sources(args.mode, store=store, llm_dir=args.llm_dir, n_jobs=args.jobs, seed=args.seed,
                      progress=args.progress)
    with one_blas_thread():  # the experiments it may run, as gapdyn reproduce
        made = make_figures(sources, names, out_dir=out)
    written = [n for n, v in made.items() if not isinstance(v, str)]
    say("figs", f"{len(written)}/{len(names)} figures written to {out} (PNG + PDF)")
    for name, why in made.items():
        if isinstance(why, str):
            say("figs", f"{name}: {why.splitlines()[0]}")
    if any(isinstance(v, str) and v.startswith("error") for v in made.values()):
        return 1
    return 3 if any(isinstance(v, str) for v in made.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
