"""llm_probe.threads: the thread count it says it sets (read back from torch), the GAPDYN_TORCH_THREADS
override, refused values, and bit-identical warm-ups at the same thread count (in-process and across fresh
processes; the spin count OpenMP really uses is read from its own start-up report, OMP_DISPLAY_ENV)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from benchmarks.threads import run_config, warm_digest  # noqa: E402
from llm_probe import threads as th  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def restore(monkeypatch):
    """Leave torch's count and the module's record as they were (the session runs with 1 thread)."""
    before = torch.get_num_threads()
    monkeypatch.setattr(th, "_configured", th._configured)
    monkeypatch.delenv(th.ENV_THREADS, raising=False)
    yield
    torch.set_num_threads(before)


def test_configure_sets_torch_threads(restore):
    assert th.configure_threads(2) == 2 and torch.get_num_threads() == 2
    assert th.configure_threads(1) == 1 and torch.get_num_threads() == 1
    assert th.configure_threads() == th.DEFAULT_THREADS == torch.get_num_threads() == 1


def test_env_override_and_explicit_count(restore, monkeypatch):
    monkeypatch.setenv(th.ENV_THREADS, "2")
    assert th.resolve_threads() == 2
    assert th.configure_threads() == 2 and torch.get_num_threads() == 2
    assert th.configure_threads(1) == 1 and torch.get_num_threads() == 1  # an explicit count wins
    monkeypatch.setenv(th.ENV_THREADS, " ")
    assert th.resolve_threads() == th.DEFAULT_THREADS


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5", "2x"])
def test_bad_env_value_refused(restore, monkeypatch, bad):
    torch.set_num_threads(1)
    monkeypatch.setenv(th.ENV_THREADS, bad)
    with pytest.raises(ValueError, match=th.ENV_THREADS):
        th.configure_threads()
    assert torch.get_num_threads() == 1  # refused before anything was set


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "x"])
def test_bad_count_refused(restore, bad):
    with pytest.raises(ValueError, match="^n must"):
        th.configure_threads(bad)


def test_use_threads_keeps_the_configured_count(restore, monkeypatch):
    from llm_probe import AdditionTask, build_char_tokenizer, warmup

    th.configure_threads(2)
    assert th.use_threads() == 2
    tok, model = build_char_tokenizer(), torch.nn.Linear(2, 2)  # steps=0: the warm-up only sets up
    warmup(model, tok, AdditionTask(), steps=0)
    assert torch.get_num_threads() == 2  # the warm-up keeps what the process configured
    monkeypatch.setattr(th, "_configured", None)
    warmup(model, tok, AdditionTask(), steps=0)
    assert torch.get_num_threads() == th.DEFAULT_THREADS  # nothing configured yet: the default
    assert th.use_threads(2) == 2 == torch.get_num_threads()


def test_set_wait_policy_keeps_an_explicit_value(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert th.set_wait_policy() is False  # torch is imported here: too late for this process
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    th.set_wait_policy()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    with pytest.raises(ValueError, match="policy"):
        th.set_wait_policy("SPIN")


def test_same_thread_count_same_bits_in_process(restore):
    th.configure_threads(1)
    a = warm_digest(3, small=True)[-1]
    b = warm_digest(3, small=True)[-1]
    c = warm_digest(3, small=True, seed=1)[-1]
    d = warm_digest(2, small=True)[-1]
    assert a == b
    assert len({a, c, d}) == 3  # the digest sees the seed and the number of steps


@pytest.mark.slow
def test_fresh_one_thread_processes_give_identical_warm_weights(restore):
    th.configure_threads(1)
    here = warm_digest(3, small=True)[-1]
    rows = [run_config(1, "PASSIVE", warmup_steps=3, rl_steps=0, small=True) for _ in range(2)]
    for r in rows:
        assert "error" not in r, r
        assert r["threads"] == 1 and r["spincount"] == "0"
    assert rows[0]["warm_digest"] == rows[1]["warm_digest"] == here


def _spincount_after_import(policy: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update(PYTHONPATH=str(ROOT), OMP_DISPLAY_ENV="VERBOSE")
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    p = subprocess.run([sys.executable, "-c", "import llm_probe, torch"], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return next(ln.split("=", 1)[1].strip().strip("'") for ln in p.stderr.splitlines() if "GOMP_SPINCOUNT" in ln)


@pytest.mark.slow
def test_import_llm_probe_sets_passive_before_torch_loads():
    assert _spincount_after_import(None) == "0"  # llm_probe's import set PASSIVE before torch's
    assert _spincount_after_import("ACTIVE") != "0"  # an explicit policy is kept
