"""Interruption: SIGKILL a running sweep and a running training job (in a subprocess) at random points,
restart each time, and check the end state equals an uninterrupted run with the same seed: the same result
rows (bitwise for the sweep), no duplicate or missing rows, no corrupted or orphan file. For the trainer:
metrics.jsonl byte-identical to the uninterrupted run once the wall-clock field is dropped, probe_prompts.jsonl
byte-identical, the final checkpoint's tensors bit for bit equal; kills land anywhere inside a step, and
(in-process, at each file commit) inside the resume itself. Extends tests/test_bandits_sweep.py (one kill
point) and tests/test_llm_trainer.py (in-process stop/resume)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from bandits.engine import Dynamics, simulate
from bandits.envs import make_bandit
from gapdyn.evidence.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def sweep_cell(seed: int, eta: float, mode: str, sleep: float = 0.0) -> pd.DataFrame:
    """A real engine cell (module-level: its qualified name keys the store, the subprocess imports it)."""
    if sleep:
        time.sleep(sleep)
    b = make_bandit(n_contexts=2, n_arms=10, dim=3, n_correct=3, seed=seed)
    tr = simulate(b, Dynamics(method="grpo", gradient=mode, steps=20, group_size=4), eta=eta, seed=seed)
    return pd.DataFrame({"context": np.arange(2), "J_final": tr.J_final[0], "Phi_final": tr.Phi_final[0],
                         "M_final": tr.M_final[0], "n_decrease": tr.n_decrease[0]})


def _cells(n_seeds: int, sleep: float):
    return [{"seed": s, "eta": e, "mode": m, "sleep": sleep} for s in range(n_seeds) for e in (0.3, 30.0)
            for m in ("exact", "sampled")]


_SWEEP_SCRIPT = """
import sys, json
from tests.test_reliability_interrupt import sweep_cell, _cells
from gapdyn.evidence.sweep import run_sweep
run_sweep(sweep_cell, _cells(int(sys.argv[2]), float(sys.argv[3])), name="kill", store=sys.argv[1],
          backend=sys.argv[4], n_jobs=2, progress=False)
"""


def _wait_then_kill(proc, count, target, timeout=150.0, extra_delay=0.0) -> bool:
    """SIGKILL ``proc`` ``extra_delay`` s after ``count()`` >= target; False if it ended on its own first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if count() >= target:
            break
        time.sleep(0.003)
    end = time.monotonic() + extra_delay
    while time.monotonic() < end and proc.poll() is None:
        time.sleep(0.003)
    if proc.poll() is not None:
        return False
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return True


def _n_cells(d: Path) -> int:
    return len(list(d.glob("*.parquet"))) if d.exists() else 0


