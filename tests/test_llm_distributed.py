"""GapProbeCallback on a real trl.GRPOTrainer under DDP: two CPU processes (gloo, 127.0.0.1) started with
``torchrun`` (what ``accelerate launch --num_processes 2`` starts on GPUs). Each process's reward function sees
only its share of the generation batch (here one group straddles the two ranks); the callback gathers every
rank's (prompt, completion, reward), then each rank probes only its own groups (llm_probe.sharding) and the
per-prompt scalars are gathered. Checked against (a) the gathered rollout replayed in this one process with
llm_probe.measure at the saved theta_k and theta_{k+1} (an independent route: per-prompt gaps and alignments to
1e-5 relative) and (b) a one-process GapProbeCallback driven on the same batch, theta_k, gradient and
theta_{k+1}: every logged number to 1e-6 relative, on both ranks. A launch that fails (once seen under heavy
load, not reproduced) is repeated once on a fresh port; two failures fail the test. Each launch runs in its own
session and is killed as a group on timeout; workers end with os._exit(0) once their results are written.

The same launch then runs tests/test_llm_fsdp.py's FSDP2 step in the two processes (checked there).

This file is also the worker script: ``torchrun --nproc_per_node 2 tests/test_llm_distributed.py OUT_DIR
[bench|empty]`` (``bench``: the probe time per rank against one process, :func:`bench_worker`; ``empty``: a rank
that owns no prompt group, :func:`empty_rank_worker`)."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

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
            if rank == 0:  # the DDP-averaged, clipped gradient the probe reads
                torch.save({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None},
                           out / f"grad{state.global_step}.pt")

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
    from tests.test_llm_fsdp import worker as fsdp_worker

    fsdp_worker(out)  # FSDP2 in the same two processes and group (tests/test_llm_fsdp.py): one launch for both


BENCH = dict(B=16, G=8, T=16, steps=4)  # probe-time benchmark: 16 prompts x 8 completions of 16 tokens


def synthetic_batch(model, *, B: int, G: int, T: int, seed: int = 0):
    """(prompts [N], completion ids [N][T], rewards [N] in {0, 1}, grads, theta_next) of a made-up step on
    ``model`` (tokens 2.. of the char vocabulary: no pad, no eos; every group mixed)."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [f"{a}+{a + 7}=" for a in range(10, 10 + B) for _ in range(G)]
    cids = torch.randint(2, model.config.vocab_size, (B * G, T), generator=gen).tolist()
    r = (torch.rand(B, G, generator=gen) < 0.5).float()
    r[:, 0], r[:, 1] = 1.0, 0.0
    named = dict(model.named_parameters())
    grads = {n: 1e-2 * torch.randn(p.shape, generator=gen) for n, p in named.items()}
    theta_next = {n: p.detach() - 1e-2 * grads[n] for n, p in named.items()}  # an SGD step
    return prompts, cids, r.reshape(-1).tolist(), grads, theta_next


