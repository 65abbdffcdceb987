"""The benchmark table: ``python -m benchmarks [--quick] [--skip-llm] [--out FILE]``.

Sections (BENCHMARKS.md explains each): 0 machine ceilings, 1 bandit engine vs its references (the plain
loop bandits.reference, the fused fast-math exact kernel and the numpy rng.choice loop of
benchmarks/references.py) and over threads, 2 sequence bandit vs T, 3 llm_probe probe costs and memory,
4 scaling. The targets are checked on the medians and printed as MET / MISSED; correctness of every fast
path against its reference is printed next to its speed (max |difference|).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from typing import Annotated

import tyro

from gapdyn.cmdline import UsageError, command, optional, parse

from . import bandit as bb
from . import roofline as rl
from . import sequence as sq
from . import speed as sp
from .timing import Stat, emit_report, load_average, machine_info, ratio

__all__ = ["Sizes", "FULL", "QUICK", "TINY", "run_all", "format_report", "format_targets", "targets", "Target",
           "BenchConfig", "main", "TARGETS"]

TARGETS = {"exact_vs_fused": 1.0, "sampled_vs_numpy": 30.0, "sequence_numba": 10.0, "probe_overhead": 1.5,
           "probe_overhead_default": 1.5, "probe_overhead_default_config": 1.5, "rl_step_vs_plain": 2.0,
           "rl_step_vs_trl": 2.0, "warmup_threads": 2.0}
"""Bounds of the Targets table (BENCHMARKS.md): ratios >= the bound, except the probe overheads (<=)."""


@dataclass(frozen=True)
class Sizes:
    """How much of each measurement to do."""

    repeats: int = 5
    workload: bb.Workload = bb.WORKLOAD
    speed_workload: bb.Workload = replace(bb.WORKLOAD, steps=200, ref_runs=2, ref_steps=20)  # section 1 ratios
    threads: tuple = (1, 2)
    stream_n: int = 1 << 23
    ceiling_steps: int = 200
    scale_steps: int = 50
    scale_K: tuple = (10, 100, 1000)
    scale_C: tuple = (8, 32, 128)
    scale_R: tuple = (8, 64, 256)
    scale_G: tuple = (2, 8, 32)
    scale_methods: tuple = ("grpo", "rloo", "dr_grpo", "wapo")
    seq_T: tuple = (1, 4, 16, 64)
    seq_runs: int = 16
    seq_steps: int = 20
    llm_warmup: int = 400
    llm_spec: str | None = None  # None: TinyQwenSpec defaults; "small": hidden 32 (tests)
    llm_B: int = 16
    llm_G: int = 8
    llm_repeats: int = 5
    llm_scale_G: tuple = (4, 8, 16)
    llm_scale_B: tuple = (4, 16, 32)
    profile_steps: int = 3
    llm_every: int | None = 10  # probe_every timed (amortised) besides 1; None: TrainConfig's default
    length_T: tuple = (1, 2, 4, 8, 16)  # sequence bandit, numba vs numpy: the length experiment's cells (): none
    length_repeats: int = 3
    length_max_ratio: float | None = None  # None: the full configuration's eta scan (ratio 1.01)
    rl_repeats: int = 7  # RL step vs the step before llm_probe.sampler (rounds)
    trl_rounds: int = 2  # trl.GRPOTrainer's plain step: rounds x trl_cycle timed steps
    trl_cycle: int = 5
    threads_warmup: int = 20  # torch threads x OMP_WAIT_POLICY: warm-up steps per fresh process
    threads_rl: int = 3
    threads_rounds: int = 2


FULL = Sizes()
QUICK = Sizes(
    repeats=3, workload=replace(bb.WORKLOAD, steps=50, ref_runs=2, ref_steps=20), stream_n=1 << 22,
    speed_workload=replace(bb.WORKLOAD, steps=200, ref_runs=2, ref_steps=10),
    ceiling_steps=50, scale_steps=10, scale_K=(10, 100, 1000), scale_C=(8, 32, 128), scale_R=(8, 64, 256),
    scale_G=(2, 8, 32), seq_T=(1, 8, 32), seq_runs=8, seq_steps=5, llm_warmup=200, llm_repeats=3,
    llm_scale_G=(4, 8), llm_scale_B=(4, 16), profile_steps=1, length_T=(1, 2, 4, 8), length_repeats=2,
    rl_repeats=9, trl_rounds=1, trl_cycle=3, threads_warmup=10, threads_rl=1, threads_rounds=1,
)
TINY = Sizes(
    repeats=1, workload=bb.Workload(n_contexts=3, n_arms=12, dim=4, n_correct=3, n_seeds=2, n_etas=2, group_size=4,
                                    steps=6, ref_runs=2, ref_steps=6),
    speed_workload=bb.Workload(n_contexts=3, n_arms=12, dim=4, n_correct=3, n_seeds=2, n_etas=2, group_size=4,
                               steps=6, ref_runs=2, ref_steps=3),
    stream_n=1 << 12, ceiling_steps=2, scale_steps=2, scale_K=(5, 10), scale_C=(2,), scale_R=(2,), scale_G=(2,),
    scale_methods=("grpo", "rloo"),
    seq_T=(1, 3), seq_runs=3, seq_steps=2, llm_warmup=0, llm_B=3, llm_G=4, llm_repeats=1, llm_scale_G=(2,),
    llm_scale_B=(2,), profile_steps=1, llm_spec="small", llm_every=2, length_T=(), length_repeats=1,
    rl_repeats=1, trl_rounds=1, trl_cycle=1, threads_warmup=1, threads_rl=1, threads_rounds=1,
)


def _spec(name):
    """TinyQwenSpec for Sizes.llm_spec: None (defaults) or "small" (hidden 32: the tests' size)."""
    from llm_probe import TinyQwenSpec

    if name is None:
        return TinyQwenSpec()
    if name == "small":
        return TinyQwenSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=8)
    raise ValueError(f"llm_spec must be None or 'small', got {name!r}")


