"""Online detectors scored as collapse alarms: alarm time, lead time, false-alarm rate, a threshold calibrated at a
fixed false-alarm rate, ROC at fixed leads, and pre-declared primaries with a hash (docs/testbed.md, "Alarm").

A run (:class:`AlarmRun`) carries its logged series (statistic -> (steps, values)), its collapse time c (None for
a run that never collapses) and a group (e.g. ``"rl"`` or ``"control"``, the random-advantage control). On one
statistic, a detector (gapdyn.evidence.detectors) with cutoff h:

* alarm time a = the first step whose score reaches h (None: never);
* lead time = c - a for a collapsing run (-inf when it never fires: a miss, below every lead);
* false-alarm rate = k / n, k of the n never-collapsing runs fire at all (Wilson interval, gapdyn.evidence.stats); per step:
  k / (the steps those runs were watched, each up to its first firing or its last logged step);
* calibration at a false-alarm rate f on a block of runs: with the n never-collapsing runs' peak scores
  p_(1) >= ... >= p_(n), the smallest cutoff at which at most floor(f n) of them fire (the next float above
  p_(floor(f n) + 1)); the threshold is then fixed and scored on a held-out block;
* ROC at lead L: a collapsing run is detected when it fires at a step <= c - L; the true-positive rate at cutoff h
  is the share of collapsing runs whose peak score over steps <= c - L reaches h, the false-positive rate the share
  of never-collapsing runs whose peak over the whole run does; AUC with the Hanley-McNeil interval
  (gapdyn.evidence.stats.roc_auc);
* the median lead with a distribution-free order-statistic interval (:func:`median_interval`).

A run without a finite value of the statistic is left out of that statistic's scores (counted as ``n_missing``).
numpy at import; scipy inside the functions.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .detectors import Detector, as_series, detector_from_dict

__all__ = ["AlarmRun", "AlarmSpec", "Calibration", "ROC", "series_of", "alarm_step", "lead_time", "peak_score",
           "false_alarms", "false_alarm_curve", "calibrate", "lead_times", "lead_summary", "median_interval",
           "roc_at_lead", "specs_hash", "evaluate_spec"]


@dataclass(frozen=True, eq=False)
class AlarmRun:
    """One run: ``series`` statistic -> (steps, values) (NaN: not logged that step), ``collapse_step`` (None:
    never collapses), ``group`` (scored apart), ``name`` and free ``meta`` (setting, seed) for tables."""

    name: str
    series: Mapping[str, tuple]
    collapse_step: int | None
    group: str = "rl"
    meta: Mapping = field(default_factory=dict)

    def __post_init__(self):
        c = self.collapse_step
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, np.integer))):
            raise ValueError(f"collapse_step must be an integer or None, got {c!r}")
        if not isinstance(self.series, Mapping):
            raise ValueError(f"series must be a mapping statistic -> (steps, values), got {type(self.series).__name__}")

    @property
    def collapses(self) -> bool:
        return self.collapse_step is not None


def series_of(run: AlarmRun, statistic: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps, values) of the logged entries of ``statistic`` in ``run``; None when it has no finite value."""
    if statistic not in run.series:
        return None
    steps, values = run.series[statistic]
    t, x = as_series(values, steps)
    return (t, x) if np.isfinite(x).any() else None


@functools.lru_cache(maxsize=8192)
def _cached_scores(run, statistic, detector):
    s = series_of(run, statistic)
    return None if s is None else detector.scores(s[1], s[0])


def _scores(run, statistic, detector):
    """Scores do not depend on the cutoff: one computation per (run, statistic, score rule), cached (a run is
    immutable once built: its series are not to be changed)."""
    return _cached_scores(run, statistic, detector.at_cutoff(0.0))


def alarm_step(run: AlarmRun, statistic: str, detector: Detector) -> int | None:
    """The first step at which ``detector`` fires on the run's ``statistic`` (None: never, or not logged)."""
    sc = _scores(run, statistic, detector)
    if sc is None:
        return None
    hit = np.flatnonzero(sc[1] >= detector.cutoff)
    return int(sc[0][hit[0]]) if hit.size else None


def lead_time(run: AlarmRun, statistic: str, detector: Detector) -> float | None:
    """c - a for a collapsing run (-inf when the detector never fires); None for a run that never collapses."""
    if not run.collapses:
        return None
    a = alarm_step(run, statistic, detector)
    return -math.inf if a is None else float(run.collapse_step - a)


