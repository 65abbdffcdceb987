"""Run outcomes of tiny-Qwen runs (llm_probe.collapse.reward_outcome) and their use by the studies: labels on
constructed reward trajectories and on the committed trainer runs (tests/data), the 10-step sensitivity variant,
the onset of the final collapse against a plain loop, one-sided tests against enumeration.
Machinery only: no scientific outcome is asserted."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

import gapdyn
from llm_probe.collapse import (OUTCOME_FLOOR, OUTCOME_WINDOW, SENSITIVITY_WINDOW, CollapseConfig, CollapseDetector,
                                collapse_onset, outcome_counts, reward_outcome)

DATA = Path(__file__).parent / "data"
R0 = 0.4


def _detect(rewards, H=0.4):
    """Alerts of the online rule on a reward stream (entropy and diversity held healthy), baseline R0."""
    det = CollapseDetector(CollapseConfig(baseline_entropy=H, baseline_reward=R0))
    for k, r in enumerate(rewards):
        det.update(k, {"entropy": H, "reward": r, "completions/distinct_frac": 0.6})
    return det.alerts


def _loop_label(r, alerted, *, window=OUTCOME_WINDOW, floor=OUTCOME_FLOOR, heldout=None, fault=False):
    """The outcome rule written as plain loops (independent of the vectorised code)."""
    fin = lambda xs: [x for x in xs if x == x]  # noqa: E731
    if fault:
        return "failed"
    head, end = fin(r[:10]), fin(r[-window:])
    if not head or not end:
        return "failed"
    base, last = sum(head) / len(head), sum(end) / len(end)
    held = heldout is None or heldout[-1] < floor * heldout[0]
    if base >= 0.05 and last < floor * base and held:
        return "collapsed"
    return "recovered" if alerted else "healthy"


def test_alert_then_recovery_is_recovered_not_collapsed():
    """Reward drops to 0 for 20 steps (the alert rule fires), then returns to R0: an alert, not a collapse."""
    r = [R0] * 20 + [0.0] * 20 + [R0] * 40
    alerts = _detect(r)
    assert [a.rule for a in alerts] == ["reward_collapse"] and 20 <= alerts[0].step < 30
    out = reward_outcome(r, alerts=alerts)
    assert out.label == "recovered" == _loop_label(r, True)
    assert out.alerted and out.alerts == ((alerts[0].step, "reward_collapse"),) and out.onset is None
    ends = reward_outcome(r[:40] + [0.0] * 40, alerts=_detect(r[:40] + [0.0] * 40))
    assert ends.label == "collapsed" and ends.onset == 20


def test_mid_run_dip_below_the_floor_that_ends_above_is_not_collapsed():
    """Below 0.25 R0 for 15 steps in the middle, ending at 0.5 R0: not collapsed; without alerts healthy."""
    r = [R0] * 30 + [0.05] * 15 + [0.5 * R0] * 30
    assert reward_outcome(r).label == "healthy" == _loop_label(r, False)
    assert reward_outcome(r, alerts=[{"step": 33, "rule": "reward_collapse"}]).label == "recovered"
    just_below = [R0] * 30 + [0.24 * R0] * OUTCOME_WINDOW
    assert reward_outcome(just_below).label == "collapsed"  # the floor is strict: 0.24 R0 < 0.25 R0
    assert reward_outcome([R0] * 30 + [0.26 * R0] * OUTCOME_WINDOW).label == "healthy"


def test_numerical_fault_is_failed_and_never_pooled():
    r = [R0] * 30 + [0.0] * 10 + [np.nan] * 3
    assert reward_outcome(r, fault="stopped at step 42: 3 consecutive steps with a non-finite loss").label == "failed"
    assert reward_outcome([R0] * 30 + [np.nan] * OUTCOME_WINDOW).label == "failed"  # no finite reward at the end
    skipped = [R0] * 30 + [np.nan] + [R0] * 30  # one skipped step: left out of the means
    assert reward_outcome(skipped).label == "healthy" and reward_outcome(skipped).R_end == pytest.approx(R0)
    outs = [reward_outcome(r, fault=True), reward_outcome([R0] * 10 + [0.0] * 30), reward_outcome([R0] * 40)]
    assert outcome_counts(outs) == {"n": 3, "alerted": 0, "recovered": 0, "collapsed": 1, "healthy": 1, "failed": 1}


def test_heldout_accuracy_rule():
    """With held-out evaluations a run ends collapsed only when the final accuracy is also below 0.25 of the
    initial one."""
    r = [R0] * 10 + [0.0] * 40
    for acc, expect in (([0.6, 0.3, 0.1], "collapsed"), ([0.6, 0.3, 0.2], "healthy"), ([0.0, 0.0], "healthy")):
        out = reward_outcome(r, heldout=acc)
        assert out.label == expect == _loop_label(r, False, heldout=acc), acc
    assert reward_outcome(r, heldout=[0.6, 0.3]).heldout_ratio == pytest.approx(0.5)


def test_ten_step_sensitivity_variant():
    """A fall in the last 12 steps: the 10-step window calls it collapsed, the 25-step window does not."""
    r = [R0] * 50 + [0.0] * 12
    assert reward_outcome(r).label == "healthy"
    assert reward_outcome(r, window=SENSITIVITY_WINDOW).label == "collapsed" == _loop_label(r, False, window=10)


def test_labels_agree_with_the_loop_on_random_trajectories():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 80))
        r = np.clip(rng.uniform(0, 0.6) * rng.random(n) * (rng.random(n) < rng.uniform(0.2, 1)), 0, 1)
        r[rng.random(n) < 0.05] = np.nan
        alerted, w = bool(rng.random() < 0.5), int(rng.choice([SENSITIVITY_WINDOW, OUTCOME_WINDOW]))
        fault = bool(rng.random() < 0.1)
        out = reward_outcome(r, alerts=[3] if alerted else [], window=w, fault=fault)
        assert out.label == _loop_label(list(r), alerted, window=w, fault=fault)


def test_recorded_trainer_runs():
    """The committed healthy run (Adam 3e-4, no alert) ends healthy; cut at step 35 and followed by zero
    rewards, the replayed alert rule fires and the run ends collapsed with its onset at the cut (not the alert).
    The weak run (R0 ~ 0.003) has no reward to lose: never collapsed, even after a fall to 0."""
    def load(name):
        lines = (DATA / f"llm_{name}_metrics.jsonl").read_text().splitlines()
        return json.loads(lines[0]), [json.loads(ln)["reward"] for ln in lines[1:]]

    head, r = load("healthy_lr3e-4_s0")
    assert head["alerts"] == [] and reward_outcome(r).label == "healthy"
    cut = r[:35] + [0.0] * 30
    det = CollapseDetector(CollapseConfig())
    det.set_baseline(head["baseline"]["entropy"], head["baseline"]["reward"])
    for k, x in enumerate(cut):
        det.update(k, {"entropy": head["baseline"]["entropy"], "reward": x, "completions/distinct_frac": 0.6})
    assert det.alerts and det.alerts[0].step > 35
    out = reward_outcome(cut, alerts=det.alerts)
    assert out.label == "collapsed" and out.onset == 35 and out.alerts[0][0] > out.onset
    _, weak = load("weak_lr3e-4_s2")
    assert reward_outcome(weak).label == "healthy" and reward_outcome(weak[:10] + [0.0] * 30).label == "healthy"


def test_onset_is_the_first_step_of_the_final_collapse():
    """Constructed: a dip at 20-29 that recovers, the final fall at 60 with one noisy step above the floor right
    after it (at 61): the onset is 62, not the dip and not the fall's first step."""
    r = [R0] * 20 + [0.0] * 10 + [R0] * 30 + [0.0, 0.9 * R0] + [0.01] * 30
    out = reward_outcome(r)
    assert out.label == "collapsed" and out.onset == 62
    assert collapse_onset(r, OUTCOME_FLOOR * out.R0) == 62


