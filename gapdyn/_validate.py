"""Boundary checks shared by the public functions of :mod:`gapdyn`.

Every public function validates its arguments here and raises a ``ValueError`` that names the
argument and the constraint; internal helpers trust their inputs.

Tolerance: a probability vector is accepted when every entry is finite and >= -PROB_ATOL and
its entries sum to 1 within ``PROB_ATOL * max(1, K)`` (K = number of entries); tiny negative
round-off is clipped to 0 and the accepted vector is divided by its sum, so a success rate computed
from it never exceeds 1 by more than the rounding of one sum (beyond the tolerance: ValueError).
"""

from __future__ import annotations

import numbers

import numpy as np
from array_api_compat import array_namespace

PROB_ATOL = 1e-8
"""Absolute tolerance per entry for probabilities (sum within PROB_ATOL * K)."""


def as_float_array(x, name: str, *, min_ndim: int = 0) -> np.ndarray:
    """Convert to a finite float64 array of at least ``min_ndim`` dimensions."""
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a numeric array, got {type(x).__name__}") from exc
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite (found NaN or inf)")
    return arr


def as_probs(probs, name: str = "probs") -> np.ndarray:
    """Probabilities over the last axis: finite, non-negative, summing to 1 (see module doc)."""
    p = as_float_array(probs, name, min_ndim=1)
    if p.shape[-1] < 2:
        raise ValueError(f"{name} must have at least 2 entries on its last axis, got shape {p.shape}")
    if np.any(p < -PROB_ATOL):
        raise ValueError(f"{name} must be non-negative (min {p.min():.3g})")
    total = p.sum(axis=-1)
    tol = PROB_ATOL * max(1, p.shape[-1])
    if np.any(np.abs(total - 1.0) > tol):
        worst = float(np.max(np.abs(total - 1.0)))
        raise ValueError(f"{name} must sum to 1 over the last axis (off by {worst:.3g} > tolerance {tol:.1g})")
    p = np.clip(p, 0.0, None)
    return p / p.sum(axis=-1, keepdims=True)


def as_rewards(rewards, shape: tuple[int, ...], name: str = "rewards") -> np.ndarray:
    """Binary rewards in {0, 1}, broadcastable to ``shape``."""
    r = as_float_array(rewards, name, min_ndim=1)
    if not np.all((r == 0.0) | (r == 1.0)):
        raise ValueError(f"{name} must be binary (every entry 0 or 1)")
    try:
        return np.broadcast_to(r, shape)
    except ValueError as exc:
        raise ValueError(f"{name} has shape {r.shape}, which does not match {shape}") from exc


def as_scores(scores, probs_shape: tuple[int, ...], name: str = "scores") -> np.ndarray:
    """Score vectors s(a) with shape probs_shape + (P,)."""
    s = as_float_array(scores, name, min_ndim=2)
    if s.shape[:-1] != tuple(probs_shape):
        raise ValueError(
            f"{name} must have shape {tuple(probs_shape)} + (P,), one score row per response; got {s.shape}"
        )
    return s


def check_positive(value, name: str) -> float:
    """A finite scalar > 0 (e.g. a step size eta)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        arr = np.asarray(value)
        if arr.shape != () or not np.issubdtype(arr.dtype, np.number):
            raise ValueError(f"{name} must be a real scalar, got {value!r}")
        value = float(arr)
    value = float(value)
    if not np.isfinite(value) or value <= 0.0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return value


def check_real_option(value, name: str, *, low: float = 0.0) -> float:
    """A finite real scalar >= low (a method option such as eps or lam)."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.number)) or isinstance(value, np.complexfloating):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not np.isfinite(value) or value < low:
        raise ValueError(f"{name} must be finite and >= {low:g}, got {value!r}")
    return value


def check_int(value, name: str, *, minimum: int = 0) -> int:
    """An integer >= minimum as a Python int (numpy integers accepted; bools, floats and others: ValueError)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_group_size(group_size) -> int:
    """An integer group size G >= 2 (one sample has no baseline)."""
    if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral):
        raise ValueError(f"group_size must be an integer >= 2, got {group_size!r}")
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2, got {group_size}")
    return int(group_size)


def check_open_unit(J, name: str = "J") -> np.ndarray:
    """Success rates strictly inside (0, 1), where the log-odds and the Gap are defined."""
    arr = as_float_array(J, name)
    if np.any((arr <= 0.0) | (arr >= 1.0)):
        raise ValueError(f"{name} must lie strictly in (0, 1): the quantity is undefined at J = 0 or J = 1")
    return arr


def check_success_defined(J: np.ndarray, Jbar: np.ndarray, what: str) -> None:
    """Raise when some prompt has J = 0 or J = 1 exactly (conditional means undefined)."""
    if np.any(J <= 0.0) or np.any(Jbar <= 0.0):
        raise ValueError(
            f"{what} is undefined when the success rate J is 0 or 1 (no correct or no incorrect "
            "response has probability mass); use the logits-based routes for extreme policies"
        )


def array_namespace_checked(*arrays):
    """The array namespace (numpy or torch) of real numeric arrays; ValueError for anything else."""
    if not all(hasattr(a, "dtype") and hasattr(a, "shape") for a in arrays):
        raise ValueError(f"expected numpy arrays or torch tensors, got {[type(a).__name__ for a in arrays]}")
    try:
        xp = array_namespace(*arrays)
    except TypeError as exc:
        raise ValueError(f"expected numpy arrays or torch tensors, got {[type(a).__name__ for a in arrays]}") from exc
    for a in arrays:
        if not any(xp.isdtype(a.dtype, kind) for kind in ("real floating", "integral", "bool")):
            raise ValueError(f"expected a real numeric array, got dtype {a.dtype}")
    return xp


SEED_MAX = 2**64 - 1
"""Largest seed accepted: numpy's SeedSequence and torch's manual_seed take unsigned 64-bit integers."""


def check_seed(value, name: str = "seed") -> int:
    """A seed as a Python int in [0, 2^64 - 1] (unsigned 64-bit); bools, floats and others: ValueError.

    Returned as a Python int, never a fixed-width numpy integer, so 2^63 and above stay positive.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer in [0, 2^64 - 1], got {value!r}")
    value = int(value)
    if not 0 <= value <= SEED_MAX:
        raise ValueError(f"{name} must be an integer in [0, 2^64 - 1] (unsigned 64-bit), got {value}")
    return value
