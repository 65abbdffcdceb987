"""Softmax and log-linear policies and their score functions.

docs/equations.md §1 [paper]: the score of a response is s(a) = grad_theta log pi_theta(a).
- tabular softmax over logits z:            s(a) = e_a - pi            (derived)
- log-linear pi(a) ~ exp(theta . phi(a)):    s(a) = phi(a) - E_pi[phi]  (derived)

All functions are pure, float64, and vectorised over leading axes (e.g. contexts).
"""

from __future__ import annotations

import numpy as np
from scipy.special import log_softmax as _log_softmax

from .._validate import as_float_array

__all__ = ["softmax", "log_softmax", "softmax_scores", "loglinear_logits", "loglinear_probs", "loglinear_scores"]


def log_softmax(logits) -> np.ndarray:
    """log pi(a) = z_a - logsumexp(z), over the last axis; finite for logits of +-1e3."""
    z = as_float_array(logits, "logits", min_ndim=1)
    return _log_softmax(z, axis=-1)


def softmax(logits) -> np.ndarray:
    """pi(a) = exp(z_a) / sum_b exp(z_b), over the last axis."""
    return np.exp(log_softmax(logits))


def softmax_scores(logits) -> np.ndarray:
    """Scores of a tabular softmax in logit space: row a is e_a - pi (shape [..., K, K]).

    derived: d log pi(a) / d z_b = 1[a = b] - pi(b).
    """
    pi = softmax(logits)
    K = pi.shape[-1]
    return np.eye(K) - pi[..., None, :]


def _check_features(features, theta):
    phi = as_float_array(features, "features", min_ndim=2)
    th = as_float_array(theta, "theta", min_ndim=1)
    if th.shape[-1] != phi.shape[-1]:
        raise ValueError(f"theta has dimension {th.shape[-1]} but features have dimension {phi.shape[-1]}")
    return phi, th


def loglinear_logits(features, theta) -> np.ndarray:
    """Logits z(a) = phi(a) . theta; features [..., K, d], theta [..., d] -> [..., K]."""
    phi, th = _check_features(features, theta)
    return np.einsum("...kd,...d->...k", phi, th)


def loglinear_probs(features, theta) -> np.ndarray:
    """pi(a) ~ exp(phi(a) . theta) over the K responses (last-but-one axis of features)."""
    return softmax(loglinear_logits(features, theta))


def loglinear_scores(features, theta) -> np.ndarray:
    """Scores phi(a) - E_pi[phi] of a log-linear softmax policy, shape [..., K, d].

    derived: grad_theta log pi(a) = phi(a) - sum_b pi(b) phi(b).
    """
    phi, _ = _check_features(features, theta)
    pi = loglinear_probs(features, theta)
    mean_phi = np.einsum("...k,...kd->...d", pi, phi)
    return phi - mean_phi[..., None, :]
