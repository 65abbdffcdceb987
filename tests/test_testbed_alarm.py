"""The testbed's alarm data and report on a constructed study folder with hand-computed cutoffs, alarm times and
leads (the clock offset of the metrics rows included), and the loader on the committed pilot record. Machinery
only: no claim about which detector warns."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from gapdyn.evidence.alarm import specs_hash
from llm_probe.testbed.alarm_data import ROW_TO_CLOCK, load_runs, parse_seeds, runs_with_seeds
from llm_probe.testbed.alarm_report import ALARM_SPECS, main


def _write_run(root, name, seed, *, headroom_min, drop_row=50, collapse=None, control=False, length="long"):
    d = root / name
    d.mkdir(parents=True)
    setting = {"method": "grpo", "lr": 3e-4, "length": length, "size": "small", "control": control}
    outcome = "collapsed" if collapse is not None else "learned"
    (d / "summary.json").write_text(json.dumps({"setting": setting, "seed": seed, "outcome": outcome,
                                                "outcome_detail": {"collapse_step": collapse}}))
    rows = []
    for k in range(100):
        r = {"step": k, "reward": 0.5, "entropy": 0.1, "frac_reward_zero_std": 0.0, "warn/cov_logp_adv": 0.01}
        if k % 5 == 0:  # the probe's statistics every 5th row; the minimum reached at drop_row
            r["gap/headroom"] = headroom_min if k == drop_row else 10.0
        rows.append(r)
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


@pytest.fixture()
def study(tmp_path):
    root = tmp_path / "study"
    for i in range(10):  # calibration negatives: headroom minima 1 .. 10
        _write_run(root, f"cal_neg{i}", 100 + i, headroom_min=float(i + 1))
    _write_run(root, "cal_pos", 100, headroom_min=0.2, collapse=60)
    _write_run(root, "cal_ctrl", 101, headroom_min=0.01, collapse=30, control=True)  # never calibrated on
    for i, h in enumerate((0.5, 3.0, 4.0, 5.0)):  # held-out negatives: one false alarm at the cutoff below 2
        _write_run(root, f"held_neg{i}", 200 + i, headroom_min=h)
    _write_run(root, "held_pos_a", 200, headroom_min=0.1, drop_row=45, collapse=60)  # fires at 46: lead 14
    _write_run(root, "held_pos_b", 201, headroom_min=1.5, drop_row=20, collapse=50)  # fires at 21: lead 29
    _write_run(root, "held_pos_miss", 202, headroom_min=2.5, collapse=40)  # never below 2: a miss
    _write_run(root, "held_ctrl", 203, headroom_min=0.3, drop_row=10, collapse=20, control=True)  # lead 9
    return root


def test_loader_clock_groups_and_collapse(study):
    runs = {r.name: r for r in load_runs(study)}
    assert ROW_TO_CLOCK == 1
    r = runs["held_pos_a"]
    t, x = r.series["gap/headroom"]
    assert t[0] == 1 and t[np.nanargmin(x)] == 46 and np.isnan(x[1])  # row 45 -> 46 updates; NaN: not probed
    assert r.collapse_step == 60 and r.group == "rl" and runs["held_ctrl"].group == "control"
    assert runs["cal_neg0"].collapse_step is None
    assert len(runs_with_seeds(runs.values(), parse_seeds("100-109"))) == 12
    assert {r.group for r in load_runs(study, by_length=True)} == {"rl long", "control long"}


def test_the_lm_head_log_joins_its_steps(study):
    d = study / "held_pos_a"
    (d / "lm_head.jsonl").write_text("\n".join(json.dumps({"step": k, "grad_norm": None if k == 3 else k / 10,
                                                            "update_norm": 0.5}) for k in range(5)) + "\n")
    runs = {r.name: r for r in load_runs(study)}
    t, x = runs["held_pos_a"].series["lm_head/grad_norm"]
    assert list(t[:5]) == [1, 2, 3, 4, 5] and np.allclose(x[:3], [0.0, 0.1, 0.2]) and np.isnan(x[3])
    assert np.isnan(x[5:]).all()  # steps the log does not cover
    assert "lm_head/grad_norm" not in runs["held_pos_b"].series  # a run without the log: the statistic is missing


def test_report_numbers_by_hand(study, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([str(study), "--calibration-seeds", "100-109", "--heldout-seeds", "200-209", "--out", str(out)]) == 0
    rows = {(r["alarm"], r["group"]): r for r in csv.DictReader(open(out / "alarm_table.csv"))}
    rl, ctrl = rows[("headroom_low", "rl")], rows[("headroom_low", "control")]
    # 10 calibration negatives at 10 %: one may fire; the cutoff sits just below the second-smallest minimum (2)
    thr = float(rl["threshold"])
    assert 2.0 - 1e-12 < thr < 2.0 and int(rl["cal_negatives"]) == 10 and int(rl["cal_false_alarms"]) == 1
    assert (int(rl["false_alarms"]), int(rl["n_negatives"]), int(rl["n_collapsing"])) == (1, 4, 3)
    # leads 14, 29 and a miss: median 14; detected at lead 10: 2 of 3; the control (scored, not calibrated): lead 9
    assert float(rl["median_lead"]) == 14 and float(rl["detected_10"]) == pytest.approx(2 / 3)
    assert float(ctrl["median_lead"]) == 9 and float(ctrl["detected_10"]) == 0
    assert float(rl["cutoff"]) == -thr  # a "below" threshold's cutoff in score units
    md = (out / "alarm_table.md").read_text()
    assert "| headroom_low | gap/headroom | exploratory | rl |" in md and specs_hash(ALARM_SPECS) in md
    spec = json.loads((out / "alarm_specs.json").read_text())
    assert spec["hash"] == specs_hash(ALARM_SPECS) and len(spec["specs"]) == len(ALARM_SPECS)
    # held-out ROC at lead 10: peaks (-h before c - 10) -0.1, -1.5, -10 against -0.5, -3, -4, -5: AUC 7/12
    roc = [r for r in csv.DictReader(open(out / "alarm_roc.csv"))
           if (r["alarm"], r["group"], r["lead"]) == ("headroom_low", "rl", "10")]
    assert roc and float(roc[0]["auc"]) == pytest.approx(7 / 12) and int(roc[0]["n_neg"]) == 4
    assert max(float(r["tpr"]) for r in roc if float(r["fpr"]) <= 0.25) == pytest.approx(2 / 3)
    # a statistic the runs never log is reported as not calibrated, not dropped
    assert rows[("curvature_high", "rl")]["note"].startswith("no never-collapsing run with 'warn/curv_gap'")


def test_overlapping_seeds_are_a_one_line_error(study, tmp_path, capsys):
    rc = main([str(study), "--calibration-seeds", "100-205", "--heldout-seeds", "200-209", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "overlap" in err[0]
    with pytest.raises(ValueError, match="seeds must look like"):
        parse_seeds("9-3")


def test_the_pilot_record_loads():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "docs" / "verdicts" / "testbed-pilot"
    runs = load_runs(root)
    with open(root / "runs.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(runs) == len(table) == 43
    by = {r.name: r for r in runs}
    for row in table:
        c = by[row["run"]].collapse_step
        assert (c is None) == (row["outcome"] != "collapsed")
        if c is not None:
            assert c == int(float(row["collapse_step"]))
    edge = by["method=grpo_lr=0.0003_seed=901"]
    assert edge.collapse_step == 80 and edge.series["reward"][0][0] == 1 and len(edge.series["reward"][0]) == 100
    assert math.isclose(edge.series["reward"][1][0], 0.398438)  # steps.csv's row of step 0


def test_freeze_selects_by_the_rule_and_decides_by_hand(study, tmp_path, capsys):
    """The frozen alarm: cutoffs from the calibration seeds alone; the primary probe alarm is the one detecting the
    most calibration collapses at its lead (only headroom is logged among the probe statistics here, so it is
    chosen; the constant scalar statistics detect nothing, so the baseline is the first baseline in spec order);
    held-out decisions by hand: headroom detects 2 of 3 at lead 10 (Wilson [0.21, 0.94]: undecided), the baseline
    0 of 3 (discordant 2, McNemar p 0.5: undecided), 1 of 4 false alarms (Wilson lower 0.05 <= 0.10: holds)."""
    from llm_probe.testbed.alarm_report import ALARM_CRITERIA, alarm_criteria_hash

    out = tmp_path / "out"
    assert main([str(study), "--calibration-seeds", "100-109", "--freeze", "--out", str(out)]) == 0
    frozen = json.loads((out / "alarm_frozen.json").read_text())
    assert frozen["primary"] == "headroom_low" and frozen["baseline"] == "reward_cusum"
    assert frozen["specs_hash"] == specs_hash(ALARM_SPECS) and frozen["criteria_hash"] == alarm_criteria_hash()
    assert alarm_criteria_hash({**ALARM_CRITERIA, "warns": {}}) != frozen["criteria_hash"]
    cut = {c["name"]: c["cutoff"] for c in frozen["calibrated"]}
    assert -2.0 < cut["headroom_low"] < -2.0 + 1e-12
    assert main([str(study), "--calibration-seeds", "100-109", "--heldout-seeds", "200-209", "--out", str(out),
                 "--frozen", str(out / "alarm_frozen.json")]) == 0
    d = {r["criterion"]: r for r in json.loads((out / "alarm_decisions.json").read_text())}
    assert (d["warns"]["k"], d["warns"]["n"], d["warns"]["verdict"]) == (2, 3, "undecided")
    assert d["beats_baseline"]["discordant"] == 2 and d["beats_baseline"]["p"] == pytest.approx(0.5)
    assert d["beats_baseline"]["verdict"] == "undecided"
    assert (d["false_alarms"]["k"], d["false_alarms"]["n"], d["false_alarms"]["verdict"]) == (1, 4, "holds")
    assert "| warns | headroom_low | 2/3" in (out / "alarm_table.md").read_text()
    # a frozen file that the calibration runs do not re-derive is refused in one line
    bad = dict(frozen, primary="curvature_high")
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    capsys.readouterr()
    rc = main([str(study), "--calibration-seeds", "100-109", "--heldout-seeds", "200-209", "--out", str(out),
               "--frozen", str(tmp_path / "bad.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "primary differs" in err[0]
    rc = main([str(study), "--calibration-seeds", "100-109", "--freeze", "--heldout-seeds", "200-209",
               "--out", str(out)])
    assert rc == 2
