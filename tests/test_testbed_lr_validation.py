"""llm_probe.testbed.lr_validation: ground truth, predictions and the predictor table on a synthetic study folder."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llm_probe.testbed.lr_validation import ground_truth, length_scaling, predictions, predictor_table

LRS = (1e-4, 2e-4, 3e-4, 4e-4)


def _summary(lr, seed, outcome, length="long", acc_after=0.5):
    return {"setting": {"method": "grpo", "length": length, "size": "small", "control": False, "lr": lr},
            "seed": seed, "outcome": outcome, "heldout_acc_before": 0.3, "heldout_acc_after": acc_after,
            "completion_tokens_median_before": 40 if length == "long" else 20}


def _study(tmp_path):
    out = []
    for seed in range(4):
        for lr in LRS:
            outcome = "collapsed" if lr > 3e-4 or (lr == 3e-4 and seed < 2) else "learned"
            s = _summary(lr, seed, outcome, acc_after=0.0 if outcome == "collapsed" else 0.6 + lr * 100)
            d = tmp_path / f"lr={lr}_seed={seed}"
            d.mkdir()
            (d / "summary.json").write_text(json.dumps(s))
            rows = [{"step": k, "gap/headroom_lr": (k + 1) * 1e-5} if k % 5 == 0 else {"step": k} for k in range(30)]
            (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
            out.append(s)
    return out


def test_ground_truth_counts_and_best_lr(tmp_path):
    gt = ground_truth(_study(tmp_path))
    (key, g), = gt.items()
    assert key == ("grpo", "long", "small", False) and g["n"] == 16
    assert list(g["per_lr"]["collapsed"]) == [0, 0, 2, 4] and list(g["per_lr"]["learned"]) == [4, 4, 2, 0]
    assert g["best_lr"] == 2e-4  # P(learned) ties at 1e-4 and 2e-4, broken by the final accuracy
    assert 2e-4 < g["lr50"].lr < 4e-4 and g["lr10"].lr < g["lr50"].lr
    assert g["T"] == 40 and g["J"] == pytest.approx(0.3)


def test_predictions_use_the_steps_before_K_only(tmp_path):
    _study(tmp_path)
    preds = predictions(tmp_path, K=20)
    assert len(preds) == 16
    # probed steps 0, 5, 10, 15 -> headroom_lr 1e-5, 6e-5, 11e-5, 16e-5: the lower median 6e-5
    assert all(p["steps"] == 4 and p["suggested_lr"] == pytest.approx(6e-5) for p in preds)


def test_predictor_table_ratios_against_lr10(tmp_path):
    S = _study(tmp_path)
    gt = ground_truth(S)
    table = predictor_table(gt, predictions(tmp_path, K=20))
    lr10 = next(iter(gt.values()))["lr10"].lr
    head = table[table["predictor"].str.startswith("headroom")]
    assert set(head["runs"]) == {4} and np.allclose(head["ratio_median"], 6e-5 / lr10)
    assert set(head["safe_share"]) == {1.0}
    best = table[table["predictor"] == "best tested lr"].iloc[0]
    assert best["lr"] == 2e-4 and best["P_learned_at"] == 1.0


def test_length_scaling_fixes_the_constant_on_the_reference(tmp_path):
    S = _study(tmp_path) + [_summary(lr, 9, "collapsed" if lr >= 2e-4 else "learned", length="short")
                            for lr in LRS for _ in range(3)]
    t = length_scaling(ground_truth(S)).set_index("length")
    assert t.loc["long", "lr10_predicted"] == pytest.approx(t.loc["long", "lr10_measured"])
    # same J, half the T: Thm 3's scaling predicts twice the reference lr10
    assert t.loc["short", "lr10_predicted"] == pytest.approx(2 * t.loc["long", "lr10_measured"])


def test_decide_reads_the_criteria(tmp_path):
    from llm_probe.testbed.lr_validation import CRITERIA, lr_criteria_hash, decide

    S = _study(tmp_path)
    gt = ground_truth(S)
    v = {d["criterion"]: d["verdict"] for d in decide(predictor_table(gt, predictions(tmp_path, K=20)))}
    assert v["safe"] == "undecided"  # 4/4 safe: Wilson lower end 0.51 < 0.8
    assert v["informative"] == "not measured"  # the suggestion 6e-5 lies below the tested grid
    assert len(lr_criteria_hash()) == 16 and lr_criteria_hash() != lr_criteria_hash({**CRITERIA, "K": 10})


def test_report_command_writes_its_tables(tmp_path, capsys):
    from llm_probe.testbed.lr_validation import lr_criteria_hash, main

    _study(tmp_path / "study" if (tmp_path / "study").mkdir() is None else None)
    assert main([str(tmp_path / "study"), "--out", str(tmp_path / "rep"), "--seeds", "0-2"]) == 0
    for name in ("dose_response.csv", "critical_lrs.csv", "predictor_table.csv", "length_scaling.csv",
                 "verdicts.csv", "lr_number.md", "criteria.json"):
        assert (tmp_path / "rep" / name).is_file()
    assert f"12 runs, criteria hash {lr_criteria_hash()}" in capsys.readouterr().out
    assert main([str(tmp_path / "nothing"), "--out", str(tmp_path / "rep2")]) != 0


def test_reproduction_by_hand():
    """The reproduction verdict from constructed fits: overlapping intervals and a ratio within the factor hold,
    disjoint intervals do not, an overlap with a ratio outside the factor is undecided, a non-finite end is not
    measured; settings absent from the reference are left out."""
    from types import SimpleNamespace as N

    from llm_probe.testbed.lr_validation import CRITERIA, reproduction

    def gt(lr, lo, hi):
        return {"lr10": N(lr=lr, lo=lo, hi=hi)}

    f = CRITERIA["reproduces"]["factor"]

    def k(m):
        return (m, "long", "small", False)

    ref = {k("a"): gt(3e-4, 2.8e-4, 3.2e-4), k("b"): gt(3e-4, 2.8e-4, 3.2e-4), k("c"): gt(3e-4, 2.0e-4, 4.0e-4),
           k("d"): gt(3e-4, 2.8e-4, float("inf"))}
    held = {k("a"): gt(3.1e-4, 2.9e-4, 3.3e-4), k("b"): gt(4e-4, 3.5e-4, 4.5e-4),
            k("c"): gt(3e-4 * f * 1.05, 3.0e-4, 4.0e-4), k("d"): gt(3e-4, 2.8e-4, 3.2e-4), k("e"): gt(1, 1, 1)}
    t = reproduction(held, ref).set_index("method")
    assert list(t["verdict"]) == ["holds", "does not hold", "undecided", "not measured"]
    assert t.loc["a", "ratio"] == pytest.approx(3.1 / 3)


def test_report_compares_with_reference_seeds(tmp_path, capsys):
    from llm_probe.testbed.lr_validation import main

    _study(tmp_path / "study" if (tmp_path / "study").mkdir() is None else None)
    assert main([str(tmp_path / "study"), "--out", str(tmp_path / "rep"), "--seeds", "0-1",
                 "--reference-seeds", "2-3"]) == 0
    assert (tmp_path / "rep" / "reproduction.csv").is_file() and "reproduces" in capsys.readouterr().out
    assert main([str(tmp_path / "study"), "--out", str(tmp_path / "rep"), "--seeds", "0-2",
                 "--reference-seeds", "2-3"]) == 2
