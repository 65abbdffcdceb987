"""The every-step ghost probe (llm_probe.ghost) against a plain RL step on the testbed (CPU, 1 torch thread).

Two :class:`llm_probe.Trainer` instances from copies of the same model and seed, both with ``probe_every=0``;
one runs :class:`llm_probe.ghost.GhostProbe` around its optimizer step: at theta_k (after backward and clipping)
``ghost_gaps`` of the batch's mixed groups with the direction grad L (Gram matrix, norms, <grad L, g_q>) and a
snapshot of theta_k, the step, then <theta_{k+1} - theta_k, g_q> from what ``keep`` holds and the realised change
of Phi_hat (a no-grad forward of the mixed rows). Not in it: the trainer's headroom meter (a forward-mode pass on
probed steps) and the fixed probe prompts. The steps are timed alternately (process CPU
time and wall), the trajectories checked equal (rewards and losses), and the peak live torch CPU bytes of one step
of each (benchmarks.llm.peak_memory) compared with the bytes of one copy of the trainable parameters.
``--trainer``: the probed trainer probes by itself instead (``probe_every=1, probe_alignment="ghost"``): the
GhostProbe plus what the trainer adds on a probed step (the headroom meter's forward-mode pass, the ``warn/*``
forward at theta_{k+1}, the gradient mass of the token statistics), i.e. the every-step configuration a user
would run; there the probe reuses the meter's x_n for the update's dot and the warn/* forward for the change
of Phi_hat (llm_probe.ghost.GhostProbe.reuse), so it holds nothing across the step (keep=None) and runs no
pass after it.

``--headroom-every n`` / ``--warn-forward-every m`` (with ``--trainer`` or ``--parts``): the trainer's
``headroom_every`` / ``warn_forward_every`` (the meter's forward-mode pass, the warn/* forward at theta_{k+1} on
every n-th / m-th step only; the gap/* metrics every step). Then the ratio is also given amortised (sum of the
probed steps' CPU time over the plain steps', over rounds that cover whole cycles of lcm(n, m) steps) and the peak
is the larger of a step without either pass and a step with both.

``--parts``: CPU time of each part of the trainer's every-step probed step (:func:`probed_step_parts`).

``python -m benchmarks.ghost [--repeats N] [--tiny] [--trainer] [--parts] [--headroom-every n]
[--warn-forward-every m]``
"""

from __future__ import annotations

import copy
import dataclasses
import tempfile
from dataclasses import dataclass

import torch

from gapdyn.cmdline import parse
from llm_probe import Trainer
from llm_probe.ghost import GhostProbe
from llm_probe.probes import mixed_groups
from llm_probe.step_hook import Step

from .llm import LLMSetup, _config, _interleaved_cpu, peak_memory, testbed_setup, warm_policy
from .timing import load_average, ratio

__all__ = ["attach_ghost", "ghost_step_times", "probed_step_parts", "main"]


def attach_ghost(trainer: Trainer, *, route: str = "auto", keep: str = "auto") -> list:
    """Wrap ``trainer``'s rollout and optimizer step so every step runs :class:`llm_probe.ghost.GhostProbe` around
    it (before at theta_k, after at theta_{k+1}: every ``gap/*`` metric of the dot route, the realised change of
    Phi_hat included); returns the list each probed step appends (n mixed groups, bytes held across the step) to."""
    log, last = [], {}
    rollout, step = trainer.rollout, trainer.opt.step
    probe = GhostProbe(trainer.model, keep=keep, route=route)

    def keep_rollout(*a, **k):
        last["ro"] = rollout(*a, **k)
        return last["ro"]

    def probed_step(*a, **k):
        probe.before(Step(last["ro"]))
        held = probe._pending[1].held_bytes()
        out = step(*a, **k)
        res = probe.after()
        log.append((res.metrics["gap/n_prompts"], held))
        return out

    trainer.rollout = keep_rollout
    trainer.opt.step = probed_step
    return log


