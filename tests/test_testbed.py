"""The testbed: the scratchpad task against independent arithmetic, the held-out split, the outcome rule on
constructed trajectories (a collapse inside the first 10 steps included), the random-advantage control, and one
tiny run's summary (machinery only, no claim about learning)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from llm_probe.testbed.outcome import FLOOR, collapse_time, rl_outcome
from llm_probe.testbed.task import LENGTHS, ScratchpadAddition, scratchpad

torch = pytest.importorskip("torch")


def _columns_by_hand(text: str, length: str):
    """Parse a scratchpad into its columns and answer (independent of scratchpad())."""
    body, answer = text.split(">")
    cols = [c for c in body.split(";") if c]
    return cols, int(answer)


@pytest.mark.parametrize("length", LENGTHS)
def test_scratchpad_is_column_addition(length):
    rng = np.random.default_rng(3)
    for a, b in rng.integers(1000, 10000, size=(300, 2)).tolist():
        cols, ans = _columns_by_hand(scratchpad(a, b, length, 4), length)
        assert ans == a + b and len(cols) == 4
        carry = 0
        for i, c in enumerate(cols):  # column i: digit i from the right
            x, y = (a // 10**i) % 10, (b // 10**i) % 10
            s = x + y + carry
            assert c == (f"{x}+{y}+{carry}={s}" if length == "long" else f"{x}{y}{s}")
            carry = s // 10


def test_reward_checks_the_answer_and_the_end():
    task = ScratchpadAddition(length="long")
    p = task.sample(np.random.default_rng(0), 1)[0]
    a, b = map(int, p.prompt[2:-1].split("+"))
    assert task.reward(p.answer, p, terminated=True) == 1.0
    assert task.reward(p.answer, p, terminated=False) == 0.0
    assert task.reward(p.answer + "0", p, terminated=True) == 0.0
    assert task.reward("junk>" + str(a + b), p, terminated=True) == 1.0  # only the outcome is verified
    assert task.reward(str(a + b), p, terminated=True) == 0.0  # no '>': no answer


def test_heldout_pairs_never_drawn_for_training():
    task = ScratchpadAddition(digits=2, length="mixed", n_heldout=4000)  # 4000 of the 8100 pairs held out
    held = set(task.heldout_pairs())
    assert len(held) == 4000
    drawn = task.sample(np.random.default_rng(1), 5000)
    pairs = {tuple(map(int, p.prompt[2:-1].split("+"))) for p in drawn}
    assert not pairs & held
    assert {p.prompt[0] for p in drawn} == {"L", "S"}


def test_completion_lengths_in_range():
    from llm_probe.testbed.task import testbed_tokenizer

    tok = testbed_tokenizer()
    assert len(tok) >= 64
    task = ScratchpadAddition(length="mixed")
    for p in task.sample(np.random.default_rng(2), 200):
        n = len(tok(p.answer, add_special_tokens=False)["input_ids"]) + 1  # + <eos>
        assert 16 <= n <= 64 and n <= task.max_completion_tokens()


def test_bad_task_settings_are_one_line_errors():
    for kw in ({"digits": 1}, {"length": "medium"}, {"n_heldout": 0}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            ScratchpadAddition(**kw)


# ---- the outcome rule ---------------------------------------------------------------------------------
def test_collapse_inside_the_first_ten_steps_is_collapsed():
    rewards = [0.3, 0.04, 0.0] + [0.0] * 97
    evals = [(s, 0.0) for s in range(10, 101, 10)]
    o = rl_outcome(evals, rewards, A0=0.3, R0=0.29)
    assert o.label == "collapsed" and o.collapse_step == 10


def test_reward_zero_after_an_alert_is_collapsed_not_recovered():
    rewards = list(np.linspace(0.3, 0.0, 50)) + [0.0] * 50
    evals = [(10, 0.25), (20, 0.2), (30, 0.1), (40, 0.05), (50, 0.0), (100, 0.0)]
    o = rl_outcome(evals, rewards, A0=0.3, R0=0.3)
    assert o.label == "collapsed" and o.collapse_step == 40


@pytest.mark.parametrize("A_end, R_end, label", [(0.5, 0.5, "learned"), (0.4, 0.4, "healthy"),
                                                  (0.15, 0.3, "degraded"), (0.05, 0.3, "degraded"),
                                                  (0.05, 0.05, "collapsed")])
def test_labels_by_severity(A_end, R_end, label):
    o = rl_outcome([(10, 0.3), (20, A_end)], [R_end] * 20, A0=0.3, R0=0.3)
    assert o.label == label


def test_failed_and_bad_input():
    assert rl_outcome([(10, 0.3)], [0.3] * 10, A0=0.3, R0=0.3, fault="non-finite").label == "failed"
    assert rl_outcome([(10, 0.3)], [math.nan] * 10, A0=0.3, R0=0.3).label == "failed"
    with pytest.raises(ValueError, match="A0"):
        rl_outcome([(10, 0.3)], [0.3], A0=1.5, R0=0.3)
    with pytest.raises(ValueError, match="increasing"):
        collapse_time([(20, 0.1), (10, 0.1)], 0.3)


def test_collapse_time_against_a_loop():
    rng = np.random.default_rng(5)
    for _ in range(200):
        accs = rng.choice([0.0, 0.05, 0.3], size=8)
        evals = [(10 * (i + 1), float(a)) for i, a in enumerate(accs)]
        want = None
        for i in range(len(evals)):
            if all(a < FLOOR * 0.3 for _, a in evals[i:]):
                want = evals[i][0]
                break
        assert collapse_time(evals, 0.3) == want


# ---- the random-advantage control -----------------------------------------------------------------------
def test_shuffled_rewards_permute_each_group():
    from llm_probe.losses import compute_advantages
    from llm_probe.trainer import shuffled_within_groups

    r = torch.tensor(np.random.default_rng(0).integers(0, 2, size=(16, 8)), dtype=torch.float32)
    s = shuffled_within_groups(r, seed=7, step=3)
    assert torch.equal(s.sort(1).values, r.sort(1).values)
    assert torch.equal(s, shuffled_within_groups(r, seed=7, step=3))
    assert not torch.equal(s, shuffled_within_groups(r, seed=7, step=4))
    a, b = compute_advantages("grpo", r), compute_advantages("grpo", s)
    np.testing.assert_allclose(np.sort(a.abs().numpy(), 1), np.sort(b.abs().numpy(), 1), atol=1e-6)


# ---- one tiny run -----------------------------------------------------------------------------------
def test_tiny_run_writes_its_summary(tmp_path):
    from llm_probe.model import TinyQwenSpec, build_tiny_qwen, save_policy
    from llm_probe.testbed.run import TestbedSetting, run_testbed
    from llm_probe.testbed.task import testbed_tokenizer

    tok = testbed_tokenizer()
    spec = TinyQwenSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=1, max_position_embeddings=96)
    warm = save_policy(build_tiny_qwen(tok, spec, seed=0), tok, tmp_path / "warm")
    setting = TestbedSetting(steps=3, eval_every=2, n_heldout=8, prompts_per_step=2, group_size=2, lr=1e-3,
                             lr_warmup_steps=2)
    s = run_testbed(setting, seed=11, out=tmp_path / "run", warm_dir=warm)
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(s))
    assert [e["step"] for e in s["evaluations"]] == [2, 3]
    for key in ("heldout_acc_before", "heldout_acc_after", "completion_tokens_median", "outcome"):
        assert key in s
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr_step"] for r in rows] == pytest.approx([5e-4, 1e-3, 1e-3])
    head = [json.loads(x) for x in (tmp_path / "run" / "lm_head.jsonl").read_text().splitlines()]
    assert [h["step"] for h in head] == [0, 1, 2]
    assert all(0 <= h["grad_norm"] < np.inf and 0 <= h["update_norm"] < np.inf for h in head)
    o = rl_outcome([(e["step"], e["acc"]) for e in s["evaluations"]], [r["reward"] for r in rows],
                   A0=s["heldout_acc_before"], R0=s["reward_before"])
    assert o.label == s["outcome"]
    import pandas as pd

    from llm_probe.testbed.study import export_study

    info = export_study(tmp_path, tmp_path / "export", command="test")
    runs = pd.read_csv(tmp_path / "export" / "runs.csv")
    assert info["runs"] == 1 and list(runs["outcome"]) == [s["outcome"]] and list(runs["seed"]) == [11]
    assert len(pd.read_csv(tmp_path / "export" / "steps.csv")) == 3
    assert list(pd.read_csv(tmp_path / "export" / "evaluations.csv")["step"]) == [2, 3]


def test_a_run_stopped_by_faults_is_labelled_failed(tmp_path, monkeypatch):
    from llm_probe.model import TinyQwenSpec, build_tiny_qwen, save_policy
    from llm_probe.testbed.run import TestbedSetting, run_testbed
    from llm_probe.testbed.task import testbed_tokenizer
    from llm_probe.trainer import Trainer

    tok = testbed_tokenizer()
    spec = TinyQwenSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=1, max_position_embeddings=96)
    warm = save_policy(build_tiny_qwen(tok, spec, seed=0), tok, tmp_path / "warm")
    monkeypatch.setattr(Trainer, "_backward", lambda self, loss: "non-finite loss (injected)")
    setting = TestbedSetting(steps=6, eval_every=2, n_heldout=4, prompts_per_step=2, group_size=2)
    s = run_testbed(setting, seed=3, out=tmp_path / "run", warm_dir=warm)
    assert s["outcome"] == "failed" and s["faults"] >= 1 and "injected" in s["fault_reason"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["outcome"] == "failed"


# ---- the study driver -----------------------------------------------------------------------------------
def test_study_resumes_skips_claimed_cells_and_reruns_torn_ones(tmp_path, monkeypatch):
    import fcntl
    import os

    from llm_probe.testbed import study

    calls = []

    def fake_run(setting, seed, out, warm_dir=None):
        calls.append((setting.lr, seed))
        out.mkdir(parents=True)
        s = {"setting": {**study.asdict(setting)}, "seed": seed, "heldout_acc_before": 0.3, "heldout_acc_after": 0.5,
             "outcome": "learned" if setting.lr < 1e-3 else "collapsed", "wall_s": 1.0, "completion_tokens_median": 40}
        (out / "summary.json").write_text(json.dumps(s))
        return s

    monkeypatch.setattr(study, "run_testbed", fake_run)
    cells = study.grid([1, 2], lr=(1e-4, 1e-2))
    torn = tmp_path / study.cell_name(study.TestbedSetting(lr=1e-2), 2)
    torn.mkdir(parents=True)
    (torn / "metrics.jsonl").write_text("{}\n")  # no summary: an interrupted run
    held = tmp_path / f"{study.cell_name(study.TestbedSetting(lr=1e-4), 2)}.lock"
    fd = os.open(held, os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another worker holds this cell
    try:
        first = study.run_study(cells, tmp_path, log=lambda *a, **k: None)
    finally:
        os.close(fd)
    assert sorted(calls) == [(1e-4, 1), (1e-2, 1), (1e-2, 2)]
    assert len(first) == 3 and not (torn / "metrics.jsonl").exists()
    calls.clear()
    again = study.run_study(cells, tmp_path, log=lambda *a, **k: None)
    assert calls == [(1e-4, 2)] and len(again) == 4
    table = study.dose_response(study.load_summaries(tmp_path))
    assert list(table["n"]) == [2, 2] and list(table["learned"]) == [2, 0] and list(table["collapsed"]) == [0, 2]
    assert (table["P_collapsed_lo"] <= table["P_collapsed"]).all() and (table["P_collapsed"] <= table["P_collapsed_hi"]).all()


@pytest.mark.parametrize("argv, word", [(["--method", "gpro"], "--method"), (["--lr", "-1"], "lr"),
                                        (["--steps", "0"], "steps")])
def test_cli_refuses_bad_settings_in_one_line_without_a_folder(tmp_path, capsys, argv, word):
    from llm_probe.cli import main

    out = tmp_path / "run"
    assert main(["testbed", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and word in err[0]
    assert not out.exists()


def test_pinned_warm_start_loads_and_is_checked(tmp_path, monkeypatch):
    from llm_probe.testbed import warm

    model, tok = warm.load_testbed("small")
    assert sum(p.numel() for p in model.parameters()) == 1_010_304 and len(tok) == 98
    assert model.config.max_position_embeddings >= 12 + ScratchpadAddition().max_completion_tokens()
    bad = tmp_path / "small"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes(b"not the pinned bytes")
    monkeypatch.setattr(warm, "PINNED_ROOT", tmp_path)
    with pytest.raises(ValueError, match="sha256"):
        warm.pinned_testbed("small")
    with pytest.raises(ValueError, match="size"):
        warm.pinned_testbed("huge")


@pytest.mark.slow
def test_the_small_warm_start_rebuilds_to_its_pinned_bytes(tmp_path):
    """train_warm('small') on this machine (1 torch thread) gives the committed model.safetensors bit for bit."""
    from llm_probe.testbed import warm

    info = warm.train_warm("small", tmp_path / "small", log=lambda *a: None)
    assert info["selected_step"] == 360
    assert warm.file_sha256(tmp_path / "small" / "model.safetensors") == warm.PINNED_SHA256["small"]


def test_dose_blocks_share_no_seed_and_keep_the_design():
    """The held-out block never shares a seed with the calibration block; it holds the predictor's probe lr (1e-4)
    in both lengths, the long grid shifted by DOSE_HELDOUT_SHIFT above it, and every cell is a distinct run folder."""
    from llm_probe.testbed.study import (DOSE_CALIBRATION_SEEDS, DOSE_HELDOUT_SEEDS, DOSE_HELDOUT_SHIFT, DOSE_LRS,
                                         DOSE_SEEDS, cell_folder_name, dose_cells, dose_heldout_cells, study_cells)

    cal, held = dose_cells(DOSE_CALIBRATION_SEEDS), dose_heldout_cells()
    assert set(DOSE_CALIBRATION_SEEDS) <= set(DOSE_SEEDS)
    assert not {c["seed"] for c in cal} & {c["seed"] for c in held}
    assert {c["seed"] for c in held} <= set(DOSE_HELDOUT_SEEDS)
    names = [cell_folder_name(c) for c in cal + held]
    assert len(set(names)) == len(names)
    rl = [c["setting"] for c in held if not c["setting"]["control"]]
    long_lrs = sorted({s["lr"] for s in rl if s["length"] == "long"} - {1e-6})
    assert long_lrs[0] == 1e-4 and {1e-4} <= {s["lr"] for s in rl if s["length"] == "short"}
    for lr, base in zip(long_lrs[1:], DOSE_LRS["long"][1:]):
        assert lr == pytest.approx(base * DOSE_HELDOUT_SHIFT, rel=1e-3)
    assert study_cells("dose-heldout", seeds=[4000]) == dose_heldout_cells(seeds=(4000,))


def test_greedy_kv_cache_route_picks_the_tokens_of_full_forwards():
    """Greedy held-out decoding through the KV-cache decoder gives the same tokens, masks and ends as the loop of
    full forwards (the independent route) on the pinned warm start, short and long."""
    from llm_probe.rollout import encode_prompts
    from llm_probe.sampler import supports_fast_path
    from llm_probe.testbed import warm
    from llm_probe.testbed.evaluate import _greedy, _sample

    model, tok = warm.load_testbed("small")
    assert supports_fast_path(model)
    for length in LENGTHS:
        task = ScratchpadAddition(length=length)
        probs = task.heldout()[:12]
        ids, mask = encode_prompts(tok, [p.prompt for p in probs])
        T = task.max_completion_tokens()
        with torch.no_grad():
            ref = _greedy(model, ids, mask, max_new_tokens=T, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
            got = _sample(model, ids, mask, max_new_tokens=T, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                          generator=None, temperature=1.0, greedy=True)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1].long(), ref[1].long())
        assert torch.equal(got[2], ref[2])
        assert ref[1].sum(1).float().median() >= 10  # long enough that the cache route carries many positions


def test_settings_study_places_its_grid_from_the_pilot_and_runs_the_block(tmp_path, monkeypatch):
    """The held-out settings: the pilot runs first, the grid follows the rule written before it ran (the smallest
    pilot lr at which every pilot run collapsed, then / 1.25^k, plus 1e-4; none collapsing: the top lr x 1.5), an
    incomplete pilot places no grid, and the block's seeds are new."""
    from llm_probe.testbed import study

    edge = {"wapo": 5e-4, "dr_grpo": 1.0}  # dr_grpo never collapses in this fake

    def fake_run(setting, seed, out, warm_dir=None):
        out.mkdir(parents=True)
        s = {"setting": study.asdict(setting), "seed": seed, "heldout_acc_before": 0.3, "heldout_acc_after": 0.5,
             "outcome": "collapsed" if setting.lr >= edge[setting.method] or (seed == 901 and setting.lr >= 3e-4)
             else "learned", "wall_s": 1.0, "completion_tokens_median": 40}
        (out / "summary.json").write_text(json.dumps(s))
        return s

    monkeypatch.setattr(study, "run_testbed", fake_run)
    ran = study.run_settings_study(tmp_path, seeds=(5000,), log=lambda *a, **k: None)
    pilot = [s for s in study.load_summaries(tmp_path) if s["seed"] in study.SETTINGS_PILOT_SEEDS]
    assert len(pilot) == 2 * 7 * 2 and study.SETTINGS_PILOT_LRS == (1e-4, 1.5e-4, 2.25e-4, 3.38e-4, 5.06e-4,
                                                                     7.59e-4, 1.14e-3)
    top = {"wapo": 5.06e-4, "dr_grpo": 1.14e-3 * 1.5}  # by hand: both seeds collapsed from 5.06e-4; dr_grpo never
    grids = json.loads((tmp_path / "grids.json").read_text())
    for m in study.SETTINGS_METHODS:
        want = sorted({float(f"{top[m] / 1.25 ** k:.3g}") for k in range(6)} | {1e-4})
        assert grids[m] == pytest.approx(want)
        assert sorted(s["setting"]["lr"] for s in ran if s["setting"]["method"] == m) == pytest.approx(want)
    assert {s["seed"] for s in ran} == {5000}
    assert not set(study.SETTINGS_SEEDS) & (set(study.DOSE_SEEDS) | set(study.DOSE_HELDOUT_SEEDS)
                                            | set(study.PILOT_SEEDS))
    with pytest.raises(ValueError, match="not complete"):
        study.settings_grid(pilot[1:], "wapo" if pilot[0]["setting"]["method"] == "wapo" else "dr_grpo")


