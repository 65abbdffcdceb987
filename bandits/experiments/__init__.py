"""Bandit experiments: each = environment + sweep (plain data, explicit seeds) + analysis.

Every experiment module ``bandits.experiments.<name>`` provides (bsuite-style):

- ``Config``: a frozen dataclass with a ``mode`` field ("quick" = seconds, for the tests; "full" = CLI);
  ``Config.quick()`` / ``Config.full()`` constructors.
- ``cells(config) -> list[dict]``: the sweep as plain JSON-serialisable dicts (seeds included).
- ``run_cell(**cell) -> pandas.DataFrame``: one cell's tidy rows (deterministic given the cell).
- ``analyse(results: DataFrame, config) -> DataFrame``: the verdict table with columns
  ``claim, setting, measured, expected, holds`` (holds in {"holds", "holds only in <setting>", "does not hold"}
  or a bool), plus any headline numbers.
- ``run(config, *, store=None, backend="joblib", n_jobs=-1, progress=True) -> (results, verdict)``,
  implemented with :func:`bandits.sweep.run_sweep`.

Modules are imported lazily by name so that ``import bandits`` stays cheap.
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXPERIMENTS: dict[str, str] = {
    "threshold": "bandits.experiments.threshold",  # 1. critical eta per instance, predictors, methods
    "length": "bandits.experiments.length",  # 2. critical eta vs T (sequence bandit)
    "success_rate": "bandits.experiments.success_rate",  # 3. critical eta vs J
    "stagnation": "bandits.experiments.stagnation",  # 4. fixed eta, plateaus, adaptive controller
    "logistic": "bandits.experiments.logistic",  # 5. accuracy vs M, Theorem 1 bound
    "methods": "bandits.experiments.methods",  # 6. GRPO vs Dr. GRPO vs WAPO vs REINFORCE vs PSR/NSR
}


def load(name: str) -> ModuleType:
    """Import an experiment module by its registry name (ValueError for unknown names)."""
    if name not in EXPERIMENTS:
        raise ValueError(f"experiment must be one of {sorted(EXPERIMENTS)}, got {name!r}")
    return importlib.import_module(EXPERIMENTS[name])


__all__ = ["EXPERIMENTS", "load"]
