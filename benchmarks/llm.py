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
import time
import tracemalloc
from dataclasses import dataclass

import numpy as np
import torch

from gapdyn.cmdline import command, parse
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

from .timing import Stat, interleaved, load_average, ratio

__all__ = ["LLMSetup", "PROBE_CONFIGS", "parse_config", "warm_policy", "step_times", "route_times", "peak_memory", "route_memory",
           "step_memory", "mixed_rollout", "profile_step", "grpo_callback_times", "GRPOCallbackTimes"]

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


@dataclass(frozen=True)
class GRPOCallbackTimes:
    setup: LLMSetup
    cycle: int  # timed optimizer steps per round: global steps 1..cycle (probe_every=cycle probes one of them)
    times: dict  # "plain", "probe_every=1", "probe_every=<cycle>" -> Stat (seconds per step, one value a round)
    overhead: dict  # same keys -> Stat (per-round time / plain time of the same round)
    same_trajectory: bool  # TRL's logged reward and loss identical across the configs in every round
    mixed_per_step: float  # mean gap/n_prompts of the every-step callback
    load: tuple  # load average (1, 5, 15 min) before and after


def grpo_callback_times(setup: LLMSetup = LLMSetup(), rounds: int = 5, cycle: int = 10, model_tok=None, *,
                        probes: bool = True) -> GRPOCallbackTimes:
    """Seconds per optimizer step of a real ``trl.GRPOTrainer`` (our warmed tiny Qwen, exact-match reward, Adam
    3e-4, B = ``prompts_per_step`` x G completions of ``max_new_tokens``), plain and with
    :class:`llm_probe.GapProbeCallback` (default settings: dot route, headroom on) at probe_every = 1 and at
    probe_every = ``cycle`` (the default, 10). Each round builds one fresh trainer per config from copies of the
    same model and seed (probing never changes training: checked on TRL's logged reward and loss), runs
    ``cycle + 1`` steps and times steps 1..cycle (``on_step_begin`` -> ``on_step_end``: generation, loss,
    backward, optimizer and the callback's hooks), so probe_every = cycle pays for exactly one probe (step
    ``cycle``). The configs' order rotates from round to round; ratios are taken within a round. ``probes=False``:
    the plain trainer only (its step time)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from llm_probe.callback import GapProbeCallback

    configure_threads(1)
    model, tok, task = model_tok if model_tok is not None else warm_policy(setup)[:3]
    B, G = setup.prompts_per_step, setup.group_size
    probs = task.sample(np.random.default_rng(setup.seed), B * (cycle + 1))
    ds = Dataset.from_dict({"prompt": [p.prompt for p in probs], "answer": [p.answer for p in probs]})

    def exact_match(prompts, completions, answer=None, **kw):
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    class Timer(TrainerCallback):
        def __init__(self):
            self.t0, self.times = None, {}

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times[state.global_step - 1] = time.perf_counter() - self.t0

    def run(every: int | None, out_dir: str):
        cb = None if every is None else GapProbeCallback(tok, G, probe_every=every)
        timer = Timer()
        args = GRPOConfig(output_dir=out_dir, per_device_train_batch_size=B * G, num_generations=G,
                          max_completion_length=setup.max_new_tokens, max_steps=cycle + 1, learning_rate=3e-4,
                          lr_scheduler_type="constant", warmup_steps=0, logging_steps=1, save_strategy="no",
                          seed=setup.seed, beta=0.0, temperature=1.0, use_cpu=True, bf16=False, report_to="none",
                          gradient_checkpointing=False, disable_tqdm=True)
        trainer = GRPOTrainer(model=copy.deepcopy(model), args=args, train_dataset=ds, processing_class=tok,
                              reward_funcs=exact_match if cb is None else cb.wrap_reward(exact_match),
                              callbacks=[timer])
        trainer.remove_callback(PrinterCallback)  # no log dict printed per step
        if cb is not None:
            cb.attach(trainer)
        trainer.train()
        logged = [(h["reward"], h["loss"]) for h in trainer.state.log_history if "loss" in h and "reward" in h]
        mixed = [r["gap/n_prompts"] for r in cb.history] if cb is not None else []
        return sum(timer.times[k] for k in range(1, cycle + 1)) / cycle, logged, mixed

    configs = {"plain": None, "probe_every=1": 1, f"probe_every={cycle}": cycle} if probes else {"plain": None}
    names = list(configs)
    load0 = load_average()
    per = {c: [] for c in names}
    same, mixed = True, []
    with tempfile.TemporaryDirectory(prefix="gapdyn_bench_grpo_") as tmp:
        for r in range(rounds + 1):  # round 0: warm-up (imports, lazy allocations), not kept
            order = names[r % len(names):] + names[:r % len(names)]
            got = {c: run(configs[c], f"{tmp}/{r}_{i}") for i, c in enumerate(order)}
            same = same and all(got[c][1] == got["plain"][1] for c in names)
            if r:
                for c in names:
                    per[c].append(got[c][0])
                mixed += got["probe_every=1"][2] if probes else []
    t = {c: Stat(tuple(v)) for c, v in per.items()}
    return GRPOCallbackTimes(setup, cycle, t, {c: ratio(t[c], t["plain"]) for c in names}, bool(same),
                             float(np.mean(mixed)) if mixed else 0.0, (load0, load_average()))


@dataclass
class GRPOCallbackConfig:
    """The probe cadence in trl.GRPOTrainer: ms per step, probes off / every K steps (BENCHMARKS.md, "Probe
    cadence in GRPOTrainer")."""

    rounds: int = 5
    """Rounds; each builds one fresh trainer per configuration (their order rotates between rounds)."""
    cycle: int = 10
    """Timed steps per trainer and round; also the probe_every timed besides 1."""
    prompts: int = LLMSetup.prompts_per_step
    """Prompts per step B."""
    group_size: int = LLMSetup.group_size
    """Completions per prompt G."""
    warmup_steps: int = LLMSetup.warmup_steps
    """Supervised warm-up steps of the tiny Qwen before the RL steps."""


@command("python -m benchmarks.llm")
def grpo_callback_main(argv: list[str]) -> int:
    """``python -m benchmarks.llm [--rounds N] [--cycle K] [--prompts B] [--group-size G] [--warmup-steps S]``:
    :func:`grpo_callback_times`, printed (BENCHMARKS.md, "Probe cadence in GRPOTrainer")."""
    a = parse(GRPOCallbackConfig, argv, prog="python -m benchmarks.llm")
    setup = LLMSetup(prompts_per_step=a.prompts, group_size=a.group_size, warmup_steps=a.warmup_steps)
    res = grpo_callback_times(setup, rounds=a.rounds, cycle=a.cycle)
    print(f"trl.GRPOTrainer, tiny Qwen2 (hidden {setup.spec.hidden_size}, {setup.spec.num_hidden_layers} layers), "
          f"B = {setup.prompts_per_step} x G = {setup.group_size}, {setup.max_new_tokens} new tokens, Adam, CPU, "
          f"1 thread; {a.rounds} rounds x {a.cycle} timed steps; mixed groups per step {res.mixed_per_step:.2f}; "
          f"same trajectory: {res.same_trajectory}")
    for c in res.times:
        tm, ov = res.times[c], res.overhead[c]
        print(f"  {c:>15}: {1e3 * tm.median:7.1f} ms/step {tm.spread():>12}   x{ov.median:.2f} "
              f"(interquartile {ov.iqr[0]:.2f}-{ov.iqr[1]:.2f}, range {ov.lo:.2f}-{ov.hi:.2f})")
    print(f"  load average before {res.load[0][0]:.1f}/{res.load[0][1]:.1f}/{res.load[0][2]:.1f}, "
          f"after {res.load[1][0]:.1f}/{res.load[1][1]:.1f}/{res.load[1][2]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(grpo_callback_main())


class _PlainStepTrainer(Trainer):
    """The training step before llm_probe.sampler: every rollout by the plain loop (the model's full forward per
    new token) and the loss scored by the model's own forward over all N x (P + T) tokens."""

    def rollout(self, problems, G: int, generator: torch.Generator):
        return make_rollout(self.model, self.tok, self.task, problems, G=G, max_new_tokens=self.cfg.max_new_tokens,
                            generator=generator, temperature=self.cfg.temperature,
                            truncate_prompts=self.cfg.truncate_prompts, fast=False)

    def compute_loss(self, ro, old_logp=None, *, keep_all: bool = True):
        args = (self.model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
        if keep_all:
            logp, _, logp_all = completion_logprobs(*args, return_entropy=True)
        else:
            logp, logp_all = completion_logprobs(*args), None
        res = policy_loss(self.cfg.method, logp, logp.detach() if old_logp is None else old_logp, ro.completion_mask,
                          ro.rewards.to(self.device), max_completion_length=self.cfg.max_new_tokens,
                          eps_low=self.cfg.eps_low, eps_high=self.cfg.eps_high)
        return res, logp, logp_all


@dataclass(frozen=True)
class RLStepTimes:
    setup: LLMSetup
    times: dict  # "step", "step_plain", "sampler", "loss_fwd", "backward" (each also "_plain"), "opt_step" -> Stat
    # (CPU seconds of the process per call)
    wall: dict  # the same keys -> Stat (wall seconds)
    speedup: Stat  # step_plain / step in CPU time, per round
    speedup_wall: Stat  # the same in wall time
    same_rewards: float  # share of the timed steps at which both trainers' batches had the same rewards
    rel_diff: float  # max relative difference of loss and grad norm between the trainers at those steps
    n_params: int
    tokens: float  # N * (P + T): the tokens the plain route scores per step (batch of the parts)
    shared_tokens: float  # B * P + N * (T - 1): the tokens the shared-prompt forward runs
    matmul_gflops: Stat  # measured float32 matmul rate on the step's shapes (1 thread)
    floor: float  # seconds: 6 * n_params * shared_tokens / matmul rate + the sampler's median
    completion_length: float  # mean completion length (tokens, incl. <eos>)


def _interleaved_cpu(fns: dict, repeats: int, warmup: int = 1) -> tuple[dict, dict]:
    """(wall, CPU) seconds of each named callable, called alternately ``repeats`` times after ``warmup`` rounds:
    ``timing.interleaved`` plus the process CPU time of each call (``time.process_time``; with 1 torch thread
    it leaves out the time the process waits for a core, which dominates the wall time on a loaded machine)."""
    for _ in range(warmup):
        for f in fns.values():
            f()
    wall, cpu = {k: [] for k in fns}, {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            w0, c0 = time.perf_counter(), time.process_time()
            f()
            cpu[k].append(time.process_time() - c0)
            wall[k].append(time.perf_counter() - w0)
    return {k: Stat(tuple(v)) for k, v in wall.items()}, {k: Stat(tuple(v)) for k, v in cpu.items()}


def _matmul_rate(rows: int, d: int, k: int, repeats: int = 7) -> Stat:
    """GFLOP/s of [rows, d] @ [d, k] float32 (1 thread): 2 rows d k flops per call, 50 calls per repeat."""
    a, b = torch.randn(rows, d), torch.randn(d, k)

    def f():
        for _ in range(50):
            torch.mm(a, b)

    t = _interleaved_cpu({"mm": f}, repeats=repeats, warmup=1)[1]["mm"]  # CPU time, as the step's parts
    return t.inverse(50 * 2 * rows * d * k / 1e9)


def rl_step_times(model, tok, task, setup: LLMSetup = LLMSetup(), repeats: int = 7) -> RLStepTimes:
    """Seconds per plain RL step (:meth:`Trainer.train_step`, probes off, GRPO) with the batched KV-cache
    sampler vs the same step with the plain sampler (the loop before it), both trainers from copies of the same
    model and seed (the completions are the same up to float rounding: checked on the logged rewards, losses
    and gradient norms), and the parts on one batch: sampler (each route, with tokenising, decoding and
    rewards), loss forward (``Trainer.compute_loss``, each route), backward (forward + backward minus forward,
    per round), optimizer step; all timed alternately in the same rounds. Floor: 6 x params x tokens the
    shared-prompt forward runs, at the measured matmul rate (forward 2, backward 4 flops per parameter and
    token), plus the sampler."""
    configure_threads(1)
    tmp = tempfile.TemporaryDirectory(prefix="gapdyn_bench_rl_")
    fast = Trainer(_config(setup, "off", f"{tmp.name}/fast"), model=copy.deepcopy(model), tokenizer=tok, task=task)
    plain = _PlainStepTrainer(_config(setup, "off", f"{tmp.name}/plain"), model=copy.deepcopy(model), tokenizer=tok,
                              task=task)
    logs = {"fast": [], "plain": []}

    def stepper(trainer, key):
        def f():
            m = trainer.train_step()
            logs[key].append([m[k] for k in ("reward", "loss", "grad_norm")])
        return f

    tr = Trainer(_config(setup, "off", f"{tmp.name}/parts"), model=copy.deepcopy(model), tokenizer=tok, task=task)
    ref = _PlainStepTrainer(_config(setup, "off", f"{tmp.name}/ref"), model=tr.model, tokenizer=tok, task=task)
    probs = task.sample(np.random.default_rng(setup.seed), setup.prompts_per_step)
    gen = lambda: torch.Generator().manual_seed(setup.seed)  # noqa: E731
    ro = tr.rollout(probs, setup.group_size, gen())

    def sampler(fast_route):
        return lambda: make_rollout(tr.model, tok, task, probs, G=setup.group_size,
                                    max_new_tokens=setup.max_new_tokens, generator=gen(), fast=fast_route)

    opt_cpu, opt_wall = [], []

    def loss(trainer, bwd: bool = False, opt: bool = False):
        def f():
            res = trainer.compute_loss(ro)[0]
            if bwd:
                tr.opt.zero_grad(set_to_none=True)
                res.loss.backward()
            if opt:
                w0, c0 = time.perf_counter(), time.process_time()
                tr.opt.step()
                opt_cpu.append(time.process_time() - c0)
                opt_wall.append(time.perf_counter() - w0)
        return f

    wall, cpu = _interleaved_cpu({"step": stepper(fast, "fast"), "step_plain": stepper(plain, "plain"),
                                  "sampler": sampler(None), "sampler_plain": sampler(False),
                                  "loss_fwd": loss(tr), "fwd_bwd": loss(tr, True), "loss_fwd_plain": loss(ref),
                                  "fwd_bwd_plain": loss(ref, True), "fwd_bwd_opt": loss(tr, True, True)},
                                 repeats=repeats, warmup=1)
    diff = lambda x, y: Stat(tuple(a - b for a, b in zip(x.values, y.values)))  # noqa: E731  per round
    for t, o in ((wall, opt_wall), (cpu, opt_cpu)):
        t["backward"] = diff(t.pop("fwd_bwd"), t["loss_fwd"])
        t["backward_plain"] = diff(t.pop("fwd_bwd_plain"), t["loss_fwd_plain"])
        t.pop("fwd_bwd_opt")
        t["opt_step"] = Stat(tuple(o[-repeats:]))  # timed inside the call (Adam on the batch's gradient)
    t = cpu
    same = [a[0] == b[0] for a, b in zip(logs["fast"], logs["plain"])]
    rel = max((abs(x - y) / max(abs(y), 1e-12) for a, b, s in zip(logs["fast"], logs["plain"], same) if s
               for x, y in zip(a[1:], b[1:])), default=float("nan"))
    tmp.cleanup()
    n_params = sum(p.numel() for p in model.parameters())
    N = setup.prompts_per_step * setup.group_size
    P, T = ro.prompt_ids.shape[1], ro.completion_ids.shape[1]
    tokens, shared = float(N * (P + T)), float(setup.prompts_per_step * P + N * (T - 1))
    rate = _matmul_rate(int(tokens), setup.spec.hidden_size, setup.spec.intermediate_size)
    floor = 6 * n_params * shared / (rate.median * 1e9) + t["sampler"].median
    return RLStepTimes(setup, cpu, wall, ratio(cpu["step_plain"], cpu["step"]), ratio(wall["step_plain"], wall["step"]),
                       float(np.mean(same)), rel, n_params, tokens, shared, rate, floor,
                       float(ro.completion_mask.sum(-1).mean()))


def testbed_setup():
    """(LLMSetup, (model, tokenizer, task, held-out accuracy)) of the testbed's default cell: the pinned small warm
    start on the long scratchpad, B = 16 x G = 8 (docs/testbed.md)."""
    from llm_probe.testbed.task import ScratchpadAddition
    from llm_probe.testbed.warm import SIZES, load_testbed

    configure_threads(1)
    task = ScratchpadAddition(length="long")
    setup = LLMSetup(max_new_tokens=task.max_completion_tokens() + 4, spec=SIZES["small"], probe_prompts=0,
                     warmup_steps=0)
    model, tok = load_testbed("small")
    acc = sampled_accuracy(model, tok, task, n=64, max_new_tokens=setup.max_new_tokens, seed=setup.seed)
    return setup, (model, tok, task, acc)


@dataclass
class RLStepConfig:
    """The tiny-Qwen RL step, part by part, against its floor (BENCHMARKS.md, "Tiny-Qwen RL step")."""

    repeats: int = 7
    """Timed repeats of each step and part (alternating, in the same rounds)."""
    warmup_steps: int = LLMSetup.warmup_steps
    """Supervised warm-up steps of the tiny Qwen before the RL steps."""
    grpo: bool = False
    """Also time trl.GRPOTrainer's plain step (rounds=2)."""
    testbed: bool = False
    """Time the testbed's step instead (llm_probe.testbed: the pinned small warm start, long scratchpad,
    48 new tokens; docs/testbed.md)."""


@command("rl_step_main")
def rl_step_main(argv: list[str]) -> int:
    """``python -c "import sys; from benchmarks.llm import rl_step_main; sys.exit(rl_step_main())" [--repeats N]
    [--warmup-steps S]``: :func:`rl_step_times` (and GRPOTrainer's step with ``--grpo``), printed
    (BENCHMARKS.md, "Tiny-Qwen RL step")."""
    a = parse(RLStepConfig, argv, prog="rl_step_main")
    setup = LLMSetup(warmup_steps=a.warmup_steps)
    load0 = load_average()
    if a.testbed:
        setup, (model, tok, task, acc) = testbed_setup()
    else:
        model, tok, task, acc = warm_policy(setup)
    res = rl_step_times(model, tok, task, setup, repeats=a.repeats)
    ms = {k: 1e3 * v.median for k, v in res.times.items()}
    start = ("the testbed's pinned small warm start" if a.testbed else f"warm-up {setup.warmup_steps} steps")
    print(f"{'testbed' if a.testbed else 'tiny'} Qwen2 (hidden {setup.spec.hidden_size}, "
          f"{setup.spec.num_hidden_layers} layers, {res.n_params} "
          f"params), B = {setup.prompts_per_step} x G = {setup.group_size}, max {setup.max_new_tokens} new tokens "
          f"(mean completion {res.completion_length:.2f}), GRPO, probes off, CPU, 1 thread; {start} "
          f"(sampled accuracy {acc:.2f}); both steps' rewards equal at "
          f"{100 * res.same_rewards:.0f} % of the steps, where loss and grad norm agree to {res.rel_diff:.1e} "
          f"(relative)")
    print("  CPU ms (median, [min, max]) | wall ms")
    for k, v in res.times.items():
        print(f"  {k:>14}: {ms[k]:7.2f} {v.spread():>12} | {1e3 * res.wall[k].median:7.2f} {res.wall[k].spread():>12}")
    for name, r in (("CPU", res.speedup), ("wall", res.speedup_wall)):
        print(f"  speedup step_plain / step ({name} time): x{r.median:.2f} [{r.lo:.2f}, {r.hi:.2f}]")
    rate = res.matmul_gflops.median
    for name, tk in (("plain route", res.tokens), ("shared prompts", res.shared_tokens)):
        flops = 6 * res.n_params * tk
        print(f"  6 x params x tokens ({name}): 6 x {res.n_params} x {tk:.0f} = {flops / 1e9:.2f} GFLOP at "
              f"{rate:.1f} GFLOP/s = {1e3 * flops / (rate * 1e9):.2f} ms")
    print(f"  floor (shared prompts + sampler) = {1e3 * res.floor:.2f} ms; step / floor = "
          f"x{res.times['step'].median / res.floor:.2f}")
    rest = ms["step"] - ms["sampler"] - ms["loss_fwd"] - ms["backward"] - ms["opt_step"]
    print(f"  rest of the step (metrics, token stats, clipping, copies of theta_k, warnings): {rest:.2f} ms")
    if a.grpo:
        g = grpo_callback_times(setup, rounds=2, cycle=5, model_tok=(model, tok, task))
        print(f"  trl.GRPOTrainer plain step (same model, B x G, {setup.max_new_tokens} new tokens): "
              f"{1e3 * g.times['plain'].median:.1f} ms {g.times['plain'].spread()}")
    l1 = load_average()
    print(f"  load average before {load0[0]:.1f}, after {l1[0]:.1f}")
    return 0