def _log(msg: str, verbose: bool):
    if verbose:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_all(sizes: Sizes = FULL, *, llm: bool = True, verbose: bool = False, bandits: bool = True) -> dict:
    """Every measurement of the table, as a dict of result objects (see format_report).

    llm: include section 3 (imports torch); bandits: include sections 0, 1, 2, 4.
    """
    res: dict = {"sizes": sizes, "load_before": load_average()}
    t0 = time.perf_counter()
    if bandits:
        res.update(_run_bandits(sizes, verbose))
    if llm:
        res.update(_run_llm(sizes, verbose))
    res["load_after"] = load_average()
    res["wall_s"] = time.perf_counter() - t0
    return res


def _run_bandits(sizes: Sizes, verbose: bool) -> dict:
    res: dict = {}
    w = sizes.workload
    _log("machine ceilings", verbose)
    res["stream"] = rl.stream_bandwidth(sizes.stream_n, repeats=sizes.repeats)
    res["exp"] = rl.exp_rate(repeats=sizes.repeats)
    ck = dict(K=w.n_arms, d=w.dim, C=w.n_contexts, R=8, steps=sizes.ceiling_steps)
    res["ceiling"] = {"strict": rl.fused_exact_ceiling(repeats=sizes.repeats, **ck),
                      "fastmath": rl.fused_exact_ceiling(fastmath=True, repeats=sizes.repeats, **ck)}
    for mode in ("exact", "sampled"):
        _log(f"bandit {mode}: engine vs bandits.reference (+ roofline kernels)", verbose)
        extra = {
            "ceiling_strict": rl.ceiling_callable(**ck),
            "ceiling_fastmath": rl.ceiling_callable(fastmath=True, **ck),
        }
        res[f"bandit_{mode}"] = bb.engine_vs_reference(w, mode, repeats=sizes.repeats, extra=extra)
    _log(f"bandit engine vs the fused kernel and the numpy loop, threads {sizes.threads}", verbose)
    res["speed"] = sp.speed_vs_references(sizes.speed_workload, repeats=sizes.repeats, threads=sizes.threads)
    _log("sequence bandit vs T", verbose)
    res["sequence"] = [sq.sequence_point(m, dr, T, runs=sizes.seq_runs, steps=sizes.seq_steps,
                                         repeats=sizes.repeats, group_size=w.group_size)
                       for m in sq.SEQ_MODELS for dr in ("sampled", "logodds") for T in sizes.seq_T]
    if sizes.length_T:
        _log(f"sequence bandit, numba vs numpy: the length experiment's eta* searches, T {sizes.length_T}", verbose)
        res["length"] = sq.length_point("sampled", Ts=sizes.length_T, repeats=sizes.length_repeats,
                                        max_ratio=sizes.length_max_ratio)
    _log("bandit scaling", verbose)
    ws = replace(w, steps=sizes.scale_steps)
    reps = max(1, min(3, sizes.repeats))
    res["scaling"] = {}
    for mode in ("exact", "sampled"):
        for axis, vals in (("n_arms", sizes.scale_K), ("n_contexts", sizes.scale_C), ("runs", sizes.scale_R)):
            res["scaling"][(mode, axis)] = bb.scaling(ws, mode, axis, vals, repeats=reps)
    res["scaling"][("sampled", "group_size")] = bb.scaling(ws, "sampled", "group_size", sizes.scale_G, repeats=reps)
    for mode in ("exact", "sampled"):
        res["scaling"][(mode, "method")] = bb.scaling(ws, mode, "method", sizes.scale_methods, repeats=reps)
    return res


