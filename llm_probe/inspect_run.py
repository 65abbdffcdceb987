"""``gapdyn inspect RUN``: a report from a run's logs (a TRL run folder or a gapdyn train folder), any time.

Reads what a run has already written, without the model:

- a TRL run (``trl.GRPOTrainer`` or any ``transformers.Trainer``): ``trainer_state.json`` and its
  ``log_history``, in RUN or, for a run still going, in its newest ``checkpoint-N/``; with or without the
  ``gap/*`` metrics that :class:`llm_probe.callback.GapProbeCallback` merges into those rows;
- a ``gapdyn train`` folder: ``metrics.jsonl`` (or ``metrics.parquet``), ``alerts.json``, ``summary.json``
  (a testbed run's summary.json adds its held-out accuracies).

The report: the run's outcome by :func:`llm_probe.collapse.reward_outcome` on the per-step mean rewards r_k
(docs/evidence.md, section 6: collapsed when R0 = mean(r_1..r_10) >= 0.05 and mean of the last 25 r_k < 0.25 R0),
with the held-out accuracies when the run logged them and by the reward alone otherwise (said so); the alerts of the
collapse rule (the run's own, or replayed here on the logged reward and entropy with the default thresholds);
the suggested learning rate by the lr finder's rule (:mod:`llm_probe.suggest`: the median of lr x headroom over the
first 20 probed steps) with the number of probed steps it rests on; what the alarm frozen on the RLVR testbed
(docs/testbed.md; ``--alarm FILE`` for another) would have said on the statistic it reads, where the run logged it;
one PNG with the reward, entropy, alignment and headroom curves that the run logged. A TRL row logged every
``logging_steps`` > 1 steps holds the mean over its interval: each of its steps is given that mean.
Numpy only (matplotlib for the figure); never imports torch.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np
import tyro

from gapdyn.cmdline import command, optional, output_dir, parse

from .collapse import (OUTCOME_BASELINE_STEPS, OUTCOME_FLOOR, OUTCOME_MIN_R0, OUTCOME_WINDOW, CollapseDetector,
                       reward_outcome)
from .suggest import SUGGEST_STEPS, first_probed, lr_suggestion

__all__ = ["RunLog", "read_run", "inspect_run", "CURVES", "main"]

TRL_STATE = "trainer_state.json"
CURVES = (("reward", "reward", "mean reward"), ("entropy", "entropy", "token entropy (nats)"),
          ("alignment", "gap/cos_update_mean", "cos(update, gap)"), ("headroom", "gap/headroom", "headroom h"))
"""The figure's panels: (name, logged key, axis label); a panel is drawn when its key holds a finite value."""


