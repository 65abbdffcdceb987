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
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import tyro

from gapdyn.evidence.alarm import AlarmSpec, evaluate_spec, specs_hash
from gapdyn.evidence.detectors import Cusum, Level, MannKendall, Threshold, zero_std_share

__all__ = ["ALARM_SPECS", "alarm_table", "calibrated_specs", "roc_rows", "table_markdown", "AlarmReportArgs", "main"]

ALARM_SPECS = (
    # the probe's statistics (gap/* every probed step, warn/cov_logp_adv every step)
    AlarmSpec("headroom_low", "gap/headroom", Threshold(sign=-1, window=1), role="primary"),
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
candidates, the scalar detectors the baselines. Fix them (and their hash) before the held-out block runs."""

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
    heldout_seeds: str
    """Seeds of the held-out block (never shared with the calibration block)."""
    out_dir: Annotated[str, tyro.conf.arg(name="out")]
    """Folder for alarm_table.csv, alarm_table.md, alarm_roc.csv and alarm_specs.json."""
    far: float | None = None
    """Calibrate every alarm at this false-alarm rate instead of its spec's."""
    lead: int | None = None
    """Read the detection share at this lead instead of the spec's."""
    by_length: bool = False
    """Score (and calibrate) the long and short scratchpads apart."""


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
        out = Path(a.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        _write_csv(rows, out / "alarm_table.csv")
        _write_csv(roc_rows(held, specs), out / "alarm_roc.csv")
        h = specs_hash(specs)
        head = (f"Alarm table of {a.study}: calibration seeds {a.calibration_seeds} ({len(cal)} runs), held-out "
                f"seeds {a.heldout_seeds} ({len(held)} runs); specs hash {h}.\n\n")
        (out / "alarm_table.md").write_text(head + table_markdown(rows) + "\n")
        (out / "alarm_specs.json").write_text(json.dumps({"hash": h, "specs": [s.to_dict() for s in specs],
                                                          "calibration_seeds": a.calibration_seeds,
                                                          "calibrated": calibrated}, indent=1))
        print(head + table_markdown(rows))
        return 0

    return run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
