"""The tiny-Qwen studies built on the llm_probe library; each is a ``gapdyn train <sub>`` subcommand (llm_probe.cli).

- ``ablation``: methods x learning rates x seeds, survival, reward, entropy at matched accuracy, pass@k, claims;
- ``early_warning``: lead time and ROC AUC of the ``warn/*`` statistics on a finished ablation study;
- ``entropy``: dH against -lr Cov(log pi, A) and the token-taxonomy cells on a finished study;
- ``safe_step_experiment``: constant vs safe step (llm_probe.safe_step), claims;
- ``demo``: GRPO vs WAPO at a normal and a large learning rate.

The library (``llm_probe.*`` outside this package) never imports it (tests/test_architecture.py). Import a study
as a submodule: ``from llm_probe.experiments import ablation``.
"""

__all__ = ["ablation", "demo", "early_warning", "entropy", "safe_step_experiment"]