def peak_score(run: AlarmRun, statistic: str, detector: Detector, *, until: int | None = None) -> float | None:
    """The largest score at steps <= ``until`` (all steps when None); -inf when none is defined there; None when
    the run has no finite value of the statistic. The detector fires by ``until`` iff this reaches its cutoff."""
    sc = _scores(run, statistic, detector)
    if sc is None:
        return None
    t, s = sc
    s = s[t <= until] if until is not None else s
    return float(s.max()) if s.size else -math.inf


def _split(runs: Iterable[AlarmRun], statistic: str):
    runs = list(runs)
    kept = [r for r in runs if series_of(r, statistic) is not None]
    return [r for r in kept if r.collapses], [r for r in kept if not r.collapses], len(runs) - len(kept)


def _watched_steps(run: AlarmRun, statistic: str, detector: Detector) -> int:
    t, _ = series_of(run, statistic)
    a = alarm_step(run, statistic, detector)
    return int((a if a is not None else t[-1]) - t[0] + 1)


def false_alarms(runs: Iterable[AlarmRun], statistic: str, detector: Detector) -> dict:
    """On the never-collapsing runs: ``k`` that fire of ``n``, ``rate`` (a gapdyn.evidence.stats.Estimate, Wilson 95 %),
    ``per_step`` = k / watched steps (``watched``), ``n_missing`` (runs without the statistic)."""
    from .stats import wilson_interval

    _, neg, missing = _split(runs, statistic)
    k = sum(alarm_step(r, statistic, detector) is not None for r in neg)
    watched = sum(_watched_steps(r, statistic, detector) for r in neg)
    return {"k": k, "n": len(neg), "rate": wilson_interval(k, len(neg)) if neg else None,
            "per_step": k / watched if watched else math.nan, "watched": watched, "n_missing": missing}


def false_alarm_curve(runs: Iterable[AlarmRun], statistic: str, detector: Detector, steps) -> np.ndarray:
    """At each of ``steps``, the share of never-collapsing runs (with the statistic) that have fired by then."""
    _, neg, _ = _split(runs, statistic)
    steps = np.atleast_1d(np.asarray(steps))
    if not neg:
        return np.full(steps.shape, np.nan)
    a = np.array([np.inf if (x := alarm_step(r, statistic, detector)) is None else x for r in neg])
    return (a[None, :] <= steps[:, None]).mean(axis=1)


@dataclass(frozen=True)
class Calibration:
    """A cutoff fixed at a false-alarm rate: the calibrated ``detector``, its ``cutoff``, the target ``far``, the
    ``n`` never-collapsing runs it rests on, ``allowed`` = floor(far n) of them may fire, ``k`` that do."""

    detector: Detector
    cutoff: float
    far: float
    n: int
    allowed: int
    k: int


def _far(far) -> float:
    if isinstance(far, bool) or not isinstance(far, (int, float)) or not 0 <= far < 1:
        raise ValueError(f"far must be a number in [0, 1), got {far!r}")
    return float(far)


def calibrate(runs: Iterable[AlarmRun], statistic: str, detector: Detector, *, far: float = 0.10) -> Calibration:
    """The smallest cutoff at which at most floor(far n) of the n never-collapsing runs fire (module doc)."""
    far = _far(far)
    _, neg, _ = _split(runs, statistic)
    if not neg:
        raise ValueError(f"no never-collapsing run with {statistic!r} to calibrate on")
    peaks = np.sort([peak_score(r, statistic, detector) for r in neg])[::-1]
    allowed = int(math.floor(far * len(neg) + 1e-9))
    # every run may fire (allowed >= n): fire on any defined score
    cutoff = float(np.nextafter(peaks[allowed] if allowed < len(neg) else -np.inf, np.inf))
    k = int(np.sum(peaks >= cutoff))
    return Calibration(detector.at_cutoff(cutoff), cutoff, far, len(neg), allowed, k)


def lead_times(runs: Iterable[AlarmRun], statistic: str, detector: Detector) -> np.ndarray:
    """Lead times (c - a; -inf for a miss) of the collapsing runs that log the statistic, in run order."""
    pos, _, _ = _split(runs, statistic)
    return np.array([lead_time(r, statistic, detector) for r in pos], dtype=float)


