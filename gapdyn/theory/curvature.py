"""The curvature gap: the sampled estimate of the log-odds' curvature along an update, from grouped completions.

Derivation: docs/theory.md, section 11. Along an update d, with x(o) = d . s(o) the change of log pi(o),
d^2 Phi / da^2 = Var_{pi+}(x) - Var_{pi-}(x) =: -kappa (softmax and log-linear policies), so per group of one
prompt (x over its completions, split by their binary reward) and over the Q groups holding both rewards,

    kappa_hat = (1 / Q) sum_{q mixed} [ var_{r=0}(x_q) - var_{r=1}(x_q) ],

each variance with ``ddof`` (divisor n - ddof; a side with n <= ddof samples counts 0). The sum runs in
group-id order and is divided by Q last, the order of the bandit engine's numba copy (ksum / cnt).

Its two uses differ only in ``ddof``:

- the safe step rule's kappa_hat (:func:`gapdyn.safe_step_estimates`, ``KAPPA_DDOF`` there = 1): unbiased
  variances, so kappa_hat is unbiased for the kappa of the model given the group's split (docs/theory.md,
  section 11); a one-sample side has no unbiased variance and counts 0;
- the logged ``warn/curv_gap`` (llm_probe.warning, ``CURV_GAP_DDOF`` there = 0): population variances, the
  statistic as the early-warning study logged it and as the testbed's collapse alarm froze it
  (docs/testbed.md): changing it would change what the frozen alarm's threshold is compared with.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["curvature_gap"]


def group_ids(groups, shape: tuple) -> np.ndarray:
    """[N] int64 group ids of ``groups`` (one group per prompt; None: one group), checked to have ``shape`` and
    to hold integers (integral floats accepted)."""
    if groups is None:
        return np.zeros(shape, dtype=np.int64)
    g = np.asarray(groups)
    if g.shape != shape:
        raise ValueError(f"groups must have the shape of x {shape}, got {g.shape}")
    if not (np.issubdtype(g.dtype, np.integer) or (np.issubdtype(g.dtype, np.floating)
                                                    and np.all(np.isfinite(g)) and np.all(g == np.round(g)))):
        raise ValueError("groups must hold integer group ids")
    return g.astype(np.int64)


def _side_var(v: np.ndarray, ddof: int) -> float:
    return float(np.var(v, ddof=ddof)) if v.size > ddof else 0.0


def curvature_gap(x, success, groups=None, *, ddof: int) -> tuple[float, int]:
    """(kappa_hat, Q): the mean over the Q mixed groups of var_{r=0}(x) - var_{r=1}(x) (module docstring).

    Args:
        x: [N] change of each completion's log-probability along the update (float; a non-finite entry makes
            its group's term, and so kappa_hat, non-finite, silently: this function does not judge x).
        success: [N] bool or 0/1, True where the completion's reward is 1.
        groups: [N] integer group id (one group per prompt); None: one group.
        ddof: the variances' delta degrees of freedom (1: the safe step; 0: ``warn/curv_gap``).
    Returns:
        kappa_hat (NaN when no group holds both rewards) and Q.

    >>> curvature_gap([1.0, 1.0, 2.0, -2.0], [1, 1, 0, 0], ddof=1)  # var(2, -2) - var(1, 1) = 8 - 0
    (8.0, 1)
    """
    xv = np.asarray(x, dtype=np.float64)
    if xv.ndim != 1:
        raise ValueError(f"x must be one-dimensional [N], got shape {xv.shape}")
    ok = np.asarray(success)
    if ok.shape != xv.shape:
        raise ValueError(f"success must have the shape of x {xv.shape}, got {ok.shape}")
    if ok.dtype != np.bool_:
        if not np.all((ok == 0) | (ok == 1)):
            raise ValueError("success must be bool or 0/1")
        ok = ok == 1
    ids = group_ids(groups, xv.shape)
    if isinstance(ddof, bool) or not isinstance(ddof, (int, np.integer)) or ddof < 0:
        raise ValueError(f"ddof must be an integer >= 0, got {ddof!r}")
    total, q = 0.0, 0
    with np.errstate(invalid="ignore", over="ignore"):
        for gid in np.unique(ids):
            in_g = ids == gid
            won, lost = xv[in_g & ok], xv[in_g & ~ok]
            if won.size and lost.size:
                total += _side_var(lost, ddof) - _side_var(won, ddof)
                q += 1
    return (total / q if q else math.nan), q