def test_onset_matches_a_loop_and_exists_for_every_collapsed_run():
    rng = np.random.default_rng(1)
    for _ in range(300):
        n = int(rng.integers(1, 60))
        if rng.random() < 0.5:  # continuous draws
            r, level = rng.random(n) * rng.uniform(0.05, 1), float(rng.uniform(0.05, 0.5))
        else:  # eighths: exact sums, so ties with the level occur and the strict "<" is tested
            r, level = rng.integers(0, 5, n) / 8, float(rng.integers(1, 4)) / 8
        loop = next((k for k in range(n) if all(np.mean(r[k:j + 1]) < level for j in range(k, n))), None)
        assert collapse_onset(r, level) == loop
        if np.mean(r[-min(n, OUTCOME_WINDOW):]) < level:
            assert loop is not None  # an end segment below the level always holds an onset


@pytest.mark.parametrize("kwargs,name", [(dict(rewards=[0.2, 1.5]), "rewards"), (dict(rewards=[[0.1]]), "rewards"),
                                         (dict(rewards=[0.1], window=0), "window"),
                                         (dict(rewards=[0.1], floor=1.2), "floor"),
                                         (dict(rewards=[0.1], heldout=[0.5]), "heldout"),
                                         (dict(rewards=[0.1], alerts=[-1]), "alerts"),
                                         (dict(rewards=[0.1], baseline_steps=True), "baseline_steps")])
