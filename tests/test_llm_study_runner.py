"""The addition studies' shared module (llm_probe.experiments._study) and their seeds on the command line: run
folders through the one runner (resumable, named, a plan made once), finished runs selected by seed, and
``--seeds`` / ``--seed`` in every mode of every study, checked on the config each command would run (no training:
the study functions are replaced by recorders)."""

from __future__ import annotations

import json

import pytest

from llm_probe.experiments import _study

pytestmark = pytest.mark.llm


def _fake_run(calls):
    def run(cell, d):
        calls.append(cell["seed"])
        d.mkdir(parents=True)
        done = {"seed": cell["seed"], "value": 10 * cell["seed"]}
        (d / _study.RESULT).write_text(json.dumps(done))
        return done

    return run


def test_run_folders_resume_and_are_named_by_the_study(tmp_path):
    cells = [{"seed": s} for s in (3, 1, 2)]
    name = lambda c: _study.run_name("grpo", "safe", lr=5e-4, seed=c["seed"])  # noqa: E731
    calls = []
    first = _study.run_study(cells, tmp_path, name=name, run=_fake_run(calls), describe=str, progress=False)
    assert calls == [3, 1, 2] and [r["value"] for r in first] == [30, 10, 20]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir() if p.is_dir()) == ["grpo_safe_lr0.0005_s1", "grpo_safe_lr0.0005_s2", "grpo_safe_lr0.0005_s3"]
    # a torn run (no done.json) is rerun from its start; the finished ones are read back, not rerun
    (tmp_path / "runs" / "grpo_safe_lr0.0005_s1" / "done.json").unlink()
    again = _study.run_study(cells, tmp_path, name=name, run=_fake_run(calls), describe=str, progress=False)
    assert calls == [3, 1, 2, 1] and again == first
    # finished runs by seed, in folder-name order (as every study's load_runs reads them)
    assert [d.name[-2:] for d in _study.finished_runs(tmp_path)] == ["s1", "s2", "s3"]
    assert [d.name[-2:] for d in _study.finished_runs(tmp_path, seeds=(3, 9))] == ["s3"]
    rows = _study.load_runs(tmp_path, lambda d: json.loads((d / "done.json").read_text()))
    assert list(rows.seed) == [1, 2, 3]


def test_run_name_and_plan_once(tmp_path):
    assert _study.run_name("grpo", lr=4e-4, seed=1000) == "grpo_lr0.0004_s1000"
    assert _study.run_name("sgd", lr=3e-3) == "sgd_lr0.003"
    made = []
    make = lambda: made.append(1) or {"n": len(made)}  # noqa: E731
    assert _study.plan_once(tmp_path / "plan.json", make) == {"n": 1}
    assert _study.plan_once(tmp_path / "plan.json", make) == {"n": 1} and made == [1]  # read back, not made again


def test_heldout_problems_are_the_studies_draws():
    """One generator for the sets, in order: the first set alone equals the first of two (the safe-step study draws
    one set, the ablation two: the same evaluation problems)."""
    task = _study.SplitAddition(20)
    (one,), (a, b) = _study.heldout_problems(task, 5), _study.heldout_problems(task, 5, 3)
    assert one == a and len(b) == 3 and all(task.is_heldout(*map(int, p.prompt[:-1].split("+"))) for p in a + b)


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    """Run the command line with the study functions replaced by recorders; returns (main, record)."""
    monkeypatch.chdir(tmp_path)
    from llm_probe.cli import main
    from llm_probe.experiments import ablation, early_warning, entropy, entropy_lemma
    from llm_probe.experiments import safe_step_experiment as sse

    record = {}
    monkeypatch.setattr(ablation, "run_study", lambda cfg, out, **k: record.update(study=cfg, out=out))
    monkeypatch.setattr(ablation, "run_confirmation", lambda *a, **k: record.update(confirmation=a))
    monkeypatch.setattr(ablation, "summarize", lambda out, **k: [])
    monkeypatch.setattr(sse, "run_and_report", lambda exp, out, **k: record.update(safe=exp, out=out))
    monkeypatch.setattr(entropy_lemma, "main_study", lambda mode, out, **k: record.update(lemma=k, out=out) or [])
    monkeypatch.setattr(early_warning, "report", lambda study, seeds=None: record.update(warning=seeds))
    monkeypatch.setattr(entropy, "report", lambda study, seeds=None: record.update(entropy=seeds))
    return main, record