@dataclass
class RunLog:
    """A run's logged rows, read by :func:`read_run`.

    kind: "trl" or "gapdyn train"; source: the file read; rows: the logged metric rows in step order;
    steps: per row, the optimizer steps done when it was logged (1 = after the first step); logging_steps:
    optimizer steps per logged row (TRL's args; 1 for gapdyn train); heldout: held-out accuracies, initial
    first (None when not evaluated); alerts: the run's own alert events [(step, rule)] (None: not recorded,
    replayed by the report); fault: why the run stopped on numerical faults (None: it did not); max_steps: the
    planned steps when known; recorded: the outcome the run wrote itself (a testbed's summary.json), or None."""

    kind: str
    source: Path
    rows: list
    steps: np.ndarray
    logging_steps: int = 1
    heldout: list | None = None
    alerts: list | None = None
    fault: str | None = None
    max_steps: int | None = None
    recorded: str | None = None
    notes: list = field(default_factory=list)

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of the rows that carry ``key`` as a number (NaN, inf kept)."""
        pairs = [(s, _num(r.get(key))) for s, r in zip(self.steps, self.rows)]
        pairs = [(s, v) for s, v in pairs if v is not None]
        return (np.array([p[0] for p in pairs], dtype=float), np.array([p[1] for p in pairs], dtype=float))

    def per_step(self, key: str) -> np.ndarray:
        """``key`` on every optimizer step 1..steps[-1]: a row's value on each step of its logging interval,
        NaN on steps no row covers with a number."""
        out = np.full(int(self.steps[-1]) if len(self.steps) else 0, np.nan)
        prev = 0
        for s, r in zip(self.steps, self.rows):
            v = _num(r.get(key))
            if v is not None and s > prev:
                out[max(prev, int(s) - self.logging_steps):int(s)] = v
            prev = max(prev, int(s))
        return out


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"RUN: cannot read {what} {path} ({type(exc).__name__}: {exc})") from None


def _newest_checkpoint(folder: Path) -> Path | None:
    found = [(int(m.group(1)), p) for p in folder.glob(f"checkpoint-*/{TRL_STATE}")
             if (m := re.fullmatch(r"checkpoint-(\d+)", p.parent.name))]
    return max(found)[1] if found else None


def _log_files(folder: Path) -> tuple[Path | None, str | None]:
    """The file :func:`read_run` reads in ``folder`` and its kind, or (None, None)."""
    if (folder / TRL_STATE).is_file():
        return folder / TRL_STATE, "trl"
    ckpt = _newest_checkpoint(folder)
    if ckpt is not None:
        return ckpt, "trl"
    for name in ("metrics.jsonl", "metrics.parquet"):
        if (folder / name).is_file():
            return folder / name, "gapdyn train"
    return None, None


def read_run(path) -> RunLog:
    """The logs of the run in ``path`` (a folder, or a trainer_state.json / metrics.jsonl file): a ValueError of
    one line naming RUN when there is no such folder or it holds no run logs (module doc)."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"RUN: no such folder: {p}")
    if p.is_file():
        if p.name not in (TRL_STATE, "metrics.jsonl", "metrics.parquet"):
            raise ValueError(f"RUN: {p} is a file but not {TRL_STATE}, metrics.jsonl or metrics.parquet; pass the "
                             "run's folder")
        source, kind = p, ("trl" if p.name == TRL_STATE else "gapdyn train")
    else:
        source, kind = _log_files(p)
        if source is None:
            below = sorted(d.name for d in p.iterdir() if d.is_dir() and _log_files(d)[0] is not None)
            hint = (f"; its subfolders {below[:6]}{' ...' if len(below) > 6 else ''} hold runs: pass one"
                    if below else "")
            raise ValueError(f"RUN: no run logs in {p} (looked for {TRL_STATE}, checkpoint-N/{TRL_STATE}, "
                             f"metrics.jsonl, metrics.parquet){hint}")
    log = _read_trl(source) if kind == "trl" else _read_gapdyn(source)
    if not log.rows:
        raise ValueError(f"RUN: {source} holds no logged training rows yet")
    return log


def _read_trl(source: Path) -> RunLog:
    state = _read_json(source, "the TRL state")
    hist = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(hist, list):
        raise ValueError(f"RUN: {source} has no log_history list (not a transformers trainer_state.json)")
    rows = [r for r in hist if isinstance(r, dict) and isinstance(r.get("step"), int)
            and not any(k.startswith("eval_") or k == "train_runtime" for k in r)]
    rows.sort(key=lambda r: r["step"])
    L = state.get("logging_steps")
    L = int(L) if isinstance(L, (int, float)) and not isinstance(L, bool) and L >= 1 else 1
    max_steps = state.get("max_steps") if isinstance(state.get("max_steps"), int) else None
    log = RunLog("trl", source, rows, np.array([r["step"] for r in rows], dtype=int), logging_steps=L,
                 max_steps=max_steps)
    if source.parent.name.startswith("checkpoint-"):
        log.notes.append(f"read the newest checkpoint's state ({source.parent.name}): steps after it are not "
                         "in the report")
    return log


def _read_gapdyn(source: Path) -> RunLog:
    folder = source.parent
    if source.suffix == ".jsonl":
        rows = []
        try:
            lines = source.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"RUN: cannot read {source} ({exc})") from None
        for i, ln in enumerate(lines):
            if not ln.strip():
                continue
            try:
                rows.append(json.loads(ln))
            except json.JSONDecodeError:
                if i == len(lines) - 1:  # a running run may be writing its last line
                    break
                raise ValueError(f"RUN: {source} line {i + 1} is not JSON") from None
    else:
        import pandas as pd

        rows = pd.read_parquet(source).to_dict("records")
    rows = [r for r in rows if isinstance(r, dict) and isinstance(r.get("step"), (int, np.integer))]
    rows.sort(key=lambda r: int(r["step"]))
    for r in rows:
        if r.get("skipped"):  # a skipped step (numerical fault) has no reward sample
            r["reward"] = math.nan
    log = RunLog("gapdyn train", source, rows, np.array([int(r["step"]) + 1 for r in rows], dtype=int))
    if (folder / "alerts.json").is_file():
        alerts = _read_json(folder / "alerts.json", "the alerts")
        log.alerts = [(int(a["step"]), str(a.get("rule", ""))) for a in alerts if isinstance(a, dict) and "step" in a]
    else:
        log.alerts = [(int(r["step"]), str(a.get("rule", ""))) for r in rows for a in (r.get("alerts") or [])
                      if isinstance(a, dict)]
    if rows and rows[-1].get("fault"):
        log.fault = str(rows[-1]["fault"])
    summary = _read_json(folder / "summary.json", "the summary") if (folder / "summary.json").is_file() else {}
    if isinstance(summary, dict):
        before, evals = summary.get("heldout_acc_before"), summary.get("evaluations")
        if _num(before) is not None and isinstance(evals, list) and evals:
            acc = [_num(e.get("acc")) for e in evals if isinstance(e, dict)]
            if acc and all(a is not None for a in acc):
                log.heldout = [float(before), *acc]
        if isinstance(summary.get("outcome"), str):
            log.recorded = summary["outcome"]
        setting = summary.get("setting")
        if isinstance(setting, dict) and isinstance(setting.get("steps"), int):
            log.max_steps = setting["steps"]
    return log


