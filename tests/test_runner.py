"""The one runner (gapdyn.evidence.runner): resumable folder cells shared through locks, adaptive cells, --seeds / --seed."""

from __future__ import annotations

import fcntl
import json
import os

import pandas as pd
import pytest

from gapdyn.evidence.runner import claim, resolve_seeds, run_adaptive, run_cells, seeds_label, with_seeds


def _name(cell):
    return f"x={cell['x']}"


def _writer(calls):
    def run(cell, out):
        calls.append(cell["x"])
        out.mkdir(parents=True)
        (out / "result.json").write_text(json.dumps({"x": cell["x"], "y": cell["x"] ** 2}))
        return {"x": cell["x"], "y": cell["x"] ** 2}
    return run


def test_resume_reruns_a_torn_cell_and_skips_a_claimed_one(tmp_path):
    cells = [{"x": i} for i in range(4)]
    calls = []
    (tmp_path / "x=0").mkdir()
    (tmp_path / "x=0" / "result.json").write_text(json.dumps({"x": 0, "y": 0}))  # done before
    (tmp_path / "x=1").mkdir()
    (tmp_path / "x=1" / "partial.txt").write_text("torn")  # no result file: interrupted
    fd = os.open(tmp_path / "x=2.lock", os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process holds x=2
    lines = []
    try:
        first = run_cells(cells, tmp_path, name=_name, run=_writer(calls), result_file="result.json",
                          log=lambda *a, **k: lines.append(a[0]))
    finally:
        os.close(fd)
    assert calls == [1, 3] and [r["x"] for r in first] == [0, 1, 3]
    assert not (tmp_path / "x=1" / "partial.txt").exists()
    assert lines[-1].startswith("[4/4] x=3:") and "(2 run, 1 done before, 1 claimed elsewhere)" in lines[-1]
    calls.clear()
    again = run_cells(cells, tmp_path, name=_name, run=_writer(calls), result_file="result.json",
                      log=lambda *a, **k: None)
    assert calls == [2] and [r["y"] for r in again] == [0, 1, 4, 9]


def test_a_cell_claimed_here_is_refused_to_a_second_claim(tmp_path):
    with claim(tmp_path / "c.lock") as mine:
        assert mine
        with claim(tmp_path / "c.lock") as other:  # a second open file description: flock refuses it
            assert not other
    with claim(tmp_path / "c.lock") as again:  # released on exit
        assert again


def test_adaptive_cells_bisect_like_a_plain_loop(tmp_path):
    """Cells added from finished results (a bisection of x >= 0.3 on a grid of 1/64) end on the bracket a
    hand-written bisection loop finds, in as many rounds, and a rerun of the whole study runs nothing."""
    edge = 0.3

    def run(cells):
        return run_cells(cells, tmp_path, name=_name, result_file="result.json", log=lambda *a, **k: None,
                         run=lambda c, d: (d.mkdir(parents=True), (d / "result.json").write_text(
                             json.dumps({"x": c["x"], "above": c["x"] >= edge})))[-1] and
                         json.loads((d / "result.json").read_text()))

    def more(results):
        lo = max(r["x"] for r in results if not r["above"])
        hi = min(r["x"] for r in results if r["above"])
        return [] if hi - lo <= 1 / 64 else [{"x": (lo + hi) / 2}]

    rounds = []
    planned, results = run_adaptive([{"x": 0.0}, {"x": 1.0}], run, more, log=lambda *a, **k: rounds.append(a))
    lo, hi, n = 0.0, 1.0, 0  # the independent route
    while hi - lo > 1 / 64:
        mid, n = (lo + hi) / 2, n + 1
        lo, hi = (lo, mid) if mid >= edge else (mid, hi)
    assert len(rounds) == n == len(planned) - 2
    assert max(r["x"] for r in results if not r["above"]) == lo and min(r["x"] for r in results if r["above"]) == hi
    again, _ = run_adaptive([{"x": 0.0}, {"x": 1.0}], run, more, log=lambda *a, **k: None)
    assert again == planned  # every cell found done: the same plan, nothing rerun
    with pytest.raises(RuntimeError, match="rounds"):
        run_adaptive([{"x": 0}], lambda cells: cells, lambda res: [{"x": len(res)}], max_rounds=3)


@pytest.mark.parametrize("seeds, seed, msg", [((1, 1), None, "twice"), ((), None, "at least one"),
                                              ((1,), 2, "not both"), ((-1,), None, "--seeds"),
                                              (None, 1.5, "--seed")])
def test_bad_seeds_are_one_line_errors(seeds, seed, msg):
    with pytest.raises(ValueError, match=msg):
        resolve_seeds(seeds, seed)


def test_seed_is_seeds_of_one_and_labels_differ():
    assert resolve_seeds(None, 7) == resolve_seeds([7]) == (7,) and resolve_seeds() is None
    assert seeds_label((3, 4, 5)) == "3-4-5"
    assert seeds_label(range(10)) != seeds_label([0, *range(2, 10), 11]) and len(seeds_label(range(100))) < 30


def test_seeds_replace_the_instance_seeds_and_never_the_confirmation_block():
    from bandits.experiments import taxonomy

    exp = taxonomy.EXPERIMENT
    full = taxonomy.Config.full()
    assert with_seeds(exp, full, (7, 8)).instances == (7, 8) and with_seeds(exp, full, None) is full
    assert with_seeds(exp, full, (7, 8)).confirmation == full.confirmation
    with pytest.raises(ValueError, match="confirmation"):
        with_seeds(exp, full, (full.confirmation[0],))


def test_bandit_run_with_seeds_runs_those_instances(tmp_path, capsys):
    """`gapdyn bandit run taxonomy --mode test --seed 7` was refused (no config had a seed field); with --seeds the
    run holds rows of the given instances only, instance 7's rows equal to its cell run by hand (a seed is an
    instance seed)."""
    from bandits.cli import main
    from bandits.experiments import taxonomy

    common = ["--mode", "test", "--out", str(tmp_path), "--no-progress", "--jobs", "1", "--backend", "serial"]
    assert main(["run", "taxonomy", "--seeds", "2", "7", *common]) == 0
    two = pd.read_parquet(tmp_path / "taxonomy-test-seeds-2-7" / "results.parquet")
    assert sorted(set(two["instance"])) == [2, 7]
    (cell,) = taxonomy.cells(taxonomy.Config.test(), (7,))
    by_hand = taxonomy.run_cell(**cell)
    pd.testing.assert_frame_equal(by_hand.reset_index(drop=True),
                                  two[two["instance"] == 7][list(by_hand.columns)].reset_index(drop=True),
                                  check_dtype=False)
    assert "instance seeds [2, 7]" in capsys.readouterr().out
    assert main(["run", "taxonomy", "--seed", "7", "--seeds", "2", *common]) == 2


def test_testbed_study_takes_seeds_through_the_runner(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    from llm_probe.testbed import study

    ran = []

    def fake_run(setting, seed, out, warm_dir=None):
        ran.append((setting.lr, setting.control, seed))
        out.mkdir(parents=True)
        s = {"setting": study.asdict(setting), "seed": seed, "heldout_acc_before": 0.3, "heldout_acc_after": 0.5,
             "outcome": "learned", "wall_s": 1.0, "completion_tokens_median": 40}
        (out / "summary.json").write_text(json.dumps(s))
        return s

    monkeypatch.setattr(study, "run_testbed", fake_run)
    assert study.main(["pilot-short", "--out", str(tmp_path), "--seed", "31"]) == 0
    assert sorted(ran) == [(1e-4, False, 31), (3e-4, False, 31), (1e-3, False, 31)]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted(
        study.cell_name(study.TestbedSetting(lr=lr, length="short"), 31) for lr in (1e-4, 3e-4, 1e-3))
    assert study.main(["pilot-short", "--out", str(tmp_path), "--seeds", "31", "--reverse"]) == 0
    assert len(ran) == 3  # resumed: every cell found done
    assert study.main(["pilot-short", "--out", str(tmp_path), "--seeds", "1", "--seed", "2"]) == 2
    assert "not both" in capsys.readouterr().err


def test_every_registered_study_takes_seeds_in_every_mode():
    """--seeds has one meaning per study: the config field it names (seed_field) holds exactly the seeds given,
    in every mode the study has, and the testbed study says its meaning too."""
    from gapdyn.evidence.experiment import INSTANCE_SEEDS, STREAM_SEEDS, registry

    seeds = (11, 12)  # below every study's confirmation block
    for name, ep in registry().items():
        exp = ep.load()
        assert exp.seed_meaning in (INSTANCE_SEEDS, STREAM_SEEDS), name
        for mode in exp.modes:
            cfg = with_seeds(exp, exp.configure(mode), seeds)
            assert tuple(getattr(cfg, exp.seed_field)) == seeds and cfg.mode == exp.configure(mode).mode, (name, mode)
