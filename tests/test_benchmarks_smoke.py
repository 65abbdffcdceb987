"""Smoke test of the benchmark harness (benchmarks/, `python -m benchmarks`) at tiny sizes: it runs, and
every fast path it times gives the same numbers as the reference path it is timed against, on the
benchmarked workloads (bandit engine vs the plain loop on C=32, K=100, d=16; the roofline kernel vs the
engine; batched vs per-run sequence simulation; JVP vs per-prompt-backward alignment; probes on vs off
leave the training trajectory unchanged). No timing assertions."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bandits.engine import Dynamics, simulate
from bandits.envs import ContextualBandit, make_bandit
from benchmarks import bandit as bb
from benchmarks import references as refs
from benchmarks import roofline as rl
from benchmarks import sequence as sq
from benchmarks.run import TINY, format_report, main, run_all, targets
from benchmarks.timing import Stat, interleaved, ratio
from gapdyn.cmdline import UsageError, parse

# the benchmarked workload (section 1), few steps: the reference loop costs ~4 ms per run-step here
SHORT = replace(bb.WORKLOAD, steps=8, ref_runs=3, ref_steps=8)


@pytest.mark.parametrize("mode", ["exact", "sampled"])
def test_engine_equals_reference_on_benchmark_workload(mode):
    r = bb.engine_vs_reference(SHORT, mode, repeats=1)
    assert r.maxdiff_by["n_decrease"] == 0
    assert r.maxdiff < 1e-9, r.maxdiff_by
    assert r.engine_rate.median > 0 and r.ref_rate.median > 0


def test_compare_trajectories_detects_a_difference():
    w = TINY.workload
    b, (eta, seed) = w.bandit(), bb.grid(w)
    a = simulate(b, w.dynamics("exact"), eta=eta, seed=seed)
    c = simulate(b, w.dynamics("exact"), eta=eta * (1 + 1e-6), seed=seed)
    assert max(bb.compare_trajectories(a, a).values()) == 0.0
    assert max(bb.compare_trajectories(a, c).values()) > 1e-12


def test_engine_full_grid_rows_equal_subset_runs():
    """The timed call (all runs) and the checked call (reference's runs) compute the same rows."""
    w = replace(TINY.workload, n_seeds=3, n_etas=3, ref_runs=3)
    b, (eta, seed) = w.bandit(), bb.grid(w)
    sub = bb._ref_subset(w)
    for mode in ("exact", "sampled"):
        full = simulate(b, w.dynamics(mode), eta=eta, seed=seed)
        part = simulate(b, w.dynamics(mode), eta=eta[sub], seed=seed[sub])
        np.testing.assert_array_equal(full.theta_final[sub], part.theta_final)


@pytest.mark.parametrize("fastmath,tol", [(False, 1e-12), (True, 1e-8)])
def test_roofline_kernel_is_the_exact_update(fastmath, tol):
    """The ceiling kernel does real work: exact REINFORCE ascent, equal to bandits.engine on C copies."""
    K, d, C, T = 30, 5, 3, 25
    featT, npos = rl.ceiling_problem(K, d, seed=1)
    eta = np.array([0.05, 0.5, 3.0])
    bandit = ContextualBandit(np.broadcast_to(featT.T, (C, K, d)).copy(),
                              np.broadcast_to((np.arange(K) < npos).astype(float), (C, K)).copy())
    ref = simulate(bandit, Dynamics(method="reinforce", gradient="exact", steps=T), eta=eta)
    th = rl.ceiling_run(featT, npos, np.zeros((3, C, d)), eta, T, fastmath=fastmath)
    np.testing.assert_allclose(th, ref.theta_final, rtol=0, atol=tol)
    assert np.abs(th).max() > 1e-3  # it moved


def test_machine_ceilings_are_positive():
    bw = rl.stream_bandwidth(1 << 12, repeats=1)
    assert all(np.isfinite(v.median) and v.median > 0 for v in bw.values())
    assert rl.exp_rate(n=10, reps=10, repeats=1).median > 0
    assert rl.fused_exact_ceiling(K=10, d=3, C=2, R=2, steps=2, repeats=1).median > 0
    with pytest.raises(ValueError, match="K"):
        rl.fused_exact_ceiling(K=1)


@pytest.mark.parametrize("model", sq.SEQ_MODELS)
def test_sequence_batched_equals_looped(model):
    p = sq.sequence_point(model, "logodds", 3, runs=3, steps=3, repeats=1, loop_runs=3)
    assert p.maxdiff <= 1e-12
    s = sq.sequence_point(model, "sampled", 2, runs=2, steps=2, repeats=1)
    assert np.isnan(s.maxdiff) and s.batched.median > 0


def test_timing_helpers():
    s = Stat((1.0, 2.0, 4.0))
    assert s.median == 2.0 and s.spread() == "[-50%,+100%]"
    assert s.inverse(4.0).values == (4.0, 2.0, 1.0)
    assert ratio(Stat((2.0, 6.0)), Stat((1.0, 2.0))).values == (2.0, 3.0)
    calls = []
    t = interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=2, warmup=1)
    assert calls == ["a", "b"] * 3 and len(t["a"].values) == 2
    with pytest.raises(ValueError, match="repeats"):
        interleaved({}, repeats=0)


