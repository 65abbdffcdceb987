"""Errors and small helpers shared by the data modules of paper_figs (no plotting, no science)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pandas as pd

from gapdyn.cmdline import MODES

__all__ = ["MODES", "NotAvailable", "SourceFailed", "default_store", "check_mode"]


class NotAvailable(RuntimeError):
    """A figure's data source (an experiment module, the LLM trainer) is not available yet."""


class SourceFailed(NotAvailable):
    """A data source exists but raised while running (a bug or a bad configuration, not a gap)."""


def default_store() -> Path:
    """The sweep store shared by ``gapdyn figs`` and ``gapdyn reproduce``: ``$GAPDYN_STORE`` or
    ``./gapdyn_out/store`` under the working directory (never inside the installed package)."""
    from gapdyn.cmdline import OUT_ROOT

    env = os.environ.get("GAPDYN_STORE")
    return Path(env) if env else Path.cwd() / OUT_ROOT / "store"


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


def _import(module: str, why: str):
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise NotAvailable(f"{module} is not available yet ({exc}); needed for {why}") from exc


def _require_cols(df: pd.DataFrame, cols, what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise NotAvailable(f"{what} lack columns {missing} (the experiment's schema changed?)")