def _kill_sweep_repeatedly(tmp_path, n_seeds, sleep, backend, n_kills, seed):
    cells = _cells(n_seeds, sleep)
    store = tmp_path / "store"
    cells_dir = store / "kill" / "cells"
    rng = np.random.default_rng(seed)
    targets = np.sort(rng.choice(np.arange(1, len(cells) - 1), size=n_kills, replace=False))
    killed = 0
    for target in targets:
        proc = subprocess.Popen([sys.executable, "-c", _SWEEP_SCRIPT, str(store), str(n_seeds), str(sleep), backend],
                                cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        killed += _wait_then_kill(proc, lambda: _n_cells(cells_dir), int(target))
        assert not (store / "kill" / "results.parquet").exists() or killed < len(targets)
        for f in cells_dir.glob("*.parquet"):  # every file that made it to its final name is complete
            pq.read_table(f)
    assert killed >= max(1, n_kills - 1), "the sweep finished before it could be killed: make the cells slower"
    n_done = _n_cells(cells_dir)
    resumed = run_sweep(sweep_cell, cells, name="kill", store=store, backend="serial", progress=False)
    fresh = run_sweep(sweep_cell, cells, name="kill", backend="serial", progress=False)
    assert resumed.attrs["n_loaded"] == n_done and resumed.attrs["n_computed"] == len(cells) - n_done
    pd.testing.assert_frame_equal(resumed, fresh, check_exact=True)
    assert len(resumed) == 2 * len(cells) and not resumed.duplicated(["cell_key", "context"]).any()
    assert resumed["cell_key"].nunique() == len(cells)
    pd.testing.assert_frame_equal(pd.read_parquet(store / "kill" / "results.parquet"), fresh, check_exact=True)
    assert not list(cells_dir.glob("*.tmp-*")), "orphan temp files left after the resumed run"
    assert _n_cells(cells_dir) == len(cells)


@pytest.mark.slow  # random kill points; the fixed-point kill-and-resume tests stay in the default suite
@pytest.mark.timeout(300)
def test_sweep_killed_at_three_random_points_resumes_to_the_uninterrupted_result(tmp_path):
    _kill_sweep_repeatedly(tmp_path, n_seeds=8, sleep=0.03, backend="serial", n_kills=3, seed=2026)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend, seed", [("serial", 1), ("serial", 2), ("joblib", 3), ("joblib", 4)])
def test_sweep_killed_many_times_slow(tmp_path, backend, seed):
    _kill_sweep_repeatedly(tmp_path, n_seeds=15, sleep=0.05, backend=backend, n_kills=6, seed=seed)


# --- the trainer ------------------------------------------------------------------------------------------


TRAIN_ARGS = ["--prompts-per-step", "2", "--group-size", "4", "--probe-prompts", "2", "--probe-group-size", "2",
              "--num-threads", "1", "--no-progress", "--device", "cpu", "--max-new-tokens", "4", "--checkpoint-every", "1",
              "--lr", "1e-3", "--seed", "3", "--probe-every", "1"]


def _train_cfg(out_dir, init_from, steps, **kw):
    from llm_probe.config import TrainConfig

    base = dict(out_dir=str(out_dir), init_from=str(init_from), steps=steps, prompts_per_step=2, group_size=4,
                probe_prompts=2, probe_group_size=2, num_threads=1, progress=False, device="cpu", max_new_tokens=4,
                checkpoint_every=1, lr=1e-3, seed=3, probe_every=1)
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def warm_dir(tmp_path_factory):
    from llm_probe.model import save_policy
    from tests.llm_helpers import warm_model

    pytest.importorskip("torch", reason="the trainer tests need torch ([llm] extra)")
    d = tmp_path_factory.mktemp("warm")
    model, tok = warm_model()
    save_policy(model, tok, d)
    return d


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x] if path.exists() else []


WALL_CLOCK = ("step_time",)  # the only fields of a metrics row that differ between identical runs


def _log_bytes(path: Path, drop=WALL_CLOCK) -> bytes:
    """The JSONL file with the wall-clock fields removed from each row (rows re-serialised in order)."""
    lines = path.read_text().splitlines(keepends=True)
    return "".join(json.dumps({k: v for k, v in json.loads(x).items() if k not in drop}) + "\n" for x in lines).encode()


def _read_ckpt(d: Path):
    from llm_probe.checkpoint import CHECKPOINT_NAME, read_checkpoint

    return read_checkpoint(d / CHECKPOINT_NAME)


