"""The suggested learning rate of a probed run: one rule, the lr finder's (``gapdyn lr-finder``), the one scored
against measured collapse lrs on the testbed (docs/testbed.md; README, "The suggested lr against the measured
collapse lr"). numpy, and scipy inside gapdyn.evidence.alarm.median_interval.

Each probed step k logs the headroom h_k of the safe step rule before its cap, h = min(delta / sd_hat,
c dmu_hat / kappa_hat) for the step actually taken (gapdyn.safe_step_headroom; derived in docs/theory.md,
section 11, with heuristic c and delta), and ``gap/headroom_lr`` = lr_k h_k: the learning rate at which that step's
cap would just bind (the update scales with lr for SGD and Adam alike). The suggested learning rate is the median
of lr_k h_k over the first K = :data:`SUGGEST_STEPS` probed steps of a run that logged a value (not NaN: a zero
update or mixed parameter-group lrs log none; +inf, no cap bound, is kept and left out of the median; the lower
median for an even count),
with the distribution-free order-statistic interval of the median (gapdyn.evidence.alarm.median_interval), which treats the
steps as exchangeable (they are serially dependent: a spread over the run's steps, not an interval over runs).
``gapdyn lr-finder`` probes every one of its K <= 20 steps; ``GapProbeCallback.summary()``, its logged
``gap/suggested_lr`` and ``gapdyn inspect`` take the run's first K probed steps (every ``probe_every``-th step).
"""

from __future__ import annotations

import math

__all__ = ["SUGGEST_STEPS", "lr_suggestion", "first_probed"]

SUGGEST_STEPS = 20
"""K: the probed steps, from the run's start, the suggestion rests on at most (the lr finder's K, scored on the
testbed at K = 20)."""


def first_probed(rows, k: int = SUGGEST_STEPS) -> list:
    """The first ``k`` rows of ``rows`` (in step order) that logged a value of ``gap/headroom_lr`` (a number, not
    NaN: a table that fills missing cells with NaN, like gapdyn train's metrics.parquet, reads the same as its
    JSONL)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")

    def has_value(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)

    return [r for r in rows if has_value(r.get("gap/headroom_lr"))][:k]


def lr_suggestion(rows, *, confidence: float = 0.95) -> dict:
    """The rule of the module doc on the rows given (the caller picks them: :func:`first_probed`, or a finder's K
    steps): ``suggested_lr`` = median of the finite ``gap/headroom_lr`` values (the lower median for an even
    count), ``lo`` / ``hi`` its order-statistic interval (unbounded below 6 values), ``steps`` = how many values
    it rests on, ``probed`` = rows that logged the key, ``headroom_median`` = the median of h."""
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
