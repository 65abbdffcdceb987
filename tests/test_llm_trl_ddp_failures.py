"""A probe failure on one DDP rank alone never stops training: two CPU processes (gloo, ``torchrun``) drive
GapProbeCallback's hooks by hand on four probed steps, with one rank's own part failing on three of them (its
gaps at theta_k on step 0, its alignment at theta_{k+1} on step 1, its headroom JVP on step 2). Every rank then
skips the same steps (none waits in a gather for the rank that gave up) and both log the same row of step 3.

This file is also the worker script: ``torchrun --nproc_per_node 2 tests/test_llm_trl_ddp_failures.py OUT_DIR``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

G = 4


def worker(out: Path) -> None:
    import torch.distributed as dist

    import llm_probe.gap_probe as gap_probe
    import llm_probe.headroom as headroom
    from llm_probe.callback import GapProbeCallback
    from tests.llm_helpers import tiny

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, tok = tiny("qwen2", seed=0)
    digits = tok("0123456789", add_special_tokens=False)["input_ids"]
    g = torch.Generator().manual_seed(rank)
    prompts = [p for p in ("1+2=", "12+3=") for _ in range(G)]  # this rank's two groups
    cids = [[digits[int(i)] for i in torch.randint(0, 10, (3,), generator=g)] + [tok.eos_token_id] for _ in prompts]
    rewards = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    cb = GapProbeCallback(tok, G, probe_every=1)
    (fn,) = cb.wrap_rewards([lambda prompts, completions, completion_ids=None, **kw: rewards])

    def fail_once(module, name, on_rank):
        real = getattr(module, name)
        calls = []

        def f(*a, **kw):
            calls.append(1)
            if rank == on_rank and len(calls) == 1:
                raise RuntimeError(f"out of memory in {name}")
            return real(*a, **kw)
        return f

    plan = {0: (gap_probe, "per_prompt_gaps", 1), 1: (gap_probe, "dot_alignment", 0),
            2: (headroom, "completion_logprob_jvp", 1)}
    for k in range(4):
        if k in plan:
            module, name, on_rank = plan[k]
            setattr(module, name, fail_once(module, name, on_rank))
        fn(prompts=prompts, completions=[""] * len(cids), completion_ids=cids)
        for q in model.parameters():
            q.grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(k)) * 1e-2
        state = SimpleNamespace(global_step=k, log_history=[])
        opt = SimpleNamespace(param_groups=[{"lr": 0.1}])
        cb.on_pre_optimizer_step(None, state, None, model=model, optimizer=opt)
        with torch.no_grad():
            for q in model.parameters():
                q -= 0.1 * q.grad
        cb.on_optimizer_step(None, state, None, model=model, optimizer=opt)
    (out / f"rank{rank}.json").write_text(json.dumps({"skipped": cb.skipped_steps, "history": cb.history}))


@pytest.mark.slow
@pytest.mark.llm
def test_a_failure_on_one_rank_skips_the_step_on_every_rank(tmp_path):
    from tests.test_llm_distributed import launch_twice

    out = launch_twice(Path(__file__).resolve(), tmp_path)
    r0, r1 = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    for r in (r0, r1):
        assert [s["step"] for s in r["skipped"]] == [0, 1, 2], r["skipped"]
        assert [h["step"] for h in r["history"]] == [3]
    assert "out of memory in per_prompt_gaps" in r1["skipped"][0]["reason"]
    assert r0["skipped"][0]["reason"].startswith("RankFailure: rank 1: RuntimeError: out of memory")
    assert "rank 0: RuntimeError: out of memory in dot_alignment" in r1["skipped"][1]["reason"]
    assert "rank 1: RuntimeError: out of memory in completion_logprob_jvp" in r0["skipped"][2]["reason"]
    assert r0["history"][0]["gap/dmu_update"] == r1["history"][0]["gap/dmu_update"]
    assert r0["history"][0]["gap/headroom"] == r1["history"][0]["gap/headroom"]


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # results are written; skip interpreter teardown (the gloo group's threads can abort it)
