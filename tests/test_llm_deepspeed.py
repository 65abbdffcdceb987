"""GapProbeCallback under DeepSpeed ZeRO-3 on CPU: the forward-only probe (llm_probe.sharding.ForwardProbe).

Two CPU processes (DeepSpeed's CPU accelerator, gloo) hold a tiny Qwen under ZeRO-3 (parameters, gradients and
optimizer state partitioned; a ZeRO-3 module is detected by its parameters' ``ds_id``). SGD steps of
loss = -mean_n log pi(o_n) on the whole batch (the same loss on every rank, so ZeRO's averaged gradient is the
one-process gradient):

- driven by hand through the callback's hooks: ``engine.backward`` / ``engine.step`` between
  ``on_pre_optimizer_step`` and ``on_optimizer_step`` (:func:`worker`); every logged number must equal the
  callback's forward-only route on the unsharded model in this process (tests/test_llm_fsdp.py's reference, 1e-5
  relative);
- under transformers' Trainer with the callback attached (:func:`trainer_worker`, 2 steps), in two launch
  environments. accelerate's default mode runs ZeRO-3 and steps the engine inside ``accelerator.backward``,
  before ``on_pre_optimizer_step`` (fingerprints of theta at the hooks show it); the callback then takes its
  theta_k forward at the start of the engine's step and its rows equal the unsharded forward-only route's.
  With ``ACCELERATE_USE_CPU=true`` (accelerate's CPU mode, as tests/test_llm_distributed.py launches) accelerate
  drops the DeepSpeed plugin and runs DDP: the hooks bracket the step and the callback takes the DDP route, whose
  rows equal the one-process gap probe's.

DeepSpeed is not a dependency of the package (not in any extra) and these tests are deselected by default: marked
``deepspeed`` (and ``slow``), each skips unless the marker expression asks for it, and when asked it fails, not
skips, without DeepSpeed. Install and run (docs/llm_probe.md, "Distributed")::

    DS_BUILD_OPS=0 python -m pip install --no-build-isolation --no-deps --target DSDIR deepspeed
    python -m pip install --no-deps --target DSDIR einops hjson ninja py-cpuinfo   # those not installed yet
    PYTHONPATH=DSDIR python -m pytest -m deepspeed tests/test_llm_deepspeed.py

Launched by tests/test_llm_distributed.py's ``launch`` with :data:`DEEPSPEED_ENV` (or its ACCELERATE_CPU_ENV).
This file is also the worker script: ``torchrun --nproc_per_node 2 tests/test_llm_deepspeed.py OUT_DIR [trainer]``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.test_llm_fsdp import B, G, LR, _replay_reward, batch

ZERO3 = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
         "zero_optimization": {"stage": 3}, "zero_allow_untested_optimizer": True,
         "gradient_clipping": 0.0,  # DeepSpeed clips at 1.0 unless told: the reference step is unclipped
         "bf16": {"enabled": False}, "fp16": {"enabled": False}}


def zero3_step_through_callback(cb, engine, tok, lo: int, hi: int) -> dict:
    """The callback's hooks around one ZeRO-3 SGD step (engine.backward, engine.step) on loss = -mean_n
    log pi(o_n) of the whole batch; this rank's reward function sees rows [lo, hi)."""
    from llm_probe.model import completion_logprobs
    from llm_probe.rollout import encode_prompts

    prompts, cids, rewards = batch(tok)
    cb.wrap_reward(_replay_reward)(prompts=prompts[lo:hi], completions=[""] * (hi - lo), completion_ids=cids[lo:hi],
                                   rewards=rewards[lo:hi])
    p_ids, p_mask = encode_prompts(tok, prompts, "cpu")
    c_ids = torch.tensor(cids)
    c_mask = torch.ones_like(c_ids, dtype=torch.float32)
    loss = -completion_logprobs(engine, p_ids, p_mask, c_ids, c_mask).sum(-1).mean()
    engine.backward(loss)
    state = SimpleNamespace(global_step=0, log_history=[])
    cb.on_pre_optimizer_step(None, state, None, model=engine.module, optimizer=engine.client_optimizer)
    engine.step()
    cb.on_optimizer_step(None, state, None, model=engine.module, optimizer=engine.client_optimizer)
    return cb.history[-1]


