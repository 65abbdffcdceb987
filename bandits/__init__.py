"""bandits: numpy/numba simulators of RLVR optimisation dynamics.

- contextual bandit (``envs``), its simulation engine (``engine``, ``reference``) and step-size
  schedules (``schedules``);
- token-level sequence bandits (``sequence``: shared log-linear token policy vs position-wise tabular;
  ``partial``: features partially shared across positions) and their simulator (``simulate_sequence``);
- the experiment registry (``experiments``) and the ``gapdyn bandit`` command (``cli``); the experiments run
  through the generic resumable sweep of :mod:`gapdyn.evidence.sweep`.

Names are re-exported lazily (PEP 562): ``import bandits`` imports nothing heavy, and a submodule
that fails to import only breaks the names that come from it. Name clashes are resolved by prefix:
``bandits.simulate`` is the contextual engine's, ``bandits.simulate_sequence`` the sequence bandit's.
"""

from __future__ import annotations

import importlib

_MODULES: dict[str, tuple[str, ...]] = {
    "bandits.envs": ("ContextualBandit", "make_bandit", "place_theta", "KINDS"),
    "bandits.engine": ("DIRECTIONS", "GRADIENTS", "Dynamics", "Trajectory", "simulate", "run_grid"),
    "bandits.reference": ("simulate_reference", "sample_arms"),
    "bandits.schedules": (
        "SCHEDULES", "Schedule", "AdamState", "adam_init", "adam_direction", "schedule_step", "decaying_step",
        "line_search_step", "group_alignment_curvature", "adaptive_step",
    ),
    "bandits.sequence": (
        "RULES", "SequenceEnv", "SharedSequenceBandit", "TabularSequenceBandit", "SequenceSample", "rule_reward",
        "place_for_success_rate", "SequenceDynamics", "SequenceTrajectory",
        "sequence_sampled_direction",
    ),
    "bandits.partial": ("PartialSharingBandit", "position_features"),
    "bandits.experiments": ("EXPERIMENTS",),
}
# exported name -> (module, attribute) where the two differ
_RENAMED: dict[str, tuple[str, str]] = {
    "simulate_sequence": ("bandits.sequence", "simulate"),
    "load_experiment": ("bandits.experiments", "load"),
}
_EXPORTS: dict[str, tuple[str, str]] = {n: (m, n) for m, names in _MODULES.items() for n in names}
_EXPORTS.update(_RENAMED)

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'bandits' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    try:
        value = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise AttributeError(f"bandits.{name} is unavailable: {module}.{attr} could not be loaded ({exc})") from exc
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
