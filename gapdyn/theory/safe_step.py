"""The safe step rule: a multiplier a in [0, 1] on a proposed update, from the sampled groups alone.

Derivation and status: docs/theory.md, section 11 (derived; the constants c and delta are heuristic).
Given an update d (e.g. an optimiser's step theta' - theta_k) and, for every sampled completion o_i,
its directional derivative x_i = d/ds log pi_{theta_k + s d}(o_i) at s = 0, the second-order model of
the log-odds along d,

    Phi(theta_k + a d) ~ Phi(theta_k) + a dmu - (a^2 / 2) kappa,

is estimated per group of one prompt (x over its G completions, r their binary rewards) by

    dmu_hat   = mean_{r_i = 1} x_i - mean_{r_i = 0} x_i      (estimates <d, g+ - g->)
    kappa_hat = var_{r_i = 0}(x) - var_{r_i = 1}(x)         (estimates d^T (-Hess Phi) d; ddof = 1,
                                                             a side with < 2 samples contributes 0:
                                                             gapdyn.theory.curvature.curvature_gap)
    sd_hat    = std(x over the group)                       (ddof = 1; the spread of the change of log pi).

Several groups sharing the parameters average dmu_hat and kappa_hat over the mixed groups (both rewards
present) and take the largest sd_hat over all groups. The step is

    a = min(1, delta / sd_hat, c dmu_hat / kappa_hat)

with the trust-region term dropped when sd_hat = 0, the curvature term dropped when kappa_hat <= 0 or
when no group is mixed, and a = 0 (skip the step) when some group is mixed and dmu_hat <= 1e-12 sd_hat
(the update does not ascend the log-odds; the tolerance maps round-off ties at 0 to 0 in every route).
Where a cap binds, a d depends on d only through its direction (x, dmu_hat, sd_hat scale like d and
kappa_hat like d^2), so the rule is invariant to the learning rate's and the advantages' scale.

:func:`safe_step_size` is the same rule for a step eta along a direction u with a ceiling eta0
(eta = eta0 a when x is measured along eta0 u); the bandit simulators' adaptive schedule uses it.

:func:`safe_step_headroom` is the rule before its cap, h = min(delta / sd_hat, c dmu_hat / kappa_hat) with the
same edge cases (+inf when neither term applies, 0 when no ascent), so a = min(1, h) and eta = min(eta0, h):
h > 1 says how far the step could grow before a cap binds, h < 1 how much the rule cuts it.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .._validate import as_float_array, as_rewards, check_positive
from .curvature import curvature_gap, group_ids

__all__ = ["SafeStep", "safe_step_multiplier", "safe_step_estimates", "safe_step_headroom", "safe_step_size",
           "KAPPA_DDOF", "NO_ASCENT_TOL", "SAFE_STEP_C", "SAFE_STEP_DELTA"]

KAPPA_DDOF = 1
"""kappa_hat's variances are unbiased (ddof = 1): kappa_hat is then unbiased for kappa given the group's split
(docs/theory.md, section 11); :func:`gapdyn.theory.curvature.curvature_gap` with this ddof."""

NO_ASCENT_TOL = 1e-12
"""dmu_hat <= NO_ASCENT_TOL * sd_hat counts as no ascent (a = 0)."""
SAFE_STEP_C = 1.0
"""Default c: the fraction of the model-optimal step dmu / kappa (1: half the local threshold; heuristic)."""
SAFE_STEP_DELTA = 2.0
"""Default delta: the trust region on the spread of the change of log pi (heuristic)."""


@dataclass(frozen=True)
class SafeStep:
    """The rule's estimates and its multiplier (docs/theory.md, section 11).

    Attributes:
        dmu_hat: mean over mixed groups of mean_{r=1} x - mean_{r=0} x (0 when no group is mixed).
        kappa_hat: mean over mixed groups of var_{r=0} x - var_{r=1} x (0 when no group is mixed).
        sd_hat: largest within-group std of x (ddof = 1; 0 when every group has < 2 samples).
        n_mixed: number of groups with both rewards.
        a: the multiplier in [0, 1] applied to the update, min(1, headroom).
        headroom: the rule before its cap, :func:`safe_step_headroom` (+inf: no term applies; NaN: not measured).
    """

    dmu_hat: float
    kappa_hat: float
    sd_hat: float
    n_mixed: int
    a: float
    headroom: float = math.nan


def _check_real(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return float(value)


def safe_step_estimates(x, rewards, groups=None) -> tuple[float, float, float, int]:
    """(dmu_hat, kappa_hat, sd_hat, n_mixed) from directional derivatives x_i, rewards r_i, group ids.

    Args:
        x: [N] x_i = d/ds log pi(o_i) along the update at s = 0 (finite).
        rewards: [N] binary rewards r_i in {0, 1}.
        groups: [N] integer group id of each completion (one group per prompt); None: one group.
    Returns:
        The estimates of the module docstring (docs/theory.md, section 11): per-group moments, dmu_hat and
        kappa_hat averaged over the n_mixed groups with both rewards, sd_hat the largest group std.
    """
    xv = as_float_array(x, "x", min_ndim=1)
    if xv.ndim != 1:
        raise ValueError(f"x must be one-dimensional [N], got shape {xv.shape}")
    r = np.asarray(as_rewards(rewards, xv.shape, "rewards"))
    if np.shape(rewards) != xv.shape:
        raise ValueError(f"rewards must have the shape of x {xv.shape}, got {np.shape(rewards)}")
    ids = group_ids(groups, xv.shape)
    dsum = sd = 0.0
    n_mixed = 0
    for gid in np.unique(ids):
        xg, rg = xv[ids == gid], r[ids == gid]
        if xg.size >= 2:
            sd = max(sd, float(np.std(xg, ddof=1)))
        pos, neg = xg[rg == 1.0], xg[rg == 0.0]
        if pos.size and neg.size:
            dsum += float(pos.mean() - neg.mean())
            n_mixed += 1
    if n_mixed == 0:
        return 0.0, 0.0, sd, 0
    kappa, _ = curvature_gap(xv, r == 1.0, ids, ddof=KAPPA_DDOF)
    return dsum / n_mixed, kappa, sd, n_mixed


def safe_step_headroom(
    dmu_hat: float, kappa_hat: float, sd_hat: float, *, c: float = SAFE_STEP_C, delta: float = SAFE_STEP_DELTA,
    mixed: bool = True,
) -> float:
    """h = min(delta / sd_hat, c dmu_hat / kappa_hat): the safe step rule before its cap (docs/theory.md, sec. 11).

    The trust-region term drops out when sd_hat <= 0, the curvature term when kappa_hat <= 0 or when ``mixed``
    is False (no group with both rewards); h = +inf when neither applies, and h = 0 when ``mixed`` and
    dmu_hat <= 1e-12 sd_hat (no ascent). With x measured along the full update the multiplier is a = min(1, h);
    along a unit step with ceiling eta0, eta = min(eta0, h) (:func:`safe_step_size`).

    >>> safe_step_headroom(1.0, 8.0, 1.0)  # min(2 / 1, 1 / 8)
    0.125
    """
    dmu_hat = _check_real(dmu_hat, "dmu_hat")
    kappa_hat = _check_real(kappa_hat, "kappa_hat")
    sd_hat = _check_real(sd_hat, "sd_hat")
    if sd_hat < 0:
        raise ValueError(f"sd_hat must be >= 0, got {sd_hat}")
    c, delta = check_positive(c, "c"), check_positive(delta, "delta")
    if not isinstance(mixed, (bool, np.bool_)):
        raise ValueError(f"mixed must be a bool, got {mixed!r}")
    h = math.inf
    if sd_hat > 0.0:
        h = delta / sd_hat
    if mixed:
        if dmu_hat <= NO_ASCENT_TOL * sd_hat:
            return 0.0
        if kappa_hat > 0.0:
            h = min(h, c * dmu_hat / kappa_hat)
    return h


def safe_step_size(
    dmu_hat: float, kappa_hat: float, sd_hat: float, eta0: float = 1.0, *, c: float = SAFE_STEP_C,
    delta: float = SAFE_STEP_DELTA, mixed: bool = True,
) -> float:
    """eta = min(eta0, delta / sd_hat, c dmu_hat / kappa_hat) with the edge cases of docs/theory.md, section 11.

    Here x (and so dmu_hat, kappa_hat, sd_hat) is measured per unit step along the direction; with eta0 = 1
    and x measured along the full update, eta is the multiplier a. eta = min(eta0, :func:`safe_step_headroom`):
    terms drop out when sd_hat <= 0, when kappa_hat <= 0 or when ``mixed`` is False (no group with both
    rewards); eta = 0 when ``mixed`` and dmu_hat <= 1e-12 sd_hat (no ascent).
    """
    eta0 = check_positive(eta0, "eta0")
    return min(eta0, safe_step_headroom(dmu_hat, kappa_hat, sd_hat, c=c, delta=delta, mixed=mixed))


def safe_step_multiplier(x, rewards, groups=None, *, c: float = SAFE_STEP_C, delta: float = SAFE_STEP_DELTA) -> SafeStep:
    """The multiplier a = min(1, h), h = min(delta / sd_hat, c dmu_hat / kappa_hat) (:func:`safe_step_headroom`)
    for an update d (docs/theory.md, sec. 11).

    Apply it after the optimiser's step: theta = theta_k + a (theta' - theta_k), with x_i the directional
    derivative of log pi(o_i) along d = theta' - theta_k at theta_k.

    Args:
        x: [N] directional derivatives of the completions' log-probabilities along d.
        rewards: [N] binary rewards.
        groups: [N] integer prompt id per completion (None: one group).
        c: fraction of the model-optimal step dmu/kappa (> 0; 1 by default: half the local threshold).
        delta: trust region on the spread of the change of log pi (> 0; 2 by default).

    >>> s = safe_step_multiplier([1.0, 1.0, 2.0, -2.0], [1, 1, 0, 0])
    >>> s.dmu_hat, s.kappa_hat, s.a  # curvature binds: c dmu_hat / kappa_hat = 1 / 8
    (1.0, 8.0, 0.125)
    """
    c, delta = check_positive(c, "c"), check_positive(delta, "delta")
    dmu, kappa, sd, n_mixed = safe_step_estimates(x, rewards, groups)
    h = safe_step_headroom(dmu, kappa, sd, c=c, delta=delta, mixed=n_mixed > 0)
    return SafeStep(dmu_hat=dmu, kappa_hat=kappa, sd_hat=sd, n_mixed=n_mixed, a=min(1.0, h), headroom=h)
