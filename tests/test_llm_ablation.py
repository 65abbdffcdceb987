"""Machinery of the method-ablation runner (llm_probe.experiments.ablation): pass@k against enumeration, the held-out split,
resume (finished runs skipped), claims with finite intervals in test mode. No scientific outcome is asserted."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace

import numpy as np
import pytest

from gapdyn.evidence.claims import VERDICTS
from llm_probe.experiments import ablation
from llm_probe.experiments.ablation import CONFIGS, SplitAddition, entropy_at_matched_accuracy, pass_at_k, run_study, summarize


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_equals_enumeration_of_subsets(n):
    """pass@k = share of the k-subsets of the n samples holding at least one correct sample."""
    for c in range(n + 1):
        samples = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(range(n), k))
            brute = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)


@pytest.mark.parametrize("args", [(4, 5, 1), (4, 2, 0), (4, 2, 5), (4, -1, 1), (4.5, 2, 1)])
def test_pass_at_k_rejects_bad_arguments(args):
    with pytest.raises(ValueError):
        pass_at_k(*args)


def test_split_task_never_trains_on_heldout_pairs():
    task = SplitAddition(mod=7)
    rng = np.random.default_rng(0)
    train, held = task.sample(rng, 500), task.heldout(rng, 200)
    pair = lambda p: tuple(int(v) for v in p.prompt[:-1].split("+"))  # noqa: E731
    assert len(train) == 500 and len(held) == 200
    assert not any(task.is_heldout(*pair(p)) for p in train)
    assert all(task.is_heldout(*pair(p)) for p in held)
    assert all(int(p.answer) == sum(pair(p)) for p in train + held)


def test_entropy_at_matched_accuracy_uses_the_first_evaluation_at_the_common_level():
    a = [{"step": 0, "acc": 0.4, "entropy": 2.0}, {"step": 5, "acc": 0.1, "entropy": 1.0},
         {"step": 10, "acc": 0.3, "entropy": 0.8}, {"step": 15, "acc": 0.5, "entropy": 0.5}]
    b = [{"step": 0, "acc": 0.4, "entropy": 2.0}, {"step": 5, "acc": 0.2, "entropy": 0.9},
         {"step": 10, "acc": 0.35, "entropy": 0.7}, {"step": 15, "acc": 0.3, "entropy": 0.6}]
    assert entropy_at_matched_accuracy(a, b) == (0.5, 0.7)  # level min(0.5, 0.35) = 0.35; step 0 is shared
    assert entropy_at_matched_accuracy(a[:1], b) is None


def test_study_resumes_and_claims_have_finite_intervals(tmp_path, monkeypatch):
    cfg = CONFIGS["test"]
    first = run_study(cfg, tmp_path, progress=False, root=tmp_path)
    assert len(first) == len(cfg.methods) * len(cfg.lrs) * len(cfg.seeds)
    mu = dict(cfg.num_iterations)
    assert mu.get("dapo", 1) > 1 and all(r["num_iterations"] == mu.get(r["method"], 1) for r in first)
    assert all(r["clip_region_mean"] == 0 for r in first if r["num_iterations"] == 1)  # on-policy: ratio 1
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("runs/*/metrics.jsonl")}

    import llm_probe.trainer

    class Boom:  # a second pass must not build a single trainer
        def __init__(self, *a, **k):
            raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(llm_probe.trainer, "Trainer", Boom)
    again = run_study(cfg, tmp_path, progress=False, root=tmp_path)
    assert again == first
    assert stamps == {p: p.stat().st_mtime_ns for p in tmp_path.glob("runs/*/metrics.jsonl")}
    monkeypatch.undo()
    # an unfinished run (no done.json) is trained again, from its first step
    victim = tmp_path / "runs" / f"{cfg.methods[0]}_lr{cfg.lrs[0]:g}_s{cfg.seeds[0]}" / "done.json"
    victim.unlink()
    run_study(replace(cfg), tmp_path, progress=False, root=tmp_path)
    assert victim.exists()
    rows = [json.loads(ln) for ln in (victim.parent / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(cfg.steps))

    claims = summarize(tmp_path)
    assert claims, "test mode must yield claims"
    for c in claims:
        assert all(math.isfinite(v) for v in (c.estimate, *c.interval)) and c.interval[0] <= c.interval[1]
        assert c.verdict in VERDICTS
    assert (tmp_path / "claims.json").exists() and (tmp_path / "survival.csv").exists()
    import pandas as pd

    from llm_probe.collapse import reward_outcome

    surv = pd.read_csv(tmp_path / "survival.csv")
    assert {"alerted", "recovered", "collapsed", "failed", "collapsed_w10"} <= set(surv.columns)
    assert int(surv["n"].sum()) == len(first)
    for d in tmp_path.glob("runs/*/"):  # the stored outcome is the rule's on the run's own files (lock files aside)
        done = json.loads((d / "done.json").read_text())
        rewards = [json.loads(ln)["reward"] for ln in (d / "metrics.jsonl").read_text().splitlines()]
        acc = [json.loads(ln)["acc"] for ln in (d / "eval.jsonl").read_text().splitlines()]
        expect = reward_outcome(rewards, alerts=done["alerts"], heldout=acc, fault=bool(done["fault"]))
        assert done["outcome"] == expect.label == ablation.folder_outcome(d).label
        assert done["collapsed"] == (expect.label == "collapsed") and done["alerted"] == bool(done["alerts"])
    assert [c.primary for c in claims if c.id.startswith(("llm.wapo_fewer", "llm.wapo_higher"))] == [True] * 2
    assert not any(c.primary for c in claims if not c.id.startswith(("llm.wapo_fewer", "llm.wapo_higher")))
    passk = json.loads(victim.parent.joinpath("passk.json").read_text())
    assert set(passk["pass_at_k"]) == {str(k) for k in (1, 2, 4) if k <= cfg.passk_n}

    # the protocol (EXPERIMENT): its analyse of the folders' rows makes the front end's claims, and one cell run
    # by its run_cell through the runner (another folder, the same cached warm model) gives the front end's row
    exp = ablation.EXPERIMENT
    rows = ablation.load_runs(tmp_path)
    again = exp.analyse(rows.sample(frac=1.0, random_state=1), cfg, block="discovery")
    assert [c.to_dict() for c in again] == [c.to_dict() for c in claims]
    assert all(c.criteria_hash == exp.criteria_hash for c in claims)
    cell = exp.cells(cfg, cfg.seeds[:1])[0]
    from gapdyn.evidence.runner import run_cells

    warm = ablation.prepare_warm(cfg, tmp_path)  # the study's cached warm model
    run_cells([cell], tmp_path / "protocol", name=exp.cell_name, result_file=exp.result_file,
              run=lambda c, d: exp.run_cell(**c, out=d, warm_dir=warm), log=lambda *a, **k: None)
    got = ablation.run_row(tmp_path / "protocol" / exp.cell_name(cell))
    want = rows[(rows.method == cell["method"]) & (rows.lr == cell["lr"]) & (rows.seed == cell["seed"])].iloc[0]
    skip = {"dir", "wall_s"}
    assert {k: v for k, v in got.items() if k not in skip} == {k: v for k, v in want.to_dict().items() if k not in skip}
    assert got["dir"] != want["dir"]


@pytest.mark.parametrize("seeds, block", [((1000, 1009), "confirmation"), ((0, 1), "discovery"),
                                          ((0, 1000), "discovery"), ((), "discovery")])
def test_block_of_seeds(seeds, block):
    assert ablation.block_of(seeds) == block
    assert ablation.block_of(CONFIGS["full"].seeds) == ablation.block_of(CONFIGS["warning"].seeds) == "confirmation"
    assert ablation.block_of(CONFIGS["quick"].seeds) == "discovery"


def test_run_cell_equals_the_hand_written_loop_it_replaced(tmp_path):
    """run_cell (Trainer.run with the held-out evaluation as its on_step hook) against the loop it used to copy:
    train_step, collapse rule, log, evaluate every eval_every steps; the same rows, evaluations and pass@k."""
    import llm_probe.experiments.ablation as ab
    from llm_probe.config import TrainConfig
    from llm_probe.seeds import STUDY_SEED, derive_seed
    from llm_probe.trainer import Trainer

    cfg = replace(CONFIGS["test"], seeds=(0,), steps=4, eval_every=3)
    warm = ab.prepare_warm(cfg, tmp_path)
    cell = ab.cells(cfg)[0]
    assert (cell["method"], cell["lr"], cell["seed"]) == ("grpo", 5e-4, 0)
    d = tmp_path / "runs" / ab.cell_name(cell)
    got = ab.run_cell(**cell, out=d, warm_dir=warm)
    read = lambda f: [json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()]  # noqa: E731

    ref_dir = tmp_path / "reference"
    task = SplitAddition(cfg.heldout_mod)
    tr = Trainer(TrainConfig(out_dir=str(ref_dir), method="grpo", lr=5e-4, seed=0, steps=cfg.steps,
                             prompts_per_step=cfg.prompts_per_step, group_size=cfg.group_size,
                             max_new_tokens=cfg.max_new_tokens, init_from=str(warm), probe_every=cfg.probe_every,
                             probe_prompts=0, num_threads=1, progress=False, device="cpu"), task=task)
    rng = np.random.default_rng(derive_seed(STUDY_SEED, "heldout_problems"))
    eval_probs, passk_probs = task.heldout(rng, cfg.eval_prompts), task.heldout(rng, cfg.passk_prompts)
    H0, R0 = tr.measure_baseline()
    tr.detector.set_baseline(H0, R0)
    evals = [ab.heldout_eval(tr, eval_probs, cfg.eval_samples, seed=derive_seed(STUDY_SEED, "heldout_eval"))[:2]]
    while tr.step < cfg.steps:
        k = tr.step
        m = tr.train_step()
        for a in tr.detector.update(k, m):
            m.setdefault("alerts", []).append(a.rule)
        tr.log_step(k, m)
        if tr.step % cfg.eval_every == 0 or tr.step == cfg.steps:
            evals.append(ab.heldout_eval(tr, eval_probs, cfg.eval_samples,
                                          seed=derive_seed(STUDY_SEED, "heldout_eval"))[:2])
    correct = ab.heldout_eval(tr, passk_probs, cfg.passk_n, seed=derive_seed(STUDY_SEED, "heldout_passk"))[2]

    drop = lambda r: {k: v for k, v in r.items() if k != "step_time"}  # noqa: E731
    ours, ref = [drop(r) for r in read(d / "metrics.jsonl")], [drop(r) for r in read(ref_dir / "metrics.jsonl")]
    assert len(ours) == cfg.steps and [r.keys() for r in ours] == [r.keys() for r in ref]
    for a, b in zip(ours, ref):
        for key in a:
            if isinstance(a[key], float):
                assert a[key] == pytest.approx(b[key], abs=1e-12, nan_ok=True), key
            else:
                assert a[key] == b[key], key
    assert [e["step"] for e in read(d / "eval.jsonl")] == [0, 3, 4]
    np.testing.assert_allclose([(e["acc"], e["entropy"]) for e in read(d / "eval.jsonl")], evals, rtol=0, atol=1e-12)
    assert json.loads((d / "passk.json").read_text())["correct"] == correct.tolist()
    assert (got["H0"], got["R0"]) == (H0, R0) and not (d / "checkpoint.safetensors").exists()


_TIMES = ("step_time", "wall_s")


def _run_records(out):
    """Every run's metrics rows and summary with the wall-clock fields removed (name -> (rows, done))."""
    recs = {}
    for d in sorted(d for d in (out / "runs").iterdir() if d.is_dir()):  # the runner's .lock files aside
        rows = [{k: v for k, v in json.loads(x).items() if k not in _TIMES}
                for x in (d / "metrics.jsonl").read_text().splitlines()]
        done = {k: v for k, v in json.loads((d / "done.json").read_text()).items() if k not in _TIMES}
        recs[d.name] = (rows, done, (d / "eval.jsonl").read_text(), (d / "passk.json").read_text())
    return recs


