"""Inverse-CDF draws of categorical responses from pre-drawn uniforms (the one sampler of the project).

For a row of masses p_1..p_K (p_k >= 0, sum > 0, not necessarily normalised) with running sums
F_k = p_1 + ... + p_k (floating-point cumsum) and a uniform u in [0, 1]:

    arm(u) = min(#{k : F_k <= u F_K},  k_last)          [standard inverse transform sampling]

i.e. ``numpy.searchsorted(F, u * F_K, side="right")`` capped at k_last, the last arm with p_k > 0.
side="right" skips every zero-mass arm below k_last (its F_k equals the one before it), and the cap
covers u * F_K rounding up to F_K (u = 1 - 2^-53 with F_K != 1), u = 1 itself and trailing zero-mass arms,
so an arm of zero probability is never returned. :func:`gapdyn.sample_group` and the plain reference
loop of :mod:`bandits` draw through it; the numba engine keeps a twin that is tested equal to it.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array

__all__ = ["inverse_cdf_draw"]


def inverse_cdf_draw(probs, u) -> np.ndarray:
    """Arms drawn by inverse CDF: probs [..., K] (rows of masses), u [..., n] uniforms in [0, 1] -> [..., n].

    Row i of u is drawn from row i of probs (same leading shape). Rows need not sum to 1 but must be
    finite, non-negative and have positive total mass. The result is exactly the per-row
    ``min(searchsorted(cumsum(p), u * cumsum(p)[-1], "right"), k_last)`` (module doc); int64.

    >>> inverse_cdf_draw([0.5, 0.5, 0.0], [0.0, 0.5, 1.0 - 2.0**-53])
    array([0, 1, 1])
    """
    p = as_float_array(probs, "probs", min_ndim=1)
    uu = as_float_array(u, "u", min_ndim=1)
    if uu.shape[:-1] != p.shape[:-1]:
        raise ValueError(f"u must have shape {p.shape[:-1]} + (n,), one row per row of probs; got {uu.shape}")
    if np.any(p < 0):
        raise ValueError(f"probs must be non-negative (min {p.min():.3g})")
    if np.any((uu < 0) | (uu > 1)):
        raise ValueError("u must hold uniforms in [0, 1]")
    K, n = p.shape[-1], uu.shape[-1]
    with np.errstate(over="ignore"):  # an overflowing total is refused just below
        cdf = np.cumsum(p.reshape(-1, K), axis=-1)  # [R, K]
    total = cdf[:, -1:]
    if not np.all((total > 0) & np.isfinite(total)):
        raise ValueError("probs must have a finite, positive total mass in every row")
    target = uu.reshape(-1, n) * total  # [R, n]
    rows = np.arange(cdf.shape[0])[:, None]
    # one exact searchsorted for all rows: complex numbers sort by (real, imag), so the key row + 1j * F
    # orders by row first and by F within the row, with both parts exact (no offset added to F)
    flat = np.searchsorted((rows + 1j * cdf).ravel(), (rows + 1j * target).ravel(), side="right")
    idx = flat.reshape(target.shape) - rows * K
    last = K - 1 - np.argmax(p.reshape(-1, K)[:, ::-1] > 0, axis=-1)  # the last arm with positive mass
    return np.minimum(idx, last[:, None]).astype(np.int64).reshape(uu.shape)
