"""What a resume trusts (llm_probe.checkpoint, Trainer._check_state): a checkpoint whose bytes, state or digest
changed after it was written, one without a digest, and one whose state contradicts the committed metrics log
are refused with one line naming the file; a kill at any point of the digest commit leaves a checkpoint that
reads whole; one process at a time writes a run folder (flock), and the next one proceeds once it is gone."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llm_probe.checkpoint import (CHECKPOINT_NAME, LOCK_NAME, CheckpointError, RunFolderLockedError, digest_path,
                                  lock_run_folder, read_checkpoint, write_checkpoint)
from llm_probe.collapse import CollapseConfig
from llm_probe.config import TrainConfig
from llm_probe.trainer import Trainer

pytestmark = [pytest.mark.llm, pytest.mark.timeout(300)]

STEPS = 6
# H0 and R0 given, so no baseline rollouts at step 0
RUN = dict(prompts_per_step=2, group_size=4, probe_prompts=0, probe_every=1, num_threads=1, progress=False,
           device="cpu", max_new_tokens=4, checkpoint_every=2, lr=1e-3, seed=3,
           collapse=CollapseConfig(baseline_entropy=0.5, baseline_reward=0.5))
CLI_RUN = ["--prompts-per-step", "2", "--group-size", "4", "--probe-prompts", "0", "--probe-every", "1",
           "--num-threads", "1", "--no-progress", "--device", "cpu", "--max-new-tokens", "4", "--checkpoint-every", "2",
           "--lr", "1e-3", "--seed", "3", "--collapse.baseline-entropy", "0.5", "--collapse.baseline-reward", "0.5"]


def _cfg(out, warm, steps=STEPS, **kw):
    return TrainConfig(out_dir=str(out), init_from=str(warm), steps=steps, **{**RUN, **kw})


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    from tests.llm_helpers import saved_warm_model

    return saved_warm_model(tmp_path_factory.mktemp("warm"))


@pytest.fixture(scope="module")
def six(tmp_path_factory, warm):
    """A finished run folder: 6 steps, 6 committed metrics rows, its checkpoint at step 6."""
    d = tmp_path_factory.mktemp("six")
    Trainer(_cfg(d, warm)).run()
    return d


# ---- damage helpers (each independent of the code under test: raw bytes, the safetensors header by hand) ----


def _header(b: bytes) -> tuple[int, dict]:
    n = int.from_bytes(b[:8], "little")  # safetensors: u64 header length, JSON header, raw tensor bytes
    return n, json.loads(b[8:8 + n])


def _flip_tensor_bit(d: Path):
    p = d / CHECKPOINT_NAME
    b = bytearray(p.read_bytes())
    n, h = _header(bytes(b))
    start = h["model/lm_head.weight"]["data_offsets"][0]
    b[8 + n + start + 2] ^= 0x10  # one bit of the first float32's mantissa
    p.write_bytes(bytes(b))


def _flip_state_bit(d: Path):
    """Bit 0 of the last digit of M_batch's mantissa ('0' <-> '1', ..., '8' <-> '9'): the state stays valid JSON
    whatever the value (flipping a leading '1' of 10.5 would give the invalid 00.5)."""
    p = d / CHECKPOINT_NAME
    b = bytearray(p.read_bytes())
    i = bytes(b).index(b'\\"M_batch\\": ') + len(b'\\"M_batch\\": ')
    j = i
    while chr(b[j]).isdigit() or chr(b[j]) == ".":
        j += 1
    j -= 1 if chr(b[j - 1]).isdigit() else 2
    assert j >= i and chr(b[j]).isdigit()
    b[j] ^= 0x01
    p.write_bytes(bytes(b))


def _flip_digest_bit(d: Path):
    p = digest_path(d / CHECKPOINT_NAME)
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x04
    p.write_bytes(bytes(b))


def _edit(d: Path, fn):
    """Rewrite the checkpoint with an edited state, through write_checkpoint (so its digest is valid)."""
    t, s = read_checkpoint(d / CHECKPOINT_NAME)
    fn(s)
    write_checkpoint(d / CHECKPOINT_NAME, t, s)


def _swap_first_two_rows(d: Path):
    """metrics.jsonl with the step numbers of rows 0 and 1 swapped: same bytes, same row count."""
    p = d / "metrics.jsonl"
    rows = p.read_bytes().split(b"\n")
    rows[0], rows[1] = rows[0].replace(b'"step": 0', b'"step": 1', 1), rows[1].replace(b'"step": 1', b'"step": 0', 1)
    p.write_bytes(b"\n".join(rows))


# case -> (damage, file named in the message, words of the message)
REFUSED = {
    "bit flip in a tensor": (_flip_tensor_bit, CHECKPOINT_NAME, "does not match its digest"),
    "bit flip in the state": (_flip_state_bit, CHECKPOINT_NAME, "does not match its digest"),
    "bit flip in the digest": (_flip_digest_bit, "checkpoint.sha256", "is damaged"),
    "no digest": (lambda d: digest_path(d / CHECKPOINT_NAME).unlink(), "checkpoint.safetensors",
                  "has no digest checkpoint.sha256 (written by an older version): start a new run or delete"),
    "step 2 with 6 rows": (lambda d: _edit(d, lambda s: s.update(step=2)), CHECKPOINT_NAME,
                           "at step 2 but committed 6 rows of metrics.jsonl"),
    "step 10**30": (lambda d: _edit(d, lambda s: s.update(step=10**30)), CHECKPOINT_NAME,
                    f"step {10**30} is outside 0..6"),
    "M_batch inf": (lambda d: _edit(d, lambda s: s.update(M_batch=float("inf"))), CHECKPOINT_NAME,
                    "M_batch = inf is not finite"),
    "M_batch NaN": (lambda d: _edit(d, lambda s: s.update(M_batch=float("nan"))), CHECKPOINT_NAME,
                    "M_batch = nan is not finite"),
    "M_batch negative": (lambda d: _edit(d, lambda s: s.update(M_batch=-1.0)), CHECKPOINT_NAME, "is negative"),
    "more faults than steps": (lambda d: _edit(d, lambda s: s.update(faults=[7, 0])), CHECKPOINT_NAME,
                               "faults [7, 0] must satisfy"),
    "inf in the optimizer state": (lambda d: _edit(d, lambda s: s["optimizer"]["param_groups"][0].update(lr=1e999)),
                                   CHECKPOINT_NAME, "optimizer.param_groups[0].lr = inf"),
    "committed rows renumbered": (_swap_first_two_rows, CHECKPOINT_NAME, "are steps [1, 0, 2]"),
}


def test_refused_checkpoints_are_one_error_line_at_the_cli(tmp_path, warm, six, capsys):
    """Every row of REFUSED: `gapdyn train --resume` exits 2 with one error line naming the file and the reason,
    no traceback, metrics.jsonl and the checkpoint unchanged (nothing was appended or cut)."""
    from gapdyn.cli import main
    from tests.tables import check_table

    def row(case, damage, named, words):
        d = tmp_path / case.replace(" ", "_").replace("*", "")
        shutil.copytree(six, d)
        damage(d)
        before = {p.name: p.read_bytes() for p in (d / "metrics.jsonl", d / CHECKPOINT_NAME)}
        capsys.readouterr()
        rc = main(["train", "--out", str(d), "--init-from", str(warm), "--steps", "8", "--resume", *CLI_RUN])
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.startswith("gapdyn train: error:")]
        assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (rc, err)
        assert named in lines[0] and words in lines[0], lines[0]
        assert {p: (d / p).read_bytes() for p in before} == before

    check_table(((case, (case, *spec)) for case, spec in REFUSED.items()), row)


def test_the_flips_are_silent_without_the_digest(tmp_path, six):
    """The two flips of REFUSED still parse as a whole checkpoint (so only the digest can catch them): the flipped
    tensor differs from the original in exactly one element, the flipped state only in M_batch."""
    t0, s0 = read_checkpoint(six / CHECKPOINT_NAME)
    for flip in (_flip_tensor_bit, _flip_state_bit):
        d = tmp_path / flip.__name__
        shutil.copytree(six, d)
        flip(d)
        t, s = read_checkpoint(d / CHECKPOINT_NAME, verify=False)
        changed = [k for k in t0 if not torch.equal(t[k], t0[k])]
        if flip is _flip_tensor_bit:
            assert changed == ["model/lm_head.weight"] and int((t[changed[0]] != t0[changed[0]]).sum()) == 1
            assert s == s0
        else:
            assert changed == [] and {k for k in s0 if s[k] != s0[k]} == {"M_batch"}


def test_an_intact_copy_resumes(tmp_path, warm, six):
    """The control of REFUSED: the undamaged folder resumes and appends exactly the new steps."""
    d = tmp_path / "intact"
    shutil.copytree(six, d)
    Trainer(_cfg(d, warm, steps=STEPS + 1, resume=True)).run()
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(STEPS + 1))
    assert read_checkpoint(d / CHECKPOINT_NAME)[1]["step"] == STEPS + 1


# ---- the digest and its commit ------------------------------------------------------------------------------


def test_the_digest_is_sha256_of_the_file_and_of_the_canonical_state(tmp_path):
    path = write_checkpoint(tmp_path / CHECKPOINT_NAME, {"x": torch.arange(5.0)}, {"step": 3, "b": [1, 2.5], "a": None})
    rec = json.loads(digest_path(path).read_text())
    assert rec["file_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert rec["state_sha256"] == hashlib.sha256(b'{"a":null,"b":[1,2.5],"step":3}').hexdigest()
    assert digest_path(path).name == "checkpoint.sha256" and not list(tmp_path.glob("*.next"))


class _Killed(BaseException):
    """Stands in for SIGKILL inside the process (nothing after the raise runs)."""


# (which write dies, before / after it) -> the checkpoint a reader then gets: "old" or "new"
COMMIT_KILLS = {("pending digest", "torn"): "old", ("checkpoint.safetensors", "before"): "old",
                ("checkpoint.safetensors", "after"): "new", ("checkpoint.sha256", "before"): "new",
                ("checkpoint.sha256", "after"): "new"}


def test_a_kill_at_any_point_of_the_digest_commit_leaves_a_checkpoint_that_reads_whole(tmp_path, monkeypatch):
    """Every row of COMMIT_KILLS: write checkpoint A, then die while writing B; read_checkpoint returns A or B
    (tensors and state as written), never a refusal; a flipped bit in that file is still refused."""
    import llm_probe.checkpoint as ck
    from tests.tables import check_table

    old = ({"w": torch.zeros(4)}, {"step": 1})
    new = ({"w": torch.ones(4)}, {"step": 2})
    orig_replace, orig_pending = os.replace, ck._write_synced

    def row(target, when, expect):
        d = tmp_path / f"{target}-{when}".replace(" ", "_")
        d.mkdir()
        path = write_checkpoint(d / CHECKPOINT_NAME, *old)

        def commit(tmp, dest):  # the rename of gapdyn.io's one writer
            if Path(dest).name == target and when == "before":
                raise _Killed()
            orig_replace(tmp, dest)
            if Path(dest).name == target and when == "after":
                raise _Killed()

        def pending(p, data):
            if target == "pending digest":
                Path(p).write_bytes(data[: len(data) // 2])  # torn: the kill hit the write
                raise _Killed()
            orig_pending(p, data)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(os, "replace", commit)
            mp.setattr(ck, "_write_synced", pending)
            with pytest.raises(_Killed):
                write_checkpoint(path, *new)
        tensors, state = read_checkpoint(path)
        want = old if expect == "old" else new
        assert state == want[1] and torch.equal(tensors["w"], want[0]["w"]), (state, tensors)
        b = bytearray(path.read_bytes())
        b[-1] ^= 0x01
        path.write_bytes(bytes(b))
        with pytest.raises(CheckpointError, match="does not match its digest"):
            read_checkpoint(path)

    check_table(((f"{t}-{w}", (t, w, e)) for (t, w), e in COMMIT_KILLS.items()), row)


# ---- one writer per run folder ------------------------------------------------------------------------------

# A plain flock from another process, the same protocol as lock_run_folder; exit 3 when the lock is taken.
HOLD = """import fcntl, sys
f = open(sys.argv[1], "a+")
try:
    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    sys.exit(3)
