"""``python -m llm_probe.testbed.alarm_report STUDY --calibration-seeds A-B --heldout-seeds C-D --out DIR``: the alarm
table of a testbed study (lead time at a fixed false-alarm rate, per detector, RL runs and control runs apart).

Each alarm of :data:`ALARM_SPECS` (a statistic, a detector of gapdyn.evidence.detectors, the false-alarm rate its cutoff is
calibrated at, the lead its detection share is read at) has its cutoff fixed on the never-collapsing runs of the
calibration seeds (of the RL groups: the random-advantage control is scored, never calibrated on), then is scored on
the held-out seeds per group (gapdyn.evidence.alarm.evaluate_spec). Writes ``alarm_table.csv`` (every column),
``alarm_table.md`` (the main columns), ``alarm_roc.csv`` (the held-out ROC at leads 0, 5, 10 per alarm and group)
and ``alarm_specs.json`` (the specs and their hash, gapdyn.evidence.alarm.specs_hash; ``"calibrated"``: each spec at its
calibrated cutoff, read by llm_probe.online_alarm.load_alarm_specs for the TRL callback's alarm).
Data: llm_probe.testbed.alarm_data (a study folder or its exported record; the clock is in updates).

The held-out test: ``--freeze`` (calibration seeds only, before the held-out block runs) writes
``alarm_frozen.json`` (every cutoff, the primary probe alarm and the primary baseline chosen by
:data:`ALARM_CRITERIA`'s selection rule, the specs' and the criteria's hashes); ``--frozen FILE`` re-derives it from
the calibration seeds (a mismatch is an error) and decides :data:`ALARM_CRITERIA` on the held-out seeds
(``alarm_decisions.json``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import tyro

import numpy as np

from gapdyn.evidence.alarm import AlarmSpec, evaluate_spec, series_of, specs_hash
from gapdyn.evidence.detectors import Cusum, Level, MannKendall, Threshold, zero_std_share

__all__ = ["ALARM_SPECS", "ALARM_CRITERIA", "alarm_criteria_hash", "alarm_table", "calibrated_specs", "roc_rows",
           "table_markdown", "freeze", "check_frozen", "decide", "AlarmReportArgs", "main"]

ALARM_SPECS = (
    # the probe's statistics (gap/* every probed step, warn/cov_logp_adv every step)
    AlarmSpec("headroom_low", "gap/headroom", Threshold(sign=-1, window=1)),
    AlarmSpec("headroom_lr_low", "gap/headroom_lr", Threshold(sign=-1, window=1)),
    AlarmSpec("alignment_low", "gap/dmu_update_mean", Threshold(sign=-1, window=2)),
    AlarmSpec("cos_alignment_low", "gap/cos_update_mean", Threshold(sign=-1, window=2)),
    AlarmSpec("curvature_high", "warn/curv_gap", Threshold(sign=1, window=2)),
    AlarmSpec("cov_logp_adv_high", "warn/cov_logp_adv", Threshold(sign=1, window=5)),
    AlarmSpec("cov_logp_adv_cusum", "warn/cov_logp_adv", Cusum(direction=1, reference_steps=10)),
    # the scalar baselines, as run doctors do them
    AlarmSpec("reward_cusum", "reward", Cusum(direction=-1, reference_steps=10), role="baseline"),
    AlarmSpec("reward_mann_kendall", "reward", MannKendall(direction=-1, window=20), role="baseline"),
    AlarmSpec("reward_level", "reward", Level(sign=-1, window=5, reference_steps=10), role="baseline"),
    AlarmSpec("entropy_up", "entropy", Level(sign=1, window=5, reference_steps=10), role="baseline"),
    AlarmSpec("entropy_down", "entropy", Level(sign=-1, window=5, reference_steps=10), role="baseline"),
    AlarmSpec("zero_std_share", "frac_reward_zero_std", zero_std_share(window=5), role="baseline"),
    # the LM head's gradient norm, the signal of Dynamic Gradient Gating (arXiv 2605.19425); its gating rule is not
    # recoverable from the abstract, so it is scored as a detector: a rise over its start, calibrated like the rest
    AlarmSpec("lm_head_grad_norm_high", "lm_head/grad_norm", Threshold(sign=1, window=1), role="baseline"),
    AlarmSpec("lm_head_grad_norm_up", "lm_head/grad_norm", Level(sign=1, window=2, reference_steps=10),
              role="baseline"),
)
"""The alarms scored (thresholds are placeholders: each is calibrated at ``far``); the probe's statistics are
candidates (role exploratory), the scalar detectors the baselines. Which probe alarm and which baseline are the
primaries is chosen on the calibration block by :data:`ALARM_CRITERIA`'s selection rule (:func:`freeze`); specs,
cutoffs and the choice are frozen before the held-out block runs."""

ALARM_CRITERIA = {
    "selection": {"rule": "on the calibration seeds' RL runs, every alarm at its calibrated cutoff (false-alarm rate "
                          "far on their never-collapsing runs); the primary probe alarm = the non-baseline alarm with "
                          "the largest share of collapsing runs detected at least its lead ahead, the primary "
                          "baseline = the baseline alarm with the largest such share; ties: the longer median lead, "
                          "then the spec order"},
    "warns": {"rule": "the primary probe alarm at its frozen cutoff on the held-out RL runs: share of collapsing runs "
                      "detected at least its lead ahead (Wilson 95 %)",
              "holds": "lower bound >= 0.5", "does not hold": "upper bound < 0.5", "undecided": "otherwise"},
    "beats_baseline": {"rule": "paired on the held-out collapsing RL runs, each alarm at its frozen cutoff: detected "
                               "at least the lead ahead by the primary probe alarm vs by the primary baseline, exact "
                               "McNemar (two-sided)",
                       "holds": "probe share > baseline share and p < 0.05",
                       "does not hold": "baseline share > probe share and p < 0.05", "undecided": "otherwise"},
    "false_alarms": {"rule": "the primary probe alarm's held-out false-alarm rate on never-collapsing RL runs "
                             "(Wilson 95 %) against its calibration target far",
                     "holds": "lower bound <= far", "does not hold": "lower bound > far"},
}
"""The alarm's pre-declared criteria (hash: :func:`alarm_criteria_hash`), frozen with the cutoffs (:func:`freeze`)
before the held-out block runs and decided on it (:func:`decide`)."""

_MD_COLUMNS = ("alarm", "statistic", "role", "group", "threshold", "false alarms", "collapsing", "detected at lead",
               "median lead", "held-out AUC at lead")


def alarm_table(calibration, heldout, specs=ALARM_SPECS, *, calibrate_groups=None, leads=(0, 5, 10)) -> list[dict]:
    """Rows of gapdyn.evidence.alarm.evaluate_spec for every spec, calibrated on ``calibrate_groups`` of ``calibration``
    (default: every group not starting with "control")."""
    if calibrate_groups is None:
        calibrate_groups = sorted({r.group for r in calibration if not r.group.startswith("control")})
    return [row for s in specs for row in evaluate_spec(s, calibration, heldout, calibrate_groups=calibrate_groups,
                                                        leads=leads)]


def roc_rows(heldout, specs=ALARM_SPECS, *, leads=(0, 5, 10)) -> list[dict]:
    """The held-out ROC of every spec per group and lead (gapdyn.evidence.alarm.roc_at_lead: cutoffs in score units,
    a detection at lead L fires at least L steps before the collapse), one row per cutoff."""
    from gapdyn.evidence.alarm import roc_at_lead

    rows = []
    for s in specs:
        for g in sorted({r.group for r in heldout}):
            runs = [r for r in heldout if r.group == g]
            for L in leads:
                roc = roc_at_lead(runs, s.statistic, s.detector, L)
                if not (roc.n_pos and roc.n_neg):
                    continue
                rows += [{"alarm": s.name, "statistic": s.statistic, "group": g, "lead": L, "cutoff": float(c),
                          "fpr": float(f), "tpr": float(t), "auc": roc.auc.estimate, "auc_lo": roc.auc.lo,
                          "auc_hi": roc.auc.hi, "n_pos": roc.n_pos, "n_neg": roc.n_neg}
                         for c, f, t in zip(roc.cutoffs, roc.fpr, roc.tpr)]
    return rows


def calibrated_specs(rows: list[dict], specs=ALARM_SPECS, *, length: str | None = None) -> list[dict]:
    """Each spec of ``rows`` (:func:`alarm_table`) with its detector at the calibrated cutoff (one cutoff per
    spec: every group's row carries the same), ``cutoff`` and ``cal_negatives`` added (``length`` when given); a
    spec that could not be calibrated is left out. What llm_probe.online_alarm.load_alarm_specs reads."""
    out = []
    for s in specs:
        cuts = {r["cutoff"] for r in rows if r["alarm"] == s.name and not math.isnan(r["cutoff"])}
        if len(cuts) != 1:
            continue
        (c,) = cuts
        n = next(r["cal_negatives"] for r in rows if r["alarm"] == s.name)
        d = {**replace(s, detector=s.detector.at_cutoff(c)).to_dict(), "cutoff": c, "cal_negatives": n}
        out.append({**d, "length": length} if length is not None else d)
    return out


def alarm_criteria_hash(criteria=None) -> str:
    """The canonical hash (gapdyn.evidence.claims.canonical_hash) of :data:`ALARM_CRITERIA` (or ``criteria``)."""
    from gapdyn.evidence.claims import canonical_hash

    return canonical_hash(ALARM_CRITERIA if criteria is None else criteria)


def _rl(runs) -> list:
    return [r for r in runs if not r.group.startswith("control")]


def _selected(rows: list[dict], specs, *, baseline: bool) -> str | None:
    """The selection rule of :data:`ALARM_CRITERIA` on calibration rows (one RL group): the largest detected share
    at the spec's lead, then the longer median lead, then the spec order."""
    order = {s.name: i for i, s in enumerate(specs)}
    role = {s.name: s.role for s in specs}
    cand = [r for r in rows if (role[r["alarm"]] == "baseline") == baseline and not math.isnan(r["cutoff"])
            and r.get("n_collapsing")]
    if not cand:
        return None

    def key(r):
        d = r[f"detected_{r['lead_target']}"]
        m = r["median_lead"]
        return (-(d if not math.isnan(d) else -1.0), -(m if not math.isnan(m) else -math.inf), order[r["alarm"]])

    return min(cand, key=key)["alarm"]


def freeze(calibration, specs=ALARM_SPECS, *, calibration_seeds: str) -> dict:
    """The alarm frozen on the calibration runs alone: every spec's calibrated cutoff (on the RL runs' never-
    collapsing runs), each spec's detection on the calibration RL runs at it, the primaries chosen by
    :data:`ALARM_CRITERIA`'s selection rule, and the hashes of the specs and the criteria. Written before the
    held-out block runs; :func:`check_frozen` re-derives it at evaluation."""
    cal = _rl(calibration)
    if not cal:
        raise ValueError("no calibration RL run to freeze on")
    rows = [r for r in alarm_table(cal, cal, specs) if r["group"] == "rl"]
    return {"specs_hash": specs_hash(specs), "criteria_hash": alarm_criteria_hash(),
            "calibration_seeds": calibration_seeds, "calibration_runs": len(cal),
            "calibration_collapsing": sum(r.collapses for r in cal),
            "calibrated": calibrated_specs(rows, specs),
            "calibration_detected": {r["alarm"]: r.get(f"detected_{r['lead_target']}") for r in rows},
            "primary": _selected(rows, specs, baseline=False), "baseline": _selected(rows, specs, baseline=True)}


def check_frozen(frozen: dict, calibration, specs=ALARM_SPECS) -> None:
    """Raise ValueError unless ``frozen`` is what :func:`freeze` gives on ``calibration`` now (same specs and
    criteria hashes, cutoffs, selection): the held-out evaluation uses exactly the frozen alarm."""
    now = freeze(calibration, specs, calibration_seeds=frozen.get("calibration_seeds", ""))
    for k in ("specs_hash", "criteria_hash", "calibration_runs", "calibrated", "primary", "baseline"):
        if json.loads(json.dumps(now[k])) != frozen.get(k):
            raise ValueError(f"the frozen alarm's {k} differs from its re-derivation on the calibration runs")


def _detected(run, spec: dict) -> bool:
    from gapdyn.evidence.alarm import lead_time

    s = AlarmSpec.from_dict({k: spec[k] for k in ("name", "statistic", "detector", "far", "lead", "role")})
    lt = lead_time(run, s.statistic, s.detector) if series_of(run, s.statistic) is not None else -math.inf
    return lt is not None and lt >= s.lead


def decide(frozen: dict, heldout) -> list[dict]:
    """The rows of :data:`ALARM_CRITERIA` on the held-out RL runs at the frozen cutoffs: per criterion its
    numbers and its verdict ("holds", "does not hold", "undecided", or "not measured" with the reason)."""
    from gapdyn.evidence.alarm import false_alarms
    from gapdyn.evidence.stats import mcnemar_exact, wilson_interval

    cal = {c["name"]: c for c in frozen["calibrated"]}
    prim, base = frozen.get("primary"), frozen.get("baseline")
    held = _rl(heldout)
    pos = [r for r in held if r.collapses]
    out = []
    if prim is None or prim not in cal:
        return [{"criterion": k, "verdict": "not measured", "reason": "no probe alarm could be calibrated"}
                for k in ("warns", "beats_baseline", "false_alarms")]
    p = cal[prim]
    dp = np.array([_detected(r, p) for r in pos], dtype=float)
    if pos:
        e = wilson_interval(int(dp.sum()), len(pos))
        v = "holds" if e.lo >= 0.5 else "does not hold" if e.hi < 0.5 else "undecided"
        out.append({"criterion": "warns", "alarm": prim, "lead": p["lead"], "k": int(dp.sum()), "n": len(pos),
                    "estimate": e.estimate, "lo": e.lo, "hi": e.hi, "verdict": v})
    else:
        out.append({"criterion": "warns", "alarm": prim, "verdict": "not measured",
                    "reason": "no held-out RL run collapsed"})
    if base is None or base not in cal or not pos:
        out.append({"criterion": "beats_baseline", "alarm": prim, "baseline": base, "verdict": "not measured",
                    "reason": "no baseline calibrated" if pos else "no held-out RL run collapsed"})
    else:
        db = np.array([_detected(r, cal[base]) for r in pos], dtype=float)
        t = mcnemar_exact(dp, db)
        sp, sb = float(dp.mean()), float(db.mean())
        v = ("holds" if sp > sb and t.p_value < 0.05 else "does not hold" if sb > sp and t.p_value < 0.05
             else "undecided")
        out.append({"criterion": "beats_baseline", "alarm": prim, "baseline": base, "n": len(pos), "estimate": sp,
                    "baseline_estimate": sb, "discordant": t.n, "p": t.p_value, "verdict": v})
    s = AlarmSpec.from_dict({k: p[k] for k in ("name", "statistic", "detector", "far", "lead", "role")})
    fa = false_alarms(held, s.statistic, s.detector)
    if fa["n"]:
        e = fa["rate"]
        out.append({"criterion": "false_alarms", "alarm": prim, "far": p["far"], "k": fa["k"], "n": fa["n"],
                    "estimate": e.estimate, "lo": e.lo, "hi": e.hi,
                    "verdict": "holds" if e.lo <= p["far"] else "does not hold"})
    else:
        out.append({"criterion": "false_alarms", "alarm": prim, "verdict": "not measured",
                    "reason": "no never-collapsing held-out RL run"})
    return out


def decisions_markdown(decisions: list[dict], frozen_path: str) -> str:
    """The verdicts of :func:`decide` as a markdown table."""
    lines = [f"Decided at the alarm frozen in {Path(frozen_path).name} (criteria {alarm_criteria_hash()}):", "",
             "| criterion | alarm | numbers | verdict |", "|---|---|---|---|"]
    for d in decisions:
        if d["verdict"] == "not measured":
            nums = d["reason"]
        elif d["criterion"] == "beats_baseline":
            nums = (f"{d['estimate']:.2f} vs {d['baseline']} {d['baseline_estimate']:.2f} of {d['n']} "
                    f"(discordant {d['discordant']}, p {d['p']:.3g})")
        else:
            nums = f"{d['k']}/{d['n']} = {d['estimate']:.2f} [{d['lo']:.2f}, {d['hi']:.2f}]"
        lines.append(f"| {d['criterion']} | {d.get('alarm', '')} | {nums} | {d['verdict']} |")
    return "\n".join(lines)


def _f(v, fmt="{:.3g}") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float) and math.isinf(v):
        return "miss" if v < 0 else "inf"
    return fmt.format(v)