def test_report_without_llm():
    res = run_all(TINY, llm=False)
    text = format_report(res)
    for head in ("## 0.", "## 1.", "### 1b.", "Threads over runs", "## 2.", "## 4.", "## Targets"):
        assert head in text
    assert res["bandit_exact"].maxdiff < 1e-9 and res["bandit_sampled"].maxdiff < 1e-9
    assert res["speed"].fused_maxdiff < 1e-12
    assert set(targets(res)) == {"exact_vs_fused", "sampled_vs_numpy"}


def test_targets_table_takes_per_round_ratios_and_bounds():
    """The warm-up target is the per-round ratio of benchmarks.threads rows (a failed row is left out), and the
    verdict flips at the bound; the table prints every target once with MET / MISSED."""
    from benchmarks.run import Target, format_targets

    def rows(t_unset):
        return [{"round": k, "threads": n, "policy": pol, "warmup_s": t}
                for k, (t1, t2) in enumerate(zip((2.0, 1.0), t_unset)) for n, pol, t in ((1, "PASSIVE", t1),
                                                                                          (2, "unset", t2))] + [
            {"round": 1, "threads": 2, "policy": "PASSIVE", "error": "timed out"}]
    met = targets({"threads": rows((5.0, 3.0))})["warmup_threads"]
    assert met.measured.values == (2.5, 3.0) and met.met
    missed = targets({"threads": rows((3.0, 1.9))})["warmup_threads"]
    assert missed.measured.values == (1.5, 1.9) and not missed.met
    assert Target("x", Stat((1.5,)), 1.5, True, "").met and not Target("x", Stat((1.51,)), 1.5, True, "").met
    t = Stat((2.0, 3.0, 40.0))  # the sequence target: numpy / numba per round
    seq = targets({"length": sq.LengthPoint("sampled", (1, 4), t.inverse(), t, ratio(t, t.inverse()), False)})
    assert seq["sequence_numba"].measured.values == (4.0, 9.0, 1600.0) and not seq["sequence_numba"].met  # median
    assert "same eta*: NO" in seq["sequence_numba"].why
    text = "\n".join(format_targets({"threads": rows((3.0, 1.9)), "load_before": (1.0,) * 3,
                                      "load_after": (2.0,) * 3, "wall_s": 1.0}))
    assert text.count("MISSED") == 1 and re.search(r"\| 1\.70x \[-12%,\+12%\] \| >= 2x +\| MISSED \|", text)


def test_fused_reference_is_the_engine_update():
    """benchmarks.references.fused_exact is the engine's exact constant-step SGD dynamics (shared blocks too)."""
    for shared, method in ((False, "grpo"), (True, "rloo")):
        w = replace(TINY.workload, n_contexts=4, n_arms=20, dim=5)
        b = make_bandit(n_contexts=4, n_arms=20, dim=5, n_correct=3, shared=shared, seed=5)
        eta = np.array([0.1, 1.0, 4.0])
        eng = simulate(b, Dynamics(method=method, gradient="exact", group_size=w.group_size, steps=30), eta=eta)
        fus = refs.fused_exact(b, method, w.group_size, eta, 30)
        np.testing.assert_allclose(fus, eng.theta_final, rtol=0, atol=1e-12 * max(1.0, np.abs(fus).max()))
        assert np.abs(fus).max() > 1e-3