def worker(out: Path) -> None:
    import deepspeed

    from llm_probe.callback import GapProbeCallback
    from tests.llm_helpers import tiny

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    model, tok = tiny("qwen2", seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ZERO3)
    cb = GapProbeCallback(tok, num_generations=G, probe_every=1)
    N = B * G
    row = zero3_step_through_callback(cb, engine, tok, rank * N // world, (rank + 1) * N // world)
    rec = {"row": row, "sharded": cb._sharded, "skipped": list(cb.skipped), "lr": cb._lr,
           "zero_stage": engine.zero_optimization_stage(), "deepspeed": deepspeed.__version__}
    (out / f"row{rank}.json").write_text(json.dumps(rec))


def trainer_worker(out: Path, device: str = "cpu") -> None:
    """transformers' Trainer (2 SGD steps of lr LR, unclipped) with the callback attached, under the DeepSpeed
    config ZERO3 or whatever accelerate makes of it in the launch's environment. The Trainer stands in for TRL's
    GRPOTrainer: ``_generate_and_score_completions`` (the method ``attach`` wraps) scores this rank's share of
    tests/test_llm_fsdp.py's fixed batch with the wrapped reward function and returns its ids, and the loss is
    -mean_n log pi(o_n) of the whole batch (the same on every rank). Written per rank: the callback's rows and
    route, accelerate's distributed type, and a fingerprint of theta (the summed logits of one fixed input) at
    on_step_begin, on_pre_optimizer_step and on_optimizer_step of each step."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from llm_probe.callback import GapProbeCallback
    from llm_probe.model import completion_logprobs
    from llm_probe.rollout import encode_prompts
    from tests.llm_helpers import tiny

    torch.set_num_threads(1)
    model, tok = tiny("qwen2", seed=0)
    fixed = torch.tensor([[3, 4, 5, 6, 7]], device=device)
    seen = []

    def note(event, state, model):
        with torch.no_grad():
            seen.append([event, int(state.global_step), float(model(input_ids=fixed).logits.double().sum())])

    class Fingerprints(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kw):
            note("step_begin", state, model)

        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            note("pre_optimizer_step", state, model)

        def on_optimizer_step(self, args, state, control, model=None, **kw):
            note("optimizer_step", state, model)

    prompts, cids, rewards = batch(tok)

    class ReplayTrainer(Trainer):
        def _generate_and_score_completions(self):
            world, rank = self.args.world_size, self.args.process_index
            lo, hi = rank * len(cids) // world, (rank + 1) * len(cids) // world
            self.reward_funcs[0](prompts=prompts[lo:hi], completions=[""] * (hi - lo), completion_ids=cids[lo:hi],
                                 rewards=rewards[lo:hi])
            p_ids, p_mask = encode_prompts(tok, prompts[lo:hi], device)
            c_ids = torch.tensor(cids[lo:hi], device=device)
            return {"prompt_ids": p_ids, "prompt_mask": p_mask, "completion_ids": c_ids,
                    "completion_mask": torch.ones_like(c_ids)}

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            self._generate_and_score_completions()  # TRL builds the step's batch before its loss, as here
            p_ids, p_mask = encode_prompts(tok, prompts, device)
            c_ids = torch.tensor(cids, device=device)
            c_mask = torch.ones_like(c_ids, dtype=torch.float32)
            return -completion_logprobs(model, p_ids, p_mask, c_ids, c_mask).sum(-1).mean()

    data = [{"input_ids": torch.tensor([2])} for _ in range(8)]
    cfg = {**ZERO3, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "train_batch_size": "auto", "gradient_clipping": "auto"}
    args = TrainingArguments(output_dir=str(out / "trainer"), per_device_train_batch_size=1, max_steps=2,
                             learning_rate=LR, optim="sgd", lr_scheduler_type="constant", weight_decay=0.0,
                             max_grad_norm=0.0, deepspeed=cfg, use_cpu=device == "cpu", report_to=[], save_strategy="no",
                             dataloader_num_workers=0, average_tokens_across_devices=False)
    trainer = ReplayTrainer(model=model, args=args, train_dataset=data, callbacks=[Fingerprints()])
    cb = GapProbeCallback(tok, num_generations=G, probe_every=1)
    trainer.reward_funcs = [cb.wrap_reward(_replay_reward)]
    cb.attach(trainer)
    trainer.train()
    rank = torch.distributed.get_rank()
    rec = {"seen": seen, "history": cb.history, "sharded": cb._sharded, "skipped": list(cb.skipped),
           "skipped_steps": cb.skipped_steps, "distributed_type": trainer.accelerator.distributed_type.value,
           "zero3": any(hasattr(p, "ds_id") for p in model.parameters())}
    (out / f"trainer{rank}.json").write_text(json.dumps(rec))


# torchrun's environment for DeepSpeed on CPU: accelerate's default mode. ACCELERATE_USE_CPU=true (accelerate's CPU
# mode, set by ``accelerate launch --cpu`` and by tests/test_llm_distributed.py's ACCELERATE_CPU_ENV) would make
# accelerate drop the DeepSpeed plugin and run DDP (llm_probe.sharding.deepspeed_engine_stepped_in_backward)
DEEPSPEED_ENV = {"ACCELERATE_USE_CPU": None}


def _requested(config) -> bool:
    expr = config.getoption("markexpr") or ""
    return "deepspeed" in expr and "not deepspeed" not in expr


def _asked_for_deepspeed(request):
    if not _requested(request.config):
        pytest.skip("DeepSpeed ZeRO-3 on CPU: run with -m deepspeed (install: this file's docstring)")
    import deepspeed  # asked for: a missing DeepSpeed is a failure

    return deepspeed


@pytest.mark.slow
@pytest.mark.deepspeed
@pytest.mark.llm
def test_callback_under_deepspeed_zero3_equals_unsharded_forward_route(tmp_path, request):
    deepspeed = _asked_for_deepspeed(request)
    from tests.test_llm_distributed import assert_rows_close, launch
    from tests.test_llm_fsdp import _one_process_row

    rc, tail = launch(Path(__file__).resolve(), tmp_path, timeout=600, env=DEEPSPEED_ENV)
    assert rc == 0, tail
    ref, _ = _one_process_row()
    for rank in range(2):
        got = json.loads((tmp_path / f"row{rank}.json").read_text())
        assert got["deepspeed"] == deepspeed.__version__ and got["zero_stage"] == 3
        assert got["sharded"] == "DeepSpeed" and "gap/cos_update_mean" in got["skipped"]
        assert got["lr"] == LR  # read from ZeRO's parameter groups (flat partitions, not the model's parameters)
        assert_rows_close(got["row"], ref, rtol=1e-5)


def _reference_rows(sharded: bool, steps: int = 2, device: str = "cpu") -> list[dict]:
    """The callback's rows of ``steps`` one-process SGD steps (lr LR, gradients zeroed after each) of
    tests/test_llm_fsdp.py's fixed batch on the unsharded model: the forward-only route (``sharded``) or the gap probe's."""
    from llm_probe.callback import GapProbeCallback
    from tests.llm_helpers import tiny
    from tests.test_llm_fsdp import sgd_step_through_callback

    model, tok = tiny("qwen2", seed=0)
    model.to(device)
    cb = GapProbeCallback(tok, num_generations=G, probe_every=1)
    if sharded:
        cb._set_sharded("DeepSpeed")
    rows = []
    for k in range(steps):
        rows.append(sgd_step_through_callback(cb, model, tok, 0, B * G, k=k, device=device))
        model.zero_grad(set_to_none=True)  # as the Trainer (and DeepSpeed's step) do after each step
    return rows


def _trainer_run(out: Path, env, *extra: str, nproc: int = 2) -> list[dict]:
    from tests.test_llm_distributed import launch

    rc, tail = launch(Path(__file__).resolve(), out, "trainer", *extra, nproc=nproc, timeout=600, env=env)
    assert rc == 0, tail
    return [json.loads((out / f"trainer{rank}.json").read_text()) for rank in range(nproc)]


# Trainer runs against the one-process reference: the Trainer's forwards, backward and update (ZeRO's partitioned
# step, or the DDP route's per-rank share of the groups) differ from the reference's at float32 round-off, which
# gap/dphi_mean, a mean of differences of two forwards of size ~1e-2, carries at up to 3.8e-5 relative (measured;
# every other number closer). The ordering bug (both forwards at theta_{k+1}: dphi = 0) is a relative error of 1.
TRAINER_RTOL = 1e-4


def assert_zero3_trainer_rows(out: Path, *, nproc: int = 2, device: str = "cpu", rtol: float = TRAINER_RTOL) -> None:
    """:func:`trainer_worker` under ZeRO-3 (accelerate's default mode): the update lands inside backward, before
    on_pre_optimizer_step, and every rank's rows equal the unsharded forward-only route's (``rtol``), both steps."""
    from tests.test_llm_distributed import assert_rows_close

    refs = _reference_rows(sharded=True, device=device)
    for got in _trainer_run(out, DEEPSPEED_ENV, *([device] if device != "cpu" else []), nproc=nproc):
        assert got["distributed_type"] == "DEEPSPEED" and got["zero3"]
        at = {(event, k): f for event, k, f in got["seen"]}
        for k in range(2):
            assert at["optimizer_step", k] != at["step_begin", k]  # the step moved theta
            assert at["pre_optimizer_step", k] == at["optimizer_step", k], got["seen"]  # ... before the hook
        assert got["sharded"] == "DeepSpeed" and "gap/cos_update_mean" in got["skipped"]
        assert not got["skipped_steps"] and len(got["history"]) == 2
        for row, ref in zip(got["history"], refs):
            assert max(abs(v) for v in ref["gap/dphi"]) > 1e-3  # a step the ordering bug (dphi = 0) would fail
            assert_rows_close(row, ref, rtol=rtol)


@pytest.mark.slow
@pytest.mark.deepspeed
@pytest.mark.llm
def test_trainer_under_zero3_steps_inside_backward_and_callback_measures_the_step(tmp_path, request):
    """accelerate in its default mode runs ZeRO-3 and steps the engine inside ``accelerator.backward``: theta at
    on_pre_optimizer_step is already theta_{k+1}. The callback takes its theta_k forward at the start of the
    engine's step instead, so both ranks' rows equal the unsharded forward-only route's (TRAINER_RTOL), both
    steps."""
    _asked_for_deepspeed(request)
    assert_zero3_trainer_rows(tmp_path)


@pytest.mark.slow
@pytest.mark.deepspeed
@pytest.mark.llm
def test_trainer_with_accelerate_cpu_mode_drops_deepspeed(tmp_path, request):
    """ACCELERATE_USE_CPU=true (tests/test_llm_distributed.py's launch environment): accelerate keeps its CPU type,
    drops the DeepSpeed plugin and runs DDP, whose update is the Trainer's ``optimizer.step()`` between the hooks.
    The callback takes the DDP route (full metrics): both ranks' rows equal the one-process gap probe's
    (TRAINER_RTOL)."""
    from tests.test_llm_distributed import ACCELERATE_CPU_ENV, assert_rows_close

    _asked_for_deepspeed(request)
    refs = _reference_rows(sharded=False)
    for got in _trainer_run(tmp_path, ACCELERATE_CPU_ENV):
        assert got["distributed_type"] == "MULTI_CPU" and not got["zero3"]
        at = {(event, k): f for event, k, f in got["seen"]}
        for k in range(2):
            assert at["optimizer_step", k] != at["step_begin", k]
            assert at["pre_optimizer_step", k] == at["step_begin", k], got["seen"]  # the hooks bracket the step
        assert got["sharded"] is None and not got["skipped"]
        assert not got["skipped_steps"] and len(got["history"]) == 2
        for row, ref in zip(got["history"], refs):
            assert abs(ref["gap/dphi_mean"]) > 1e-3
            assert_rows_close(row, ref, rtol=TRAINER_RTOL)


class _StubTrainer:
    """What the callback reads of a trainer whose accelerator (``distributed_type`` ``dist_type``) steps a
    stand-in engine inside its backward, as accelerate's DeepSpeedEngineWrapper steps DeepSpeed's (``wrapper``
    False: no engine wrapper). ``_generate_and_score_completions`` scores tests/test_llm_fsdp.py's fixed batch."""

    def __init__(self, cb, model, tok, dist_type="DEEPSPEED", wrapper=True):
        from llm_probe.rollout import encode_prompts

        self.model, self.tok, self.events = model, tok, []
        self.optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        self.state = SimpleNamespace(global_step=0, log_history=[])
        self.callback_handler = SimpleNamespace(callbacks=[])
        self.reward_funcs = [cb.wrap_reward(_replay_reward)]
        engine = SimpleNamespace(step=self._engine_step)
        self.accelerator = SimpleNamespace(distributed_type=dist_type,
                                           deepspeed_engine_wrapped=SimpleNamespace(engine=engine) if wrapper else None)
        self.prompts, self.cids, self.rewards = batch(tok)
        self.p_ids, self.p_mask = encode_prompts(tok, self.prompts, "cpu")

    def _engine_step(self):
        self.events.append("update")
        self.optimizer.step()

    def _generate_and_score_completions(self):
        self.reward_funcs[0](prompts=self.prompts, completions=[""] * len(self.cids), completion_ids=self.cids,
                             rewards=self.rewards)
        c_ids = torch.tensor(self.cids)
        return {"prompt_ids": self.p_ids, "prompt_mask": self.p_mask, "completion_ids": c_ids,
                "completion_mask": torch.ones_like(c_ids)}

    def train_step(self, cb):
        """Trainer order: batch, loss, backward (the engine steps in it), on_pre_optimizer_step, (the Trainer's
        optimizer.step(), a no-op under DeepSpeed), on_optimizer_step."""
        from llm_probe.model import completion_logprobs

        self._generate_and_score_completions()
        c_ids = torch.tensor(self.cids)
        loss = -completion_logprobs(self.model, self.p_ids, self.p_mask, c_ids,
                                    torch.ones_like(c_ids, dtype=torch.float32)).sum(-1).mean()
        loss.backward()
        self.accelerator.deepspeed_engine_wrapped.engine.step()
        cb.on_pre_optimizer_step(None, self.state, None, model=self.model, optimizer=self.optimizer)
        cb.on_optimizer_step(None, self.state, None, model=self.model, optimizer=self.optimizer)
        self.optimizer.zero_grad()
        self.state.global_step += 1


def _attached(dist_type="DEEPSPEED", wrapper=True, args=None):
    from llm_probe.callback import GapProbeCallback
    from tests.llm_helpers import tiny

    model, tok = tiny("qwen2", seed=0)
    cb = GapProbeCallback(tok, num_generations=G, probe_every=1)
    trainer = _StubTrainer(cb, model, tok, dist_type, wrapper)
    cb.attach(trainer)
    cb.on_train_begin(args or SimpleNamespace(), trainer.state, None, model=model, train_dataloader=None)
    return cb, trainer


@pytest.mark.llm
def test_callback_probes_theta_k_at_the_start_of_a_step_taken_inside_backward():
    """The update lands inside backward, before on_pre_optimizer_step (as accelerate runs DeepSpeed): the callback's
    theta_k forward runs at the start of the engine's step, so its rows equal those of the hooks bracketing the
    step by hand (the forward-only route, 2 steps, 1e-6); a route probing at on_pre_optimizer_step would see
    dphi = 0."""
    from tests.test_llm_distributed import assert_rows_close

    cb, trainer = _attached()
    seen = []
    before = cb._before
    cb._before = lambda *a: (seen.append(list(trainer.events)), before(*a))[1]
    for _ in range(2):
        trainer.train_step(cb)
    assert seen == [[], ["update"]]  # before each update, once per step
    assert cb._sharded == "DeepSpeed" and not cb.skipped_steps and len(cb.history) == 2
    for row, ref in zip(cb.history, _reference_rows(sharded=True)):
        assert max(abs(v) for v in ref["gap/dphi"]) > 1e-3
        assert_rows_close(row, ref, rtol=1e-6)


@pytest.mark.llm
def test_callback_refuses_deepspeed_without_an_engine_wrapper_and_notes_a_dropped_config(caplog):
    """accelerate's type DEEPSPEED without an engine wrapper: where the update happens is unknown, one-line
    ValueError at on_train_begin. ``args.deepspeed`` set while accelerate runs DDP (ACCELERATE_USE_CPU=true): one
    log line naming it, and the DDP / one-process route."""
    with pytest.raises(ValueError, match="deepspeed_engine_wrapped"):
        _attached(wrapper=False)
    with caplog.at_level("WARNING"):
        cb, _ = _attached("MULTI_CPU", wrapper=False, args=SimpleNamespace(deepspeed={"zero_optimization": {}}))
    assert cb._sharded is None and not cb.skipped
    assert any("ACCELERATE_USE_CPU=true" in r.getMessage() for r in caplog.records)


if __name__ == "__main__":
    if sys.argv[2:3] == ["trainer"]:
        trainer_worker(Path(sys.argv[1]), *sys.argv[3:4])
    else:
        worker(Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # results are written; skip interpreter teardown (the gloo group's threads can abort it)
