"""paper_figs: the paper figures, the shared style, the quick reproduction and its report.

- ``style``: one look for every figure (Okabe-Ito palette, glossary axis labels, PNG/PDF with captions);
- ``plots``: reusable plotting functions (one idea per Axes; notebooks call them too), implemented in
  ``plots_theory``, ``plots_bandit`` and ``plots_llm``;
- ``data``: where each figure's data comes from (sweep store, experiment runs, the tiny-Qwen demo); the
  tables themselves are cut in ``views`` (the experiments' results) and ``llm`` (tiny-Qwen runs and their claims);
- ``fig1_phase_diagram`` ... ``fig7_llm_probe``: one script per figure (``python -m paper_figs.<name>``);
- ``cli`` (``gapdyn figs``), ``reproduce`` (``gapdyn reproduce``), ``report`` (REPORT.md), ``gallery``
  (docs/figures.md). Documentation: docs/figures.md.

Submodules are imported lazily (PEP 562) so that ``import paper_figs`` does not import matplotlib.
"""

from __future__ import annotations

import importlib

_SUBMODULES = ("style", "plots", "data", "views", "llm", "report", "cli", "reproduce", "gallery")
_NAMES = {
    "FIGURES": "cli",
    "make_figures": "cli",
    "Sources": "data",
    "NotAvailable": "data",
    "reproduce": "reproduce",
    "save_figure": "style",
    "new_figure": "style",
    "set_style": "style",
}

__all__ = sorted(set(_SUBMODULES) | set(_NAMES))


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _NAMES:
        mod = importlib.import_module(f"{__name__}.{_NAMES[name]}")
        # ``reproduce`` is both a submodule and its main function: the attribute is the module
        return mod if name == _NAMES[name] else getattr(mod, name)
    raise AttributeError(f"module 'paper_figs' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
