"""The tiny-Qwen studies built on the llm_probe library; each is a ``gapdyn train <sub>`` subcommand (llm_probe.cli).

- ``ablation``: methods x learning rates x seeds, survival, reward, entropy at matched accuracy, pass@k, claims;
- ``early_warning``: lead time and ROC AUC of the ``warn/*`` statistics on a finished ablation study;
- ``entropy``: dH against -lr Cov(log pi, A) and the token-taxonomy cells on a finished study;
- ``safe_step_experiment``: constant vs safe step (llm_probe.safe_step), claims;
- ``demo``: GRPO vs WAPO at a normal and a large learning rate.

The library (``llm_probe.*`` outside this package) never imports it (tests/test_architecture.py). Import a study
as a submodule: ``from llm_probe.experiments import ablation``. ``ablation`` and ``safe_step_experiment`` are
also studies of the one experiment protocol (:class:`StudyExperiment`, registered as ``llm_ablation`` and
``llm_safe_step`` in the ``gapdyn.experiments`` entry points).
"""

from dataclasses import dataclass

from gapdyn.experiment import Experiment

__all__ = ["ablation", "demo", "early_warning", "entropy", "safe_step_experiment", "StudyExperiment"]


@dataclass(frozen=True)
class StudyExperiment(Experiment):
    """A gapdyn.experiment.Experiment with the command line that runs it at full size (``gapdyn reproduce``
    names it for the studies it does not run itself)."""

    command: str = ""
