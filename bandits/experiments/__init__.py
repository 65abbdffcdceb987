"""Bandit experiments: each = environment + sweep (plain data, explicit seeds) + analysis.

Every experiment module ``bandits.experiments.<name>`` defines ``EXPERIMENT``, a
:class:`gapdyn.evidence.experiment.Experiment` (the one protocol of the bandit experiments and the tiny-Qwen
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

Experiments are registered once, as entry points of the group ``gapdyn.experiments`` in pyproject.toml
(:func:`gapdyn.evidence.experiment.registry`); :data:`EXPERIMENTS` is read from there. Modules are imported lazily by name
so that ``import bandits`` stays cheap.
"""

from __future__ import annotations

import importlib
from types import ModuleType

def _registered() -> dict[str, str]:
    """The bandit experiments of the one registry (the ``gapdyn.experiments`` entry points,
    :func:`gapdyn.evidence.experiment.registry`), name -> module, in the order the source checkout declares them (else
    the installed order)."""
    from gapdyn.cli import checkout_entry_points
    from gapdyn.evidence.experiment import GROUP, registry

    found = registry()
    declared = [n for n in checkout_entry_points(GROUP) if n in found]
    names = declared + [n for n in found if n not in declared]
    return {n: found[n].module for n in names if found[n].module.startswith(__name__ + ".")}


EXPERIMENTS: dict[str, str] = _registered()
"""name -> module of every registered bandit experiment (read from the registry at import, not a second list)."""


def load(name: str) -> ModuleType:
    """Import an experiment module by its registry name (ValueError for unknown names)."""
    if name not in EXPERIMENTS:
        raise ValueError(f"experiment must be one of {sorted(EXPERIMENTS)}, got {name!r}")
    return importlib.import_module(EXPERIMENTS[name])


__all__ = ["EXPERIMENTS", "load"]
