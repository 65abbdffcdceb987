"""The tiny-Qwen studies on the addition task, built on the llm_probe library; each is a ``gapdyn train <sub>``
subcommand (llm_probe.cli).

- ``ablation``: methods x learning rates x seeds, survival, reward, entropy at matched accuracy, pass@k, claims;
- ``safe_step_experiment``: constant vs safe step (llm_probe.safe_step), claims;
- ``entropy_lemma``: Cui et al.'s entropy dynamics per visited state, claims;
- ``early_warning``: lead time and ROC AUC of the ``warn/*`` statistics on a finished ablation study;
- ``entropy``: dH against -lr Cov(log pi, A) and the token-taxonomy cells on a finished study;
- ``demo``: GRPO vs WAPO at a normal and a large learning rate.

These are the legacy addition studies: their committed records (docs/verdicts/llm-*, safe_step-full) stay as they
are, and their test modes are kept as smoke tests of the machinery; the LLM evidence is rebuilt on the testbed
(llm_probe.testbed). Every study that trains runs its cells through the one runner: a cell is one run folder
``<study>/runs/<name>/`` done when its done.json exists (``_study.run_study`` over gapdyn.evidence.runner.run_cells); the
run-folder I/O, outcomes, held-out evaluation and survival table are the one shared module ``_study``.
``ablation`` and ``safe_step_experiment`` are studies of the one experiment protocol (:class:`gapdyn.Experiment`,
registered as ``llm_ablation`` and ``llm_safe_step`` in the ``gapdyn.experiments`` entry points).

The library (``llm_probe.*`` outside this package) never imports it (tests/test_architecture.py). Import a study
as a submodule: ``from llm_probe.experiments import ablation``.
"""

__all__ = ["ablation", "demo", "early_warning", "entropy", "entropy_lemma", "safe_step_experiment"]