# ---- the report -----------------------------------------------------------------------------------------------

def _replayed_alerts(log: RunLog) -> list[tuple[int, str]]:
    """The collapse rule's alerts (default thresholds; baselines the medians of the first steps) on the logged
    per-step reward, entropy and distinct-completion share."""
    det = CollapseDetector()
    keys = ("reward", "entropy", "completions/distinct_frac")
    cols = {k: log.per_step(k) for k in keys}
    for j in range(len(cols["reward"])):
        m = {k: float(cols[k][j]) for k in keys if not math.isnan(cols[k][j])}
        det.update(j + 1, m)
    return [(a.step, a.rule) for a in det.alerts]


def _outcome(log: RunLog) -> dict:
    """The outcome section of the report (a dict; ``text`` its lines)."""
    rewards = log.per_step("reward")
    # the step of each entry of ``rewards``, as the run counts them (TRL: steps done; gapdyn train: from 0)
    offset = 0 if log.kind == "trl" else -1
    lines = []
    fin = rewards[np.isfinite(rewards)]
    own = log.alerts is not None
    alerts = log.alerts if own else _replayed_alerts(log)
    out = {"alerts": [list(a) for a in alerts], "alerts_source": "the run's own" if own else "replayed"}
    if fin.size == 0:
        out.update(label=None, text=["outcome: not decided: no step logged a finite reward"])
        return out
    if fin.min() < 0 or fin.max() > 1:
        out.update(label=None, text=[f"outcome: not decided: the rule reads a success rate in [0, 1], and this "
                                     f"run's logged reward spans [{fin.min():.4g}, {fin.max():.4g}]"])
        return out
    o = reward_outcome(rewards, alerts=[{"step": max(s, 0), "rule": r} for s, r in alerts], heldout=log.heldout,
                    fault=log.fault or False)
    basis = ("reward and held-out accuracy" if log.heldout is not None else
             "reward only: the run logged no held-out accuracy, so a collapse is read off the training reward alone")
    lines.append(f"outcome: {o.label}  ({basis})")
    n = len(rewards)
    lines.append(f"  R0 {o.R0:.4g} (mean reward of the first {min(OUTCOME_BASELINE_STEPS, n)} steps), R_end "
                 f"{o.R_end:.4g} (of the last {min(OUTCOME_WINDOW, n)}); collapsed means R_end < "
                 f"{OUTCOME_FLOOR:g} R0 = {OUTCOME_FLOOR * o.R0:.4g}"
                 + (f" and final held-out accuracy < {OUTCOME_FLOOR:g} x its initial {log.heldout[0]:.4g}"
                    if log.heldout is not None else ""))
    if o.heldout_ratio is not None:
        lines.append(f"  held-out accuracy {log.heldout[0]:.4g} -> {log.heldout[-1]:.4g} (ratio {o.heldout_ratio:.3g})")
    if o.R0 < OUTCOME_MIN_R0 and o.label != "failed":
        lines.append(f"  R0 < {OUTCOME_MIN_R0:g}: the run has no reward to lose, so it cannot end collapsed")
    if n < OUTCOME_BASELINE_STEPS + OUTCOME_WINDOW:
        lines.append(f"  a short run ({n} steps < {OUTCOME_BASELINE_STEPS + OUTCOME_WINDOW}): the first and last "
                     "windows overlap")
    if o.onset is not None:
        lines.append(f"  the final collapse starts at step {o.onset + 1 + offset}")
    if log.fault:
        lines.append(f"  stopped on numerical faults: {log.fault}")
    if log.max_steps is not None and int(log.steps[-1]) < log.max_steps:
        lines.append(f"  still running or stopped early: {int(log.steps[-1])} of {log.max_steps} steps logged; the "
                     "outcome is that of the steps so far")
    src = ("the run's own" if own else
           "replayed here on the logged reward and entropy, default thresholds, baselines the first 10 steps' medians")
    lines.append(f"alerts ({src}): " + (", ".join(f"{r} at step {s}" for s, r in alerts[:6])
                                         + (f" and {len(alerts) - 6} more" if len(alerts) > 6 else "")
                                         if alerts else "none")
                 + ("; an alert is an event, not a collapse" if alerts else ""))
    if log.recorded is not None:
        lines.append(f"the run's own outcome (summary.json, against its pre-RL held-out accuracy): {log.recorded}")
    out.update(label=o.label, R0=o.R0, R_end=o.R_end, reward_only=log.heldout is None,
               onset=None if o.onset is None else o.onset + 1 + offset, text=lines)
    return out