@pytest.fixture(scope="module")
def grpo_study(tmp_path_factory):
    """A small slice of the study (GRPO x 2 seeds, 3 steps) run once in this process: (config, its folder, the
    root it ran under). Shared by the tests that read it; none writes into it."""
    root = tmp_path_factory.mktemp("grpo_study")
    cfg = replace(CONFIGS["test"], methods=("grpo",))
    run_study(cfg, root / "one", progress=False, root=root)
    return cfg, root / "one", root


def _assert_same_runs(one, two):
    a, b = _run_records(one), _run_records(two)
    assert len(a) == 2 and a.keys() == b.keys()
    for name in a:  # compared as JSON text: every float by its exact repr, NaN (a row with no mixed group) equal to NaN
        assert json.dumps(a[name], sort_keys=True) == json.dumps(b[name], sort_keys=True), name
    assert len({a[n][1]["warm_sha256"] for n in a}) == 1 and len(a["grpo_lr0.0005_s0"][1]["warm_sha256"]) == 64


@pytest.mark.xfail(strict=False, reason="machine-dependent: on an AVX2-only 2-core machine (2026-12-02) the rerun "
                   "under 2 torch threads differs in float32 rounding (entropy 2.8132532 vs 2.8132534 at step 0); "
                   "bit for bit on the machines CI ran before; the cause (a kernel that does not keep 1 thread) "
                   "is open")
