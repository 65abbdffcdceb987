"""The tiny-Qwen studies built on the llm_probe library; each is a ``gapdyn train <sub>`` subcommand (llm_probe.cli).

- ``ablation``: methods x learning rates x seeds, survival, reward, entropy at matched accuracy, pass@k, claims;
- ``early_warning``: lead time and ROC AUC of the ``warn/*`` statistics on a finished ablation study;
- ``entropy``: dH against -lr Cov(log pi, A) and the token-taxonomy cells on a finished study;
- ``safe_step_experiment``: constant vs safe step (llm_probe.safe_step), claims;
- ``demo``: GRPO vs WAPO at a normal and a large learning rate.

The library (``llm_probe.*`` outside this package) never imports it (tests/test_architecture.py). Import a study
as a submodule: ``from llm_probe.experiments import ablation``. ``ablation`` and ``safe_step_experiment`` are
also studies of the one experiment protocol (:class:`gapdyn.Experiment`, registered as ``llm_ablation`` and
``llm_safe_step`` in the ``gapdyn.experiments`` entry points); each run of them sits in :func:`cell_folder`.
"""

import hashlib
import json
from pathlib import Path

__all__ = ["ablation", "demo", "early_warning", "entropy", "safe_step_experiment", "cell_folder"]


def cell_folder(study: str, settings: dict, root=None) -> Path:
    """``<root>/<study>/<hash of the run settings>`` (the first 16 hex digits of the SHA-256 of their canonical
    JSON): root ./gapdyn_out of the working directory unless given."""
    from gapdyn.cmdline import OUT_ROOT

    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    return Path(Path.cwd() / OUT_ROOT if root in (None, "") else root) / study / key