def _only(v: np.ndarray) -> str:
    """What a series without a finite value holds: '+inf', 'NaN' or 'NaN or infinite'."""
    kinds = {"+inf" if x == math.inf else "-inf" if x == -math.inf else "NaN" for x in v}
    return " or ".join(sorted(kinds))


def _suggestion(log: RunLog) -> dict:
    """The suggested lr section: the lr finder's rule (:func:`llm_probe.suggest.lr_suggestion` on the run's first
    :data:`~llm_probe.suggest.SUGGEST_STEPS` probed rows), with the count it rests on."""
    probed = [r for r in log.rows if "gap/headroom" in r]
    first = first_probed(probed)  # the first 20 with a value of lr x h (NaN, e.g. a zero update: none)
    s = lr_suggestion(first)
    out = {k: v for k, v in s.items() if k != "confidence"}
    per_row = log.kind != "trl" or log.logging_steps == 1
    unit = "probed steps" if per_row else "logged rows"
    out["unit"] = unit
    if not probed:
        out["text"] = ["suggested lr: not available: the run logged no gap/headroom (attach GapProbeCallback with "
                       "headroom=True, or gapdyn train with --probe-every N)"]
        return out
    lr_h = [_num(r.get("gap/headroom_lr")) for r in first]
    if s["steps"] == 0:
        if any(v == math.inf for v in lr_h):
            out["text"] = [f"suggested lr: no bound: the safe step rule's cap bound on none of the first {len(first)} "
                           f"{unit} with a value (h = +inf there: no prompt group with both a success and a failure, "
                           "or no curvature term), so the headroom says nothing about the lr yet"]
        else:
            out["text"] = [f"suggested lr: not available: none of the {len(probed)} {unit} with gap/headroom "
                           "logged a value of gap/headroom_lr (a zero update has no direction; mixed learning rates "
                           "name none)"]
        return out
    lr_now = None
    for r in reversed(log.rows):
        lr_now = _num(r.get("learning_rate", r.get("lr")))
        if lr_now is not None:
            break
    text = [f"suggested lr: {s['suggested_lr']:.3g}, interval [{s['lo']:.3g}, {s['hi']:.3g}]  (the lr finder's rule: "
            f"the median of lr x headroom over the first {s['steps']} {unit} with a value, at most "
            f"{SUGGEST_STEPS}; the lr at which the safe step rule's cap would just bind)",
            f"  rests on {s['steps']} {unit}" + (f" ({s['probed'] - s['steps']} more with h = +inf, no cap bound, "
                                                f"left out)" if s["probed"] > s["steps"] else "")
            + (f"; the run's last logged lr: {lr_now:.3g}" if lr_now is not None else "")]
    if s["steps"] < 6:
        text.append(f"  {s['steps']} values: the interval is unbounded, a rough figure")
    if not per_row:
        logged = [_num(r.get("gap/suggested_lr")) for r in log.rows]
        logged = [v for v in logged if v is not None and not math.isnan(v)]
        text.append(f"  logging_steps = {log.logging_steps}: a row holds the mean over the probed steps of its "
                    f"interval" + (f"; the callback's own value over its probed steps: {logged[-1]:.3g}"
                                   if logged else ""))
    out["text"] = text
    return out