def default_probe_every(sizes: Sizes) -> int:
    """The cadence timed besides probe_every=1: sizes.llm_every, else TrainConfig's default."""
    if sizes.llm_every is not None:
        return sizes.llm_every
    from llm_probe import TrainConfig

    return TrainConfig.probe_every


def _run_llm(sizes: Sizes, verbose: bool) -> dict:
    from . import llm as lb

    out = {}
    setup = lb.LLMSetup(prompts_per_step=sizes.llm_B, group_size=sizes.llm_G, warmup_steps=sizes.llm_warmup,
                        spec=_spec(sizes.llm_spec))
    _log(f"llm: warm-up ({setup.warmup_steps} steps)", verbose)
    model, tok, task, acc = lb.warm_policy(setup)
    out["llm_acc"] = acc
    every = default_probe_every(sizes)
    configs = lb.PROBE_CONFIGS + (tuple(f"{c}/{every}" for c in lb.PROBE_CONFIGS[1:]) if every > 1 else ())
    _log(f"llm: train step, probes off / on (every step{f' and every {every} steps' if every > 1 else ''})", verbose)
    out["llm_steps"] = lb.step_times(model, tok, task, setup, configs=configs, repeats=sizes.llm_repeats)
    out["llm_every"] = every
    _log("llm: alignment routes", verbose)
    out["llm_routes"] = lb.route_times(model, tok, task, setup, repeats=sizes.llm_repeats)
    _log("llm: peak memory", verbose)
    out["llm_route_mem"] = lb.route_memory(model, tok, task, setup)
    out["llm_step_mem"] = lb.step_memory(model, tok, task, setup)
    _log("llm: profile", verbose)
    out["llm_profile"] = {p: lb.profile_step(model, tok, task, setup, p, steps=sizes.profile_steps)
                          for p in ("off", "dot", "jvp")}
    _log("llm: scaling", verbose)
    reps = max(1, min(3, sizes.llm_repeats))
    scal = {}
    for axis, vals in (("group_size", sizes.llm_scale_G), ("prompts_per_step", sizes.llm_scale_B)):
        for v in vals:
            scal[(axis, v)] = lb.step_times(model, tok, task, replace(setup, **{axis: v}), configs=("off", "dot"),
                                            repeats=reps)
    out["llm_scaling"] = scal
    _log(f"llm: RL step vs the step before llm_probe.sampler ({sizes.rl_repeats} rounds)", verbose)
    out["rl_step"] = lb.rl_step_times(model, tok, task, setup, repeats=sizes.rl_repeats)
    _log(f"llm: trl.GRPOTrainer plain step ({sizes.trl_rounds} rounds x {sizes.trl_cycle} steps)", verbose)
    out["trl_step"] = lb.grpo_callback_times(setup, rounds=sizes.trl_rounds, cycle=sizes.trl_cycle,
                                             model_tok=(model, tok, task), probes=False)
    from . import threads as th

    _log(f"llm: warm-up at 1 / 2 torch threads x OMP_WAIT_POLICY (fresh processes, {sizes.threads_warmup} steps)",
         verbose)
    out["threads"] = th.run_all(warmup_steps=sizes.threads_warmup, rl_steps=sizes.threads_rl,
                                rounds=sizes.threads_rounds, small=sizes.llm_spec == "small")
    return out


# ---------------------------------------------------------------------------------------------
# formatting


def _m(stat, f=1.0, fmt="{:.2f}"):
    return fmt.format(stat.median * f)


def _ms(stat, f=1.0, fmt="{:.2f}"):
    return f"{_m(stat, f, fmt)} {stat.spread()}"


def _table(header, rows) -> list[str]:
    cols = [header] + rows
    wd = [max(len(str(r[i])) for r in cols) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(x).ljust(n) for x, n in zip(r, wd)) + " |"  # noqa: E731
    return [line(header), "|" + "|".join("-" * (n + 2) for n in wd) + "|"] + [line(r) for r in rows]


