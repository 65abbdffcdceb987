"""The suggested learning rate of a probed run, two rules over the same logged values (numpy only): the running
rule (:func:`suggest_lr`), read by the TRL callback while it runs and by ``gapdyn inspect``, and the lr finder's
(:func:`lr_suggestion`), the one scored against measured collapse lrs on the testbed (docs/testbed.md).

Each probed step k logs the headroom h_k of the safe step rule before its cap, h = min(delta / sd_hat,
c dmu_hat / kappa_hat) for the step actually taken (gapdyn.safe_step_headroom; derived in docs/theory.md,
section 11, with heuristic c and delta), and ``gap/headroom_lr`` = lr_k h_k: the learning rate at which that step's
cap would just bind (the update scales with lr for SGD and Adam alike). The suggested
learning rate is the q quantile (lower order statistic) of lr_k h_k over the last ``window`` probed steps with a
measured h: at it, the cap would have bound on about a fraction q of those steps. The lr finder's rule is the
median of lr_k h_k over every probed step with a measured h, with the distribution-free order-statistic interval of
the median (gapdyn.evidence.alarm.median_interval), which treats the steps as exchangeable (they are serially dependent: a
spread over the run's steps, not an interval over runs).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["SUGGEST_QUANTILE", "SUGGEST_WINDOW", "suggest_lr", "lr_suggestion"]

SUGGEST_QUANTILE = 0.1
"""The quantile of lr_k h_k that is the suggested learning rate."""
SUGGEST_WINDOW = 50
"""The number of most recent probed steps (with a measured h) the quantile is taken over."""


def _finite_or_nan(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        return math.nan
    return float(v)


def suggest_lr(rows, q: float = SUGGEST_QUANTILE, window: int = SUGGEST_WINDOW) -> dict:
    """The rule of the module doc on ``rows`` (probed-step dicts in step order holding ``gap/headroom`` and
    ``gap/headroom_lr``; a row without a number for ``gap/headroom``, or with NaN, has no measured h and is
    left out). Returns ``headroom_q`` (the q quantile of h over the last ``window`` rows with a measured h),
    ``headroom_steps`` (how many rows that is), ``suggested_lr`` (the q quantile of lr_k h_k over those of them
    with a number there; NaN when none) and ``suggested_lr_steps``. h = +inf (no cap bound) stays in the
    quantile."""
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 < q < 1.0:
        raise ValueError(f"q must be a number in (0, 1), got {q!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    kept = [r for r in rows if not math.isnan(_finite_or_nan(r.get("gap/headroom")))][-window:]
    h = np.array([float(r["gap/headroom"]) for r in kept])
    lr_h = np.array([_finite_or_nan(r.get("gap/headroom_lr")) for r in kept])
    lr_h = lr_h[~np.isnan(lr_h)]
    return {"headroom_q": float(np.quantile(h, q, method="lower")) if len(h) else math.nan,
            "headroom_steps": len(h),
            "suggested_lr": float(np.quantile(lr_h, q, method="lower")) if len(lr_h) else math.nan,
            "suggested_lr_steps": len(lr_h)}


def lr_suggestion(rows, *, confidence: float = 0.95) -> dict:
    """From metrics rows (dicts): ``suggested_lr`` = median of the finite ``gap/headroom_lr`` values (the lower
    median for an even count), ``lo`` / ``hi`` its order-statistic interval (module doc), ``steps`` = how many
    values it rests on, ``probed`` = rows that logged the key, ``headroom_median`` = the median of h."""
    import numpy as np

    from gapdyn.evidence.alarm import median_interval

    def finite(key):
        v = np.array([float(r[key]) for r in rows if isinstance(r.get(key), (int, float))
                      and not isinstance(r.get(key), bool)], dtype=float)
        return v[np.isfinite(v)]

    lr_h, h = finite("gap/headroom_lr"), finite("gap/headroom")
    probed = sum("gap/headroom_lr" in r for r in rows)
    if not lr_h.size:
        return {"suggested_lr": math.nan, "lo": math.nan, "hi": math.nan, "steps": 0, "probed": probed,
                "headroom_median": math.nan, "confidence": confidence}
    med, lo, hi = median_interval(lr_h, confidence=confidence)
    return {"suggested_lr": med, "lo": lo, "hi": hi, "steps": int(lr_h.size), "probed": probed,
            "headroom_median": median_interval(h, confidence=confidence)[0] if h.size else math.nan,
            "confidence": confidence}