def test_bad_inputs_name_the_argument(kwargs, name):
    r = kwargs.pop("rewards")
    with pytest.raises(ValueError, match=name):
        reward_outcome(r, **kwargs)


# ---- the studies' tests and tables -----------------------------------------------------------------------------
def test_one_sided_wilcoxon_equals_the_exact_signed_rank_null():
    """p = share of the 2^n sign vectors whose positive-rank sum is >= the observed one (no ties)."""
    from llm_probe.experiments.ablation import one_sided_wilcoxon

    rng = np.random.default_rng(2)
    for n in (3, 6, 9):
        x, y = rng.normal(0.3, 1, n), rng.normal(0, 1, n)
        d = x - y
        ranks = np.argsort(np.argsort(np.abs(d))) + 1
        obs = ranks[d > 0].sum()
        null = [sum(rk for rk, s in zip(ranks, signs) if s) for signs in itertools.product((0, 1), repeat=n)]
        assert one_sided_wilcoxon(x, y) == pytest.approx(np.mean(np.array(null) >= obs), abs=1e-12)
    assert one_sided_wilcoxon([1.0, 2.0], [1.0, 2.0]) == 1.0


def test_survival_table_counts_outcomes_and_keeps_failed_apart():
    import pandas as pd

    from llm_probe.experiments.ablation import survival_table

    labels = ["collapsed", "collapsed", "recovered", "healthy", "failed"]
    runs = pd.DataFrame({"method": "grpo", "lr": 4e-4, "outcome": labels,
                         "outcome_w10": ["collapsed"] * 3 + ["healthy"] * 2,
                         "alerted": [True, False, True, False, True], "reward_last25": 0.1, "heldout_acc_final": 0.2})
    row = survival_table(runs).iloc[0]
    assert (row.n, row.alerted, row.recovered, row.collapsed, row.failed, row.collapsed_w10) == (5, 3, 1, 2, 1, 3)
    cp = gapdyn.clopper_pearson_interval(2, 4)  # the collapse rate among the 4 runs that did not fail
    assert (row.rate, row.cp_lo, row.cp_hi) == (0.5, cp.lo, cp.hi)


