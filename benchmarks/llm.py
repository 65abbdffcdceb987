"""llm_probe: cost of the gradient-gap probes on the tiny Qwen (CPU, torch.set_num_threads(1)).

1. Training step, probes off vs on: :class:`llm_probe.Trainer` instances built from copies of the same
   warmed-up model and the same seed, one with ``probe_every=0`` and one per probe configuration
   ("dot": per-group gaps + dot products, the default; "jvp": forward-mode JVPs, no gap vectors; "both"),
   all with the fixed probe prompts, probing every step and ("align/N") every N steps (amortised: each
   timed call runs whole probe cycles). Probing never changes the training trajectory (own generator for
   the probe prompts), so the trainers sample the same prompts and completions step after step and their
   timed steps do the same training work; this is checked (identical rewards and losses per step). Steps
   of the trainers are timed alternately.
2. Alignment routes on one rollout whose groups are all mixed (rewards overwritten): per-prompt gaps by
   the reference route (``per_prompt_gaps_batched``: one backward per prompt through the whole batch) and
   by ``per_prompt_gaps`` (per group, vmap'd), each followed by dot products, against forward-mode passes
   (``jvp_alignment``, one direction and two directions in one vmap'd pass), for random directions over
   all parameters; plus one plain loss forward + backward on the same rollout as the unit.
   max |dmu_jvp - dmu_dot| and max |gaps - reference gaps| are reported.
3. Peak memory of each: the high-water mark of torch CPU bytes allocated during the call above its start
   (tensors alive before the call, e.g. the weights, are not counted), from torch.profiler's memory
   events (``profile_memory=True``: every CPU allocation and free with its size and time, summed in time
   order); and tracemalloc's peak for Python-side (numpy, Python objects) allocations.
"""

from __future__ import annotations

import copy
import math
import tempfile
import tracemalloc
from dataclasses import dataclass

import numpy as np
import torch

from llm_probe import (
    AdditionTask,
    TinyQwenSpec,
    Trainer,
    TrainConfig,
    build_char_tokenizer,
    build_tiny_qwen,
    dot_alignment,
    jvp_alignment,
    make_rollout,
    per_prompt_gaps,
    sampled_accuracy,
    select_params,
    warmup,
)
from llm_probe.losses import policy_loss
from llm_probe.model import completion_logprobs
from llm_probe.probes import per_prompt_gaps_batched
from llm_probe.threads import configure_threads

from .timing import interleaved, ratio

__all__ = ["LLMSetup", "PROBE_CONFIGS", "parse_config", "warm_policy", "step_times", "route_times", "peak_memory", "route_memory",
           "step_memory", "mixed_rollout", "profile_step"]

PROBE_CONFIGS = ("off", "dot", "jvp", "both")


def parse_config(probe: str) -> tuple[str, int]:
    """(alignment, probe_every) of a config name: "off" -> ("dot", 0), "jvp" -> ("jvp", 1), "both/4" -> ("both", 4)."""
    if probe == "off":
        return "dot", 0
    align, _, every = probe.partition("/")
    if align not in ("dot", "jvp", "both"):
        raise ValueError(f"probe config must be off, dot, jvp or both (optionally /N), got {probe!r}")
    return align, int(every) if every else 1


@dataclass(frozen=True)
class LLMSetup:
    """The benchmarked run: tiny Qwen (TinyQwenSpec defaults), B prompts x G completions per step."""

    prompts_per_step: int = 16
    group_size: int = 8
    max_new_tokens: int = 6
    probe_prompts: int = 8
    warmup_steps: int = 400  # supervised warm-up (400 steps give ~27% sampled accuracy on this task)
    spec: TinyQwenSpec = TinyQwenSpec()
    seed: int = 0


def warm_policy(setup: LLMSetup):
    """(model, tokenizer, task, sampled accuracy) after the supervised warm-up, with 1 torch thread."""
    configure_threads(1)
    tok = build_char_tokenizer()
    task = AdditionTask()
    model = build_tiny_qwen(tok, setup.spec, seed=setup.seed)
    if setup.warmup_steps:
        warmup(model, tok, task, steps=setup.warmup_steps, batch_size=128, lr=1e-3, seed=setup.seed)
    acc = sampled_accuracy(model, tok, task, n=64, max_new_tokens=setup.max_new_tokens, seed=setup.seed)
    return model, tok, task, acc


def _config(setup: LLMSetup, probe: str, out_dir: str) -> TrainConfig:
    return TrainConfig(
        out_dir=out_dir, method="grpo", seed=setup.seed, steps=10**6, prompts_per_step=setup.prompts_per_step,
        group_size=setup.group_size, max_new_tokens=setup.max_new_tokens, lr=3e-4, warmup_steps=0,
        probe_every=parse_config(probe)[1], probe_alignment=parse_config(probe)[0],
        probe_prompts=setup.probe_prompts, num_threads=1, device="cpu", progress=False,
    )