@dataclass(frozen=True)
class GhostTimes:
    times: dict  # "plain", "ghost" -> Stat (CPU seconds per step)
    wall: dict  # the same, wall seconds
    ratio: object  # Stat: ghost / plain per round (CPU)
    ratio_wall: object
    same_trajectory: bool
    mixed_per_step: float  # mean mixed groups over every probed step (warm-up and memory steps included)
    mixed_timed: float  # the same over the timed rounds only (the same batches in every configuration)
    peak: dict  # "plain", "ghost" -> peak live torch bytes above the step's start (with ``memory``)
    param_bytes: int
    held_bytes: int  # largest bytes the ghost probe held across an optimizer step (what ``keep`` holds)
    keep: str  # the probed trainer's GhostProbe keep ("none" for None)
    amortised: float  # sum of the probed steps' CPU time / the plain steps' over the timed rounds
    cycle: int  # lcm(headroom_every, warn_forward_every): the steps between two steps with both passes


def watch_trainer_probe(trainer: Trainer) -> list:
    """The list each of ``trainer``'s own probed steps appends (n mixed groups, bytes a GhostProbe holds across the
    optimizer step; 0 for another probe) to."""
    log, probe = [], trainer.probe
    before = probe.before

    def watched(step):
        out = before(step)
        held = probe._pending[1].held_bytes() if isinstance(probe, GhostProbe) else 0
        log.append((len(mixed_groups(step.ro.rewards)), held))
        return out

    probe.before = watched
    return log


def ghost_step_times(model, tok, task, setup: LLMSetup, repeats: int = 5, route: str = "auto",
                     keep: str = "auto", memory: bool = False, trainer: bool = False,
                     alignment: str = "ghost", headroom_every: int = 1, warn_forward_every: int = 1) -> GhostTimes:
    import math

    tmp = tempfile.TemporaryDirectory(prefix="gapdyn_bench_ghost_")
    cfg = {k: _config(setup, "off", f"{tmp.name}/{k}") for k in ("plain", "ghost")}
    cycle = math.lcm(headroom_every, warn_forward_every) if trainer else 1
    if trainer:  # the trainer's own every-step ghost probe (its default keep and route)
        cfg["ghost"] = dataclasses.replace(cfg["ghost"], probe_every=1, probe_alignment=alignment, probe_prompts=0,
                                           headroom_every=headroom_every, warn_forward_every=warn_forward_every)
    tr = {k: Trainer(cfg[k], model=copy.deepcopy(model), tokenizer=tok, task=task) for k in ("plain", "ghost")}
    log = watch_trainer_probe(tr["ghost"]) if trainer else attach_ghost(tr["ghost"], route=route, keep=keep)
    seen = {k: [] for k in tr}

    def stepper(k):
        def f():
            m = tr[k].train_step()
            seen[k].append((m["reward"], m["loss"]))
        return f

    wall, cpu = _interleaved_cpu({k: stepper(k) for k in tr}, repeats=repeats, warmup=1)
    peak = {k: peak_memory(stepper(k))[0] for k in tr} if memory else {}
    if memory and cycle > 1:  # that step had neither pass or not both: also the next step with both
        while tr["ghost"].step % cycle:
            for k in tr:
                stepper(k)()
        peak = {k: max(peak[k], peak_memory(stepper(k))[0]) for k in tr}
    same = seen["plain"] == seen["ghost"]
    tmp.cleanup()
    params = [p for p in model.parameters() if p.requires_grad]
    probe = tr["ghost"].probe
    kept = (probe.keep or "none") if trainer and isinstance(probe, GhostProbe) else (keep or "none")
    return GhostTimes(cpu, wall, ratio(cpu["ghost"], cpu["plain"]), ratio(wall["ghost"], wall["plain"]), same,
                      sum(x[0] for x in log) / max(1, len(log)),
                      sum(x[0] for x in log[1:1 + repeats]) / max(1, len(log[1:1 + repeats])), peak,
                      sum(p.numel() * p.element_size() for p in params), max(x[1] for x in log), kept,
                      sum(cpu["ghost"].values) / sum(cpu["plain"].values), cycle)