def _verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def roofline(res: dict) -> dict:
    """Ceilings in context-arm updates / s: memory (triad BW / 8 (d + 1)), compute (best fused kernel)."""
    w = res["sizes"].workload
    mem = res["stream"]["triad"].median / (8.0 * (w.dim + 1))
    comp = max(res["ceiling"]["strict"].median, res["ceiling"]["fastmath"].median)
    return {"memory": mem, "compute": comp, "roofline": min(mem, comp), "strict": res["ceiling"]["strict"].median}


def roof_fraction(res: dict, r: bb.BanditResult, key: str = "engine") -> Stat:
    """Per-repeat rate / roofline, the ceilings timed in the same interleaved rounds as the engine."""
    mem = roofline(res)["memory"]
    rate = r.engine_rate if key == "engine" else r.extra_rates[key]
    cs, cf = r.extra_rates["ceiling_strict"], r.extra_rates["ceiling_fastmath"]
    return Stat(tuple(e / min(mem, max(a, b)) for e, a, b in zip(rate.values, cs.values, cf.values)))


@dataclass(frozen=True)
class Target:
    """One row of the Targets table: the measured ratio (median of per-round ratios), its bound, the verdict
    and why it stands where it does (one clause, from the same run's numbers)."""

    label: str
    measured: Stat
    bound: float
    at_most: bool  # the probe overheads: measured <= bound; every other target: measured >= bound
    why: str

    @property
    def met(self) -> bool:
        m = self.measured.median
        return m <= self.bound if self.at_most else m >= self.bound


def _threads_ratio(rows: list[dict], threads: int, policy: str, key: str = "warmup_s") -> Stat | None:
    """Per-round time of (threads, policy) / time of 1 thread + PASSIVE (benchmarks.threads rows)."""
    by = {(r["round"], r["threads"], r["policy"]): r.get(key) for r in rows if "error" not in r}
    vals = tuple(by[(k, threads, policy)] / by[(k, 1, "PASSIVE")] for k in sorted({r["round"] for r in rows})
                 if by.get((k, threads, policy)) and by.get((k, 1, "PASSIVE")))
    return Stat(vals) if vals else None


def targets(res: dict) -> dict[str, Target]:
    """Every target measured in res (TARGETS), by name."""
    out = {}
    if "speed" in res:
        sp_ = res["speed"]
        out["exact_vs_fused"] = Target(
            "exact engine (1 thread) / the fused single-core fast-math kernel", sp_.exact_vs_fused,
            TARGETS["exact_vs_fused"], False, "vectorised exp, both runs of a pair in one pass over the features")
        out["sampled_vs_numpy"] = Target(
            "sampled engine (1 thread) / the numpy rng.choice loop (GRPO workload)", sp_.sampled_vs_numpy,
            TARGETS["sampled_vs_numpy"], False,
            f"the {100 * sp_.sampled_zero_share:.0f} % zero directions are skipped (with none: "
            f"{sp_.dense_vs_numpy.median:.1f}x, {sp_.dense_method})")
    if "length" in res:
        p = res["length"]
        out["sequence_numba"] = Target(
            f"sequence bandit numba / numpy (length cells' eta* searches, T {','.join(map(str, p.Ts))})",
            p.speedup, TARGETS["sequence_numba"], False,
            f"one kernel call per run, no [R, G, T, V] temporaries; same eta*: {'yes' if p.same_eta_star else 'NO'}")
    if "llm_steps" in res:
        st = res["llm_steps"]
        ov = st.overhead
        worst = max((k for k in ov if k != "off" and "/" not in k), key=lambda k: ov[k].median)
        out["probe_overhead"] = Target(
            f"probed step / plain step, probe_every=1 (worst: {worst})", ov[worst], TARGETS["probe_overhead"], True,
            f"a probed step adds a forward + backward per mixed group ({st.mixed_per_step:.1f} of "
            f"{st.setup.prompts_per_step} here)")
        amort = [k for k in ov if "/" in k]
        if amort:
            w = max(amort, key=lambda k: ov[k].median)
            n = res.get("llm_every")
            out["probe_overhead_default"] = Target(
                f"probed / plain step amortised at probe_every={n} (worst: {w.split('/')[0]})",
                ov[w], TARGETS["probe_overhead_default"], True,
                f"one probe per {n} steps: 1 + (every-step ratio - 1) / {n} = "
                f"{1 + (ov[worst].median - 1) / n:.2f}x expected")
            from llm_probe.config import TrainConfig  # what a user gets: the default alignment at this cadence

            a = TrainConfig.probe_alignment
            if f"{a}/{n}" in ov and n == TrainConfig.probe_every:
                out["probe_overhead_default_config"] = Target(
                    f"the same at the default configuration (alignment {a!r}, probe_every={n})", ov[f"{a}/{n}"],
                    TARGETS["probe_overhead_default_config"], True,
                    f"{ov[a].median:.2f}x every step" if a in ov else "")
    if "rl_step" in res:
        r = res["rl_step"]
        fl = r.times["step"].median / r.floor
        out["rl_step_vs_plain"] = Target(
            "tiny-Qwen RL step: the step before llm_probe.sampler / now (CPU time)", r.speedup,
            TARGETS["rl_step_vs_plain"], False,
            f"the step is {fl:.1f}x its floor (matmuls + sampler): per-kernel overhead on tiny operands")
    if "rl_step" in res and "trl_step" in res:
        ours = res["rl_step"].wall["step"].median
        out["rl_step_vs_trl"] = Target(
            "tiny-Qwen RL step: trl.GRPOTrainer's plain step / ours (wall, same model and B x G)",
            res["trl_step"].times["plain"].scaled(1.0 / ours), TARGETS["rl_step_vs_trl"], False,
            "TRL samples with generate() (a full forward per token), ours with the KV-cache sampler; "
            "separate rounds (not interleaved)")
    if "threads" in res:
        d = _threads_ratio(res["threads"], 2, "unset")
        if d is not None:
            p2 = _threads_ratio(res["threads"], 2, "PASSIVE")
            why = ("spinning OpenMP workers compete with the other jobs for the cores" if d.median >= 2.0 else
                   "the cores had room for the spinning workers")
            out["warmup_threads"] = Target(
                "warm-up: torch's default (2 threads, OMP_WAIT_POLICY unset) / llm_probe's (1 thread, PASSIVE)", d,
                TARGETS["warmup_threads"], False,
                why + (f"; 2 threads PASSIVE / 1: {p2.median:.2f}x" if p2 is not None else ""))
    return out


