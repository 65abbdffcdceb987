"""A documented collapse rule for RLVR runs, applied online to the per-step metrics.

The WAPO paper's collapse criterion is not public, so this toolkit defines its own.
Baselines H0, R0 are given explicitly, or set from a pre-RL measurement (:meth:`CollapseDetector.set_baseline`;
the trainer measures the initial policy), or else are the medians of the first ``baseline_steps`` steps; every signal is a
rolling mean over ``window`` steps; a rule fires when its condition holds for ``patience`` consecutive
steps after the baseline period:

| rule                | condition on the rolling mean                                     | the failure mode                  |
|---------------------|-------------------------------------------------------------------|-----------------------------------|
| entropy_blowup      | entropy > max(blowup_factor * H0, H0 + blowup_margin)             | high-entropy off-task output, length at the cap |
| entropy_collapse    | entropy < collapse_factor * H0                                    | repetitive / malformed output, length 1 |
| reward_collapse     | reward < reward_floor * R0 (needs R0 >= min_baseline_reward)       | success falls to ~0 (absorbing with binary r) |
| identical_rollouts  | completions/distinct_frac < distinct_floor                        | every group repeats one completion |

H0, R0: baseline entropy and reward. reward_collapse is off when R0 < min_baseline_reward (default 0.05): a
ratio to a near-zero baseline is noise (R0 = 0.002 put the threshold at 5e-4, so three zero-reward steps, the
common case for a weak policy, raised an alarm at step 2); such a run has no reward to lose. distinct_frac = mean over groups of (#distinct completions) / G.
An alert records the step at which the rule fired (and a trainer can stop early); alerts are events, never
withdrawn, and an alert is not a collapse: what a run ends as is :func:`reward_outcome` (collapsed / recovered /
healthy / failed, decided on the run's last OUTCOME_WINDOW steps; docs/evidence.md, section 6). Defaults were
set on synthetic streams and checked on healthy tiny-Qwen runs (docs/llm_probe.md reports delays and false alarms).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["CollapseConfig", "Alert", "CollapseDetector", "synthetic_stream", "detection_stats", "RULES",
           "RewardOutcome", "reward_outcome", "collapse_onset", "outcome_counts", "REWARD_OUTCOMES", "OUTCOME_WINDOW",
           "SENSITIVITY_WINDOW", "OUTCOME_FLOOR", "OUTCOME_BASELINE_STEPS", "OUTCOME_MIN_R0"]

RULES = ("entropy_blowup", "entropy_collapse", "reward_collapse", "identical_rollouts")


@dataclass(frozen=True)
class CollapseConfig:
    """Thresholds of the collapse rule (module doc)."""

    baseline_steps: int = 10  # steps whose medians give H0 and R0 (ignored when given explicitly)
    window: int = 5  # rolling-mean window, steps
    patience: int = 3  # consecutive steps a condition must hold
    blowup_factor: float = 3.0  # entropy_blowup: rolling H > max(blowup_factor*H0, H0 + blowup_margin)
    blowup_margin: float = 0.5  # nats
    collapse_factor: float = 0.2  # entropy_collapse: rolling H < collapse_factor*H0
    reward_floor: float = 0.25  # reward_collapse: rolling reward < reward_floor*R0
    distinct_floor: float = 0.2  # identical_rollouts: rolling distinct_frac < distinct_floor
    baseline_entropy: float | None = None  # H0 if known (e.g. measured before RL)
    baseline_reward: float | None = None  # R0 if known
    min_baseline_reward: float = 0.05  # reward_collapse needs R0 >= this (a ratio to a near-zero R0 is noise)

    def __post_init__(self):
        for n in ("baseline_steps", "window", "patience"):
            if getattr(self, n) < 1:
                raise ValueError(f"{n} must be >= 1, got {getattr(self, n)}")
        for n, lo, hi in (("blowup_factor", 1.0, math.inf), ("blowup_margin", 0.0, math.inf),
                          ("collapse_factor", 0.0, 1.0), ("reward_floor", 0.0, 1.0), ("distinct_floor", 0.0, 1.0),
                          ("min_baseline_reward", 0.0, 1.0)):
            v = getattr(self, n)
            if not (math.isfinite(v) and lo <= v <= hi):
                raise ValueError(f"{n} must be finite and in [{lo}, {hi}], got {v}")
        for n in ("baseline_entropy", "baseline_reward"):
            v = getattr(self, n)
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{n} must be finite and >= 0 (or None), got {v}")


@dataclass
class Alert:
    step: int
    rule: str
    value: float
    threshold: float

    def __str__(self):
        return f"collapse alert at step {self.step}: {self.rule} (rolling value {self.value:.4g} vs threshold {self.threshold:.4g})"


@dataclass
class CollapseDetector:
    """Feed one metrics dict per step with :meth:`update`; read :attr:`alerts` / :attr:`alerted`."""

    config: CollapseConfig = field(default_factory=CollapseConfig)
    alerts: list = field(default_factory=list)
    _hist: dict = field(default_factory=dict)
    _base: dict = field(default_factory=dict)
    _run: dict = field(default_factory=dict)
    _n: int = 0

    @property
    def alerted(self) -> bool:
        """True once any alert fired (an online event, for stop_on_alert); not the run's outcome: what a
        run ends as is :func:`reward_outcome`."""
        return bool(self.alerts)

    def _roll(self, key, value):
        if value is None or not math.isfinite(value):
            return None
        d = self._hist.setdefault(key, deque(maxlen=self.config.window))
        d.append(float(value))
        return sum(d) / len(d)

    def update(self, step: int, metrics: dict) -> list[Alert]:
        """Add one step; returns the alerts that fired at this step (each rule fires once)."""
        c = self.config
        self._n += 1
        H, R = metrics.get("entropy"), metrics.get("reward")
        D = metrics.get("completions/distinct_frac")
        if self._n <= c.baseline_steps:
            for k, v in (("H", H), ("R", R)):
                if v is not None and np.isfinite(v):
                    self._base.setdefault(k + "_list", []).append(float(v))
        rH, rR, rD = self._roll("H", H), self._roll("R", R), self._roll("D", D)
        fixed = (c.baseline_entropy is not None or "H0" in self._base) and (c.baseline_reward is not None or "R0" in self._base)
        if self._n <= c.baseline_steps and not fixed:
            return []
        H0, R0 = self.baseline()
        checks = []
        if H0 is not None and rH is not None:
            hi = max(c.blowup_factor * H0, H0 + c.blowup_margin)
            checks.append(("entropy_blowup", rH > hi, rH, hi))
            lo = c.collapse_factor * H0
            checks.append(("entropy_collapse", rH < lo, rH, lo))
        if R0 is not None and R0 > 0 and R0 >= c.min_baseline_reward and rR is not None:
            checks.append(("reward_collapse", rR < c.reward_floor * R0, rR, c.reward_floor * R0))
        if rD is not None:
            checks.append(("identical_rollouts", rD < c.distinct_floor, rD, c.distinct_floor))
        fired = []
        done = {a.rule for a in self.alerts}
        for rule, cond, val, thr in checks:
            self._run[rule] = self._run.get(rule, 0) + 1 if cond else 0
            if self._run[rule] >= c.patience and rule not in done:
                a = Alert(int(step), rule, float(val), float(thr))
                self.alerts.append(a)
                fired.append(a)
        return fired

    def set_baseline(self, entropy: float, reward: float) -> None:
        """Fix H0 and R0 (e.g. measured on the initial policy before RL); config values take precedence."""
        self._base["H0"], self._base["R0"] = float(entropy), float(reward)

    def baseline(self) -> tuple:
        """(H0, R0): config value, else one set by :meth:`set_baseline`, else the median of the first steps."""
        c = self.config
        H0 = c.baseline_entropy if c.baseline_entropy is not None else self._base.get("H0", _median(self._base.get("H_list")))
        R0 = c.baseline_reward if c.baseline_reward is not None else self._base.get("R0", _median(self._base.get("R_list")))
        return H0, R0

    def state_dict(self) -> dict:
        return {"alerts": [asdict(a) for a in self.alerts], "hist": {k: list(v) for k, v in self._hist.items()},
                "base": self._base, "run": self._run, "n": self._n}

    def load_state_dict(self, s: dict) -> None:
        self.alerts = [Alert(**a) for a in s["alerts"]]
        self._hist = {k: deque(v, maxlen=self.config.window) for k, v in s["hist"].items()}
        self._base, self._run, self._n = dict(s["base"]), dict(s["run"]), int(s["n"])


def _median(xs):
    return float(np.median(xs)) if xs else None


def synthetic_stream(kind: str, steps: int, rng: np.random.Generator, *, onset: int = 40, G: int = 8,
                     H0: float = 0.4, R0: float = 0.4, noise: float = 0.04) -> list[dict]:
    """Synthetic per-step metrics for testing the detector.

    kind: "healthy" (stationary noisy reward ~R0 slowly rising, entropy ~H0 slowly falling),
    "blowup" (after ``onset``: entropy rises 5x over ~5 steps, reward -> 0, lengths at cap),
    "entropy_collapse" (entropy -> 0.01, reward -> 0, one distinct completion per group),
    "reward_collapse" (reward -> 0 with entropy unchanged).
    """
    if kind not in ("healthy", "blowup", "entropy_collapse", "reward_collapse"):
        raise ValueError(f"kind must be healthy|blowup|entropy_collapse|reward_collapse, got {kind!r}")
    out = []
    for k in range(steps):
        s = 0.0 if kind == "healthy" or k < onset else min(1.0, (k - onset + 1) / 5.0)
        R = R0 + 0.05 * k / steps
        H = H0 * (1 - 0.2 * k / steps)
        D = 0.6
        if kind == "blowup":
            H, R, D = H * (1 + 4 * s), R * (1 - s), D + 0.4 * s
        elif kind == "entropy_collapse":
            H, R, D = H * (1 - s) + 0.01 * s, R * (1 - s), D * (1 - s) + s / G
        elif kind == "reward_collapse":
            R = R * (1 - s)
        out.append({
            "entropy": max(H + rng.normal(0, 0.1 * H0 * noise / 0.04), 1e-4),
            "reward": float(np.clip(R + rng.normal(0, noise), 0, 1)) if R > 0 else 0.0,
            "completions/distinct_frac": float(np.clip(D + rng.normal(0, 0.05), 1 / G, 1)),
        })
    return out


def detection_stats(kind: str, *, n_streams: int = 100, steps: int = 150, onset: int = 40, seed: int = 0,
                    config: CollapseConfig | None = None, **stream_kw) -> dict:
    """Run the detector on ``n_streams`` synthetic streams of ``kind``: detection rate, delays, false alarms.

    A false alarm is an alert before ``onset`` (for "healthy": any alert). Delay = alert step - onset.
    """
    rng = np.random.default_rng(seed)
    delays, false_alarms, detected, rules = [], 0, 0, {}
    for _ in range(n_streams):
        det = CollapseDetector(config or CollapseConfig())
        first = None
        for k, m in enumerate(synthetic_stream(kind, steps, rng, onset=onset, **stream_kw)):
            fired = det.update(k, m)
            if fired and first is None:
                first = fired[0]
        if first is None:
            continue
        if kind == "healthy" or first.step < onset:
            false_alarms += 1
        else:
            detected += 1
            delays.append(first.step - onset)
            rules[first.rule] = rules.get(first.rule, 0) + 1
    return {"kind": kind, "n_streams": n_streams, "detected": detected, "false_alarms": false_alarms,
            "delay_mean": float(np.mean(delays)) if delays else float("nan"),
            "delay_max": int(max(delays)) if delays else -1, "first_rules": rules}





# ---- the run outcome: what a run ends as, decided on its whole reward trajectory ----------------------------
OUTCOME_WINDOW = 25
"""Steps at the end of a run whose mean reward decides the outcome (the last-25-step reward)."""
SENSITIVITY_WINDOW = 10
"""The sensitivity variant's end window (reported beside the outcome, never instead of it)."""
OUTCOME_FLOOR = 0.25
"""A run ends collapsed when its end-window reward is below OUTCOME_FLOOR * R0 (the alert rule's reward_floor)."""
OUTCOME_BASELINE_STEPS = 10
"""R0 = the mean reward over a run's first OUTCOME_BASELINE_STEPS steps."""
OUTCOME_MIN_R0 = CollapseConfig().min_baseline_reward
"""Below this R0 a run has no reward to lose: it cannot end collapsed (the alert rule's min_baseline_reward)."""
REWARD_OUTCOMES = ("collapsed", "recovered", "healthy", "failed")
"""Run outcomes; ``failed`` runs are reported apart and never pooled with collapses."""