def median_interval(x, *, confidence: float = 0.95) -> tuple[float, float, float]:
    """(median, lo, hi): lo = x_(l), hi = x_(n+1-l) of the sorted sample, l the largest index with
    P(B <= l - 1) <= (1 - confidence) / 2, B ~ Binomial(n, 1/2): coverage >= confidence for any continuous
    distribution (order-statistic interval; Conover, Practical Nonparametric Statistics, 3rd ed., 3.2). -inf / +inf
    when n is too small for any l. ``x`` may hold -inf (misses); the median is the lower one for even n."""
    from scipy.stats import binom

    v = np.sort(np.asarray(x, dtype=float))
    if v.ndim != 1 or v.size == 0 or np.isnan(v).any():
        raise ValueError("x must be a non-empty 1-D sample without NaN")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    n = v.size
    a = (1 - confidence) / 2
    ls = [l for l in range(1, n // 2 + 1) if binom.cdf(l - 1, n, 0.5) <= a]
    med = float(v[(n - 1) // 2])
    if not ls:
        return med, -math.inf, math.inf
    l = max(ls)
    return med, float(v[l - 1]), float(v[n - l])


def lead_summary(leads, *, at=(0, 5, 10), confidence: float = 0.95) -> dict:
    """From lead times (-inf: a miss): ``n``; per L in ``at``, ``detected_L`` = share with lead >= L (Wilson);
    the median lead and its order-statistic interval (``median``, ``median_lo``, ``median_hi``); quartiles."""
    from .stats import wilson_interval

    v = np.asarray(leads, dtype=float)
    out: dict = {"n": int(v.size)}
    for L in at:
        k = int(np.sum(v >= L))
        out[f"detected_{L}"] = wilson_interval(k, v.size, confidence=confidence) if v.size else None
    if v.size:
        out["median"], out["median_lo"], out["median_hi"] = median_interval(v, confidence=confidence)
        srt = np.sort(v)
        out["q25"], out["q75"] = (float(srt[int(math.floor(q * (v.size - 1)))]) for q in (0.25, 0.75))
    return out


@dataclass(frozen=True)
class ROC:
    """ROC at one lead: ``cutoffs`` (descending), ``fpr``, ``tpr`` at each (fires: score >= cutoff), ``auc`` (a
    gapdyn.evidence.stats.Estimate, Hanley-McNeil; None without both kinds of run), ``n_pos``, ``n_neg``, ``lead``."""

    lead: int
    cutoffs: np.ndarray
    fpr: np.ndarray
    tpr: np.ndarray
    auc: object
    n_pos: int
    n_neg: int

    def tpr_at(self, fpr: float) -> float:
        """The largest true-positive rate among cutoffs whose false-positive rate is <= ``fpr``."""
        ok = self.fpr <= fpr + 1e-12
        return float(self.tpr[ok].max()) if ok.any() else 0.0


def roc_at_lead(runs: Iterable[AlarmRun], statistic: str, detector: Detector, lead: int) -> ROC:
    """The ROC of the module doc at lead ``lead`` (cutoffs: every distinct peak score, and +inf)."""
    from .stats import roc_auc

    if isinstance(lead, bool) or not isinstance(lead, (int, np.integer)):
        raise ValueError(f"lead must be an integer, got {lead!r}")
    pos, neg, _ = _split(runs, statistic)
    p = np.array([peak_score(r, statistic, detector, until=r.collapse_step - lead) for r in pos], dtype=float)
    q = np.array([peak_score(r, statistic, detector) for r in neg], dtype=float)
    cut = np.unique(np.concatenate([p, q, [np.inf]]))[::-1]
    tpr = np.array([(p >= c).mean() if p.size else np.nan for c in cut])
    fpr = np.array([(q >= c).mean() if q.size else np.nan for c in cut])
    auc = None
    if p.size and q.size:
        both = np.concatenate([p, q])
        fin = both[np.isfinite(both)]
        lo = (fin.min() - 1.0) if fin.size else 0.0  # -inf (never scored) ranks below every score
        auc = roc_auc(np.where(np.isfinite(p), p, lo), np.where(np.isfinite(q), q, lo))
    return ROC(int(lead), cut, fpr, tpr, auc, int(p.size), int(q.size))


@dataclass(frozen=True)
class AlarmSpec:
    """A pre-declared alarm: ``name``, the ``statistic`` it reads, its ``detector`` (threshold to be calibrated),
    the false-alarm rate ``far`` its cutoff is calibrated at, the ``lead`` its detection share is read at, and its
    ``role`` ("primary", "baseline" or "exploratory"). Hash it (:func:`specs_hash`) before the held-out block runs."""

    name: str
    statistic: str
    detector: Detector
    far: float = 0.10
    lead: int = 10
    role: str = "exploratory"

    def __post_init__(self):
        if not isinstance(self.detector, Detector):
            raise ValueError(f"detector must be a gapdyn.evidence.detectors.Detector, got {type(self.detector).__name__}")
        _far(self.far)
        if isinstance(self.lead, bool) or not isinstance(self.lead, int) or self.lead < 0:
            raise ValueError(f"lead must be an integer >= 0, got {self.lead!r}")
        if self.role not in ("primary", "baseline", "exploratory"):
            raise ValueError(f"role must be primary, baseline or exploratory, got {self.role!r}")

    def to_dict(self) -> dict:
        return {"name": self.name, "statistic": self.statistic, "detector": self.detector.to_dict(),
                "far": self.far, "lead": self.lead, "role": self.role}

    @classmethod
    def from_dict(cls, d: Mapping) -> AlarmSpec:
        d = dict(d)
        return cls(**{**d, "detector": detector_from_dict(d["detector"])})


def specs_hash(specs: Sequence[AlarmSpec]) -> str:
    """SHA-256 (first 16 hex digits) of the specs' canonical JSON, by name; order-independent (as
    gapdyn.evidence.claims.criteria_hash)."""
    if not all(isinstance(s, AlarmSpec) for s in specs):
        raise ValueError("specs must be AlarmSpec objects")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError("spec names must be unique")
    from .claims import canonical_hash

    return canonical_hash({s.name: s.to_dict() for s in specs})


def evaluate_spec(spec: AlarmSpec, calibration: Sequence[AlarmRun], heldout: Sequence[AlarmRun], *,
                  calibrate_groups: Sequence[str] | None = None, leads=(0, 5, 10)) -> list[dict]:
    """Calibrate ``spec`` on the never-collapsing runs of ``calibration`` (of ``calibrate_groups``, all when
    None), then one row per group of ``heldout``: the cutoff (score units) and the detector's threshold, held-out
    false alarms (k / n, Wilson), collapsing runs, detected shares at ``leads`` and at the spec's lead, the median
    lead with its interval, the TPR at the spec's far on the held-out ROC at the spec's lead (an oracle: the
    cutoff chosen on the held-out runs themselves, for reference only) and its AUC. A spec
    that cannot be calibrated (no never-collapsing calibration run with the statistic) gives rows with ``cutoff``
    NaN and a ``note``."""
    cal_runs = [r for r in calibration if calibrate_groups is None or r.group in calibrate_groups]
    groups = sorted({r.group for r in heldout})
    try:
        cal = calibrate(cal_runs, spec.statistic, spec.detector, far=spec.far)
        note = ""
    except ValueError as exc:
        cal, note = None, str(exc)
    leads = tuple(dict.fromkeys((*leads, spec.lead)))
    rows = []
    for g in groups:
        runs = [r for r in heldout if r.group == g]
        row = {"alarm": spec.name, "statistic": spec.statistic, "role": spec.role, "group": g, "far_target": spec.far,
               "lead_target": spec.lead, "cutoff": math.nan, "cal_negatives": cal.n if cal else 0, "note": note}
        if cal is not None:
            det = cal.detector
            fa = false_alarms(runs, spec.statistic, det)
            lt = lead_times(runs, spec.statistic, det)
            summ = lead_summary(lt, at=leads)
            roc = roc_at_lead(runs, spec.statistic, spec.detector, spec.lead)
            row.update(cutoff=cal.cutoff, threshold=float(det.threshold), cal_false_alarms=cal.k,
                       n_negatives=fa["n"], false_alarms=fa["k"],
                       far=fa["rate"].estimate if fa["rate"] else math.nan,
                       far_lo=fa["rate"].lo if fa["rate"] else math.nan,
                       far_hi=fa["rate"].hi if fa["rate"] else math.nan, far_per_step=fa["per_step"],
                       n_collapsing=summ["n"], n_missing=fa["n_missing"])
            for L in leads:
                e = summ[f"detected_{L}"]
                row.update({f"detected_{L}": e.estimate if e else math.nan, f"detected_{L}_lo": e.lo if e else math.nan,
                            f"detected_{L}_hi": e.hi if e else math.nan})
            row.update(median_lead=summ.get("median", math.nan), median_lead_lo=summ.get("median_lo", math.nan),
                       median_lead_hi=summ.get("median_hi", math.nan),
                       heldout_tpr_at_far=roc.tpr_at(spec.far) if roc.n_pos and roc.n_neg else math.nan,
                       heldout_auc=roc.auc.estimate if roc.auc else math.nan,
                       heldout_auc_lo=roc.auc.lo if roc.auc else math.nan,
                       heldout_auc_hi=roc.auc.hi if roc.auc else math.nan)
        rows.append(row)
    return rows