def table_markdown(rows: list[dict]) -> str:
    """The main columns of :func:`alarm_table` as a markdown table: rates with their Wilson 95 % intervals, the
    median lead (steps; "miss": the median run is never detected) with its order-statistic interval."""
    lines = ["| " + " | ".join(_MD_COLUMNS) + " |", "|" + "---|" * len(_MD_COLUMNS)]
    for r in rows:
        if math.isnan(r["cutoff"]):
            cells = [r["alarm"], r["statistic"], r["role"], r["group"], "not calibrated: " + r["note"], *[""] * 5]
        else:
            L = r["lead_target"]
            cells = [r["alarm"], r["statistic"], r["role"], r["group"], _f(r["threshold"], "{:.4g}"),
                     f"{r['false_alarms']}/{r['n_negatives']} "
                     f"[{_f(r['far_lo'], '{:.2f}')}, {_f(r['far_hi'], '{:.2f}')}]"
                     if r["n_negatives"] else "0/0",
                     str(r["n_collapsing"]),
                     f"L={L}: {_f(r[f'detected_{L}'], '{:.2f}')} [{_f(r[f'detected_{L}_lo'], '{:.2f}')}, "
                     f"{_f(r[f'detected_{L}_hi'], '{:.2f}')}]" if r["n_collapsing"] else "",
                     f"{_f(r['median_lead'], '{:g}')} [{_f(r['median_lead_lo'], '{:g}')}, "
                     f"{_f(r['median_lead_hi'], '{:g}')}]" if r["n_collapsing"] else "",
                     f"{_f(r['heldout_auc'], '{:.2f}')} [{_f(r['heldout_auc_lo'], '{:.2f}')}, "
                     f"{_f(r['heldout_auc_hi'], '{:.2f}')}]" if not math.isnan(r["heldout_auc"]) else ""]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


