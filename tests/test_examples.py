"""examples/trl_grpo_probe.py runs as users copy it (via runpy, tiny settings, CPU): what it prints is what
GapProbeCallback recorded (history rows vs TRL's log_history, parsed back from stdout), probed on the steps
probe_every says, and ``--model DIR`` trains the saved model (a save / from_pretrained round trip)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

pytestmark = pytest.mark.llm

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "trl_grpo_probe.py"


def _main():
    import torch

    torch.set_num_threads(1)
    return runpy.run_path(str(EXAMPLE))["main"]


def test_trl_example_prints_the_callbacks_metrics(tmp_path, capsys):
    trainer, cb = _main()(["--steps", "4", "--probe-every", "2", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert [r["step"] for r in cb.history] == [0, 2]  # optimizer steps k % 2 == 0
    lines = [ln for ln in out.splitlines() if ln.startswith("step ")]
    assert len(lines) == 2
    for ln, row in zip(lines, cb.history):
        printed = dict(re.findall(r"(gap/\S+) (\S+)", ln))
        assert int(ln.split()[1]) == row["step"] + 1  # TRL's log rows count the steps done
        for k, v in printed.items():
            assert float(v) == pytest.approx(row[k], rel=1e-3, abs=1e-12), k
        assert "gap/headroom" in printed
    h = np.array([r["gap/headroom_lr"] for r in cb.history if not np.isnan(r["gap/headroom_lr"])])
    suggested = float(re.search(r"suggested lr (\S+)", out).group(1))
    assert suggested == pytest.approx(np.quantile(h, 0.1, method="lower"), rel=1e-2)
    logged = [r for r in trainer.state.log_history if "gap/M_batch" in r]
    assert [r["step"] for r in logged] == [1, 3]


def test_trl_example_trains_a_local_from_pretrained_folder(tmp_path, capsys):
    from llm_probe.model import save_policy
    from tests.llm_helpers import SMALL, tiny

    model, tok = tiny(spec=SMALL, seed=3)
    save_policy(model, tok, tmp_path / "m")
    trainer, cb = _main()(["--model", str(tmp_path / "m"), "--steps", "2", "--probe-every", "1",
                           "--out", str(tmp_path / "out")])
    assert trainer.model.config.hidden_size == SMALL.hidden_size != 64  # the saved model, not the built default
    assert [r["step"] for r in cb.history] == [0, 1]
    assert "probed 2 steps" in capsys.readouterr().out