CALLBACK_WARN_STATS = ("warn/cov_logp_adv",)
"""The only ``warn/*`` statistic :class:`llm_probe.callback.GapProbeCallback` logs, and only on its forward-only
route under sharded parameters (:class:`llm_probe.sharding.ForwardProbe`); the others (``warn/curv_gap`` among them,
llm_probe.warning) are logged by ``gapdyn train`` runs alone, so an alarm on one cannot be replayed on a TRL run."""

FROZEN_ALARM = Path(__file__).resolve().parents[1] / "docs" / "verdicts" / "testbed-dose" / "alarm" / "alarm_frozen.json"
"""The alarm frozen on the RLVR testbed's calibration block (``python -m llm_probe.testbed.alarm_report --freeze``,
docs/testbed.md): the report's default alarm."""


def _alarm(log: RunLog, path=None) -> dict:
    """What the frozen alarm (``path``, default :data:`FROZEN_ALARM`; its primary probe alarm, or every alarm of an
    alarm_specs.json named by it) would have said on this run: its statistic fed in logged order, the first row whose
    detector score reaches the cutoff (gapdyn.evidence.alarm.alarm_step, which the online alarm equals). Calibrated
    on the testbed only; the report says so."""
    from gapdyn.evidence.alarm import AlarmRun, alarm_step

    from .online_alarm import load_alarm_specs

    p = Path(path) if path is not None else FROZEN_ALARM
    if not p.is_file():
        return {"alarms": [], "text": [f"alarm: not available: no frozen alarm file {p} (pass --alarm FILE)"]}
    specs = load_alarm_specs(p)
    out, text = [], []
    for spec in specs:
        steps, values = log.series(spec.statistic)
        ok = np.isfinite(values)
        row = {"name": spec.name, "statistic": spec.statistic, "cutoff": float(spec.detector.cutoff),
               "logged": int(ok.sum()), "fired_step": None}
        what = f"alarm {spec.name} ({spec.statistic}, frozen on the RLVR testbed, {p.name})"
        if not ok.any() and log.kind == "trl" and spec.statistic.startswith("warn/") \
                and spec.statistic not in CALLBACK_WARN_STATS:
            text.append(f"{what}: not available on a TRL run: GapProbeCallback does not log {spec.statistic} (only "
                        "`gapdyn train` runs do), so this report cannot say whether the alarm would have fired")
        elif not ok.any():
            text.append(f"{what}: not available: the run logged no {spec.statistic}")
        else:
            a = alarm_step(AlarmRun(str(log.source), {spec.statistic: (steps[ok].astype(np.int64), values[ok])}, None),
                           spec.statistic, spec.detector)
            row["fired_step"] = a
            when = (None if a is None else f"after {a} optimizer steps" if log.kind == "trl" else f"at step k = {a - 1}")
            text.append(f"{what}: " + (f"did not fire over {int(ok.sum())} logged values" if a is None else
                                      f"fired {when} ({spec.statistic} = {values[steps == a][0]:.4g})")
                        + " -- calibrated on the testbed's tiny models, not validated on your setting")
        out.append(row)
    return {"alarms": out, "text": text}


def inspect_run(path, out=None, *, figure: bool = True, alarm=None) -> dict:
    """The report of the run in ``path`` (a folder or file as :func:`read_run` takes, or its :class:`RunLog`;
    module doc): a dict with ``text`` (the lines printed), ``outcome``,
    ``suggested``, ``alarm`` (:func:`_alarm` with the file ``alarm``), ``curves`` (the panels drawn) and, with
    ``out``, ``files`` (report.txt, report.json, and curves.png when ``figure``)."""
    log = path if isinstance(path, RunLog) else read_run(path)
    first, last = (int(log.steps[0]), int(log.steps[-1])) if log.kind == "trl" else (int(log.steps[0]) - 1,
                                                                                     int(log.steps[-1]) - 1)
    head = [f"run: {log.source} ({log.kind}; {len(log.rows)} logged rows, "
            + (f"optimizer steps done {first}..{last}, logging_steps {log.logging_steps})" if log.kind == "trl"
               else f"steps k = {first}..{last})")]
    outcome, suggested, alarmed = _outcome(log), _suggestion(log), _alarm(log, alarm)
    curves = [(name, key, ylab) for name, key, ylab in CURVES if np.isfinite(log.series(key)[1]).any()]
    drawn = {c[0] for c in curves}
    absent = [name for name, key, _ in CURVES if name not in drawn and not len(log.series(key)[1])]
    empty = [f"{name} (every value {_only(log.series(key)[1])})" for name, key, _ in CURVES
             if name not in drawn and len(log.series(key)[1])]
    text = head + log.notes + outcome["text"] + suggested["text"] + alarmed["text"]
    text.append("curves: " + (", ".join(c[0] for c in curves) or "none")
                + (f"; not logged: {', '.join(absent)}" if absent else "")
                + (f"; not drawn: {', '.join(empty)}" if empty else ""))
    report = {"run": str(log.source), "kind": log.kind, "rows": len(log.rows), "last_step": int(log.steps[-1]),
              "logging_steps": log.logging_steps, "outcome": {k: v for k, v in outcome.items() if k != "text"},
              "suggested": {k: v for k, v in suggested.items() if k != "text"}, "alarm": alarmed["alarms"],
              "curves": [c[0] for c in curves],
              "text": text}
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        files = [out / "report.txt", out / "report.json"]
        if figure and curves:
            files.append(_figure(log, curves, outcome, suggested, out / "curves.png"))
        text.append("wrote " + ", ".join(str(f) for f in files))
        from gapdyn.io import atomic_write_json, atomic_write_text

        atomic_write_text(files[0], "\n".join(text) + "\n")
        atomic_write_json(files[1], report, indent=1, default=str)
        report["files"] = [str(f) for f in files]
    return report