def format_report(res: dict) -> str:
    sz = res["sizes"]
    w = sz.workload
    info = machine_info()
    L = []
    L.append("## Machine")
    for k in ("cpu", "cores", "caches", "python", "numpy", "numba", "torch"):
        L.append(f"- {k}: {info[k]}")
    lb, la = res["load_before"], res["load_after"]
    L.append(f"- load average (1/5/15 min): before {lb[0]:.2f} {lb[1]:.2f} {lb[2]:.2f}, "
             f"after {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}; wall {res['wall_s']:.0f} s")
    L.append(f"- every figure: median of {sz.repeats} repeats (LLM: {sz.llm_repeats}) [min, max relative to "
             f"the median]; ratios are per-repeat ratios of interleaved timings")
    L.append("")
    if "stream" in res:
        L.append("## 0. Machine ceilings (single core, float64)")
        roof = roofline(res)
        flops = rl.ceiling_kernel_flops(w.n_arms, w.dim) / w.n_arms
        L += _table(["quantity", "value"], [
            ["STREAM triad bandwidth (GB/s)", _ms(res["stream"]["triad"], 1e-9)],
            ["STREAM copy bandwidth (GB/s)", _ms(res["stream"]["copy"], 1e-9)],
            ["math.exp rate (M/s; one per arm-update)", _ms(res["exp"], 1e-6)],
            [f"memory ceiling BW/(8(d+1)) (M upd/s)", f"{roof['memory'] / 1e6:.1f}"],
            ["fused exact kernel, IEEE order (M upd/s)", _ms(res["ceiling"]["strict"], 1e-6)
             + f" = {res['ceiling']['strict'].median * flops / 1e9:.2f} GFLOP/s"],
            ["fused exact kernel, fastmath (M upd/s)", _ms(res["ceiling"]["fastmath"], 1e-6)
             + f" = {res['ceiling']['fastmath'].median * flops / 1e9:.2f} GFLOP/s"],
            ["roofline = min(memory, best compute) (M upd/s)", f"{roof['roofline'] / 1e6:.1f}"],
        ])
        L.append("")
        L.append(f"## 1. Bandit throughput: bandits.engine vs bandits.reference (method {w.method}, C={w.n_contexts}, "
                 f"K={w.n_arms}, d={w.dim}, {w.runs} runs = {w.n_seeds} seeds x {w.n_etas} etas, G={w.group_size})")
        L.append(f"engine: all {w.runs} runs x {w.steps} steps per call; reference: {len(bb._ref_subset(w))} runs x "
                 f"{w.ref_steps} steps per call (linear in both). M upd/s = million context-arm updates per second.")
        rows = []
        for mode in ("exact", "sampled"):
            r = res[f"bandit_{mode}"]
            rows.append([mode, _ms(r.engine_rate, 1e-6), _ms(r.ref_rate, 1e-6, "{:.3f}"), _ms(r.speedup, 1, "{:.1f}x"),
                         f"{_m(r.extra_rates['ceiling_strict'], 1e-6, '{:.1f}')} / "
                         f"{_m(r.extra_rates['ceiling_fastmath'], 1e-6, '{:.1f}')}",
                         _ms(roof_fraction(res, r)), f"{r.maxdiff:.1e}"])
        L += _table(["mode", "engine M upd/s", "reference M upd/s", "engine / reference",
                     "ceiling IEEE / fastmath M upd/s", "engine / roofline", "max|engine-ref|"], rows)
        L.append("(ceilings: benchmarks/roofline.py, one L1-resident context, re-timed in the same interleaved rounds; "
                 "roofline = min(memory ceiling, faster kernel) per round)")
        L.append("")
        L += _format_speed(res)
        L.append("## 2. Sequence bandit (bandits.sequence.simulate): time per run-step vs T")
        L.append(f"batched: {sz.seq_runs} runs in one call; looped: one call per run (reference). V=10, d=4, MAJ, GRPO, "
                 f"G={w.group_size}. max|diff|: J_final batched vs looped (exact direction only).")
        rows = [[p.model, p.direction, p.T, _ms(p.batched, 1e6, "{:.0f}"), _ms(p.looped, 1e6, "{:.0f}"),
                 _ms(p.speedup, 1, "{:.1f}x"), "-" if p.maxdiff != p.maxdiff else f"{p.maxdiff:.1e}"]
                for p in res["sequence"]]
        L += _table(["model", "direction", "T", "batched us/run-step", "looped us/run-step", "speedup", "max|diff|"], rows)
        L.append("")
    if "llm_steps" in res:
        L += _format_llm(res)
    if "scaling" in res:
        L.append("## 4. Scaling of bandits.engine (time per run-step; other sizes as in section 1, "
                 f"{sz.scale_steps} steps)")
        rows = []
        for (mode, axis), pts in res["scaling"].items():
            base = None
            for v, st in pts:
                C = v if axis == "n_contexts" else w.n_contexts
                K = v if axis == "n_arms" else w.n_arms
                G = v if axis == "group_size" else w.group_size
                per = st.median
                base = base or (per, v)
                size = "-" if axis == "method" else f"{v / base[1]:.3g}"
                rows.append([mode, axis, v, _ms(st, 1e6, "{:.1f}"), f"{per / (C * K) * 1e9:.1f}",
                             f"{per / base[0]:.2f}", size])
        L += _table(["mode", "axis", "value", "us/run-step", "ns/context-arm", "time vs first", "size vs first"], rows)
        L.append("")
    if "llm_scaling" in res:
        rows = []
        for (axis, v), st in res["llm_scaling"].items():
            rows.append([axis, v, _ms(st.times["off"], 1e3, "{:.0f}"), _ms(st.times["dot"], 1e3, "{:.0f}"),
                         _ms(st.overhead["dot"], 1, "{:.2f}x"), f"{st.mixed_per_step:.1f}"])
        L.append("llm_probe train step (tiny Qwen, 1 thread) vs group size G and prompts per step B "
                 "(the other at its section-3 value):")
        L += _table(["axis", "value", "probes off ms", "probes on (dot) ms", "on/off", "mixed groups/step"], rows)
        L.append("")
    L += _format_derived(res)
    if "threads" in res:
        from . import threads as th

        L.append("## 6. Torch threads x OMP_WAIT_POLICY (benchmarks.threads, fresh processes)")
        L += [th.format_report(res["threads"], sz.threads_warmup, sz.threads_rl), ""]
    if "rl_step" in res:
        r = res["rl_step"]
        L.append("## 7. Tiny-Qwen RL step (benchmarks.llm.rl_step_times; ms, median over rounds)")
        L += _table(["part", "CPU ms now", "CPU ms before llm_probe.sampler", "wall ms now"], [
            [k, _m(r.times[k], 1e3, "{:.1f}"), _m(r.times[k + "_plain"], 1e3, "{:.1f}") if k + "_plain" in r.times
             else "", _m(r.wall[k], 1e3, "{:.1f}")] for k in ("step", "sampler", "loss_fwd", "backward", "opt_step")])
        if "trl_step" in res:
            L.append(f"trl.GRPOTrainer plain step (wall): {_ms(res['trl_step'].times['plain'], 1e3, '{:.0f}')} ms")
        L.append("")
    L += format_targets(res)
    return "\n".join(L) + "\n"