def _fake_run_folder(root, setting, seed, *, collapse_step=None, steps=3):
    from llm_probe.testbed import study

    d = root / study.cell_name(setting, seed)
    d.mkdir(parents=True)
    s = {"setting": study.asdict(setting), "seed": seed, "outcome": "learned" if collapse_step is None else "collapsed",
         "heldout_acc_before": 0.25, "heldout_acc_after": 0.5 + seed * 1e-3, "heldout_greedy_before": 0.3,
         "heldout_greedy_after": 0.4, "reward_before": 0.2, "outcome_detail": {"collapse_step": collapse_step},
         "completion_tokens_median": 41.0, "completion_tokens_median_before": 40.0, "wall_s": 12.345,
         "warm_sha256": "ab", "evaluations": [{"step": 10, "acc": 0.5, "tokens_median": 41.0}]}
    (d / "summary.json").write_text(json.dumps(s))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "reward": 0.1 * k + seed * 1e-7, "entropy": 1 / 3})
                                             + "\n" for k in range(steps)))
    return d


def test_export_merge_keeps_the_first_block_byte_for_byte(tmp_path):
    """A second block exported with merge=True adds its lines after the first block's, unchanged byte for byte; a
    run exported again replaces its own lines only; a record with other columns is refused in one line."""
    from llm_probe.testbed.study import TestbedSetting, export_study

    a, b, dest = tmp_path / "a", tmp_path / "b", tmp_path / "record"
    _fake_run_folder(a, TestbedSetting(lr=1e-4), 3000)
    _fake_run_folder(a, TestbedSetting(lr=3e-4), 3001, collapse_step=20)
    export_study(a, dest, command="block a")
    first = {f: (dest / f).read_text() for f in ("runs.csv", "evaluations.csv", "steps.csv")}
    _fake_run_folder(b, TestbedSetting(lr=2.2e-4), 4000)
    info = export_study(b, dest, command="block b", merge=True)
    assert info["runs"] == 3 and [x["command"] for x in info["blocks"]] == ["block a", "block b"]
    for f, text in first.items():
        merged = (dest / f).read_text()
        assert merged.startswith(text) and "seed=4000" in merged[len(text):]
    _fake_run_folder(b, TestbedSetting(lr=5e-4), 4001, collapse_step=30)  # block b grows; exported again
    info = export_study(b, dest, command="block b", merge=True)
    runs = (dest / "runs.csv").read_text()
    assert info["runs"] == 4 and runs.count("seed=4000,") == 1 and runs.startswith(first["runs.csv"])
    assert [x["command"] for x in info["blocks"]] == ["block a", "block b"]
    c = tmp_path / "c"
    _fake_run_folder(c, TestbedSetting(lr=1e-4), 4002, steps=0)  # no steps: other columns in steps.csv
    with pytest.raises(ValueError, match="columns differ"):
        export_study(c, dest, command="block c", merge=True)