def bench_worker(out: Path) -> None:
    """Per-rank probe time of a sharded DDP step (2 ranks, gloo) against the one-process probe of the same
    batch (rank 0, after the group is destroyed); the median over BENCH["steps"] - 1 steps (the first warms up)."""
    import torch.distributed as dist

    from llm_probe.callback import GapProbeCallback
    from llm_probe.model import TinyQwenSpec
    from tests.llm_helpers import tiny

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, tok = tiny("qwen2", seed=0, spec=TinyQwenSpec())
    theta0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    prompts, cids, rewards, grads, theta_next = synthetic_batch(model, B=BENCH["B"], G=BENCH["G"], T=BENCH["T"])

    def timed(cb, lo, hi):
        times, row = [], None
        for k in range(BENCH["steps"]):
            model.load_state_dict(theta0, strict=False)
            if dist.is_initialized():
                dist.barrier()
            t0 = time.perf_counter()
            row = drive_step(cb, model, prompts[lo:hi], cids[lo:hi], rewards[lo:hi], grads=grads,
                             theta_next=theta_next, k=k)
            times.append(time.perf_counter() - t0)
        return sorted(times[1:])[len(times[1:]) // 2], row

    N = len(cids)
    t_rank, row = timed(GapProbeCallback(tok, num_generations=BENCH["G"], probe_every=1),
                        rank * N // world, (rank + 1) * N // world)
    (out / f"bench{rank}.json").write_text(json.dumps({"time": t_rank, "row": row}))
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:  # alone: the whole batch, and one rank's share of the work (N / world rows)
        t_one, row1 = timed(GapProbeCallback(tok, num_generations=BENCH["G"], probe_every=1), 0, N)
        t_share, _ = timed(GapProbeCallback(tok, num_generations=BENCH["G"], probe_every=1), 0, N // world)
        (out / "bench_one.json").write_text(json.dumps({"time": t_one, "share_alone": t_share, "row": row1,
                                                        "load": os.getloadavg()}))


EMPTY = dict(B=1, G=4, T=5)  # one prompt group on two ranks: rank 1 owns none (owned_groups(1, 1, 2) is empty)
EMPTY_ROUTES = ("dot", "jvp")  # the gathered scalars differ by route (GapProbe._gather)


def empty_rank_worker(out: Path) -> None:
    """One probed step per route in :data:`EMPTY_ROUTES` of GapProbeCallback (headroom on) on 2 ranks (gloo)
    sharing the one group of the batch: each rank's reward function scores half of its completions, the gather
    makes the group whole, rank 0 probes it and rank 1 probes nothing but still joins every gather."""
    import torch.distributed as dist

    from llm_probe.callback import GapProbeCallback
    from tests.llm_helpers import tiny

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, tok = tiny("qwen2", seed=0)
    theta0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    prompts, cids, rewards, grads, theta_next = synthetic_batch(model, **EMPTY)
    lo, hi = rank * len(cids) // world, (rank + 1) * len(cids) // world
    rows = {}
    for alignment in EMPTY_ROUTES:
        model.load_state_dict(theta0, strict=False)
        cb = GapProbeCallback(tok, num_generations=EMPTY["G"], probe_every=1, alignment=alignment)
        rows[alignment] = drive_step(cb, model, prompts[lo:hi], cids[lo:hi], rewards[lo:hi], grads=grads,
                                     theta_next=theta_next, k=0)
    (out / f"empty{rank}.json").write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def drive_step(cb, model, prompts, cids, rewards, *, grads, theta_next, k: int, lr: float = 1e-2):
    """One probed optimizer step of ``cb`` without a trainer: the wrapped reward scores (prompts, cids) with
    ``rewards``, ``grads`` become p.grad at the model's theta_k, then the parameters jump to ``theta_next``."""
    fn = cb._rewards.wrapped[0] if cb._rewards is not None else cb.wrap_reward(_replay_reward)
    fn(prompts=prompts, completions=[""] * len(cids), completion_ids=cids, rewards=rewards)
    for n, p in model.named_parameters():
        p.grad = grads[n].clone() if n in grads else None
    state = SimpleNamespace(global_step=k, log_history=[])
    opt = SimpleNamespace(param_groups=[{"lr": lr}])
    cb.on_pre_optimizer_step(None, state, None, model=model, optimizer=opt)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in theta_next:
                p.copy_(theta_next[n])
    cb.on_optimizer_step(None, state, None, model=model, optimizer=opt)
    return cb.history[-1]


def _replay_reward(prompts, completions, completion_ids=None, rewards=None, **kw):
    return list(rewards)


def assert_rows_close(row, ref, rtol=1e-6):
    """Every number of ``ref`` (scalars and per-prompt lists) equals ``row``'s to rtol, relative to the entry
    (lists: to the list's largest entry)."""
    assert set(row) == set(ref), set(row) ^ set(ref)
    for key, b in ref.items():
        a = row[key]
        if isinstance(b, list):
            assert len(a) == len(b), key
            scale = max([abs(v) for v in b], default=0.0)
            assert all(abs(x - y) <= rtol * scale for x, y in zip(a, b)), (key, a, b)
        elif isinstance(b, float) and math.isnan(b):
            assert math.isnan(a), (key, a)
        else:
            assert a == pytest.approx(b, rel=rtol, abs=1e-12), (key, a, b)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# the environment of the CPU launches of the DDP / FSDP2 tests: accelerate in CPU mode (``accelerate launch --cpu``,
# ``use_cpu: true`` in an accelerate config); under it accelerate ignores a DeepSpeed plugin (tests/test_llm_deepspeed.py)
ACCELERATE_CPU_ENV = {"MASTER_ADDR": "127.0.0.1", "ACCELERATE_USE_CPU": "true"}


def launch(script: Path, out: Path, *extra: str, nproc: int = 2, timeout: float = 300,
           env: dict[str, str | None] | None = None) -> tuple[int, str]:
    """``torchrun --nproc_per_node nproc script out *extra`` in its own session (one thread per process, the
    repository first on PYTHONPATH, this process's PYTHONPATH kept after it), with this process's environment
    updated by ``env`` (None: :data:`ACCELERATE_CPU_ENV`; a None value unsets the variable); on timeout the whole process group is killed.
    (returncode, the tail of its output)."""
    root = Path(__file__).resolve().parents[1]
    path = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, **(ACCELERATE_CPU_ENV if env is None else env), "PYTHONPATH": path, "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    env = {k: v for k, v in env.items() if v is not None}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
           "127.0.0.1", "--master_port", str(_free_port()), str(script), str(out), *extra]
    with open(out / "launch.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = -9
    return rc, (out / "launch.log").read_text()[-6000:]


def launch_twice(script: Path, tmp_path: Path, *extra: str, timeout: float = 300) -> Path:
    """:func:`launch`, repeated once (fresh port and folder) when the first fails; the folder of the success."""
    failures = []
    for attempt in range(2):
        out = tmp_path / f"launch{attempt}"
        out.mkdir()
        rc, tail = launch(script, out, *extra, timeout=timeout)
        if rc == 0:
            return out
        failures.append(tail)
    raise AssertionError("\n--- next launch ---\n".join(failures))


@pytest.mark.llm
def test_callback_under_ddp_equals_single_process_replay(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    pytest.importorskip("accelerate")
    from llm_probe.callback import GapProbeCallback
    from llm_probe.measure import measure
    from tests.llm_helpers import tiny

    out = launch_twice(Path(__file__).resolve(), tmp_path)
    h0 = json.loads((out / "history0.json").read_text())
    h1 = json.loads((out / "history1.json").read_text())
    assert len(h0) == len(h1) == STEPS
    recs = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    _, tok = tiny("qwen2", seed=0)
    one, _ = tiny("qwen2", seed=0)  # the one-process callback on the same batches, theta_k, gradients, theta_{k+1}
    cb1 = GapProbeCallback(tok, num_generations=G, probe_every=1)
    for k in range(STEPS):
        step = [r for r in recs if r["step"] == k]
        one.load_state_dict(torch.load(out / f"k{k}.pt"), strict=False)
        ref = drive_step(cb1, one, [r["prompt"] for r in step], [r["completion_ids"] for r in step],
                         [r["reward"] for r in step], grads=torch.load(out / f"grad{k}.pt"),
                         theta_next=torch.load(out / f"k1_{k}.pt"), k=k)
        assert ref["gap/n_prompts"] == h0[k]["gap/n_prompts"]
        for h in (h0[k], h1[k]):
            assert_rows_close(h, ref)
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
    from tests.test_llm_fsdp import assert_fsdp_rows

    assert_fsdp_rows(out)  # FSDP2: the forward-only metrics equal the unsharded route's


@pytest.mark.slow
@pytest.mark.llm
def test_sharded_probe_time_per_rank(tmp_path):
    """Each rank probes half the prompts: the numbers equal the one-process ones; the probe times against the
    one-process probe are printed for BENCHMARKS.md ("Sharded gap probe under DDP"), not asserted (a speed is a
    measurement, and on a shared machine a timed assertion fails with the load, not with the code)."""
    out = launch_twice(Path(__file__).resolve(), tmp_path, "bench", timeout=600)
    ranks = [json.loads((out / f"bench{r}.json").read_text()) for r in range(2)]
    one = json.loads((out / "bench_one.json").read_text())
    for r in ranks:
        assert_rows_close(r["row"], one["row"])
    ratio = max(r["time"] for r in ranks) / one["time"]
    print(f"sharded probe: rank times {[round(r['time'], 3) for r in ranks]} s (both ranks at once), one process "
          f"{one['time']:.3f} s, ratio {ratio:.2f}; one rank's share alone {one['share_alone']:.3f} s, ratio "
          f"{one['share_alone'] / one['time']:.2f}; load {one['load']}")
    assert all(r["time"] > 0 for r in ranks) and one["time"] > 0 and one["share_alone"] > 0


@pytest.mark.parametrize("alignment", ["dot", "jvp", "both", "stream"])
def test_shard_index_path_equals_plain_probe_in_one_process(alignment):
    """GapProbe with shard_index (the whole batch as one rank's share: the gather is the identity without a
    process group) logs what the plain probe logs, on every route; a share of the groups logs its own."""
    from llm_probe.gap_probe import GapProbe
    from llm_probe.sharding import owned_groups, sub_rollout
    from llm_probe.step_hook import Step
    from tests.llm_helpers import sampled_rollout, tiny

    model, tok = tiny("qwen2", seed=0)
    ro = sampled_rollout(model, tok, B=3, G=4, T=5, seed=3)
    theta_k = {n: p.detach().clone() for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(4)
    for p in model.parameters():
        p.grad = 1e-2 * torch.randn(p.shape, generator=gen)
    step = {n: -1e-2 * p.grad for n, p in model.named_parameters()}
    res = {}
    for name, kw in (("plain", {}), ("sharded", {"shard_index": torch.arange(3)}),
                     ("share", {"shard_index": owned_groups(3, 1, 2)})):
        model.load_state_dict(theta_k, strict=False)
        probe = GapProbe(model, alignment=alignment)
        probe.before(Step(sub_rollout(ro, owned_groups(3, 1, 2)) if name == "share" else ro, **kw))
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.add_(step[n])
        res[name] = probe.after()
    assert res["sharded"].metrics.keys() == res["plain"].metrics.keys()
    for k, v in res["plain"].metrics.items():
        assert res["sharded"].metrics[k] == pytest.approx(v, rel=1e-6, abs=1e-9), k
    torch.testing.assert_close(res["sharded"].dmu_update, res["plain"].dmu_update, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(res["share"].dmu_update, res["plain"].dmu_update[1:2], rtol=1e-5, atol=1e-7)


@pytest.mark.slow  # a second two-process launch: 110 s wall at load 9 on the 2-core machine
@pytest.mark.llm
def test_rank_without_prompt_groups_logs_the_one_process_numbers(tmp_path):
    """Fewer prompt groups than ranks (1 group, 2 ranks): the rank that owns no group logs what the owning rank
    logs, and both what one process logs on the whole batch (same theta_k, gradient, theta_{k+1}), per route."""
    pytest.importorskip("accelerate")
    from llm_probe.callback import GapProbeCallback
    from llm_probe.sharding import owned_groups
    from tests.llm_helpers import tiny

    assert owned_groups(EMPTY["B"], 0, 2).tolist() == [0] and owned_groups(EMPTY["B"], 1, 2).numel() == 0
    out = launch_twice(Path(__file__).resolve(), tmp_path, "empty")
    ranks = [json.loads((out / f"empty{r}.json").read_text()) for r in range(2)]
    for alignment in EMPTY_ROUTES:
        model, tok = tiny("qwen2", seed=0)
        prompts, cids, rewards, grads, theta_next = synthetic_batch(model, **EMPTY)
        ref = drive_step(GapProbeCallback(tok, num_generations=EMPTY["G"], probe_every=1, alignment=alignment),
                         model, prompts, cids, rewards, grads=grads, theta_next=theta_next, k=0)
        assert ref["gap/n_prompts"] == 1 and math.isfinite(ref["gap/headroom"])  # not vacuous
        for r in ranks:
            assert_rows_close(r[alignment], ref)


def test_callback_names_what_fsdp_and_deepspeed_skip(monkeypatch, caplog):
    pytest.importorskip("trl")
    from llm_probe.callback import GapProbeCallback
    from llm_probe.sharding import NEEDS_FULL_PARAMETERS

    base = dict(num_iterations=1, gradient_accumulation_steps=1, steps_per_generation=1)
    for extra, name in ((dict(fsdp="full_shard"), "FSDP"), (dict(deepspeed="ds.json"), "DeepSpeed")):
        cb = GapProbeCallback(object(), num_generations=4)
        with caplog.at_level("WARNING", logger="llm_probe.callback"):
            cb.on_train_begin(SimpleNamespace(**base, **extra), None, None)
        assert cb._sharded == name and cb.skipped == NEEDS_FULL_PARAMETERS
        assert f"under {name}" in caplog.text and "gap/cos_update_mean" in caplog.text
    cb = GapProbeCallback(object(), num_generations=4)
    cb.on_train_begin(SimpleNamespace(**base, fsdp=[], deepspeed=None), None, None)  # plain DDP / one process
    assert cb._sharded is None and cb.skipped == ()
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch` with an FSDP config sets
    cb.on_train_begin(SimpleNamespace(**base, fsdp=[], deepspeed=None), None, None)
    assert cb._sharded == "FSDP"


if __name__ == "__main__":
    {"bench": bench_worker, "empty": empty_rank_worker}.get(sys.argv[2] if sys.argv[2:] else "", worker)(
        Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # results are written; skip interpreter teardown (the gloo group's threads can abort it)