if sys.argv[2] == "hold":
    print("locked", flush=True)
    sys.stdin.read()
"""


def _try_lock(d: Path) -> int:
    return subprocess.run([sys.executable, "-c", HOLD, str(d / LOCK_NAME), "try"], timeout=60).returncode


def test_a_second_writer_is_refused_until_the_first_process_dies(tmp_path, warm, capsys):
    """Another process holds the folder's lock: Trainer.run and `gapdyn train --resume` are refused with one line
    naming the folder, the files untouched; once that process is SIGKILLed, the same resume runs to the end."""
    from gapdyn.cli import main

    d = tmp_path / "run"
    Trainer(_cfg(d, warm, steps=2)).run()
    before = (d / "metrics.jsonl").read_bytes()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(d / LOCK_NAME), "hold"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderLockedError, match=rf"run folder {d} is being written by another process"):
            Trainer(_cfg(d, warm, steps=3, resume=True)).run()
        capsys.readouterr()
        rc = main(["train", "--out", str(d), "--init-from", str(warm), "--steps", "3", "--resume", *CLI_RUN])
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.startswith("gapdyn train: error:")]
        assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
        assert lines[0].startswith(f"gapdyn train: error: run folder {d} is being written by another process"), err
        assert (d / "metrics.jsonl").read_bytes() == before
    finally:
        holder.kill()
        holder.wait(timeout=60)
    Trainer(_cfg(d, warm, steps=3, resume=True)).run()
    assert [json.loads(x)["step"] for x in (d / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]


def test_the_trainer_holds_the_lock_while_it_runs_and_releases_it(tmp_path, warm, monkeypatch):
    """During Trainer.run another process cannot take the lock (exit 3), nor a second open of the file in this
    process (lock_run_folder refuses); after the run, and after a run that died with an exception, both can."""
    d = tmp_path / "run"
    seen = []
    orig = Trainer.train_step

    def step_and_probe_the_lock(self):
        if self.step == 1:
            seen.append(_try_lock(d))
            with pytest.raises(RunFolderLockedError):
                with lock_run_folder(d):
                    pass
        if self.step == 2 and getattr(self, "die", False):
            raise _Killed()
        return orig(self)

    monkeypatch.setattr(Trainer, "train_step", step_and_probe_the_lock)
    Trainer(_cfg(d, warm, steps=2)).run()
    assert seen == [3] and _try_lock(d) == 0
    tr = Trainer(_cfg(d, warm, steps=4, resume=True))
    tr.die = True
    with pytest.raises(_Killed):
        tr.run()
    assert _try_lock(d) == 0
    with lock_run_folder(d):  # released in this process too
        pass