@dataclass
class AlarmReportArgs:
    """The alarm table of a testbed study: cutoffs calibrated at a fixed false-alarm rate on the calibration seeds,
    lead times and false alarms on the held-out seeds, RL runs and control runs apart."""

    study: tyro.conf.Positional[str]
    """A study folder (one sub-folder per run) or its exported record (runs.csv, steps.csv)."""
    calibration_seeds: str
    """Seeds of the calibration block, e.g. 3000-3039 or 1,2,5."""
    out_dir: Annotated[str, tyro.conf.arg(name="out")]
    """Folder for alarm_table.csv, alarm_table.md, alarm_roc.csv and alarm_specs.json."""
    heldout_seeds: str | None = None
    """Seeds of the held-out block (never shared with the calibration block); not with --freeze."""
    far: float | None = None
    """Calibrate every alarm at this false-alarm rate instead of its spec's."""
    lead: int | None = None
    """Read the detection share at this lead instead of the spec's."""
    by_length: bool = False
    """Score (and calibrate) the long and short scratchpads apart."""
    freeze: bool = False
    """Only freeze the alarm on the calibration seeds (cutoffs, the primaries, hashes) into DIR/alarm_frozen.json,
    before the held-out block runs."""
    frozen: str | None = None
    """An alarm_frozen.json: check that the calibration seeds re-derive it, then decide ALARM_CRITERIA on the
    held-out seeds (alarm_decisions.json and a section of alarm_table.md)."""


