"""Step-size schedules and the theory-driven step controller (plain-numpy reference versions).

The numba kernels of :mod:`bandits.engine` re-implement these rules; ``tests/test_bandits_engine.py``
checks the two against each other through :mod:`bandits.reference`, which calls these functions.

Schedules (``Schedule.kind``), for an update theta_{k+1} = theta_k + eta_k u_k:

- ``constant``:   eta_k = eta0.
- ``decay``:      eta_k = eta0 / sqrt(k + 1).
- ``linesearch``: the largest eta = eta0 2^-j (j = 0..max_halvings) with Phi(theta + eta u) > Phi(theta);
  eta = 0 (skip the step) if none. Needs the exact log-odds Phi: a simulator-only oracle
  [derived]
- ``adaptive``:   the curvature controller below; needs NO evaluation of Phi. [derived]

The adaptive controller is the safe step rule of gapdyn.theory.safe_step (derivation and status: docs/theory.md,
section 11); :func:`group_alignment_curvature` and :func:`adaptive_step` call gapdyn's functions, so the
rule lives once. Summary (derived, docs/equations.md §1-3). Along u, the second-order model of the log-odds is
    Phi(theta + eta u) ~ Phi(theta) + eta dmu - (eta^2 / 2) kappa,   dmu = <u, g+ - g->,
    kappa = u^T (-Hess Phi) u = Var_{pi-}(u . s) - Var_{pi+}(u . s)
(Hess Phi = Cov_{pi+}(s) - Cov_{pi-}(s) for softmax / log-linear policies). The model rises most at
eta = dmu / kappa and returns to its start at 2 dmu / kappa (gapdyn.local_step_threshold). The model is
only trustworthy while the step changes log-probabilities by O(1): the step moves log pi(o) by
eta (u . s(o)) to first order, whose spread over responses is eta sd_pi(u . s). Hence
    eta_k = min(eta0, delta / sd_hat, c * dmu_hat / kappa_hat)
(the last term only when kappa_hat > 0; eta = 0 when dmu_hat <= 1e-12 sd_hat, i.e. no ascent), with c = 1 (the model-optimal step,
half the local threshold) and delta = 2 (a two-standard-deviation trust region on the change of
log pi) by default (delta trades speed for safety: bandits.experiments.stagnation sweeps it).
All three estimates come from the sampled group itself: with x_i = u . s(o_i), the
directional derivative of log pi(o_i) along the update (one Jacobian-vector product per response in an
LLM; any baseline shift of s cancels),
    dmu_hat   = mean_{r_i = 1} x_i - mean_{r_i = 0} x_i       (estimates <u, g+ - g->)
    kappa_hat = var_{r_i = 0}(x) - var_{r_i = 1}(x)          (unbiased variances; 0 for < 2 samples)
    sd_hat    = std(x_1..x_G)                               (ddof = 1).
dmu_hat, kappa_hat need a group with both rewards; otherwise only the trust region applies. Several
contexts sharing one parameter block average dmu_hat and kappa_hat over their mixed groups and take the
largest sd_hat. In the exact (expected-update) simulator the same formula uses population moments under
pi, pi+ and pi-. The curvature term alone does NOT prevent collapses (measured: a group with a single
failure has kappa_hat <= 0 and the controller then took eta0 and collapsed 47% of contexts at eta0 = 1000,
more than a constant step); the trust region is what removes them (bandits.experiments.stagnation).
Where a cap binds, eta_k u_k depends on u only through its direction: the rule is then invariant to the
scale of the advantages (GRPO vs REINFORCE) and to normalising u.

Adam (Kingma & Ba 2015) can transform the direction before any schedule: u = m_hat / (sqrt(v_hat) + eps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from gapdyn._validate import as_float_array, check_positive
from gapdyn.theory.safe_step import SAFE_STEP_C, SAFE_STEP_DELTA, safe_step_estimates, safe_step_size

__all__ = [
    "SCHEDULES",
    "Schedule",
    "AdamState",
    "adam_init",
    "adam_direction",
    "schedule_step",
    "decaying_step",
    "line_search_step",
    "group_alignment_curvature",
    "adaptive_step",
]

SCHEDULES = ("constant", "decay", "linesearch", "adaptive")


@dataclass(frozen=True)
class Schedule:
    """How eta_k is chosen from eta0 (see module docstring).

    Attributes:
        kind: one of SCHEDULES.
        c: the adaptive controller's fraction of the model-optimal step (eta = c dmu / kappa).
        delta: the adaptive controller's trust region: eta sd(u . s) <= delta (log-prob change per step).
        max_halvings: line search: at most this many halvings of eta0 before skipping the step.
    """

    kind: str = "constant"
    c: float = SAFE_STEP_C
    delta: float = SAFE_STEP_DELTA
    max_halvings: int = 40

    def __post_init__(self):
        if self.kind not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.kind!r}")
        check_positive(self.c, "c")
        check_positive(self.delta, "delta")
        if isinstance(self.max_halvings, bool) or not isinstance(self.max_halvings, (int, np.integer)):
            raise ValueError(f"max_halvings must be an integer >= 0, got {self.max_halvings!r}")
        if self.max_halvings < 0:
            raise ValueError(f"max_halvings must be an integer >= 0, got {self.max_halvings!r}")


def decaying_step(eta0: float, k: int) -> float:
    """eta_k = eta0 / sqrt(k + 1)."""
    eta0 = check_positive(eta0, "eta0")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"k must be an integer >= 0, got {k!r}")
    return eta0 / math.sqrt(k + 1.0)


def schedule_step(kind: str, eta0: float, k: int) -> float:
    """The open-loop schedules: constant or decay (closed-loop ones need more information)."""
    eta0 = check_positive(eta0, "eta0")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"k must be an integer >= 0, got {k!r}")
    if kind == "constant":
        return eta0
    if kind == "decay":
        return decaying_step(eta0, k)
    raise ValueError(f"schedule_step handles 'constant' and 'decay', got {kind!r}")


def line_search_step(
    logodds_fn: Callable[[np.ndarray], float], theta, direction, eta0: float, *, max_halvings: int = 40, gap=None
) -> float:
    """Largest eta = eta0 2^-j, j <= max_halvings, with Phi(theta + eta u) > Phi(theta); 0.0 if none.

    With ``gap`` (grad Phi at theta) given: when the first-order change eta0 |<u, gap>| is below the
    resolution of Phi (<= 1e-12 (1 + |Phi|)) the comparison is round-off, and eta0 is returned.
    """
    th = as_float_array(theta, "theta", min_ndim=1)
    u = as_float_array(direction, "direction", min_ndim=1)
    eta = check_positive(eta0, "eta0")
    if isinstance(max_halvings, bool) or not isinstance(max_halvings, (int, np.integer)) or max_halvings < 0:
        raise ValueError(f"max_halvings must be an integer >= 0, got {max_halvings!r}")
    if gap is not None:
        gap = as_float_array(gap, "gap", min_ndim=1)
        if gap.shape != u.shape:
            raise ValueError(f"gap must have the shape of direction {u.shape}, got {gap.shape}")
    phi0 = logodds_fn(th)
    if gap is not None and eta * abs(float(np.dot(u, gap))) <= 1e-12 * (1.0 + abs(phi0)):
        return eta
    for _ in range(max_halvings + 1):
        if logodds_fn(th + eta * u) > phi0:
            return eta
        eta *= 0.5
        if eta == 0.0:  # underflow: no further halving can succeed (a huge budget must not hang)
            break
    return 0.0


def group_alignment_curvature(proj, rewards) -> tuple[float, float, float, bool]:
    """(dmu_hat, kappa_hat, spread, mixed) from one group's projections x_i = u . s(o_i) and binary rewards r_i.

    gapdyn.safe_step_estimates for one group (docs/theory.md, section 11): dmu_hat = mean_{r=1} x - mean_{r=0} x;
    kappa_hat = var_{r=0}(x) - var_{r=1}(x) (ddof = 1; a side with fewer than 2 samples contributes 0);
    spread = std(x) over the whole group (ddof = 1). ``mixed`` is False (and dmu_hat, kappa_hat are 0) when
    the group has only one reward value.
    """
    x = as_float_array(proj, "proj", min_ndim=1)
    r = as_float_array(rewards, "rewards", min_ndim=1)
    if r.shape != x.shape:
        raise ValueError(f"rewards must have the shape of proj {x.shape}, got {r.shape}")
    if x.ndim != 1:
        raise ValueError(f"proj must be one-dimensional (one group), got shape {x.shape}")
    dmu, kappa, spread, n_mixed = safe_step_estimates(x, r)
    return dmu, kappa, spread, n_mixed > 0


def adaptive_step(
    dmu_hat: float, kappa_hat: float, spread: float, eta0: float, *, c: float = SAFE_STEP_C, delta: float = SAFE_STEP_DELTA,
    mixed: bool = True,
) -> float:
    """eta = min(eta0, delta / spread, c dmu_hat / kappa_hat): gapdyn.safe_step_size (docs/theory.md, section 11).

    Terms drop out when spread <= 0, kappa_hat <= 0 or the estimates are unavailable (``mixed=False``);
    eta = 0 when dmu_hat <= 1e-12 spread (no ascent; the tolerance makes round-off ties at dmu_hat = 0, e.g.
    at a stationary point, give 0 in every route).
    """
    if isinstance(spread, (int, float, np.integer, np.floating)) and not isinstance(spread, bool) and spread < 0:
        raise ValueError(f"spread must be >= 0 (a standard deviation), got {spread!r}")
    return safe_step_size(dmu_hat, kappa_hat, spread, eta0, c=c, delta=delta, mixed=mixed)


@dataclass(frozen=True)
class AdamState:
    """Adam moments for one parameter block: m, v of shape [d]; t = number of updates so far."""

    m: np.ndarray
    v: np.ndarray
    t: int


def adam_init(dim: int) -> AdamState:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ValueError(f"dim must be an integer >= 1, got {dim!r}")
    return AdamState(np.zeros(dim), np.zeros(dim), 0)


def adam_direction(
    state: AdamState, w, *, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8
) -> tuple[np.ndarray, AdamState]:
    """Adam's update direction u = m_hat / (sqrt(v_hat) + eps) for ascent direction w (Kingma & Ba 2015)."""
    w = as_float_array(w, "w", min_ndim=1)
    if w.shape != np.shape(state.m):
        raise ValueError(f"w must have the shape of the Adam moments {np.shape(state.m)}, got {w.shape}")
    for name, b in (("beta1", beta1), ("beta2", beta2)):
        if isinstance(b, bool) or not isinstance(b, (int, float, np.integer, np.floating)) or not 0 <= b < 1:
            raise ValueError(f"{name} must lie in [0, 1), got {b!r}")
    eps = check_positive(eps, "eps")
    t = state.t + 1
    m = beta1 * state.m + (1.0 - beta1) * w
    v = beta2 * state.v + (1.0 - beta2) * w * w
    m_hat = m / (1.0 - beta1**t)
    v_hat = v / (1.0 - beta2**t)
    return m_hat / (np.sqrt(v_hat) + eps), AdamState(m, v, t)
