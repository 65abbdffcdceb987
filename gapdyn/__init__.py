"""gapdyn: the theory of RLVR optimisation dynamics (Gradient Gap, step-size thresholds, WAPO
taxonomy) as pure numpy functions. Formulas and their status: docs/equations.md.

Names are exported lazily (PEP 562): ``import gapdyn`` imports no submodule (no numpy, scipy or
sibling package), and ``gapdyn.<name>`` imports the one module that defines it on first use. To export a
name, add it to its module's tuple in ``_EXPORTS_BY_MODULE`` and to ``__all__`` (tests/test_imports_cli.py checks
the two agree and that every name resolves). A submodule is an attribute too (``gapdyn.stats``).
"""

from __future__ import annotations

import importlib

_EXPORTS_BY_MODULE: dict[str, tuple[str, ...]] = {
    "alignment": ("cumulative_alignment", "gap_alignment", "gap_cosine", "logodds_lower_bound"),
    "claims": ("BLOCKS", "CONFIRMATION_SEEDS", "DISCOVERY_SEEDS", "VERDICTS", "COUNTED_FORMS", "FORMS", "Claim",
        "ClaimSpec", "Criterion", "claims_from_json", "claims_markdown", "claims_table", "claims_to_json",
        "count_verdicts", "criteria_hash", "decide_verdict", "holm_adjust_claims", "markdown_table",
        "replication_table"),
    "collapse": ("COLLAPSE_J", "CONVERGED_J", "OUTCOMES", "SENSITIVITY_J", "EtaStar", "RunStats", "has_dipped",
        "run_outcome", "tail_start", "RatioCheck", "check_eta_star_ratio", "eta_grid", "find_eta_star",
        "is_collapsed", "collapsed_window_eta", "excursion_lengths"),
    "directions": ("expected_direction", "sample_group", "sampled_direction"),
    "experiment": ("Experiment",),
    "gap": ("conditional_scores", "failure_rate", "gradient_gap", "gradient_gap_from_logits", "log_odds",
        "log_odds_from_logits", "logodds_gradient", "logodds_hessian", "logodds_hessian_from_logits",
        "success_gradient", "success_rate"),
    "logistic": ("LogisticFit", "fit_logistic_accuracy"),
    "methods": ("METHOD_NAMES", "METHODS", "c_G", "expected_scalar", "get_method", "group_advantages"),
    "policy": ("log_softmax", "loglinear_logits", "loglinear_probs", "loglinear_scores", "softmax",
        "softmax_scores"),
    "taxonomy": ("BIN_NAMES", "PROB_BIN_EDGES", "TokenStepEffects", "collision_probability", "exact_token_step",
        "token_bin_index", "token_entropy", "token_step_effects"),
    "sampling": ("inverse_cdf_draw",),
    "safe_step": ("NO_ASCENT_TOL", "SAFE_STEP_C", "SAFE_STEP_DELTA", "SafeStep", "safe_step_estimates",
        "safe_step_headroom", "safe_step_multiplier", "safe_step_size"),
    "stats": ("Estimate", "TestResult", "bootstrap_ratio", "bootstrap_slope", "clopper_pearson_interval",
        "cluster_bootstrap", "fieller_paired_ratio", "fisher_exact_test", "holm_adjust", "mcnemar_exact",
        "newcombe_difference", "paired_bootstrap_difference", "roc_auc", "wilcoxon_signed_rank", "wilson_interval"),
    "thresholds": ("BoundConstants", "LogLogFit", "local_step_threshold", "loglinear_bound_constants",
        "loglinear_logodds_fn", "loglog_slope", "predicted_critical_step", "sharp_step_threshold",
        "stagnation_ceiling", "tabular_logodds_fn", "theorem1_step_bound"),
}
"""Submodule -> the public names it defines (each name in exactly one module)."""
_EXPORTS: dict[str, str] = {name: module for module, names in _EXPORTS_BY_MODULE.items() for name in names}
_SUBMODULES = ("coverage", "planner")
"""Submodules exported as attributes of the package (any other submodule also resolves on access)."""

__version__ = "0.1.0"

__all__ = [
    "BIN_NAMES",
    "BLOCKS",
    "COLLAPSE_J",
    "CONVERGED_J",
    "OUTCOMES",
    "RunStats",
    "has_dipped",
    "inverse_cdf_draw",
    "run_outcome",
    "tail_start",
    "CONFIRMATION_SEEDS",
    "Claim",
    "ClaimSpec",
    "Experiment",
    "COUNTED_FORMS",
    "FORMS",
    "Criterion",
    "DISCOVERY_SEEDS",
    "Estimate",
    "EtaStar",
    "LogLogFit",
    "LogisticFit",
    "METHODS",
    "METHOD_NAMES",
    "PROB_BIN_EDGES",
    "RatioCheck",
    "NO_ASCENT_TOL",
    "SafeStep",
    "SENSITIVITY_J",
    "TestResult",
    "TokenStepEffects",
    "VERDICTS",
    "bootstrap_ratio",
    "bootstrap_slope",
    "c_G",
    "check_eta_star_ratio",
    "claims_from_json",
    "claims_markdown",
    "claims_table",
    "claims_to_json",
    "clopper_pearson_interval",
    "cluster_bootstrap",
    "collision_probability",
    "conditional_scores",
    "count_verdicts",
    "criteria_hash",
    "cumulative_alignment",
    "decide_verdict",
    "eta_grid",
    "exact_token_step",
    "expected_direction",
    "expected_scalar",
    "failure_rate",
    "find_eta_star",
    "fisher_exact_test",
    "fit_logistic_accuracy",
    "gap_alignment",
    "gap_cosine",
    "get_method",
    "gradient_gap",
    "gradient_gap_from_logits",
    "group_advantages",
    "holm_adjust",
    "holm_adjust_claims",
    "is_collapsed",
    "collapsed_window_eta",
    "excursion_lengths",
    "local_step_threshold",
    "log_odds",
    "log_odds_from_logits",
    "log_softmax",
    "BoundConstants",
    "loglinear_bound_constants",
    "loglinear_logits",
    "loglinear_logodds_fn",
    "loglinear_probs",
    "loglinear_scores",
    "loglog_slope",
    "logodds_gradient",
    "logodds_hessian",
    "logodds_hessian_from_logits",
    "logodds_lower_bound",
    "markdown_table",
    "mcnemar_exact",
    "newcombe_difference",
    "fieller_paired_ratio",
    "paired_bootstrap_difference",
    "predicted_critical_step",
    "replication_table",
    "roc_auc",
    "safe_step_estimates",
    "safe_step_headroom",
    "SAFE_STEP_C",
    "SAFE_STEP_DELTA",
    "safe_step_multiplier",
    "safe_step_size",
    "sample_group",
    "sampled_direction",
    "sharp_step_threshold",
    "softmax",
    "softmax_scores",
    "stagnation_ceiling",
    "success_gradient",
    "success_rate",
    "tabular_logodds_fn",
    "theorem1_step_bound",
    "token_bin_index",
    "token_entropy",
    "token_step_effects",
    "wilcoxon_signed_rank",
    "wilson_interval",
]


def __getattr__(name: str):
    """Import the module defining ``name`` on first access and cache the value in the package namespace."""
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    elif not name.startswith("__"):
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))