@dataclass(frozen=True)
class StepTimes:
    setup: LLMSetup
    times: dict  # probe config -> timing.Stat (seconds per train step)
    overhead: dict  # probe config -> Stat (per-repeat time / time with probes off)
    same_trajectory: bool  # rewards and losses identical across configs at every timed step
    mixed_per_step: float  # mean number of mixed groups in the batch (prompts the probes differentiate)
    reward: float  # mean batch reward over the timed steps


def step_times(model, tok, task, setup: LLMSetup, configs=PROBE_CONFIGS, repeats: int = 5,
               n_warmup: int = 1) -> StepTimes:
    """Seconds per :meth:`Trainer.train_step` for each probe configuration (module doc, item 1).

    A config "align/N" probes every N steps; every timed call then runs lcm(N of all configs) steps of each
    trainer (the same steps for all), so its time per step is the amortised cost over whole probe cycles.
    """
    if "off" not in configs:
        raise ValueError("configs must include 'off' (the plain step every ratio is taken against)")
    cycle = math.lcm(*[max(1, parse_config(c)[1]) for c in configs])
    tmp = tempfile.TemporaryDirectory(prefix="gapdyn_bench_")
    trainers, logs = {}, {c: [] for c in configs}
    for c in configs:
        trainers[c] = Trainer(_config(setup, c, f"{tmp.name}/{c}"), model=copy.deepcopy(model), tokenizer=tok,
                              task=task)

    def stepper(c):
        def f():
            for _ in range(cycle):
                m = trainers[c].train_step()
                logs[c].append((m["reward"], m["loss"], m.get("gap/n_prompts", 0)))
        return f

    t = interleaved({c: stepper(c) for c in configs}, repeats=repeats, warmup=n_warmup)
    t = {c: v.scaled(1.0 / cycle) for c, v in t.items()}
    tmp.cleanup()
    ref = logs["off"]
    same = all([x[:2] for x in logs[c]] == [x[:2] for x in ref] for c in configs)
    mixed = [x[2] for x in logs[configs[1]]] if len(configs) > 1 else [0]  # configs[1] should probe every step
    return StepTimes(setup, t, {c: ratio(t[c], t["off"]) for c in configs}, bool(same),
                     float(np.mean(mixed)), float(np.mean([x[0] for x in ref])))


def mixed_rollout(model, tok, task, setup: LLMSetup, seed: int = 0):
    """A rollout of B x G completions whose every group is mixed (rewards overwritten: half 1, half 0)."""
    B, G = setup.prompts_per_step, setup.group_size
    ro = make_rollout(model, tok, task, task.sample(np.random.default_rng(seed), B), G=G,
                      max_new_tokens=setup.max_new_tokens, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed + 1)
    r = (torch.rand(B, G, generator=g) < 0.5).float()
    r[:, 0], r[:, 1] = 1.0, 0.0
    ro.rewards = r
    return ro


@dataclass(frozen=True)
class RouteTimes:
    setup: LLMSetup
    times: dict  # "loss_fwd_bwd", "backward_route", "jvp_route" -> Stat (seconds)
    maxdiff: float  # max |dmu_jvp - dmu_dot|
    scale: float  # max |dmu_dot| (for the relative size of maxdiff)
    gap_maxdiff: float  # max |per_prompt_gaps - per_prompt_gaps_batched| over all gap entries
    gap_scale: float  # max |per_prompt_gaps_batched|
    n_prompts: int
    n_params: int


def _routes(model, ro, setup: LLMSetup):
    params = select_params(model, "all")
    gen = torch.Generator().manual_seed(123)
    tang = {n: torch.randn(p.shape, generator=gen, dtype=p.dtype) for n, p in params.items()}
    vflat = torch.cat([t.reshape(-1) for t in tang.values()])

    def loss_step():
        model.zero_grad(set_to_none=True)
        logp = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
        res = policy_loss("grpo", logp, logp.detach(), ro.completion_mask, ro.rewards,
                          max_completion_length=setup.max_new_tokens)
        res.loss.backward()
        model.zero_grad(set_to_none=True)

    tang2 = {n: torch.randn(p.shape, generator=gen, dtype=p.dtype) for n, p in params.items()}

    def backward_route():  # reference: one backward per prompt through the whole batch's graph
        est = per_prompt_gaps_batched(model, ro, params)
        return est.groups, dot_alignment(est.gaps, vflat)

    def per_group_route():  # llm_probe.per_prompt_gaps: one forward + backward per group over its G rows
        est = per_prompt_gaps(model, ro, params)
        return est.groups, dot_alignment(est.gaps, vflat)

    def jvp_route():
        groups = torch.arange(ro.B)
        return jvp_alignment(model, ro, groups, {n: p.detach() for n, p in params.items()}, tang)

    def jvp2_route():  # two directions (the trainer's update and -grad) in one vmap'd forward-mode pass
        groups = torch.arange(ro.B)
        return jvp_alignment(model, ro, groups, {n: p.detach() for n, p in params.items()}, [tang, tang2])

    return {"loss_fwd_bwd": loss_step, "backward_route": backward_route, "per_group_route": per_group_route,
            "jvp_route": jvp_route, "jvp2_route": jvp2_route}, params