def test_study_is_bit_identical_under_another_thread_setting(grpo_study, tmp_path, monkeypatch):
    """The fast twin of the test below, in this process: the GRPO slice rerun while the process is set to 2 torch
    threads (and GAPDYN_TORCH_THREADS=2) gives the shared run's rows bit for bit: each run fixes its own torch
    threads to 1 and takes its randomness from seeded generators."""
    import torch

    from llm_probe import threads

    cfg, one, root = grpo_study
    before = threads._configured
    monkeypatch.setenv("GAPDYN_TORCH_THREADS", "2")
    try:
        assert threads.configure_threads(2) == 2 == torch.get_num_threads()
        run_study(cfg, tmp_path / "two", progress=False, root=root)
    finally:
        threads.configure_threads(before if before is not None else threads.DEFAULT_THREADS)
    _assert_same_runs(one, tmp_path / "two")


@pytest.mark.slow  # two worker processes (each loads torch and the warm model): the twin above runs in-process
def test_study_is_bit_identical_across_jobs_and_thread_settings(grpo_study, tmp_path, monkeypatch):
    """A small slice of the study (GRPO x 2 seeds, 3 steps) run in one process and in 2 worker processes with
    GAPDYN_TORCH_THREADS=2 in the environment gives the same rows bit for bit (every float equal; only the wall
    times differ): each run fixes its own torch threads to 1 and takes its randomness from seeded generators."""
    cfg, one, root = grpo_study
    monkeypatch.setenv("GAPDYN_TORCH_THREADS", "2")
    run_study(cfg, tmp_path / "two", n_jobs=2, progress=False, root=root)
    _assert_same_runs(one, tmp_path / "two")


