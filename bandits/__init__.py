"""bandits: numpy simulators of RLVR optimisation dynamics (sweeps, sequence bandit, experiments).

Names are re-exported lazily (PEP 562), so ``import bandits`` is cheap and a module that is still
missing does not break the others.
"""

from __future__ import annotations

import importlib

_EXPORTS: dict[str, str] = {
    "run_sweep": "bandits.sweep",
    "sweep_keys": "bandits.sweep",
    "example_cell": "bandits.sweep",
    "CellStore": "bandits.store",
    "cell_key": "bandits.store",
    "load_experiment": "bandits.experiments",
    "EXPERIMENTS": "bandits.experiments",
}
_ALIASES = {"load_experiment": "load"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'bandits' has no attribute {name!r}")
    mod = importlib.import_module(_EXPORTS[name])
    value = getattr(mod, _ALIASES.get(name, name))
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