@pytest.mark.parametrize("mode", ["test", "quick", "full"])
def test_ablation_seeds_in_every_mode(recorded, mode, tmp_path):
    """--seeds runs the mode's grid on exactly those seeds (full: the full grid, no pilot plan) into its own
    default folder; --seed S is --seeds S."""
    from llm_probe.experiments import ablation

    main, record = recorded
    assert main(["ablation", "--mode", mode, "--seed", "9100", "--no-progress"]) == 0
    cfg = record["study"]
    assert cfg.seeds == (9100,) and "confirmation" not in record
    want = ablation.CONFIGS[mode]
    assert (cfg.methods, cfg.lrs, cfg.steps, cfg.pinned) == (want.methods, want.lrs, want.steps, want.pinned)
    assert {c["seed"] for c in ablation.cells(cfg)} == {9100}
    assert record["out"].name == f"ablation-{mode}-seeds-9100"


def test_ablation_full_without_seeds_is_the_planned_study(recorded):
    main, record = recorded
    assert main(["ablation", "--mode", "full", "--no-progress"]) == 0
    pilot, full, _ = record["confirmation"]
    assert pilot.seeds == tuple(range(10)) and full.seeds[0] == 1000 and "study" not in record


def test_ablation_seeds_of_the_confirmation_block_are_refused(recorded, capsys):
    main, record = recorded
    assert main(["ablation", "--mode", "full", "--seeds", "1003", "--no-progress"]) == 2 and not record
    assert "belong to llm_ablation's confirmation block" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["test", "quick", "full"])
def test_safe_step_seeds_in_every_mode(recorded, mode):
    """--seeds makes a replication: both arms at both lrs on exactly those seeds, any seeds (full mode and seeds
    above the confirmation start included), no plan."""
    from llm_probe.experiments import safe_step_experiment as sse

    main, record = recorded
    assert main(["safe-step", "--mode", mode, "--seeds", "9100", "1001", "--no-progress"]) == 0
    exp = record["safe"]
    assert exp.replicate and exp.seeds == (9100, 1001) and exp.steps == sse.PRESETS[mode].steps
    got = {(c["arm"], c["lr"], c["seed"]) for c in sse.cells(exp)}
    assert got == {(a, lr, s) for a in ("constant", "safe") for lr in exp.lrs for s in (1001, 9100)}
    assert record["out"].name == f"{mode}-seeds-9100-1001"


def test_safe_step_replication_runs_its_seeds_and_no_plan(tmp_path, monkeypatch):
    import dataclasses

    from llm_probe.experiments import safe_step_experiment as sse

    seen = []
    monkeypatch.setattr(sse, "warm_folder", lambda exp: (tmp_path, "sha"))
    monkeypatch.setattr(sse, "_pairs", lambda exp, out, warm, by_lr, progress: seen.append(by_lr))
    exp = dataclasses.replace(sse.PRESETS["full"], seeds=(9100,), replicate=True)
    assert sse.run_study(exp, tmp_path, progress=False) is None
    assert seen == [{exp.collapse_lr: (9100,), exp.safe_lr: (9100,)}] and not (tmp_path / "plan.json").exists()
    with pytest.raises(ValueError, match="pilot seeds"):
        dataclasses.replace(sse.PRESETS["full"], seeds=(9100,))


def test_entropy_lemma_seeds(recorded):
    from llm_probe.experiments import entropy_lemma as el

    main, record = recorded
    assert main(["entropy-lemma", "--mode", "full", "--seeds", "5", "6"]) == 0
    assert record["lemma"]["seeds"] == (5, 6) and record["out"].name == "full-seeds-5-6"
    cfg = el.CONFIGS["test"]
    assert [el.cell_name(c) for c in el.cells(cfg)] == ["sgd_lr0.003", "adam_lr0.0004"]  # the committed names
    assert [el.cell_name(c) for c in el.cells(cfg, (0, 5))] == ["sgd_lr0.003_s0", "adam_lr0.0004_s0",
                                                                "sgd_lr0.003_s5", "adam_lr0.0004_s5"]


@pytest.mark.parametrize("sub", ["early-warning", "entropy"])
def test_analyses_read_the_runs_of_the_seeds(recorded, tmp_path, sub, capsys):
    main, record = recorded
    d = tmp_path / "study" / "runs" / "grpo_lr0.0004_s7"
    d.mkdir(parents=True)
    (d / "done.json").write_text(json.dumps({"seed": 7}))
    assert main([sub, "--from", str(tmp_path / "study"), "--seed", "7"]) == 0
    assert record[sub.replace("early-", "")] == (7,)
    assert main([sub, "--from", str(tmp_path / "study"), "--seed", "7", "--seeds", "8"]) == 2
    assert "not both" in capsys.readouterr().err


def test_demo_seed():
    from llm_probe.experiments.demo import DemoConfig

    assert DemoConfig(seed=4).seeds == (4,) and DemoConfig().seeds == (0, 1, 2)