def _check_trainer_end_state(out: Path, ref: Path, steps: int, n_probe: int):
    """Each step's rows exactly once, and the logs byte-identical to the uninterrupted run (wall time dropped);
    the checkpoint at the last step with the reference's weights bit for bit; no temp file left."""
    rows = _rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(steps)), "duplicate or missing metric rows"
    probe = _rows(out / "probe_prompts.jsonl")
    assert sorted((r["step"], r["prompt_id"]) for r in probe) == [(k, i) for k in range(steps) for i in range(n_probe)]
    assert _log_bytes(out / "metrics.jsonl") == _log_bytes(ref / "metrics.jsonl")
    assert (out / "probe_prompts.jsonl").read_bytes() == (ref / "probe_prompts.jsonl").read_bytes()
    tensors, state = _read_ckpt(out)
    ref_tensors, ref_state = _read_ckpt(ref)
    assert state["step"] == ref_state["step"] == steps  # committed bytes differ with the width of step_time
    assert {n: c["rows"] for n, c in state["logs"].items()} == {n: c["rows"] for n, c in ref_state["logs"].items()}
    assert tensors.keys() == ref_tensors.keys()
    for k, v in ref_tensors.items():
        assert bool((tensors[k] == v).all()), k
    assert not list(out.glob("*.tmp")), "orphan temp file"
    assert len(pd.read_parquet(out / "metrics.parquet")) == steps


def _kill_train_repeatedly(tmp_path, warm_dir, steps, n_kills, seed):
    """SIGKILL the CLI at random moments: after a random number of logged rows plus a random delay of up to
    0.4 s (anywhere inside a step: the rollout, a log append, the checkpoint write), then restart with --resume."""
    from llm_probe.trainer import Trainer

    ref = tmp_path / "ref"
    Trainer(_train_cfg(ref, warm_dir, steps)).run()
    out = tmp_path / "run"
    rng = np.random.default_rng(seed)
    targets = np.sort(rng.choice(np.arange(0, steps), size=n_kills, replace=False))
    killed = 0
    for target in targets:
        proc = subprocess.Popen([sys.executable, "-m", "gapdyn.cli", "train", "--out", str(out), "--init-from",
                                 str(warm_dir), "--steps", str(steps), "--resume", *TRAIN_ARGS],
                                cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        killed += _wait_then_kill(proc, lambda: _safe_rows_count(out / "metrics.jsonl"), int(target),
                                  extra_delay=float(rng.uniform(0, 0.4)))
        if (out / "checkpoint.safetensors").exists():  # whatever the kill hit, the checkpoint on disk is whole
            tensors, state = _read_ckpt(out)
            assert 1 <= state["step"] <= steps and "rng/gen" in tensors
    assert killed >= 1
    Trainer(_train_cfg(out, warm_dir, steps, resume=True)).run()  # the final restart runs to the end
    _check_trainer_end_state(out, ref, steps, n_probe=2)


def _safe_rows_count(path: Path) -> int:
    try:
        return len(_rows(path))
    except (json.JSONDecodeError, FileNotFoundError):  # a row being written right now, a log being replaced
        return 0


@pytest.mark.slow  # random kill points; the fixed-point kill-and-resume tests stay in the default suite
@pytest.mark.llm
@pytest.mark.timeout(400)
def test_training_killed_at_two_random_points_resumes_to_the_uninterrupted_run(tmp_path, warm_dir):
    _kill_train_repeatedly(tmp_path, warm_dir, steps=6, n_kills=2, seed=17)


@pytest.mark.llm
@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_training_killed_many_times_slow(tmp_path, warm_dir, seed):
    _kill_train_repeatedly(tmp_path, warm_dir, steps=12, n_kills=6, seed=seed)


class _Killed(BaseException):
    """Stands in for SIGKILL inside the process (nothing after the raise runs, no cleanup)."""


@pytest.fixture(scope="module")
def ref_run(tmp_path_factory, warm_dir):
    from llm_probe.trainer import Trainer

    ref = tmp_path_factory.mktemp("ref")
    Trainer(_train_cfg(ref, warm_dir, 4, checkpoint_every=2)).run()
    return ref


def _dies_at(monkeypatch, target, when: str):
    """Make the ``target``-th file commit (temp -> final name, the rename of gapdyn.io's one writer) die ``when`` =
    'before' or 'after' the rename; returns the call counter."""
    orig, calls = os.replace, []

    def commit(tmp, path):
        if ".tmp-" not in Path(tmp).name:  # not a commit of gapdyn.io's writer
            return orig(tmp, path)
        calls.append(Path(path).name)
        if len(calls) == target and when == "before":
            raise _Killed()
        orig(tmp, path)
        if len(calls) == target and when == "after":
            raise _Killed()

    monkeypatch.setattr(os, "replace", commit)
    return calls


# every file commit of a resume that finds rows after its checkpoint: the cut of metrics.jsonl, of
# probe_prompts.jsonl, then the checkpoint of the first resumed step; a kill before or after each rename
RESUME_KILLS = [(n, when) for n in (1, 2, 3) for when in ("before", "after")]


@pytest.mark.llm
def test_kill_during_resume_then_resume_equals_the_uninterrupted_run(tmp_path, warm_dir, ref_run):
    """Every row of RESUME_KILLS: a run killed after logging step 2 (checkpoint at 2), a resume killed at that
    file commit, a last resume to the end: logs byte-identical to the uninterrupted run, checkpoint bit for bit."""
    from llm_probe.trainer import Trainer
    from tests.tables import check_table

    orig_step = Trainer.train_step

    def dies_after_logging_step_2(self):
        if self.step == 3:  # rows of step 2 (metrics and probe) are written, the checkpoint is at step 2
            raise _Killed()
        return orig_step(self)

    def row(target, when):
        out = tmp_path / f"commit{target}-{when}"
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Trainer, "train_step", dies_after_logging_step_2)
            with pytest.raises(_Killed):
                Trainer(_train_cfg(out, warm_dir, 4, checkpoint_every=2)).run()
        assert _read_ckpt(out)[1]["step"] == 2 and len(_rows(out / "metrics.jsonl")) == 3
        with pytest.MonkeyPatch.context() as mp:
            calls = _dies_at(mp, target, when)
            with pytest.raises(_Killed):
                Trainer(_train_cfg(out, warm_dir, 4, checkpoint_every=2, resume=True)).run()
        assert calls == ["metrics.jsonl", "probe_prompts.jsonl", "checkpoint.safetensors"][:target]
        Trainer(_train_cfg(out, warm_dir, 4, checkpoint_every=2, resume=True)).run()
        _check_trainer_end_state(out, ref_run, 4, n_probe=2)

    check_table(((f"commit{n}-{w}", (n, w)) for n, w in RESUME_KILLS), row)


