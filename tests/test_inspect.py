"""``gapdyn inspect RUN`` (llm_probe.inspect_run) on a real trl.GRPOTrainer output folder, on gapdyn train folders
and on constructed logs whose outcome and suggestion are known by construction:

- the suggested lr (the lr finder's rule: the median over the first 20 probed steps) read back from TRL's
  trainer_state.json equals what the callback computed while it ran (its ``gap/suggested_lr`` log rows;
  ``GapProbeCallback.summary()`` on a fresh run) and a sorted list's median, with the same step count;
- R0 / R_end equal plain means of the logged rewards; a TRL row logged every L > 1 steps covers L steps;
- the reward-only variant is said so, and held-out accuracy (a testbed summary.json) changes the verdict;
- a missing folder, a folder without logs, an empty log: one line, exit 2; the newest checkpoint-N is read;
- ``gapdyn inspect --help`` and its errors import nothing heavy.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from llm_probe.inspect_run import inspect_run, main, read_run

DATA = Path(__file__).resolve().parent / "data"
TRL_STATE = DATA / "trl_grpo_probe_trainer_state.json"
"""trainer_state.json of ``python examples/trl_grpo_probe.py --steps 12 --probe-every 2`` (trl GRPOTrainer, CPU)."""


def _lower_median(v):
    """The lower median, by sorting: an independent route to the lr finder's rule (llm_probe.suggest)."""
    v = sorted(v)
    return v[(len(v) - 1) // 2]


def _trl_folder(tmp_path, rows, logging_steps=1, max_steps=None, name="run"):
    d = tmp_path / name
    d.mkdir()
    state = {"log_history": rows, "logging_steps": logging_steps, "global_step": rows[-1]["step"] if rows else 0,
             "max_steps": max_steps or (rows[-1]["step"] if rows else 0)}
    (d / "trainer_state.json").write_text(json.dumps(state))
    return d


# ---- a real GRPOTrainer run ----------------------------------------------------------------------------------

def test_real_trl_run_report_matches_what_the_callback_logged(tmp_path):
    run = tmp_path / "trl"
    run.mkdir()
    shutil.copy(TRL_STATE, run / "trainer_state.json")
    rep = inspect_run(run, tmp_path / "out")
    hist = json.loads(TRL_STATE.read_text())["log_history"]
    gap_rows = [r for r in hist if "gap/headroom" in r]
    # the callback's own suggestion, logged at train time from its in-memory history
    assert rep["suggested"]["suggested_lr"] == pytest.approx(gap_rows[-1]["gap/suggested_lr"], rel=1e-12)
    lr_h = [r["gap/headroom_lr"] for r in gap_rows[:20] if np.isfinite(r["gap/headroom_lr"])]
    assert rep["suggested"]["steps"] == len(lr_h) > 0
    assert rep["suggested"]["suggested_lr"] == _lower_median(lr_h)
    # the outcome's R0 and R_end: plain means of TRL's logged rewards (logging_steps = 1)
    r = [row["reward"] for row in hist if "reward" in row]
    assert rep["outcome"]["R0"] == pytest.approx(np.mean(r[:10]))
    assert rep["outcome"]["R_end"] == pytest.approx(np.mean(r[-25:]))
    text = "\n".join(rep["text"])
    assert "reward only" in text and "probed steps" in text
    assert rep["curves"] == ["reward", "entropy", "alignment", "headroom"]
    png = tmp_path / "out" / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "out" / "report.txt").read_text().splitlines()[:3] == rep["text"][:3]


@pytest.mark.llm
@pytest.mark.slow  # ~20 s at load 10: a fresh GRPOTrainer run (the committed state above is the default suite's)
def test_inspect_the_example_output_folder_as_written(tmp_path, capsys):
    """examples/trl_grpo_probe.py's output folder, as the example leaves it: the report's suggestion is the one
    GapProbeCallback.summary() gives from the same run's in-memory history."""
    pytest.importorskip("trl")
    import runpy

    import torch

    torch.set_num_threads(1)
    example = Path(__file__).resolve().parents[1] / "examples" / "trl_grpo_probe.py"
    trainer, cb = runpy.run_path(str(example))["main"](["--steps", "4", "--probe-every", "1",
                                                         "--out", str(tmp_path / "run")])
    capsys.readouterr()
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "rep")]) == 0
    printed = capsys.readouterr().out
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    s = cb.summary()
    assert rep["suggested"]["suggested_lr"] == pytest.approx(s["suggested_lr"], rel=1e-12)
    assert rep["suggested"]["steps"] == s["suggested_lr_steps"] == 4
    assert f"over the first {s['suggested_lr_steps']} probed steps" in printed
    assert (tmp_path / "rep" / "curves.png").is_file()


