"""The demonstration writes the documented files and columns (fast: 2 runs x 3 steps on the cached warm model);
the full CPU demonstration is marked slow."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from llm_probe.experiments.demo import RUN_COLUMNS, DemoConfig, run_demo
from llm_probe.model import save_policy
from tests.llm_helpers import warm_model

pytestmark = pytest.mark.llm


def _seed_warm_dir(out):
    model, tok = warm_model()
    save_policy(model, tok, out / "warm")
    (out / "warm" / "warmup.json").write_text(json.dumps({"sampled_accuracy": float("nan")}))


def test_demo_writes_documented_outputs(tmp_path):
    _seed_warm_dir(tmp_path)
    runs = run_demo(DemoConfig(out_dir=str(tmp_path), seeds=(0,), lrs=(3e-4,), steps=3, prompts_per_step=4,
                               group_size=4, probe_every=1, probe_prompts=2))
    assert list(runs.columns) == list(RUN_COLUMNS) and len(runs) == 2
    assert set(runs["method"]) == {"grpo", "wapo"}
    on_disk = pd.read_csv(tmp_path / "runs.csv")
    assert list(on_disk.columns) == list(RUN_COLUMNS)
    allm = pd.read_parquet(tmp_path / "metrics_all.parquet")
    assert len(allm) == 6 and {"method", "lr", "seed", "reward", "gap/M_mean"} <= set(allm.columns)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert {g["method"] for g in s["groups"]} == {"grpo", "wapo"} and "baseline" in s


@pytest.mark.slow
def test_full_cpu_demo(tmp_path):
    """The documented demonstration (about 20-40 min on a shared 2-core CPU): 2 methods x 3 lrs x 5 seeds."""
    runs = run_demo(DemoConfig(out_dir=str(tmp_path), seeds=(0, 1, 2, 3, 4), lrs=(3e-4, 5e-4, 1e-3), steps=150))
    assert len(runs) == 30
    assert not runs[runs.lr == 3e-4]["alerted"].any()  # the healthy setting raised no alarm in our run