def format_targets(res: dict) -> list[str]:
    """The one Targets table: every target with its measured ratio (median [min, max] over rounds), its bound,
    MET / MISSED and why."""
    rows = [[t.label, _ms(t.measured, 1, "{:.2f}x"), f"{'<=' if t.at_most else '>='} {t.bound:g}x",
             _verdict(t.met), t.why] for t in targets(res).values()]
    lb, la = res["load_before"], res["load_after"]
    return ["## Targets", f"(load average, 1 min: {lb[0]:.2f} before, {la[0]:.2f} after; wall {res['wall_s']:.0f} s)"
            ] + _table(["target", "measured", "target", "status", "why"], rows)


def _format_speed(res: dict) -> list[str]:
    r = res["speed"]
    w = r.workload
    L = [f"### 1b. Engine vs its speed references ({w.runs} runs x {w.steps} steps, C={w.n_contexts}, K={w.n_arms}, "
         f"d={w.dim}, G={w.group_size}, {w.method}; benchmarks/references.py, benchmarks/speed.py)"]
    L += _table(["comparison (1 thread)", "ratio median [min, max]", "target", "check"], [
        ["exact: fused fast-math kernel time / engine time", _ms(r.exact_vs_fused, 1, "{:.2f}x"),
         f">= {TARGETS['exact_vs_fused']:g}x: {_verdict(r.exact_vs_fused.median >= TARGETS['exact_vs_fused'])}",
         f"max|theta engine - fused| / max|theta| = {r.fused_maxdiff:.1e}"],
        [f"sampled: numpy rng.choice loop / engine, per run-step (loop: {r.numpy_runs} runs x {r.numpy_steps} "
         "steps)", _ms(r.sampled_vs_numpy, 1, "{:.1f}x"),
         f">= {TARGETS['sampled_vs_numpy']:g}x: {_verdict(r.sampled_vs_numpy.median >= TARGETS['sampled_vs_numpy'])}",
         f"different random stream (speed only); u = 0 (work skipped) in {100 * r.sampled_zero_share:.0f} % of "
         "run-context-steps"],
        [f"sampled, {r.dense_method} (no zero directions, E_pi[phi] every step): the same ratio",
         _ms(r.dense_vs_numpy, 1, "{:.1f}x"), "", f"u = 0 in {100 * r.dense_zero_share:.0f} %"],
        [f"exact: recording every {r.sparse_every} steps / every step (time)", _ms(r.sparse_vs_dense, 1, "{:.2f}x"),
         "", ""],
    ])  # fmt: skip
    L.append("")
    L.append("Threads over runs (numba prange; bitwise-identical results for any count):")
    rows = [[m, t, _ms(r.times[f"{m}_{t}"], 1e3, "{:.0f}"), _ms(r.scaling[(m, t)], 1, "{:.2f}x")]
            for m in ("exact", "sampled") for t in r.threads]
    L += _table(["mode", "threads", "ms per call", "speedup vs 1 thread"], rows)
    L.append("")
    return L


