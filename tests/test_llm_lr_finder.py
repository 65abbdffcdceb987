"""``gapdyn lr-finder``: the suggestion rule against a hand-sorted median and order-statistic interval, the command
end to end on a saved tiny Qwen with a JSONL task (the printed count and median recomputed from the run's own
metrics), and its one-line refusals. Machinery only: whether the suggested lr is safe is the testbed study's."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from llm_probe.lr_finder import lr_suggestion, main

torch = pytest.importorskip("torch")


def test_suggestion_is_the_lower_median_with_its_order_statistic_interval():
    rng = np.random.default_rng(0)
    vals = rng.lognormal(-9, 0.5, size=10)
    rows = [{"step": k, "gap/headroom_lr": float(v), "gap/headroom": float(v) * 1e4} for k, v in enumerate(vals)]
    rows += [{"step": 10, "gap/headroom_lr": float("nan"), "gap/headroom": float("nan")}, {"step": 11}]
    r = lr_suggestion(rows)
    srt = sorted(vals)
    # n = 10 at 95 %: P(B <= 1) = 11/1024 <= 0.025 < P(B <= 2) = 56/1024, so [x_(2), x_(9)]
    assert (r["suggested_lr"], r["lo"], r["hi"]) == (srt[4], srt[1], srt[8])
    assert r["steps"] == 10 and r["probed"] == 11 and r["headroom_median"] == pytest.approx(srt[4] * 1e4)
    few = lr_suggestion(rows[:3])
    assert few["steps"] == 3 and (few["lo"], few["hi"]) == (-math.inf, math.inf)
    assert lr_suggestion([{"step": 0}])["steps"] == 0


def _qa(path):
    path.write_text("".join(json.dumps({"question": f"{a}+{b}=", "answer": f"#### {a + b}"}) + "\n"
                            for a in range(10, 30, 3) for b in range(40, 60, 4)))
    return path


def test_end_to_end_on_a_saved_tiny_model(tmp_path, capsys):
    from tests.llm_helpers import saved_warm_model

    model = saved_warm_model(tmp_path / "model")
    out = tmp_path / "out"
    rc = main(["--model", str(model), "--task", str(_qa(tmp_path / "qa.jsonl")), "--lr", "1e-3", "--steps", "3",
               "--prompts-per-step", "3", "--group-size", "4", "--max-new-tokens", "5", "--out", str(out),
               "--no-progress", "--device", "cpu", "--seed", "1"])
    text = capsys.readouterr().out
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all("gap/headroom_lr" in r for r in rows)  # probed every step
    lr_h = sorted(v for r in rows if math.isfinite(v := float(r["gap/headroom_lr"])))
    r = json.loads((out / "lr_finder.json").read_text())
    assert r["steps"] == len(lr_h) and r["K"] == 3 and r["probe_lr"] == 1e-3
    if lr_h:
        assert rc == 0 and r["suggested_lr"] == lr_h[(len(lr_h) - 1) // 2]
        assert f"suggested lr {r['suggested_lr']:.3g}" in text and f"median over {len(lr_h)} probed steps" in text
    else:
        assert rc == 1 and "no suggestion" in text


@pytest.mark.parametrize("argv, says", [
    (["--steps", "21"], "--steps must be an integer in [1, 20]"),
    (["--model", "somewhere", "--lr", "1e-5"], "needs --task"),
    (["--model", "somewhere", "--task", "t.jsonl"], "needs --lr"),
    (["--task", "t.jsonl"], "--task is for a --model folder"),
    (["--lr", "-1"], "--lr must be a positive number"),
])
def test_refusals_are_one_line(argv, says, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_the_testbed_route(tmp_path, capsys):
    """The default model (the pinned testbed warm start and its scratchpad task), two short steps."""
    out = tmp_path / "tb"
    rc = main(["--steps", "2", "--prompts-per-step", "4", "--group-size", "4", "--out", str(out), "--no-progress",
               "--device", "cpu"])
    r = json.loads((out / "lr_finder.json").read_text())
    assert r["model"] == "testbed" and r["probe_lr"] == 1e-4 and rc == (0 if r["steps"] else 1)