def _figure(log: RunLog, curves, outcome: dict, suggested: dict, path: Path) -> Path:
    from paper_figs.plots_llm import plot_logged_curve
    from paper_figs.style import new_figure

    import matplotlib.pyplot as plt

    fig, axes = new_figure(1, len(curves), width=3.6, height=3.0)
    xlabel = "optimizer steps done" if log.kind == "trl" else "step k (from 0)"
    for ax, (name, key, ylab) in zip(axes[0], curves):
        x, y = log.series(key)
        if log.kind != "trl":
            x = x - 1
        refs = []
        if name == "reward" and outcome.get("label") is not None:
            n0 = min(OUTCOME_BASELINE_STEPS, int(log.steps[-1]))
            refs = [(outcome["R0"], f"R0 (mean of the first {n0} steps)"),
                    (OUTCOME_FLOOR * outcome["R0"], f"{OUTCOME_FLOOR:g} R0: the collapse floor")]
        elif name == "headroom":
            refs = [(1.0, "h = 1: the cap binds below")]
        plot_logged_curve(ax, x, y, ylabel=ylab, xlabel=xlabel, logy=name == "headroom", refs=refs,
                          markers=name in ("alignment", "headroom"))
        if name == "reward" and outcome.get("label") is not None:
            ax.set_title(f"outcome: {outcome['label']}" + (" (reward only)" if outcome.get("reward_only") else ""),
                         fontsize=10)
        if name == "headroom" and suggested.get("steps") and math.isfinite(suggested["suggested_lr"]):
            ax.set_title(f"suggested lr {suggested['suggested_lr']:.2g} ({suggested['steps']} "
                         f"{suggested['unit']})", fontsize=10)
    fig.tight_layout()
    from gapdyn.io import write_with

    write_with(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120), what="figure")
    plt.close(fig)
    return path


# ---- the command ----------------------------------------------------------------------------------------------

@dataclass
class InspectArgs:
    """Report on a run from its logs: outcome, alerts, suggested learning rate, one figure of its curves."""

    run: Annotated[str, tyro.conf.arg(metavar="RUN"), tyro.conf.Positional]
    """The run's folder: a TRL output_dir (trainer_state.json, or checkpoint-N/ while it runs) or a gapdyn train
    folder (metrics.jsonl)."""
    out: Annotated[str | None, optional("DIR", "./gapdyn_out/inspect")] = None
    """Folder for report.txt, report.json and curves.png."""
    figure: bool = True
    """Draw curves.png."""
    alarm: Annotated[str | None, optional("FILE", "the testbed's frozen alarm")] = None
    """An alarm_frozen.json (python -m llm_probe.testbed.alarm_report --freeze): the alarm the report replays."""


@command("gapdyn inspect")
def main(argv: list[str]) -> int:
    """``gapdyn inspect RUN [--out DIR] [--no-figure]``: the report printed and written under --out; a missing
    folder or one without run logs: one line, exit 2."""
    args = parse(InspectArgs, argv, prog="gapdyn inspect")
    log = read_run(args.run)  # a one-line error before any folder is made
    report = inspect_run(log, output_dir("inspect", args.out, announce=False), figure=args.figure, alarm=args.alarm)
    print("\n".join(report["text"]))
    return 0