def test_plan_seeds_on_a_known_effect():
    """plan_seeds on a constructed pilot: the collapse row's n is the smallest n whose one-sided Fisher power at
    alpha / m reaches 0.8 (checked against gapdyn.evidence.planner directly), a zero effect is not decidable and sends the
    confirmation block to the budget, and the clipping to [n_min, n_max] holds."""
    import pandas as pd

    from gapdyn.evidence.planner import power_two_proportions

    rows = []
    for s in range(10):  # lr 4e-4: GRPO collapses on 6 of 10 seeds, WAPO on 1; rewards WAPO +0.1 +- noise
        for m, col, rew in (("grpo", s < 6, 0.3 + 0.01 * s), ("wapo", s < 1, 0.4 + 0.012 * s)):
            rows.append(dict(method=m, lr=4e-4, seed=s, collapsed=col, reward_last25=rew, failed=False))
    runs = pd.DataFrame(rows)
    plan = ablation.plan_seeds(runs, n_min=5, n_max=200)
    col = next(r for r in plan["rows"] if r["id"] == "llm.wapo_fewer_collapses@lr0.0004")
    a = 0.05 / 2
    n = col["n"]
    assert power_two_proportions(0.6, 0.1, n, alpha=a) >= 0.8 > power_two_proportions(0.6, 0.1, n - 1, alpha=a)
    assert plan["n"] == max(r["n"] for r in plan["rows"]) and 5 <= plan["n"] <= 200
    flat = runs.assign(collapsed=False)
    p2 = ablation.plan_seeds(flat, n_min=5, n_max=60)
    assert not p2["rows"][0]["decidable"] and p2["n"] == 60
    with pytest.raises(ValueError, match="n_min"):
        ablation.plan_seeds(runs, n_min=50, n_max=10)