def test_committed_dose_runs_keep_their_cell_names():
    """Every run of the committed calibration record is a cell of dose_cells on DOSE_CALIBRATION_SEEDS under the
    same folder name (settings added later keep their defaults out of the names), and the safe step study's cells
    pair the two arms on each seed under new seeds."""
    import csv
    from pathlib import Path

    from llm_probe.testbed.study import (DOSE_CALIBRATION_SEEDS, DOSE_HELDOUT_SEEDS, DOSE_SEEDS, SAFE_STEP_SEEDS,
                                         cell_folder_name, dose_cells, safe_step_cells)

    record = Path(__file__).resolve().parents[1] / "docs" / "verdicts" / "testbed-dose" / "runs.csv"
    names = {r["run"] for r in csv.DictReader(record.open()) if int(r["seed"]) in DOSE_CALIBRATION_SEEDS}
    assert names == {cell_folder_name(c) for c in dose_cells(DOSE_CALIBRATION_SEEDS)}
    cells = safe_step_cells()
    assert len(cells) == 2 * 2 * len(SAFE_STEP_SEEDS)
    pairs = {}
    for c in cells:
        pairs.setdefault((c["seed"], c["setting"]["lr"]), []).append(c["setting"]["safe_step"])
    assert all(sorted(v) == [False, True] for v in pairs.values())
    assert not set(SAFE_STEP_SEEDS) & (set(DOSE_SEEDS) | set(DOSE_HELDOUT_SEEDS))
    assert "safe_step=True" in cell_folder_name(cells[1]) and "safe_step" not in cell_folder_name(cells[0])
