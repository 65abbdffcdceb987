"""Gap alignment, cumulative alignment M(K) and Theorem 1's lower bound on J.

docs/equations.md §2-3:
- Delta mu_k = < w_k, g+ - g- >                               [paper]
- M(K) = sum_{k<K} eta_k [Delta mu_k]_+                       [paper, Eq. 14]
- J(K) >= sigmoid(logit J0 + M(K) / 2)                         [paper, Thm 1; constants unconfirmed]
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit, logit

from .._validate import as_float_array, check_open_unit

__all__ = ["gap_alignment", "gap_cosine", "cumulative_alignment", "logodds_lower_bound"]


def gap_alignment(direction, gap) -> np.ndarray:
    """Delta mu = <w, g+ - g->, over the last axis: the first-order change of Phi per unit step."""
    w = as_float_array(direction, "direction", min_ndim=1)
    g = as_float_array(gap, "gap", min_ndim=1)
    if w.shape[-1] != g.shape[-1]:
        raise ValueError(f"direction has dimension {w.shape[-1]} but gap has {g.shape[-1]}")
    return np.sum(w * g, axis=-1)


def gap_cosine(direction, gap) -> np.ndarray:
    """cos(w, gap) = Delta mu / (||w|| ||gap||); 0 where either vector is zero.

    Each vector is first divided by its largest |entry| (the cosine is scale-free), so vectors of
    1e-200 or 1e200 neither underflow nor overflow in the norms and the dot product.
    """
    w = as_float_array(direction, "direction", min_ndim=1)
    g = as_float_array(gap, "gap", min_ndim=1)
    if w.shape[-1] != g.shape[-1]:
        raise ValueError(f"direction has dimension {w.shape[-1]} but gap has {g.shape[-1]}")

    def unit_max(x):
        m = np.max(np.abs(x), axis=-1, keepdims=True)
        return np.divide(x, m, out=np.zeros_like(x), where=m > 0)

    w, g = unit_max(w), unit_max(g)
    norm = np.linalg.norm(w, axis=-1) * np.linalg.norm(g, axis=-1)
    dmu = np.sum(w * g, axis=-1)
    return np.clip(np.divide(dmu, norm, out=np.zeros_like(dmu), where=norm > 0), -1.0, 1.0)


def cumulative_alignment(etas, dmus) -> np.ndarray:
    """Running M: entry k is M(k+1) = sum_{j<=k} eta_j [Delta mu_j]_+ (steps on the last axis)."""
    e = as_float_array(etas, "etas", min_ndim=1)
    d = as_float_array(dmus, "dmus", min_ndim=1)
    if np.any(e < 0):
        raise ValueError("etas must be >= 0")
    try:
        e, d = np.broadcast_arrays(e, d)
    except ValueError as exc:
        raise ValueError(f"etas {e.shape} and dmus {d.shape} must have matching shapes") from exc
    return np.cumsum(e * np.maximum(d, 0.0), axis=-1)


def logodds_lower_bound(J0, M) -> np.ndarray:
    """Theorem 1's bound J >= J0 / (J0 + (1 - J0) exp(-M/2)) = sigmoid(logit J0 + M/2)."""
    J0 = check_open_unit(J0, "J0")
    M = as_float_array(M, "M")
    if np.any(M < 0):
        raise ValueError("M must be >= 0 (a sum of positive parts)")
    return expit(logit(J0) + M / 2.0)
