"""Testbed runs as alarm data (gapdyn.evidence.alarm.AlarmRun): a study folder (one sub-folder per run with summary.json and
metrics.jsonl) or its exported record (runs.csv + steps.csv, llm_probe.testbed.study.export_study).

Clock: a metrics row with step k (0-based) is written after the (k+1)-th update, so its statistics are available at
k+1 updates; the collapse time is an evaluation step, counted in updates (llm_probe.testbed.outcome.collapse_time).
A row's alarm time is therefore k + 1: no detector is credited with a lead it could not have had. A run's collapse
time is its ``outcome_detail.collapse_step`` when its outcome is ``collapsed`` (None otherwise: a run that never
collapses, the false-alarm pool); ``failed`` runs (a numerical fault) are left out unless asked for. Group:
``"control"`` for the random-advantage control, ``"rl"`` otherwise (``by_length``: then " long" / " short" is added).
Standard library and numpy only.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

from gapdyn.evidence.alarm import AlarmRun

__all__ = ["ROW_TO_CLOCK", "load_study_runs", "load_export_runs", "load_runs", "parse_seeds", "runs_with_seeds",
           "run_group"]

ROW_TO_CLOCK = 1
"""A metrics row of step k is read at k + ROW_TO_CLOCK updates (module doc)."""


def run_group(setting: dict, *, by_length: bool = False) -> str:
    """``"control"`` or ``"rl"`` (and the scratchpad length when ``by_length``)."""
    g = "control" if str(setting.get("control")).lower() in ("true", "1") else "rl"
    return f"{g} {setting.get('length', 'long')}" if by_length else g


def _number(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    return float(v)


def _series(rows: list[dict], statistics) -> dict:
    keys = statistics if statistics is not None else sorted({k for r in rows for k, v in r.items()
                                                             if isinstance(v, (int, float)) and not isinstance(v, bool)
                                                             and k not in ("step", "seed")})
    steps = np.array([int(r["step"]) + ROW_TO_CLOCK for r in rows], dtype=np.int64)
    return {k: (steps, np.array([_number(r.get(k)) for r in rows])) for k in keys}


def _meta(setting: dict, seed, outcome: str) -> dict:
    return {**setting, "seed": int(seed), "outcome": outcome}


def _merge_head_log(rows: list[dict], folder: Path) -> None:
    """Add the run's lm_head.jsonl values (llm_probe.testbed.run.read_head_log) to its metrics rows of the same
    step."""
    from .run import read_head_log

    head = read_head_log(folder)
    for r in rows:
        r.update(head.get(int(r["step"]), {}))


def load_study_runs(root, *, statistics=None, include_failed: bool = False, by_length: bool = False) -> list[AlarmRun]:
    """Every finished run under the study folder ``root`` (module doc); ``statistics``: the metrics keys to keep
    (all numeric keys when None)."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"study folder {root} does not exist")
    runs = []
    for p in sorted(root.glob("*/summary.json")):
        s = json.loads(p.read_text())
        if s["outcome"] == "failed" and not include_failed:
            continue
        rows = [json.loads(ln) for ln in (p.parent / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        rows = [r for r in rows if not r.get("skipped")]
        _merge_head_log(rows, p.parent)
        c = s["outcome_detail"].get("collapse_step") if s["outcome"] == "collapsed" else None
        runs.append(AlarmRun(p.parent.name, _series(rows, statistics), None if c is None else int(c),
                             run_group(s["setting"], by_length=by_length),
                             _meta(s["setting"], s["seed"], s["outcome"])))
    return runs


def load_export_runs(dest, *, include_failed: bool = False, by_length: bool = False) -> list[AlarmRun]:
    """The runs of an exported record (runs.csv, steps.csv: every statistic column it holds, per step)."""
    dest = Path(dest)
    if not (dest / "runs.csv").is_file() or not (dest / "steps.csv").is_file():
        raise ValueError(f"{dest} holds no runs.csv and steps.csv (an exported study record)")
    with open(dest / "steps.csv", newline="") as f:
        by_run: dict[str, list[dict]] = {}
        for r in csv.DictReader(f):
            by_run.setdefault(r["run"], []).append(
                {k: (int(v) if k == "step" else float(v) if v not in ("", None) else math.nan)
                 for k, v in r.items() if k != "run"})
    runs = []
    with open(dest / "runs.csv", newline="") as f:
        for r in csv.DictReader(f):
            if r["outcome"] == "failed" and not include_failed:
                continue
            c = r["collapse_step"] if r["outcome"] == "collapsed" else ""
            setting = {k: r[k] for k in ("method", "lr", "length", "size", "control") if k in r}
            setting["lr"] = float(setting["lr"])
            setting["control"] = r.get("control") == "True"
            rows = sorted(by_run.get(r["run"], []), key=lambda x: x["step"])
            runs.append(AlarmRun(r["run"], _series(rows, None),
                                 int(float(c)) if c not in ("", None) else None,
                                 run_group(setting, by_length=by_length), _meta(setting, r["seed"], r["outcome"])))
    return runs


def load_runs(path, **kw) -> list[AlarmRun]:
    """A study folder or an exported record, whichever ``path`` is."""
    path = Path(path)
    return load_export_runs(path, **{k: v for k, v in kw.items() if k != "statistics"}) \
        if (path / "runs.csv").is_file() else load_study_runs(path, **kw)


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"3000-3039"`` (inclusive), ``"1,2,5"`` or a mix ``"1-3,7"``; non-negative integers."""
    out = []
    try:
        for part in str(text).split(","):
            a, _, b = part.strip().partition("-")
            lo, hi = int(a), int(b if b else a)
            if lo < 0 or hi < lo:
                raise ValueError
            out.extend(range(lo, hi + 1))
    except ValueError:
        raise ValueError(f"seeds must look like 3000-3039 or 1,2,5, got {text!r}") from None
    return tuple(dict.fromkeys(out))


def runs_with_seeds(runs, seeds) -> list[AlarmRun]:
    """The runs whose seed is in ``seeds``."""
    s = set(int(x) for x in seeds)
    return [r for r in runs if int(r.meta.get("seed", -1)) in s]