@dataclass(frozen=True)
class RewardOutcome:
    """What one run ends as (:func:`reward_outcome`).

    label: one of REWARD_OUTCOMES; R0, R_end: mean reward over the first baseline steps and over the last
    ``window`` steps (NaN steps, skipped on faults, left out); heldout_ratio: final / initial held-out
    accuracy (None without held-out evaluations or with initial accuracy 0); alerts: the alert rule's
    events as (step, rule), never withdrawn; onset: first step of the final collapse (:func:`collapse_onset`;
    collapsed runs only, else None); window, floor: the rule's parameters.
    """

    label: str
    R0: float
    R_end: float
    heldout_ratio: float | None
    alerts: tuple[tuple[int, str], ...]
    onset: int | None
    window: int
    floor: float

    @property
    def alerted(self) -> bool:
        return bool(self.alerts)

    @property
    def collapsed(self) -> bool:
        return self.label == "collapsed"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["alerts"] = [list(a) for a in self.alerts]
        return d


def _rewards(rewards) -> np.ndarray:
    r = np.asarray(rewards, dtype=float)
    if r.ndim != 1 or r.size < 1:
        raise ValueError(f"rewards must be a non-empty 1-D sequence (one mean reward per step), got shape {r.shape}")
    fin = r[~np.isnan(r)]
    if np.any((fin < 0) | (fin > 1)):
        bad = fin[(fin < 0) | (fin > 1)][0]
        raise ValueError(f"rewards must lie in [0, 1] (NaN marks a skipped step), got {bad!r}")
    return r