def _format_derived(res: dict) -> list[str]:
    if "llm_steps" not in res:
        return []
    L = ["## 5. Derived: probe cost amortised over a cadence (from section 3's every-step overhead)"]
    st = res["llm_steps"]
    rows = []
    for k in (5, 10):
        worst = max((c for c in st.overhead if c != "off" and "/" not in c), key=lambda c: st.overhead[c].median)
        o = 1.0 + (st.overhead[worst].median - 1.0) / k
        rows.append([f"probes every {k} steps (1 + (on/off - 1)/{k}), worst config {worst!r}", f"{o:.2f}x plain step"])
    L += _table(["estimate", "value"], rows)
    L.append("")
    return L


def _format_llm(res: dict) -> list[str]:
    L = []
    st, rt = res["llm_steps"], res["llm_routes"]
    s = st.setup
    L.append(f"## 3. llm_probe: tiny Qwen (hidden {s.spec.hidden_size}, {s.spec.num_hidden_layers} layers), CPU, "
             f"torch.set_num_threads(1); B={s.prompts_per_step} prompts x G={s.group_size}, "
             f"{s.max_new_tokens} new tokens, {s.probe_prompts} probe prompts; warm-up {s.warmup_steps} steps "
             f"(sampled accuracy {res['llm_acc']:.2f})")
    L.append(f"train step (Trainer.train_step, GRPO, Adam): mean batch reward {st.reward:.2f}, "
             f"{st.mixed_per_step:.1f} mixed groups/step; same training trajectory in every config: "
             f"{st.same_trajectory}")
    mem = res["llm_step_mem"]
    rows = []
    for c in st.times:
        mc = mem.get(c.split("/")[0])
        rows.append([c if "/" in c else f"{c}/1" if c != "off" else c, _ms(st.times[c], 1e3, "{:.0f}"),
                     _ms(st.overhead[c], 1, "{:.2f}x"), f"{mc[0] / 2**20:.1f}" if mc else "-",
                     f"{mc[1] / 2**20:.2f}" if mc else "-"])
    L.append("(probes align/N: probe_every=N; every timed call runs the same whole probe cycles of steps in each "
             "config, so ms/step is amortised; peak memory is that of a probe step)")
    L += _table(["probes", "ms/step", "vs off", "peak torch MiB", "peak tracemalloc MiB"], rows)
    L.append("")
    L.append(f"alignment routes on one rollout with all {rt.n_prompts} groups mixed ({rt.n_params} parameters, "
             f"random direction): max|dmu_jvp - dmu_dot| = {rt.maxdiff:.2e} (max|dmu| = {rt.scale:.3g}, float32)")
    m2 = res["llm_route_mem"]
    base = rt.times["loss_fwd_bwd"]
    labels = {"loss_fwd_bwd": "plain loss forward+backward",
              "backward_route": f"reference gaps: per_prompt_gaps_batched ({rt.n_prompts} backwards) + dots",
              "per_group_route": "per_prompt_gaps (per-group gradients, vmap over groups) + dots",
              "jvp_route": "forward-mode JVP (one pass, one direction)",
              "jvp2_route": "forward-mode JVP (one vmap'd pass, two directions)"}
    rows = [[labels[k], _ms(v, 1e3, "{:.0f}"), f"{v.median / base.median:.2f}x", f"{m2[k][0] / 2**20:.1f}",
             f"{m2[k][1] / 2**20:.2f}"] for k, v in rt.times.items()]
    L += _table(["route", "ms", "vs loss fwd+bwd", "peak torch MiB", "peak tracemalloc MiB"], rows)
    a, b = rt.times["per_group_route"], rt.times["backward_route"]
    L.append(f"per_prompt_gaps vs the reference route: {_ms(ratio(b, a), 1, '{:.2f}x')} faster, max|gap diff| "
             f"{rt.gap_maxdiff:.1e} (max|g| {rt.gap_scale:.3g}, float32)")
    L.append("")
    prof = res["llm_profile"]
    keys = ["total", "make_rollout", "compute_loss", "backward", "per_prompt_gaps", "prompt_objectives",
            "jvp_alignment", "_alignment", "token_stats", "optimizer step"]
    L.append("cProfile of train_step (cumulative ms per step; nested entries overlap):")
    L += _table(["probes"] + keys, [[p] + [f"{prof[p].get(k, 0.0) * 1e3:.0f}" for k in keys] for p in prof])
    L.append("")
    return L