def route_times(model, tok, task, setup: LLMSetup, repeats: int = 5) -> RouteTimes:
    """Time of the two alignment routes and of a plain loss forward + backward (module doc, item 2)."""
    configure_threads(1)
    ro = mixed_rollout(model, tok, task, setup)
    fns, params = _routes(model, ro, setup)

    groups, d_dot = fns["backward_route"]()
    d_jvp = fns["jvp_route"]()
    if len(groups) != ro.B:
        raise RuntimeError(f"expected all {ro.B} groups mixed, got {len(groups)}")
    g_ref = per_prompt_gaps_batched(model, ro, params).gaps
    g_new = per_prompt_gaps(model, ro, params).gaps
    t = interleaved(fns, repeats=repeats, warmup=1)
    return RouteTimes(setup, t, float((d_jvp - d_dot).abs().max()), float(d_dot.abs().max()),
                      float((g_new - g_ref).abs().max()), float(g_ref.abs().max()), ro.B,
                      sum(p.numel() for p in params.values()))


def peak_memory(fn) -> tuple[int, int]:
    """(peak live torch CPU tensor bytes above the start, tracemalloc peak bytes) during one call of fn."""
    from torch.profiler import ProfilerActivity, profile

    tracemalloc.start()
    tracemalloc.reset_peak()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
        fn()
    _, tm_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    events = []
    for e in prof.profiler.kineto_results.events():  # every allocation (+bytes) and free (-bytes), in time
        if e.name() == "[memory]":
            events.append((e.start_ns(), int(e.nbytes())))
    events.sort(key=lambda x: x[0])
    cur = peak = 0
    for _, b in events:
        cur += b
        peak = max(peak, cur)
    return int(peak), int(tm_peak)


def route_memory(model, tok, task, setup: LLMSetup) -> dict[str, tuple[int, int]]:
    """peak_memory of the loss step and of both alignment routes on the mixed rollout."""
    ro = mixed_rollout(model, tok, task, setup)
    fns, _ = _routes(model, ro, setup)
    return {k: peak_memory(f) for k, f in fns.items()}


def step_memory(model, tok, task, setup: LLMSetup, configs=PROBE_CONFIGS) -> dict[str, tuple[int, int]]:
    """peak_memory of one train step per probe configuration (fresh trainers, same model and seed)."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="gapdyn_bench_") as tmp:
        for c in configs:
            tr = Trainer(_config(setup, c, f"{tmp}/{c}"), model=copy.deepcopy(model), tokenizer=tok, task=task)
            tr.train_step()  # first step: lazy allocations (optimizer state)
            out[c] = peak_memory(tr.train_step)
    return out


_PROFILED = {
    "make_rollout": "rollout.py:76(make_rollout)",
    "per_prompt_gaps": "probes.py:(per_prompt_gaps)",
    "jvp_alignment": "probes.py:(jvp_alignment)",
    "token_stats": "probes.py:(token_stats)",
    "prompt_objectives": "probes.py:(prompt_objectives)",
    "_alignment": "gap_probe.py:(after)",
    "compute_loss": "trainer.py:(compute_loss)",
    "backward": "(backward)",
    "optimizer step": "(step)",
}


def profile_step(model, tok, task, setup: LLMSetup, probe: str, steps: int = 3) -> dict[str, float]:
    """cProfile of ``steps`` train steps with ``probe``: cumulative seconds per step of the main parts.

    Parts (cumulative, so nested ones overlap: per_prompt_gaps contains a make_rollout-free forward and
    the backwards; _alignment (GapProbe.after) contains the JVPs and the realised-dPhi forward): see _PROFILED.
    """
    import cProfile
    import pstats

    with tempfile.TemporaryDirectory(prefix="gapdyn_bench_") as tmp:
        tr = Trainer(_config(setup, probe, f"{tmp}/{probe}"), model=copy.deepcopy(model), tokenizer=tok, task=task)
        tr.train_step()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(steps):
            tr.train_step()
        pr.disable()
    st = pstats.Stats(pr)
    out = {"total": 0.0}
    calls = {}
    for (fname, line, func), (cc, nc, tt, ct, callers) in st.stats.items():
        if func == "train_step" and fname.endswith("trainer.py"):
            out["total"] = ct / steps
        for key, pat in _PROFILED.items():
            file_part, func_part = pat.split("(")
            func_part = func_part.rstrip(")")
            file_ok = (file_part.split(":")[0] == "" or fname.endswith(file_part.split(":")[0]))
            if func == func_part and file_ok:
                if key == "backward" and "torch" not in fname:
                    continue
                if key == "optimizer step" and "optim" not in fname:
                    continue
                calls[key] = calls.get(key, 0.0) + ct / steps
    out.update(calls)
    return out
