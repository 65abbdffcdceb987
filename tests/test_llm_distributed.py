"""GapProbeCallback on a real trl.GRPOTrainer under DDP: two CPU processes (gloo, 127.0.0.1) started with
``torchrun`` (what ``accelerate launch --num_processes 2`` starts on GPUs). Each process's reward function sees
only its share of the generation batch (here one group straddles the two ranks); the callback gathers every rank's (prompt, completion, reward) before the probe.
Checked against the gathered rollout replayed in this one process with llm_probe.measure at the saved theta_k
and theta_{k+1}: per-prompt gaps (norms) and alignments equal to 1e-5 relative, on both ranks. A launch that
fails (once seen under heavy load, not reproduced) is repeated once on a fresh port; two failures fail the test.

This file is also the worker script: ``torchrun --nproc_per_node 2 tests/test_llm_distributed.py OUT_DIR``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

G, PER_DEVICE, STEPS = 4, 6, 2  # 2 ranks x 6 = 12 completions = 3 groups; group 1 lies on both ranks


def worker(out: Path) -> None:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from llm_probe.callback import GapProbeCallback
    from tests.llm_helpers import tiny

    torch.set_num_threads(1)
    model, tok = tiny("qwen2", seed=0)
    ds = Dataset.from_dict({"prompt": [f"{a}+{a + 3}=" for a in range(10, 40)]})

    def parity(prompts, completions, completion_ids=None, **kw):  # any deterministic, mixed reward
        return [float(sum(c) % 2) for c in completion_ids]

    rank = int(os.environ.get("RANK", "0"))

    class Snapshots(TrainerCallback):
        """theta_k and theta_{k+1} of every step (rank 0), for the single-process replay."""

        def save(self, model, name):
            if rank == 0:
                torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, out / name)

        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            self.save(model, f"k{state.global_step}.pt")

        def on_optimizer_step(self, args, state, control, model=None, **kw):
            self.save(model, f"k1_{state.global_step}.pt")

    cb = GapProbeCallback(tok, num_generations=G, probe_every=1, log_path=out / "gap.jsonl",
                          rollout_path=out / "rollouts.jsonl")
    args = GRPOConfig(output_dir=str(out / "trl"), per_device_train_batch_size=PER_DEVICE, num_generations=G,
                      max_completion_length=5, max_steps=STEPS, learning_rate=1e-2, optim="adamw_torch",
                      lr_scheduler_type="constant", use_cpu=True, bf16=False, report_to="none",
                      gradient_checkpointing=False, logging_steps=1, save_strategy="no", temperature=1.0, beta=0.0,
                      seed=0, warmup_steps=0, generation_kwargs={"suppress_tokens": [tok.pad_token_id]},
                      ddp_backend="gloo")
    trainer = GRPOTrainer(model=model, reward_funcs=cb.wrap_reward(parity), args=args, train_dataset=ds,
                          processing_class=tok, callbacks=[Snapshots()])
    cb.attach(trainer)
    trainer.train()
    (out / f"history{rank}.json").write_text(json.dumps(cb.history))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.llm
def test_callback_under_ddp_equals_single_process_replay(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    pytest.importorskip("accelerate")
    from llm_probe.measure import measure
    from tests.llm_helpers import tiny

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "ACCELERATE_USE_CPU": "true", "TOKENIZERS_PARALLELISM": "false"}
    failures = []
    for attempt in range(2):  # a second launch (fresh port and folder) only when the first fails to start or finish
        out = tmp_path / f"launch{attempt}"
        out.mkdir()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(_free_port()), str(Path(__file__).resolve()), str(out)]
        run = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
        if run.returncode == 0:
            break
        failures.append(run.stdout[-2000:] + run.stderr[-4000:])
    assert run.returncode == 0, "\n--- next launch ---\n".join(failures)
    h0 = json.loads((out / "history0.json").read_text())
    h1 = json.loads((out / "history1.json").read_text())
    assert len(h0) == len(h1) == STEPS
    recs = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    _, tok = tiny("qwen2", seed=0)
    for k in range(STEPS):
        step = [r for r in recs if r["step"] == k]
        assert len(step) == 2 * PER_DEVICE  # both ranks' completions
        model, _ = tiny("qwen2", seed=0)
        sd0, sd1 = torch.load(out / f"k{k}.pt"), torch.load(out / f"k1_{k}.pt")
        model.load_state_dict(sd0, strict=False)
        prompts = [tok(r["prompt"], add_special_tokens=False)["input_ids"] for r in step]
        ref = measure(model, None, prompts, [r["completion_ids"] for r in step], [r["reward"] for r in step],
                      update=(sd0, sd1), route="dot")
        for h in (h0[k], h1[k]):
            assert h["gap/n_prompts"] == len(ref["groups"])
            if not len(ref["groups"]):
                continue
            scale = float(ref["dmu"].abs().max())
            torch.testing.assert_close(torch.tensor(h["gap/dmu_update"], dtype=torch.float64), ref["dmu"],
                                       rtol=1e-5, atol=1e-5 * scale)
            torch.testing.assert_close(torch.tensor(h["gap/norm"], dtype=torch.float64), ref["gap_norm"],
                                       rtol=1e-5, atol=0)
            assert h["update_norm"] == pytest.approx(ref["update_norm"], rel=1e-5)
    assert any(h["gap/n_prompts"] > 0 for h in h0)  # not vacuous


def test_callback_refuses_fsdp_and_deepspeed(monkeypatch):
    pytest.importorskip("trl")
    from types import SimpleNamespace

    from llm_probe.callback import GapProbeCallback

    cb = GapProbeCallback(object(), num_generations=4)
    base = dict(num_iterations=1, gradient_accumulation_steps=1, steps_per_generation=1)
    for extra, name in ((dict(fsdp="full_shard"), "FSDP"), (dict(deepspeed="ds.json"), "DeepSpeed")):
        with pytest.raises(ValueError, match=f"DDP training only, not {name}"):
            cb.on_train_begin(SimpleNamespace(**base, **extra), None, None)
    cb.on_train_begin(SimpleNamespace(**base, fsdp=[], deepspeed=None), None, None)  # plain DDP / one process
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch` with an FSDP config sets
    with pytest.raises(ValueError, match="not FSDP"):
        cb.on_train_begin(SimpleNamespace(**base, fsdp=[], deepspeed=None), None, None)


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
    if torch.distributed.is_initialized():  # the gloo group's threads, left to interpreter exit, can abort
        torch.distributed.destroy_process_group()  # the process ("terminate called without an active exception")
