"""gapdyn: the theory of RLVR optimisation dynamics (Gradient Gap, step-size thresholds, WAPO
taxonomy) as pure numpy functions. Formulas and their status: docs/equations.md."""

from .alignment import cumulative_alignment, gap_alignment, gap_cosine, logodds_lower_bound
from .directions import expected_direction, sample_group, sampled_direction
from .gap import (
    conditional_scores,
    failure_rate,
    gradient_gap,
    gradient_gap_from_logits,
    log_odds,
    log_odds_from_logits,
    logodds_gradient,
    logodds_hessian,
    logodds_hessian_from_logits,
    success_gradient,
    success_rate,
)
from .logistic import LogisticFit, fit_logistic_accuracy
from .methods import METHOD_NAMES, METHODS, c_G, expected_scalar, get_method, group_advantages
from .policy import log_softmax, loglinear_logits, loglinear_probs, loglinear_scores, softmax, softmax_scores
from .taxonomy import (
    BIN_NAMES,
    PROB_BIN_EDGES,
    TokenStepEffects,
    collision_probability,
    exact_token_step,
    token_bin_index,
    token_entropy,
    token_step_effects,
)
from .thresholds import (
    LogLogFit,
    local_step_threshold,
    loglinear_bound_constants,
    loglinear_logodds_fn,
    loglog_slope,
    predicted_critical_step,
    sharp_step_threshold,
    stagnation_ceiling,
    tabular_logodds_fn,
    theorem1_step_bound,
)

__version__ = "0.1.0"

__all__ = [
    "BIN_NAMES",
    "LogLogFit",
    "LogisticFit",
    "METHODS",
    "METHOD_NAMES",
    "PROB_BIN_EDGES",
    "TokenStepEffects",
    "c_G",
    "collision_probability",
    "conditional_scores",
    "cumulative_alignment",
    "exact_token_step",
    "expected_direction",
    "expected_scalar",
    "failure_rate",
    "fit_logistic_accuracy",
    "gap_alignment",
    "gap_cosine",
    "get_method",
    "gradient_gap",
    "gradient_gap_from_logits",
    "group_advantages",
    "local_step_threshold",
    "log_odds",
    "log_odds_from_logits",
    "log_softmax",
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
    "predicted_critical_step",
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
]