def test_wapo_grpo_claims_are_one_sided_primaries_on_terminal_outcomes():
    import pandas as pd

    from llm_probe.experiments.ablation import SPECS, wapo_grpo_claims

    seeds = range(8)
    g_col = [True, True, True, False, False, False, True, False]
    w_col = [False, True, False, False, False, False, False, False]
    failed = [False] * 7 + [True]  # seed 7's GRPO run failed: the pair is left out
    rows = [{"method": "grpo", "lr": 4e-4, "seed": s, "collapsed": c, "failed": f, "reward_last25": 0.1 + 0.01 * s}
            for s, c, f in zip(seeds, g_col, failed)]
    rows += [{"method": "wapo", "lr": 4e-4, "seed": s, "collapsed": c, "failed": False, "reward_last25": 0.2 + 0.02 * s}
             for s, c in zip(seeds, w_col)]
    claims = {c.id.split("@")[0]: c for c in wapo_grpo_claims(pd.DataFrame(rows), 4e-4, rng=np.random.default_rng(0),
                                                               n_boot=200)}
    col, rew = claims["llm.wapo_fewer_collapses"], claims["llm.wapo_higher_reward"]
    assert col.n == rew.n == 7 and col.primary and rew.primary and col.form == rew.form == "comparison"
    fisher = gapdyn.fisher_exact_test([[4, 3], [1, 6]], alternative="greater")  # seeds 0-6
    assert col.p_value == pytest.approx(fisher.p_value) and col.estimate == pytest.approx(3 / 7)
    assert rew.p_value == pytest.approx(1 / 2**7)  # every pair favours WAPO: the smallest exact one-sided p
    assert col.criterion_text.endswith(SPECS["llm.wapo_fewer_collapses"].criterion.describe())
    assert not SPECS["llm.wapo_passk_not_lower"].primary and not SPECS["llm.nsr_passk_above_psr"].primary


def test_early_warning_labels_come_from_the_outcome(tmp_path):
    """A constructed study: a run that ends collapsed (fall at step 30, first alert later), one that alerts and
    recovers, one healthy, one failed. Positives: the collapsed run at its onset (30, not the alert); negatives:
    the healthy and the recovered run; the failed run is in the frame but in no table."""
    from llm_probe.experiments.early_warning import PRIMARY, load_study_steps, report, warning_table

    fall = [R0] * 30 + [0.0] * 30
    dip = [R0] * 20 + [0.0] * 10 + [R0] * 30
    runs = {"grpo_lr0.0004_s0": (fall, None), "grpo_lr0.0004_s1": (dip, None), "wapo_lr0.0004_s0": ([R0] * 60, None),
            "wapo_lr0.0004_s1": ([R0] * 20 + [0.0] * 3, "stopped at step 22")}
    for i, (name, (rew, fault)) in enumerate(runs.items()):
        d = tmp_path / "runs" / name
        d.mkdir(parents=True)
        alerts = {a.step: a.rule for a in _detect(rew)}
        rows = [{"step": k, "reward": r, "warn/curv_gap": float(k), **({"alerts": [alerts[k]]} if k in alerts else {})}
                for k, r in enumerate(rew)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "eval.jsonl").write_text(json.dumps({"step": 0, "acc": 0.5, "entropy": 1.0}) + "\n"
                                      + json.dumps({"step": len(rew), "acc": 0.1 if rew is fall else 0.5,
                                                    "entropy": 1.0}) + "\n")
        method, lr, seed = name.split("_")
        (d / "done.json").write_text(json.dumps({"method": method, "lr": 4e-4, "seed": int(seed[1:]), "fault": fault,
                                                 "collapsed": bool(alerts), "collapse_step": min(alerts, default=-1)}))
    steps = load_study_steps(tmp_path)
    by = steps.groupby("run").first()
    assert sorted(by.outcome) == ["collapsed", "failed", "healthy", "recovered"]
    col = by[by.outcome == "collapsed"].iloc[0]
    assert col.collapse_step == 30 and _detect(fall)[0].step > 30  # the onset, not the first alert
    tab = warning_table(steps, n_permutations=99, n_boot=99)
    row = tab[tab.lr == "all"].set_index("statistic").loc["curv_gap"]
    assert (row["n_collapsed"], row["n_negative"]) == (1, 2) and row["auc_L0"] == 0.5  # curv_gap = step everywhere: ties
    report(tmp_path)  # the CLI's files: the table and the claims (json round-trips, verdicts re-decided)
    assert (tmp_path / "early_warning.csv").exists() and (tmp_path / "early_warning_claims.md").exists()
    claims = gapdyn.claims_from_json((tmp_path / "early_warning_claims.json").read_text())
    assert {c.id for c in claims if c.primary} == {f"llm.warning.{n}_beats_reward" for n in PRIMARY}
