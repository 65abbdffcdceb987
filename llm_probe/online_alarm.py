"""Collapse alarms watched while a run trains: each alarm reads one logged statistic and feeds it, log row by log
row, to a detector of gapdyn.evidence.detectors (CUSUM, Mann-Kendall, threshold, level).

An alarm is (name, statistic, detector with its cutoff c). At each log row t that carries a number for the statistic
(NaN: not logged, skipped; one value per step), the value joins the alarm's series and its score s_t is the
detector's score on that series so far: causal, s_t uses only the values logged at steps <= t, so s_t equals the
offline score of :meth:`gapdyn.evidence.detectors.Detector.scores` on the whole logged series at t. The alarm fires at the
first t with s_t >= c, the step :func:`gapdyn.evidence.alarm.alarm_step` gives offline on the same series.

Cutoffs: the alarms of ``llm_probe.testbed.alarm_report.ALARM_SPECS`` have placeholder thresholds; ``alarm_report``
calibrates each at its false-alarm rate on the testbed's calibration block and writes the cutoffs into
``alarm_specs.json`` (``"calibrated"``); ``--freeze`` writes ``alarm_frozen.json`` with the cutoffs and the primary
alarm chosen on the calibration block; :func:`load_alarm_specs` reads either. Those cutoffs are calibrated on the
testbed (the RLVR testbed's tiny models and task, docs/testbed.md); their held-out test is the alarm report's
``--frozen`` decision; on another model or task their false-alarm rate is unknown.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gapdyn.evidence.detectors import Detector

__all__ = ["OnlineAlarm", "as_alarms", "load_alarm_specs"]



@dataclass
class OnlineAlarm:
    """One alarm watched online (module doc): ``name``, the ``statistic`` it reads, its ``detector`` (fires at
    score >= ``detector.cutoff``); ``steps`` / ``values`` the series fed so far; ``fired`` = {step, value, score} of
    its first firing (None before)."""

    name: str
    statistic: str
    detector: Detector
    steps: list = field(default_factory=list)
    values: list = field(default_factory=list)
    fired: dict | None = None

    def update(self, step: int, value: float) -> tuple[float, bool] | None:
        """Feed the value logged at ``step``: (s_t, s_t >= cutoff); None when it is not fed (NaN, or a step not
        after the last one fed). s_t = -inf while the score is not defined (e.g. inside a reference period)."""
        if math.isnan(value) or (self.steps and step <= self.steps[-1]):
            return None
        self.steps.append(int(step))
        self.values.append(float(value))
        s = float(self.detector.score_values(np.asarray(self.values, dtype=float))[-1])
        s = -math.inf if math.isnan(s) else s
        return s, s >= self.detector.cutoff


def _one(a, i: int) -> OnlineAlarm:
    if isinstance(a, (tuple, list)) and len(a) in (3, 4):
        name, statistic, det = a[:3]
        if not isinstance(det, Detector):
            raise ValueError(f"alarm[{i}]: the third entry must be a gapdyn.evidence.detectors.Detector, got "
                             f"{type(det).__name__}")
        if len(a) == 4:
            c = a[3]
            if isinstance(c, bool) or not isinstance(c, (int, float, np.integer, np.floating)) or math.isnan(c):
                raise ValueError(f"alarm[{i}]: cutoff must be a number, got {c!r}")
            det = det.at_cutoff(float(c))
    elif all(hasattr(a, k) for k in ("name", "statistic", "detector")):  # an AlarmSpec (gapdyn.evidence.alarm) or alike
        name, statistic, det = a.name, a.statistic, a.detector
        if not isinstance(det, Detector):
            raise ValueError(f"alarm[{i}]: detector must be a gapdyn.evidence.detectors.Detector, got {type(det).__name__}")
    else:
        raise ValueError(f"alarm[{i}] must be an AlarmSpec, a (name, statistic, detector[, cutoff]) tuple or a "
                         f"path to alarm_specs.json, got {type(a).__name__}")
    for what, v in (("name", name), ("statistic", statistic)):
        if not isinstance(v, str) or not v:
            raise ValueError(f"alarm[{i}]: {what} must be a non-empty string, got {v!r}")
    return OnlineAlarm(name, statistic, det)


def as_alarms(alarm) -> list[OnlineAlarm]:
    """The alarms of ``GapProbeCallback(alarm=...)``: None (none); an AlarmSpec or any object with ``name``,
    ``statistic`` and a calibrated ``detector``; a tuple (name, statistic, detector) or (name, statistic, detector,
    cutoff) (the cutoff in score units, :meth:`Detector.at_cutoff`); a path to ``alarm_specs.json``
    (:func:`load_alarm_specs` with its defaults); or a list of these. Names must be unique."""
    if alarm is None:
        return []
    if isinstance(alarm, (str, Path)):
        alarm = load_alarm_specs(alarm)
    single = isinstance(alarm, tuple) and len(alarm) in (3, 4) and isinstance(alarm[0], str)
    if single or not isinstance(alarm, (list, tuple)):
        alarm = [alarm]
    out = []
    for i, a in enumerate(alarm):
        out += [OnlineAlarm(s.name, s.statistic, s.detector) for s in load_alarm_specs(a)] \
            if isinstance(a, (str, Path)) else [_one(a, i)]
    if not out:
        raise ValueError("alarm: an empty list (pass None for no alarm)")
    names = [a.name for a in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"alarm: names must be unique, {dup} repeat")
    return out


def load_alarm_specs(path, *, names=None, roles=None, length: str | None = None) -> list:
    """The calibrated alarms in ``alarm_frozen.json`` or ``alarm_specs.json`` (written by ``python -m
    llm_probe.testbed.alarm_report``, with ``--freeze`` for the first), as gapdyn.evidence.alarm.AlarmSpec objects whose
    detectors carry the calibrated cutoffs: those named in ``names``, else those of ``roles``, else the frozen
    primary probe alarm (an alarm_frozen.json's ``"primary"``). ``length``: the scratchpad whose cutoffs to take
    when the report was calibrated per length (``--by-length``). The cutoffs are calibrated on the testbed (module
    doc)."""
    from gapdyn.evidence.alarm import AlarmSpec

    p = Path(path)
    try:
        blob = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{p}: not a readable alarm_specs.json ({type(exc).__name__})") from None
    cal = blob.get("calibrated") if isinstance(blob, dict) else None
    if not isinstance(cal, list):
        raise ValueError(f"{p}: no calibrated cutoffs (an alarm_specs.json written before they were saved, or not "
                         "one): rerun python -m llm_probe.testbed.alarm_report")
    lengths = sorted({c.get("length") for c in cal if c.get("length") is not None})
    if lengths and length not in lengths:
        raise ValueError(f"{p}: calibrated per scratchpad length {lengths}: pass length= one of them")
    cal = [c for c in cal if c.get("length") == (length if lengths else None)]
    known = [c["name"] for c in cal]
    if names is not None:
        names = [names] if isinstance(names, str) else list(names)
        missing = [n for n in names if n not in known]
        if missing:
            raise ValueError(f"{p}: no calibrated alarm {missing}; calibrated: {known}")
        cal = [c for c in cal if c["name"] in names]
    elif roles is not None:
        cal = [c for c in cal if c.get("role") in roles]
        if not cal:
            raise ValueError(f"{p}: no calibrated alarm of roles {roles}; calibrated: {known}")
    else:
        primary = blob.get("primary")
        if primary not in known:
            raise ValueError(f"{p}: no frozen primary alarm (an alarm_specs.json): pass names= or roles=, or an "
                             "alarm_frozen.json")
        cal = [c for c in cal if c["name"] == primary]
    return [AlarmSpec.from_dict({k: c[k] for k in ("name", "statistic", "detector", "far", "lead", "role")})
            for c in cal]