def test_a_trl_run_says_the_callback_cannot_log_the_alarms_statistic(tmp_path):
    """The frozen alarm reads warn/curv_gap, which a real GapProbeCallback run never logs (the committed state: the
    callback's keys, read back): on a TRL folder the report says the callback does not log it, not that this run
    happened to miss it; a gapdyn train folder without it still reads "the run logged no"."""
    from llm_probe.inspect_run import CALLBACK_WARN_STATS, FROZEN_ALARM

    frozen = json.loads(FROZEN_ALARM.read_text())
    stat = next(c["statistic"] for c in frozen["calibrated"] if c["name"] == frozen["primary"])
    hist = json.loads(TRL_STATE.read_text())["log_history"]
    logged = {k for r in hist for k in r}
    assert "gap/headroom" in logged and stat not in logged and stat not in CALLBACK_WARN_STATS
    run = tmp_path / "trl"
    run.mkdir()
    shutil.copy(TRL_STATE, run / "trainer_state.json")
    (line,) = [t for t in inspect_run(run, figure=False)["text"] if t.startswith("alarm ")]
    assert f"not available on a TRL run: GapProbeCallback does not log {stat}" in line
    (line,) = [t for t in inspect_run(_gapdyn_folder(tmp_path, [0.5] * 10), figure=False)["text"]
               if t.startswith("alarm ")]
    assert f"the run logged no {stat}" in line


# ---- gapdyn train folders -------------------------------------------------------------------------------------

def _gapdyn_folder(tmp_path, rewards, *, headroom=None, alerts=(), summary=None, name="gt"):
    d = tmp_path / name
    d.mkdir()
    rows = []
    for k, r in enumerate(rewards):
        row = {"step": k, "lr": 3e-4, "reward": r, "entropy": 0.4, "completions/distinct_frac": 0.5}
        if headroom is not None and k % 2 == 0:
            row.update({"gap/headroom": headroom[k // 2], "gap/headroom_lr": 3e-4 * headroom[k // 2],
                        "gap/cos_update_mean": 0.1})
        rows.append(row)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "alerts.json").write_text(json.dumps([{"step": s, "rule": rule, "value": 0.0, "threshold": 0.1}
                                               for s, rule in alerts]))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    return d


def test_gapdyn_train_folder_suggestion_and_outcome(tmp_path):
    rng = np.random.default_rng(3)
    h = list(rng.lognormal(0.0, 1.0, 30))
    h[4] = float("nan")  # a zero update: no measured h
    rewards = [0.5] * 20 + [0.02] * 40
    d = _gapdyn_folder(tmp_path, rewards, headroom=h, alerts=[(24, "reward_collapse")])
    rep = inspect_run(d, tmp_path / "out")
    kept = [x for x in h if not math.isnan(x)][:20]  # the first 20 probed steps with a value (h[4] has none)
    assert rep["suggested"]["steps"] == len(kept) == 20
    assert rep["suggested"]["suggested_lr"] == pytest.approx(_lower_median([3e-4 * x for x in kept]), rel=1e-12)
    assert rep["outcome"]["label"] == "collapsed"
    assert rep["outcome"]["onset"] == 20  # the first step of the final collapse (steps k from 0)
    assert rep["outcome"]["alerts"] == [[24, "reward_collapse"]] and rep["outcome"]["alerts_source"] == "the run's own"
    assert "steps k = 0..59" in rep["text"][0]


def test_the_suggestion_rests_on_the_first_twenty_probed_steps(tmp_path):
    h = list(np.linspace(0.1, 8.0, 70))  # rising: the first 20 hold the smallest values
    d = _gapdyn_folder(tmp_path, [0.4] * 140, headroom=h)
    s = inspect_run(d)["suggested"]
    assert s["steps"] == 20
    assert s["suggested_lr"] == pytest.approx(_lower_median([3e-4 * x for x in h[:20]]), rel=1e-12)