def _write_csv(rows: list[dict], path: Path) -> None:
    import csv

    cols = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    """``python -m llm_probe.testbed.alarm_report STUDY --calibration-seeds A-B --heldout-seeds C-D --out DIR``."""
    import sys

    from gapdyn.cmdline import command, parse

    prog = "python -m llm_probe.testbed.alarm_report"

    @command(prog)
    def run(argv: list[str]) -> int:
        from .alarm_data import load_runs, parse_seeds, runs_with_seeds

        a = parse(AlarmReportArgs, argv, prog=prog)
        out = Path(a.out_dir)
        if a.freeze:
            if a.heldout_seeds is not None or a.frozen is not None:
                raise ValueError("--freeze takes the calibration seeds only (no --heldout-seeds, no --frozen)")
            cal = runs_with_seeds(load_runs(a.study), parse_seeds(a.calibration_seeds))
            frozen = freeze(cal, ALARM_SPECS, calibration_seeds=a.calibration_seeds)
            out.mkdir(parents=True, exist_ok=True)
            (out / "alarm_frozen.json").write_text(json.dumps(frozen, indent=1) + "\n")
            print(f"froze {len(frozen['calibrated'])} alarms on {frozen['calibration_runs']} calibration runs "
                  f"(specs {frozen['specs_hash']}, criteria {frozen['criteria_hash']}): primary {frozen['primary']}, "
                  f"baseline {frozen['baseline']} -> {out / 'alarm_frozen.json'}")
            return 0
        if a.heldout_seeds is None:
            raise ValueError("--heldout-seeds is needed (or --freeze)")
        cal_seeds, held_seeds = parse_seeds(a.calibration_seeds), parse_seeds(a.heldout_seeds)
        if set(cal_seeds) & set(held_seeds):
            raise ValueError("the calibration and held-out seeds must not overlap")
        specs = tuple(replace(s, **{k: v for k, v in (("far", a.far), ("lead", a.lead)) if v is not None})
                      for s in ALARM_SPECS)
        runs = load_runs(a.study, by_length=a.by_length)
        cal, held = runs_with_seeds(runs, cal_seeds), runs_with_seeds(runs, held_seeds)
        if not cal or not held:
            raise ValueError(f"{a.study}: {len(cal)} calibration and {len(held)} held-out runs (both are needed)")
        if a.by_length:  # each length calibrated on its own RL runs
            per = {length: alarm_table([r for r in cal if r.meta.get("length") == length],
                                       [r for r in held if r.meta.get("length") == length], specs)
                   for length in sorted({r.meta.get("length") for r in held})}
            rows = [row for length_rows in per.values() for row in length_rows]
            calibrated = [c for length, rs in per.items() for c in calibrated_specs(rs, specs, length=length)]
        else:
            rows = alarm_table(cal, held, specs)
            calibrated = calibrated_specs(rows, specs)
        decisions = None
        if a.frozen is not None:
            if a.far is not None or a.lead is not None or a.by_length:
                raise ValueError("--frozen decides the frozen alarm: no --far, --lead or --by-length")
            frozen = json.loads(Path(a.frozen).read_text())
            if frozen.get("calibration_seeds") != a.calibration_seeds:
                raise ValueError(f"{a.frozen} was frozen on seeds {frozen.get('calibration_seeds')}, "
                                 f"not {a.calibration_seeds}")
            check_frozen(frozen, cal, ALARM_SPECS)
            decisions = decide(frozen, held)
        out.mkdir(parents=True, exist_ok=True)
        _write_csv(rows, out / "alarm_table.csv")
        _write_csv(roc_rows(held, specs), out / "alarm_roc.csv")
        h = specs_hash(specs)
        head = (f"Alarm table of {a.study}: calibration seeds {a.calibration_seeds} ({len(cal)} runs), held-out "
                f"seeds {a.heldout_seeds} ({len(held)} runs); specs hash {h}.\n\n")
        body = table_markdown(rows)
        if decisions is not None:
            (out / "alarm_decisions.json").write_text(json.dumps(decisions, indent=1) + "\n")
            body += "\n\n" + decisions_markdown(decisions, a.frozen)
        (out / "alarm_table.md").write_text(head + body + "\n")
        (out / "alarm_specs.json").write_text(json.dumps({"hash": h, "specs": [s.to_dict() for s in specs],
                                                          "calibration_seeds": a.calibration_seeds,
                                                          "calibrated": calibrated}, indent=1))
        print(head + body)
        return 0

    return run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