def test_relabel_under_other_bits_compares_labels_run_by_run(grpo_study, tmp_path):
    """relabel_under_other_bits on a test-mode study: with the same thread count the rerun is the same run (every
    label equal, no reward differs), and its rows name each (method, lr, seed) once."""
    cfg, study, _ = grpo_study
    rows = ablation.relabel_under_other_bits(study, tmp_path / "r", methods=("grpo",), lrs=cfg.lrs,
                                             seeds=cfg.seeds, torch_threads=1)
    assert [(r["method"], r["seed"]) for r in rows] == [("grpo", 0), ("grpo", 1)]
    assert all(r["committed"] == r["rerun"] and r["first_reward_difference"] is None for r in rows)
    assert json.loads((tmp_path / "r" / "relabel.json").read_text())["rows"] == rows


def test_paired_mean_is_measured_only_where_its_interval_is_valid(monkeypatch):
    """paired_mean: below the n from which the coverage table finds the studentized interval valid the row is not
    measured (its claim inconclusive with the reason), from that n on it is the studentized bootstrap itself. On a
    constructed table (valid from 40): the committed one finds it valid at no tabulated n (docs/coverage.md)."""
    import pandas as pd

    from gapdyn.evidence import coverage
    from gapdyn.evidence.coverage import min_valid_n, valid_at
    from gapdyn.evidence.stats import studentized_cluster_bootstrap_mean

    table = pd.DataFrame([dict(method=ablation.MEAN_INTERVAL, kind="mean", dgp="d", n=n, nominal=0.95,
                               coverage=0.95 if n >= 40 else 0.90) for n in (10, 20, 40, 60)])
    monkeypatch.setattr(coverage, "frozen_table", lambda: table)
    need = min_valid_n(ablation.MEAN_INTERVAL)
    assert need == 40
    rng = np.random.default_rng(3)
    d = rng.normal(0.1, 0.2, need)
    short = ablation.paired_mean(d[:need - 1], rng=np.random.default_rng(0), n_boot=500)
    assert not valid_at(ablation.MEAN_INTERVAL, need - 1) and short.method.startswith("no data: too few pairs")
    c = ablation._claim("llm.wapo_higher_reward", "lr=4e-4", "s", short, p=0.001, lr=4e-4)
    assert not c.measured and c.verdict == "inconclusive" and "valid from n" in c.reason
    full = ablation.paired_mean(d, rng=np.random.default_rng(0), n_boot=500)
    ref = studentized_cluster_bootstrap_mean(d, rng=np.random.default_rng(0), n_resamples=500)
    assert (full.estimate, full.lo, full.hi) == (ref.estimate, ref.lo, ref.hi)
    flat = ablation.paired_mean(np.zeros(need), rng=np.random.default_rng(0), n_boot=500)
    assert flat.method.startswith("no data: no interval")