def test_numpy_sampled_loop_is_the_sampled_update_in_expectation():
    """The numpy rng.choice loop moves theta like the engine's sampled dynamics on average (one step, many
    seeds, small eta: mean of the updates vs the engine's exact update direction E[w])."""
    b = make_bandit(n_contexts=2, n_arms=6, dim=3, n_correct=2, seed=1)
    seeds = np.arange(4000)
    th = refs.numpy_sampled(b, "rloo", 4, np.full(seeds.size, 1.0), seeds, 1)
    ex = simulate(b, Dynamics(method="rloo", gradient="exact", group_size=4, steps=1), eta=1.0).theta_final[0]
    se = th.std(axis=0) / np.sqrt(seeds.size)
    assert np.all(np.abs(th.mean(axis=0) - ex) <= 5 * se + 1e-12)


def test_cli_main(capsys):
    assert main(["--tiny", "--skip-llm", "-q"]) == 0
    out = capsys.readouterr().out
    assert "## Targets" in out and "### 1b." in out
    help_ = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], capture_output=True, text=True, timeout=120)
    assert help_.returncode == 0 and "--quick" in help_.stdout


# ---- the command lines (tyro, gapdyn.cmdline) ---------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTED = re.compile(r"python -m (benchmarks(?:\.\w+)?)((?:[ \t]+--?[\w-]+(?:[ \t]+[^\s#`|\[-][^\s#`|]*)*)*)"
                        r"|(rl_step_main)\(\)\)\"((?:[ \t]+--?[\w-]+(?:[ \t]+[^\s#`|\[-][^\s#`|]*)*)*)")


def _configs() -> dict:
    """Module (or function) of each benchmark command -> the config dataclass its main parses."""
    from benchmarks import probe_memory, real_size, section1, threads
    from benchmarks.run import BenchConfig

    out = {"benchmarks": BenchConfig, "benchmarks.section1": section1.Section1Config,
           "benchmarks.sequence": sq.SequenceConfig, "benchmarks.threads": threads.ThreadsConfig,
           "benchmarks.probe_memory": probe_memory.ProbeMemoryConfig,
           "benchmarks.real_size": real_size.RealSizeConfig}
    if importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"):
        from benchmarks import ghost, llm

        out |= {"benchmarks.llm": llm.GRPOCallbackConfig, "rl_step_main": llm.RLStepConfig,
                "benchmarks.ghost": ghost.GhostBenchConfig}
    return out


