"""The library entry point ``gapdyn.evidence.sweep.run_sweep`` under SIGTERM (RELIABILITY.md, "Commands: exit codes,
signals, outputs"): a plain script (no ``gapdyn.cmdline.command`` around it) that is sent SIGTERM while a
joblib sweep runs dies of the signal, as with no handler, but only after the sweep's worker processes are
stopped; the caller's SIGTERM handler is the same after the call."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gapdyn.cmdline import _alive, _descendants

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "NUMBA_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "GAPDYN_TORCH_THREADS": "1"}

# cell 0 returns at once; the others hold their worker for 120 s, so a worker the sweep does not stop outlives it
_SCRIPT = """
import sys
from gapdyn.evidence.sweep import example_cell, run_sweep
cells = [{"seed": 0, "n": 2}] + [{"seed": s, "n": 2, "sleep": 120.0} for s in range(1, 5)]
run_sweep(example_cell, cells, name="sig", store=sys.argv[1], backend="joblib", n_jobs=2, progress=False)
print("finished")
"""


def _wait_for(pred, proc, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def test_sigterm_to_a_script_running_a_joblib_sweep_leaves_no_worker(tmp_path):
    cells = tmp_path / "sig" / "cells"
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "w") as fo, open(err, "w") as fe:  # files, not pipes: a leftover worker would hold a pipe open
        proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, str(tmp_path)], cwd=tmp_path, env=ENV,
                                stdout=fo, stderr=fe)
    kids = []
    try:
        # the hook: the first cell committed to the store (written by the driver as the cell completes)
        assert _wait_for(lambda: any(cells.glob("*.parquet")), proc), err.read_text()
        kids = _descendants(proc.pid)
        assert len(kids) >= 2, kids  # the loky workers (and their resource tracker)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, err.read_text())  # 143 in a shell
    assert "finished" not in out.read_text()
    deadline = time.monotonic() + 10
    while _alive(kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [k for k in kids if _alive(k)]
    try:
        assert not left, f"processes of the sweep left running: {left}"
    finally:
        for k in left:
            os.kill(k, signal.SIGKILL)
    assert len(list(cells.glob("*.parquet"))) == 1  # the committed cell stays; no other cell finished


def _custom(signum, frame):  # pragma: no cover - never called
    pass


def test_run_sweep_restores_the_callers_sigterm_handler(tmp_path):
    from gapdyn.evidence.sweep import example_cell, run_sweep

    cells = [{"seed": 0, "n": 2}, {"seed": 1, "n": 2}]
    before = signal.getsignal(signal.SIGTERM)
    try:
        for handler in (signal.SIG_DFL, _custom):
            signal.signal(signal.SIGTERM, handler)
            df = run_sweep(example_cell, cells, name=f"h{id(handler)}", backend="joblib", n_jobs=2, progress=False)
            assert len(df) == 4
            assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, before)
