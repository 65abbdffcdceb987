"""Bandit experiments: each = environment + sweep (plain data, explicit seeds) + analysis.

Every experiment module ``bandits.experiments.<name>`` defines ``EXPERIMENT``, a
:class:`gapdyn.experiment.Experiment` (the one protocol of the bandit experiments and the tiny-Qwen
studies; docs/evidence.md), frozen at import:

- ``name``; ``claims``: the :class:`gapdyn.ClaimSpec` of every claim (source, statement, form, criterion),
  written from the paper's statement before any run and hashed at import (the hash is stamped on every claim);
- ``config``: a frozen dataclass with ``mode`` in gapdyn.cmdline.MODES, ``instances`` (the discovery block's
  seeds) and ``confirmation`` (the confirmation block's seeds, the budget: full mode only), with the
  constructors ``Config.test()`` / ``Config.quick()`` / ``Config.full()``;
- ``cells(config, instances) -> list[dict]``: the sweep for one block as plain JSON-serialisable dicts;
- ``run_cell(**cell) -> pandas.DataFrame``: one cell's tidy rows (deterministic given the cell);
- ``analyse(results, config, *, block) -> list[gapdyn.Claim]``: the claims of one block, from its rows only.

The module's ``run(config, *, store=None, backend="joblib", n_jobs=-1, progress=True) -> ExperimentResult``
passes ``EXPERIMENT`` to :func:`bandits.experiments._common.run_experiment` (discovery, then a confirmation
block sized by the planner).

Modules are imported lazily by name so that ``import bandits`` stays cheap.
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXPERIMENTS: dict[str, str] = {
    "threshold": "bandits.experiments.threshold",  # 1. critical eta per instance, predictors, methods
    "length": "bandits.experiments.length",  # 2. critical eta vs T (sequence bandit)
    "success_rate": "bandits.experiments.success_rate",  # 3. critical eta vs J
    "stagnation": "bandits.experiments.stagnation",  # 4. plateaus vs J* bracket, misalignment, grad-norm sums
    "taxonomy": "bandits.experiments.taxonomy",  # 7. WAPO token taxonomy on random softmax positions
    "logistic": "bandits.experiments.logistic",  # 5. accuracy vs M, Theorem 1 bound
    "methods": "bandits.experiments.methods",  # 6. GRPO vs Dr. GRPO vs WAPO vs REINFORCE vs PSR/NSR
}


def load(name: str) -> ModuleType:
    """Import an experiment module by its registry name (ValueError for unknown names)."""
    if name not in EXPERIMENTS:
        raise ValueError(f"experiment must be one of {sorted(EXPERIMENTS)}, got {name!r}")
    return importlib.import_module(EXPERIMENTS[name])


__all__ = ["EXPERIMENTS", "load"]