def probed_step_parts(model, tok, task, setup: LLMSetup, steps: int = 4, alignment: str = "ghost",
                      headroom_every: int = 1, warn_forward_every: int = 1) -> dict:
    """CPU seconds per step of each part of the trainer's every-step probed step (``probe_every=1``), over ``steps``
    steps after one warm-up step: each part's function wrapped with a process-time timer; "total" the whole
    step. The parts: rollout, loss forward, backward, probe at theta_k, optimizer step, headroom meter (its
    forward-mode pass), the forward at theta_{k+1} (warn/* and the probe; with ``warn_forward_every`` > 1 also the
    ghost probe's forward over the mixed rows on the other steps), probe after the step, warn/* rest; with
    ``headroom_every`` / ``warn_forward_every`` > 1 the means cover whichever steps ran the passes."""
    import time

    import llm_probe.trainer as trainer_module

    tmp = tempfile.TemporaryDirectory(prefix="gapdyn_bench_ghost_parts_")
    cfg = dataclasses.replace(_config(setup, "off", tmp.name), probe_every=1, probe_alignment=alignment,
                              probe_prompts=0, headroom_every=headroom_every, warn_forward_every=warn_forward_every)
    tr = Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok, task=task)
    acc: dict = {}

    def timed(f, key):
        def g(*a, **k):
            t = time.process_time()
            try:
                return f(*a, **k)
            finally:
                acc[key] = acc.get(key, 0.0) + time.process_time() - t
        return g

    for obj, name, key in ((tr, "rollout", "rollout"), (tr, "compute_loss", "loss forward"),
                           (tr, "_backward", "backward"), (tr.probe, "before", "probe at theta_k"),
                           (tr.opt, "step", "optimizer step"), (tr, "_headroom", "headroom meter"),
                           (tr.probe, "after", "probe after the step")):
        setattr(obj, name, timed(getattr(obj, name), key))
    saved = {n: getattr(trainer_module, n) for n in ("forward_at_current", "step_warning_metrics")}
    try:
        trainer_module.forward_at_current = timed(saved["forward_at_current"], "forward at theta_k+1")
        trainer_module.step_warning_metrics = timed(saved["step_warning_metrics"], "warn/* rest")
        tr.train_step()
        acc.clear()
        t0 = time.process_time()
        for _ in range(steps):
            tr.train_step()
        acc["total"] = time.process_time() - t0
    finally:
        for n, f in saved.items():
            setattr(trainer_module, n, f)
        tmp.cleanup()
    return {k: v / steps for k, v in acc.items()}


@dataclass
class GhostBenchConfig:
    repeats: int = 5
    """Timed rounds (each: one plain step and one probed step, alternately)."""
    tiny: bool = False
    """The warmed tiny Qwen of benchmarks.llm instead of the testbed's pinned small warm start."""
    route: str = "auto"
    """llm_probe.ghost route: auto, ghost or grad."""
    keep: str = "auto"
    """What the probe holds across the optimizer step for the update's dot: captures, blocks, auto (per
    parameter the smaller; llm_probe.ghost) or none (nothing: the update's dot by one forward-mode pass)."""
    memory: bool = False
    """Also the peak live torch bytes of one step of each (torch.profiler; slow)."""
    trainer: bool = False
    """The trainer's own every-step probe (probe_every=1, probe_alignment=alignment; ghost: its default keep)."""
    alignment: str = "ghost"
    """With --trainer: the trainer's probe_alignment (ghost, or dot / jvp / both / stream to compare)."""
    parts: bool = False
    """Instead: CPU time per part of the trainer's every-step probed step (probe_every=1, alignment), over
    ``repeats`` steps (probed_step_parts)."""
    headroom_every: int = 1
    """With --trainer or --parts: the trainer's headroom_every (the headroom meter on every n-th step only)."""
    warn_forward_every: int = 1
    """With --trainer or --parts: the trainer's warn_forward_every (the warn/* forward at theta_{k+1} on every
    n-th step only)."""