@dataclass
class BenchConfig:
    """Print the benchmark table (BENCHMARKS.md): sections 0-5 and the targets, MET / MISSED."""

    quick: bool = False
    """Smaller sizes and fewer repeats (about a minute)."""
    tiny: bool = False
    """Smoke-test sizes (seconds; numbers meaningless)."""
    skip_llm: bool = False
    """Leave out section 3 (no torch import)."""
    llm_only: bool = False
    """Only section 3 (llm_probe), 5 and its Targets."""
    llm_every: Annotated[int | None, optional("N", "10, --tiny 2")] = None
    """probe_every timed (amortised) besides 1 (TrainConfig.probe_every's doc)."""
    out: Annotated[str | None, optional("FILE")] = None
    """Also write the report to this file."""
    quiet: Annotated[bool, tyro.conf.arg(aliases=("-q",))] = False
    """No progress lines on stderr."""


@command("python -m benchmarks")
def main(argv: list[str]) -> int:
    a = parse(BenchConfig, argv, prog="python -m benchmarks")
    sizes = TINY if a.tiny else QUICK if a.quick else FULL
    if a.llm_every is not None:
        if a.llm_every < 1:
            raise UsageError(f"--llm-every must be >= 1, got {a.llm_every}")
        sizes = replace(sizes, llm_every=a.llm_every)
    if a.llm_only and a.skip_llm:
        raise UsageError("--llm-only and --skip-llm exclude each other")
    res = run_all(sizes, llm=not a.skip_llm, verbose=not a.quiet, bandits=not a.llm_only)
    emit_report("gapdyn benchmarks", "python -m benchmarks " + " ".join(argv), format_report(res), a.out)
    return 0