def _alert_events(alerts) -> tuple[tuple[int, str], ...]:
    out = []
    for a in alerts:
        step, rule = (a.get("step"), a.get("rule", "")) if isinstance(a, dict) else (getattr(a, "step", a),
                                                                                    getattr(a, "rule", ""))
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"alerts must be Alerts, {{'step', 'rule'}} dicts or steps >= 0, got {a!r}")
        out.append((int(step), str(rule)))
    return tuple(sorted(out))


def _positive_int(v, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    return int(v)


def collapse_onset(rewards, level: float) -> int | None:
    """First step of the final collapse: c = min{k : mean(r_k..r_j) < level for every j >= k}.

    From step c on the running mean of the reward (restarted at c) never reaches ``level`` again; NaN steps
    are left out (c is a step with a finite reward). None when no step qualifies. Exists whenever the mean of
    some end segment is below ``level`` (split a segment with no qualifying start greedily into blocks of mean
    >= level: its mean would be >= level), so every collapsed run has one. Derived here, no paper defines it.
    Vectorised: with C the cumulative sum of r - level, k qualifies iff max_{j >= k} C_{j+1} < C_k.
    """
    r = _rewards(rewards)
    if not (isinstance(level, (int, float, np.floating)) and math.isfinite(level)):
        raise ValueError(f"level must be a finite number, got {level!r}")
    steps = np.flatnonzero(~np.isnan(r))
    if steps.size == 0:
        return None
    C = np.concatenate([[0.0], np.cumsum(r[steps] - level)])
    suffix_max = np.maximum.accumulate(C[1:][::-1])[::-1]  # max_{j >= k} C_{j+1}
    ok = np.flatnonzero(suffix_max < C[:-1])
    return int(steps[ok[0]]) if ok.size else None


def reward_outcome(rewards, *, alerts=(), heldout=None, fault=False, window: int = OUTCOME_WINDOW,
                   floor: float = OUTCOME_FLOOR, baseline_steps: int = OUTCOME_BASELINE_STEPS,
                   min_R0: float = OUTCOME_MIN_R0) -> RewardOutcome:
    """The outcome of one run without an exact J, from its per-step mean rewards (docs/evidence.md, section 6).

    R0 = mean of rewards[:baseline_steps], R_end = mean of rewards[-window:] (the whole run when shorter;
    NaN steps left out). In order of precedence:

    * ``failed``     the run stopped on numerical faults (``fault``: True or the fault's message), or a window
                     holds no finite reward; reported apart, never pooled with collapses;
    * ``collapsed``  R0 >= min_R0, R_end < floor * R0 and, with ``heldout`` (held-out accuracies by step,
                     initial first), heldout[-1] < floor * heldout[0];
    * ``recovered``  an alert fired (``alerts``: the alert rule's events), not collapsed;
    * ``healthy``    no alert, not collapsed.

    Alerts stay events with their steps (:attr:`RewardOutcome.alerts`); an alert is not a collapse. The
    counterpart of gapdyn.bandit_outcome (collapse = J -> 0 at the end, Suk & Duan, arXiv 2510.08539, Thm 2)
    for runs whose J is only sampled; the floor is the alert rule's reward_floor. The sensitivity variant is
    ``window=SENSITIVITY_WINDOW``.
    """
    r = _rewards(rewards)
    window, baseline_steps = _positive_int(window, "window"), _positive_int(baseline_steps, "baseline_steps")
    for name, v in (("floor", floor), ("min_R0", min_R0)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) or not 0 <= v < 1:
            raise ValueError(f"{name} must be a number in [0, 1), got {v!r}")
    if floor == 0:
        raise ValueError("floor must be > 0 (a mean reward is never below 0)")
    if not isinstance(fault, (bool, str)) and fault is not None:
        raise ValueError(f"fault must be a bool or the fault's message, got {fault!r}")
    events = _alert_events(alerts)
    acc = None
    if heldout is not None:
        acc = np.asarray(heldout, dtype=float)
        if acc.ndim != 1 or acc.size < 2 or not np.all(np.isfinite(acc)) or np.any((acc < 0) | (acc > 1)):
            raise ValueError(f"heldout must hold >= 2 finite accuracies in [0, 1] (initial first), got {heldout!r}")
    head, end = r[:baseline_steps], r[-window:]
    R0 = float(np.nanmean(head)) if np.isfinite(head).any() else math.nan
    R_end = float(np.nanmean(end)) if np.isfinite(end).any() else math.nan
    ratio = float(acc[-1] / acc[0]) if acc is not None and acc[0] > 0 else None
    onset = None
    if bool(fault) or math.isnan(R0) or math.isnan(R_end):
        label = "failed"
    elif R0 >= min_R0 and R_end < floor * R0 and (acc is None or acc[-1] < floor * acc[0]):
        label = "collapsed"
        onset = collapse_onset(r, floor * R0)
    else:
        label = "recovered" if events else "healthy"
    return RewardOutcome(label, R0, R_end, ratio, events, onset, window, float(floor))


def outcome_counts(outcomes) -> dict:
    """The survival row of a group of runs: runs, alerted, recovered, ends collapsed, healthy, failed."""
    outs = list(outcomes)
    if not all(isinstance(o, RewardOutcome) for o in outs):
        raise ValueError("outcomes must be RewardOutcome records (llm_probe.collapse.reward_outcome)")
    labels = [o.label for o in outs]
    return {"n": len(outs), "alerted": sum(o.alerted for o in outs), "recovered": labels.count("recovered"),
            "collapsed": labels.count("collapsed"), "healthy": labels.count("healthy"),
            "failed": labels.count("failed")}
