"""How a testbed run ends, judged against its pre-RL start (docs/evidence.md, "Testbed outcome").

The baseline is the warm checkpoint measured before the first update: A0 its held-out accuracy (sampled at the RL
temperature), R0 its mean sampled reward on training prompts. A_end is the last held-out evaluation (at the end of
the run), R_end the mean training reward over the last ``window`` steps. Labels, most severe first:

* ``failed``     a numerical fault stopped the run (reported apart);
* ``collapsed``  A_end < floor * A0 and R_end < floor * R0 (both fell to under a quarter of their start);
* ``degraded``   A_end <= A0 - drop (not collapsed);
* ``learned``    A_end >= A0 + gain;
* ``healthy``    otherwise (within [A0 - drop, A0 + gain)).

Alerts are events, never a label. The collapse time is the first evaluation from which every later evaluation
(the end included) has held-out accuracy below floor * A0; its resolution is the evaluation cadence.
Derived here (no paper defines a run outcome for sampled J); the counterpart of Suk & Duan's J -> 0
(arXiv 2510.08539, Thm 2) for a policy whose J is estimated on held-out problems.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["RL_OUTCOMES", "FLOOR", "GAIN", "DROP", "WINDOW", "RLOutcome", "rl_outcome", "collapse_time"]

RL_OUTCOMES = ("collapsed", "degraded", "healthy", "learned", "failed")
"""Labels in order of severity (failed apart)."""
FLOOR = 0.25
"""Collapsed: final held-out accuracy and final reward below this fraction of their pre-RL values."""
GAIN = 0.15
"""Learned: final held-out accuracy at least this much above the pre-RL accuracy."""
DROP = 0.10
"""Degraded: final held-out accuracy at least this much below the pre-RL accuracy."""
WINDOW = 10
"""Steps at the end whose mean training reward is R_end."""


@dataclass(frozen=True)
class RLOutcome:
    """One run's end state (:func:`rl_outcome`): label, baseline (A0, R0), end (A_end, R_end), collapse time."""

    label: str
    A0: float
    R0: float
    A_end: float
    R_end: float
    collapse_step: int | None

    def to_dict(self) -> dict:
        return asdict(self)


def _unit(v, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) or not (0 <= v <= 1):
        raise ValueError(f"{name} must be a number in [0, 1], got {v!r}")
    return float(v)


def collapse_time(evaluations, A0: float, *, floor: float = FLOOR) -> int | None:
    """First evaluation step from which held-out accuracy stays below floor * A0 ((step, accuracy) pairs in step
    order, the end included); None when the last one is not below."""
    evals = [(int(s), _unit(a, "evaluation accuracy")) for s, a in evaluations]
    if any(s1 >= s2 for (s1, _), (s2, _) in zip(evals, evals[1:])):
        raise ValueError("evaluations must be in increasing step order")
    level, t = floor * _unit(A0, "A0"), None
    for s, a in reversed(evals):
        if a >= level:
            break
        t = s
    return t


def rl_outcome(evaluations, rewards, *, A0: float, R0: float, fault: bool | str = False, floor: float = FLOOR,
               gain: float = GAIN, drop: float = DROP, window: int = WINDOW) -> RLOutcome:
    """The outcome (module doc) of a run with held-out ``evaluations`` [(step, accuracy), ...] after the start
    (the last at the end of the run), per-step mean training ``rewards`` (NaN: a skipped step), and its pre-RL
    held-out accuracy ``A0`` and reward ``R0``."""
    A0, R0 = _unit(A0, "A0"), _unit(R0, "R0")
    for name, v in (("floor", floor), ("gain", gain), ("drop", drop)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
            raise ValueError(f"{name} must be a number in (0, 1), got {v!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an integer >= 1, got {window!r}")
    evals = list(evaluations)
    r = np.asarray(rewards, dtype=float)
    if r.ndim != 1:
        raise ValueError(f"rewards must be 1-D (one mean reward per step), got shape {r.shape}")
    end = r[-window:]
    R_end = float(np.nanmean(end)) if np.isfinite(end).any() else math.nan
    if fault or not evals or math.isnan(R_end):
        A_end = _unit(evals[-1][1], "evaluation accuracy") if evals else math.nan
        return RLOutcome("failed", A0, R0, A_end, R_end, None)
    t = collapse_time(evals, A0, floor=floor)
    A_end = float(evals[-1][1])
    if A_end < floor * A0 and R_end < floor * R0:
        label = "collapsed"
    elif A_end <= A0 - drop:
        label = "degraded"
    elif A_end >= A0 + gain:
        label = "learned"
    else:
        label = "healthy"
    return RLOutcome(label, A0, R0, A_end, R_end, t if label == "collapsed" else None)