def test_heldout_accuracy_replaces_the_reward_only_variant(tmp_path):
    rewards = [0.5] * 20 + [0.05] * 40  # the reward alone would call it collapsed
    summary = {"heldout_acc_before": 0.6, "evaluations": [{"step": 30, "acc": 0.5}, {"step": 60, "acc": 0.55}],
               "outcome": "healthy", "setting": {"steps": 60}}
    with_acc = inspect_run(_gapdyn_folder(tmp_path, rewards, summary=summary, name="a"))
    without = inspect_run(_gapdyn_folder(tmp_path, rewards, name="b"))
    assert without["outcome"]["label"] == "collapsed" and without["outcome"]["reward_only"]
    assert with_acc["outcome"]["label"] == "healthy" and not with_acc["outcome"]["reward_only"]
    assert "reward and held-out accuracy" in with_acc["text"][1]
    assert any("own outcome" in t and "healthy" in t for t in with_acc["text"])


def test_the_real_gapdyn_train_layout(tmp_path):
    """A folder as ``gapdyn train`` writes it, parquet only (metrics.jsonl removed) read the same as the JSONL."""
    pd = pytest.importorskip("pandas")
    d = _gapdyn_folder(tmp_path, [0.3, 0.4, 0.5, 0.4] * 5, headroom=[1.0, 2.0] * 5)
    a = inspect_run(d)
    rows = [json.loads(ln) for ln in (d / "metrics.jsonl").read_text().splitlines()]
    pd.DataFrame(rows).to_parquet(d / "metrics.parquet")  # keys a row lacks become NaN, as in gapdyn train's table
    (d / "metrics.jsonl").unlink()
    b = inspect_run(d)
    assert a["outcome"] == b["outcome"] and a["suggested"] == b["suggested"]


# ---- TRL logs: logging intervals, alerts, running runs ----------------------------------------------------------