@pytest.mark.llm
def test_resume_without_a_checkpoint_leaves_no_duplicate_rows(tmp_path, warm_dir, monkeypatch):
    from llm_probe.trainer import Trainer

    cfg = _train_cfg(tmp_path, warm_dir, 3, checkpoint_every=0, probe_prompts=0)
    orig = Trainer.train_step

    def dies_at_step_2(self):
        if self.step == 2:
            raise _Killed()
        return orig(self)

    monkeypatch.setattr(Trainer, "train_step", dies_at_step_2)
    with pytest.raises(_Killed):
        Trainer(cfg).run()
    assert not (tmp_path / "checkpoint.safetensors").exists() and len(_rows(tmp_path / "metrics.jsonl")) == 2
    monkeypatch.setattr(Trainer, "train_step", orig)
    Trainer(_train_cfg(tmp_path, warm_dir, 3, checkpoint_every=0, probe_prompts=0, resume=True)).run()
    assert [r["step"] for r in _rows(tmp_path / "metrics.jsonl")] == [0, 1, 2]


@pytest.mark.llm
def test_resume_after_a_torn_metrics_line(tmp_path, warm_dir):
    from llm_probe.trainer import Trainer

    Trainer(_train_cfg(tmp_path, warm_dir, 2, probe_prompts=0)).run()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "method": "grp')  # the kill hit the write of step 2's row
    Trainer(_train_cfg(tmp_path, warm_dir, 3, probe_prompts=0, resume=True)).run()
    assert [r["step"] for r in _rows(tmp_path / "metrics.jsonl")] == [0, 1, 2]