def keep_what(keep: str) -> str:
    return {"captures": "layer inputs and output gradients", "blocks": "per-group gradients",
            "none": "nothing; the update's dot by a forward-mode pass, or in the trainer from the headroom "
                    "meter's"}.get(
        keep, "per parameter the smaller of the two")


def main(argv: list[str] | None = None) -> int:
    import sys

    a = parse(GhostBenchConfig, sys.argv[1:] if argv is None else argv, prog="benchmarks.ghost")
    load0 = load_average()
    if a.tiny:
        setup = LLMSetup(probe_prompts=0)
        model, tok, task, _ = warm_policy(setup)
    else:
        setup, (model, tok, task, _) = testbed_setup()
    if a.parts:
        parts = probed_step_parts(model, tok, task, setup, steps=a.repeats, alignment=a.alignment,
                                  headroom_every=a.headroom_every, warn_forward_every=a.warn_forward_every)
        load1 = load_average()
        print(f"{'tiny' if a.tiny else 'testbed'} model, B = {setup.prompts_per_step} x G = {setup.group_size}, "
              f"the trainer probing every step ({a.alignment}; headroom_every {a.headroom_every}, "
              f"warn_forward_every {a.warn_forward_every}), CPU ms per step over {a.repeats} steps:")
        for k, v in parts.items():
            print(f"  {k:>22}: {1e3 * v:8.1f}")
        print(f"  load average before {load0[0]:.1f}, after {load1[0]:.1f}")
        return 0
    res = ghost_step_times(model, tok, task, setup, repeats=a.repeats, route=a.route,
                           keep=None if a.keep == "none" else a.keep, memory=a.memory, trainer=a.trainer,
                           alignment=a.alignment, headroom_every=a.headroom_every,
                           warn_forward_every=a.warn_forward_every)
    load1 = load_average()
    mib = 2**20
    how = (f"the trainer probing (probe_every=1, {a.alignment}, headroom_every={a.headroom_every}, "
           f"warn_forward_every={a.warn_forward_every})" if a.trainer else f"route {a.route}, keep {a.keep}")
    print(f"{'tiny' if a.tiny else 'testbed'} model, B = {setup.prompts_per_step} x G = {setup.group_size}, "
          f"{res.mixed_per_step:.1f} mixed groups per step ({res.mixed_timed:.1f} in the timed rounds), {how}, CPU, "
          f"1 thread, {a.repeats} rounds; "
          f"same trajectory: {res.same_trajectory}")
    for k in ("plain", "ghost"):
        print(f"  {k:>5} step: CPU {1e3 * res.times[k].median:8.1f} ms {res.times[k].spread():>12} | wall "
              f"{1e3 * res.wall[k].median:8.1f} ms" + (f" | peak {res.peak[k] / mib:7.1f} MiB" if res.peak else ""))
    r, w = res.ratio, res.ratio_wall
    print(f"  probed / plain step: CPU x{r.median:.2f} [{r.lo:.2f}, {r.hi:.2f}], wall x{w.median:.2f} "
          f"[{w.lo:.2f}, {w.hi:.2f}] (target <= 1.3x)")
    if res.cycle > 1:
        whole = "" if a.repeats % res.cycle == 0 else f"; {a.repeats} rounds are not whole cycles of {res.cycle}"
        print(f"  amortised (sum probed / sum plain CPU over the rounds): x{res.amortised:.2f}{whole}")
    if res.peak:
        print(f"  peak extra memory: {(res.peak['ghost'] - res.peak['plain']) / mib:.1f} MiB")
    if not a.trainer or a.alignment == "ghost":
        print(f"  held across the optimizer step: {res.held_bytes / mib:.1f} MiB "
              f"(keep {res.keep}: {keep_what(res.keep)}) + the theta_k snapshot")
    print(f"  one copy of the trainable parameters: {res.param_bytes / mib:.1f} MiB")
    print(f"  load average before {load0[0]:.1f}, after {load1[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