def test_trl_rows_every_L_steps_cover_their_interval(tmp_path):
    L = 3
    vals = [0.6, 0.5, 0.55, 0.1, 0.05, 0.0, 0.0, 0.02, 0.0, 0.0, 0.01, 0.0]
    rows = [{"step": L * (i + 1), "reward": v, "entropy": 1.0, "learning_rate": 1e-6} for i, v in enumerate(vals)]
    log = read_run(_trl_folder(tmp_path, rows, logging_steps=L))
    per_step = log.per_step("reward")
    loop = [vals[j // L] for j in range(L * len(vals))]  # step j + 1 lies in row j // L's interval
    assert per_step.tolist() == loop
    rep = inspect_run(log)
    assert rep["outcome"]["R0"] == pytest.approx(np.mean(loop[:10]))
    assert rep["outcome"]["R_end"] == pytest.approx(np.mean(loop[-25:]))


def test_replayed_alerts_are_events_and_said_so(tmp_path):
    rewards = [0.5] * 20 + [0.0] * 30
    rows = [{"step": k + 1, "reward": r, "entropy": 1.0} for k, r in enumerate(rewards)]
    rep = inspect_run(_trl_folder(tmp_path, rows, max_steps=100))
    assert rep["outcome"]["label"] == "collapsed" and rep["outcome"]["onset"] == 21  # steps done
    assert rep["outcome"]["alerts_source"] == "replayed"
    assert [a[1] for a in rep["outcome"]["alerts"]] == ["reward_collapse"]
    assert rep["outcome"]["alerts"][0][0] > 21
    text = "\n".join(rep["text"])
    assert "an alert is an event, not a collapse" in text
    assert "50 of 100 steps logged" in text
    assert "suggested lr: not available" in text and "not logged: alignment, headroom" in text


def test_rewards_outside_unit_interval_leave_the_outcome_undecided(tmp_path):
    rows = [{"step": k + 1, "reward": 2.0 - k * 0.1, "entropy": 1.0} for k in range(30)]
    rep = inspect_run(_trl_folder(tmp_path, rows))
    assert rep["outcome"]["label"] is None
    assert "not decided" in rep["text"][1] and "[-0.9, 2]" in rep["text"][1]


def test_a_running_run_is_read_from_its_newest_checkpoint(tmp_path):
    d = tmp_path / "running"
    for n in (9, 10):  # numeric order: checkpoint-10 is newer than checkpoint-9
        (d / f"checkpoint-{n}").mkdir(parents=True)
        rows = [{"step": k + 1, "reward": 0.5, "entropy": 1.0} for k in range(n)]
        (d / f"checkpoint-{n}" / "trainer_state.json").write_text(json.dumps({"log_history": rows,
                                                                              "max_steps": 40}))
    log = read_run(d)
    assert log.source.parent.name == "checkpoint-10" and int(log.steps[-1]) == 10
    assert any("checkpoint-10" in n for n in inspect_run(d)["text"])


# ---- errors and import sets -----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["missing", "empty", "no_rows", "bad_json", "other_file"])
def test_bad_runs_end_with_one_line_exit_2(tmp_path, capsys, case):
    if case == "missing":
        run = tmp_path / "nope"
    elif case == "empty":
        run = tmp_path / "e"
        run.mkdir()
    elif case == "no_rows":
        run = _trl_folder(tmp_path, [])
    elif case == "bad_json":
        run = tmp_path / "b"
        run.mkdir()
        (run / "trainer_state.json").write_text("{not json")
    else:
        run = tmp_path / "x.txt"
        run.write_text("hi")
    assert main([str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gapdyn inspect: error: RUN:"), err
    assert not (tmp_path / "out").exists()


def test_a_parent_folder_names_the_runs_below(tmp_path, capsys):
    _gapdyn_folder(tmp_path, [0.5] * 4, name="seed0")
    assert main([str(tmp_path)]) == 2
    assert "['seed0'] hold runs" in capsys.readouterr().err


def test_help_and_errors_import_nothing_heavy(tmp_path):
    from tests.test_imports_cli import heavy, run_cases

    _, results = run_cases([{"argv": ["inspect", "--help"]}, {"argv": ["inspect", str(tmp_path / "none")]},
                            {"argv": ["inspect"]}], tmp_path)
    for r in results:
        assert heavy(r["modules"]) == [] and "torch" not in r["modules"], (r["argv"], heavy(r["modules"]))
    assert [r["rc"] for r in results] == [0, 2, 2]
    assert all(len(r["stderr"].strip().splitlines()) == 1 for r in results[1:])


def test_the_frozen_alarm_is_replayed_on_the_logged_statistic(tmp_path, capsys):
    """A frozen alarm (curvature_high: the mean of the last two logged warn/curv_gap values at or above 2.5) fires
    at the first row where that mean reaches it, by hand: (3.0 + 5.0) / 2 at row k = 8 (clock k + 1 = 9; the NaN row
    is not logged, every earlier pair's mean is below 2.5); a run that never reaches it does not fire; a run without
    the statistic says so; the committed testbed file is the default; --alarm reads another file."""
    from gapdyn.evidence.detectors import Threshold
    from llm_probe.inspect_run import FROZEN_ALARM, main
    from llm_probe.testbed.alarm_report import ALARM_SPECS

    spec = next(s for s in ALARM_SPECS if s.name == "curvature_high")
    det = spec.detector.at_cutoff(2.5)
    assert isinstance(det, Threshold)
    frozen = {"calibrated": [{**spec.to_dict(), "detector": det.to_dict(), "cutoff": 2.5}], "primary": spec.name}
    f = tmp_path / "alarm_frozen.json"
    f.write_text(json.dumps(frozen))
    curv = [0.5, 1.0, 2.0, float("nan"), 1.5, 2.4, 0.1, 3.0, 5.0, 0.2]
    d = _gapdyn_folder(tmp_path, [0.5] * 10)
    rows = [json.loads(ln) for ln in (d / "metrics.jsonl").read_text().splitlines()]
    (d / "metrics.jsonl").write_text("".join(json.dumps({**r, "warn/curv_gap": c}) + "\n" for r, c in zip(rows, curv)))
    rep = inspect_run(d, alarm=f, figure=False)
    (a,) = rep["alarm"]
    assert a["fired_step"] == 9 and a["logged"] == 9 and "fired at step k = 8 (warn/curv_gap = 5)" in rep["text"][-2]
    quiet = _gapdyn_folder(tmp_path, [0.5] * 10, name="quiet")
    assert inspect_run(quiet, alarm=f, figure=False)["alarm"][0]["fired_step"] is None
    assert "the run logged no warn/curv_gap" in "\n".join(inspect_run(quiet, figure=False)["text"])
    assert FROZEN_ALARM.is_file() and json.loads(FROZEN_ALARM.read_text())["primary"]
    capsys.readouterr()
    assert main([str(d), "--out", str(tmp_path / "o"), "--no-figure", "--alarm", str(f)]) == 0
    assert "fired at step k = 8" in capsys.readouterr().out