def test_documented_benchmark_commands_parse():
    """Every `python -m benchmarks...` command line of the docs parses with today's flags (and a misspelt flag
    does not)."""
    configs = _configs()
    with pytest.raises(UsageError, match="--quik"):
        parse(configs["benchmarks"], ["--quik"], prog="python -m benchmarks")
    seen = []
    for page in [*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md")]:
        for m in DOCUMENTED.finditer(page.read_text(encoding="utf-8")):
            name, args = (m[1], m[2]) if m[1] else (m[3], m[4])
            if name in configs:
                parse(configs[name], shlex.split(args), prog=name)  # a UsageError names the flag
                seen.append((name, args.strip()))
    flags = {a.split()[0] for _, a in seen if a}
    assert {"--quick", "--skip-llm", "--llm-only", "--prompts"} <= flags, seen


def test_benchmark_help_has_no_none_noise(capsys):
    """--help shows `--out FILE` (gapdyn.cmdline.optional), not tyro's `{None}|STR ... (default: None)`."""
    for name, cls in _configs().items():
        with pytest.raises(SystemExit) as exc:
            parse(cls, ["--help"], prog=name)
        text = capsys.readouterr().out
        assert exc.value.code == 0 and "--" in text, name
        assert "{None}" not in text and "(default: None)" not in text, (name, text)


# ---- llm_probe (torch) --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_policy():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from benchmarks import llm as lb
    from benchmarks.run import _spec

    setup = lb.LLMSetup(prompts_per_step=3, group_size=4, probe_prompts=2, warmup_steps=0, spec=_spec("small"))
    model, tok, task, _ = lb.warm_policy(setup)
    return lb, setup, model, tok, task


@pytest.mark.llm
def test_jvp_route_equals_backward_route(small_policy):
    lb, setup, model, tok, task = small_policy
    rt = lb.route_times(model, tok, task, setup, repeats=1)
    assert rt.n_prompts == setup.prompts_per_step
    assert rt.maxdiff <= 1e-4 * max(rt.scale, 1.0)  # float32 forward-mode vs reverse-mode
    assert rt.gap_maxdiff <= 1e-4 * max(rt.gap_scale, 1.0)  # what-if per-group gaps == per_prompt_gaps


@pytest.mark.llm
def test_probes_do_not_change_the_training_trajectory(small_policy):
    lb, setup, model, tok, task = small_policy
    st = lb.step_times(model, tok, task, setup, configs=("off", "dot", "jvp"), repeats=2, n_warmup=0)
    assert st.same_trajectory
    assert set(st.overhead) == {"off", "dot", "jvp"} and st.overhead["off"].median == 1.0


@pytest.mark.llm
def test_peak_memory_sees_an_allocation():
    torch = pytest.importorskip("torch")
    from benchmarks.llm import peak_memory

    def f():
        a = torch.ones(1 << 20, dtype=torch.float64)  # 8 MiB
        return float(a.sum())

    peak, _ = peak_memory(f)
    assert peak >= 8 * 2**20


@pytest.mark.llm
def test_real_size_benchmark_on_a_tiny_model():
    """benchmarks.real_size's parts run in this process on the tiny model of its family (--tiny): the probe's
    dmu_q = <delta, g_q> (streamed gaps) agrees with the realised change of Phi_hat_q (forward difference, an
    independent route; first order, lr 1e-6), and every part has a time and a peak >= its start."""
    pytest.importorskip("transformers")
    from benchmarks.real_size import RealSizeConfig, format_report, measure

    r = measure(RealSizeConfig(prompts=2, G=4, T=8, tiny=True))
    assert r["n_prompts"] == 2 and len(r["dmu_update"]) == 2 and r["optimizer"] == "adamw"
    assert r["dphi_mean"] == pytest.approx(r["dmu_update_mean"], rel=5e-2)
    for part in ("plain", "before", "after", "headroom", "opt_step"):
        assert r[f"{part}_s"] > 0 and r[f"{part}_peak_MiB"] >= r["base_MiB"] * 0.9, part
    text = format_report({**r, "load_before": [0.0] * 3, "load_after": [0.0] * 3, "wall_s": 1.0})
    assert "| probe: all three |" in text


def test_probe_targets_report_the_worst_and_the_default_configuration():
    """The amortised probe target is the worst alignment at the cadence; a second row is the configuration a user
    gets (TrainConfig's alignment and probe_every), read from its own row, not the worst."""
    from types import SimpleNamespace

    from llm_probe.config import TrainConfig

    n, default = TrainConfig.probe_every, TrainConfig.probe_alignment
    ov = {"off": Stat((1.0,)), "dot": Stat((4.0,)), "jvp": Stat((6.0,)),
          f"dot/{n}": Stat((1.3, 1.4)), f"jvp/{n}": Stat((1.6, 1.7))}
    res = {"llm_steps": SimpleNamespace(overhead=ov, mixed_per_step=4.0, setup=SimpleNamespace(prompts_per_step=16)),
           "llm_every": n}
    t = targets(res)
    assert t["probe_overhead"].measured is ov["jvp"] and not t["probe_overhead"].met
    assert t["probe_overhead_default"].measured is ov[f"jvp/{n}"] and not t["probe_overhead_default"].met
    row = t["probe_overhead_default_config"]
    assert row.measured is ov[f"{default}/{n}"] and row.met == (ov[f"{default}/{n}"].median <= 1.5)
    res["llm_every"] = n + 1  # another cadence: no default-configuration row
    res["llm_steps"].overhead = {k.replace(f"/{n}", f"/{n + 1}"): v for k, v in ov.items()}
    assert "probe_overhead_default_config" not in targets(res)
