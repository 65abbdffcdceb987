"""bandits.engine's dispatch and boundary: every method code takes gapdyn's rule and an unknown code is refused;
the numba safe step rule equals gapdyn.safe_step_size with gapdyn's constant; seeds are unsigned 64-bit end to end
(numpy.random.default_rng's range); the benchmark's equality check covers every outcome field."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from scipy.special import softmax

import gapdyn
import gapdyn.theory.safe_step as gss
from bandits import engine
from bandits.engine import DIRECTIONS, Dynamics, Trajectory, advantages_nb, exact_scalar_nb, run_grid, simulate
from bandits.envs import make_bandit
from bandits.reference import simulate_reference

FORGED = (-1, 9, 10, 77, 2**31 - 1)  # not a code of _CODE


def _bandit():
    return make_bandit(n_contexts=3, n_arms=7, dim=4, n_correct=3, seed=5)


def _forged(dyn: Dynamics, **fields) -> Dynamics:
    """dyn with fields set past Dynamics' own validation (what a caller bypassing __post_init__ could pass)."""
    for k, v in fields.items():
        object.__setattr__(dyn, k, v)
    return dyn


# --- every registered code is gapdyn's rule ---------------------------------------------------------------


def test_codes_are_one_per_direction():
    assert set(engine._CODE) == set(DIRECTIONS) == set(gapdyn.METHOD_NAMES) | {"gap"}
    assert len(set(engine._CODE.values())) == len(engine._CODE)
    assert not set(FORGED) & set(engine._CODE.values())


@pytest.mark.parametrize("method", gapdyn.METHOD_NAMES)
def test_every_code_gives_gapdyns_advantages_and_scalar(method):
    """Through the code: advantages on every reward pattern (G = 2..5) and the expected scalar on a J grid equal
    gapdyn.group_advantages and gapdyn.expected_scalar, for each option setting of the method."""
    opts_list = [{}]
    if method == "grpo":
        opts_list = [{"std": s, "eps": e} for s in ("population", "bessel") for e in (0.0, 1e-3)]
    if method == "w_reinforce":
        opts_list = [{"lam": 0.1}, {"lam": 0.6}]
    for opts, G in itertools.product(opts_list, (2, 3, 5)):
        groups = np.array(list(itertools.product([0.0, 1.0], repeat=G)))
        want = gapdyn.group_advantages(method, groups, **opts)
        np.testing.assert_allclose(advantages_nb(method, groups, **opts), want, rtol=1e-14, atol=1e-15)
        for J in (1e-5, 0.2, 0.5, 0.93):
            want = gapdyn.expected_scalar(method, J, G, **opts)
            np.testing.assert_allclose(exact_scalar_nb(method, J, G, **opts), want, rtol=1e-10)


@pytest.mark.parametrize("method", DIRECTIONS)
def test_exact_first_step_is_gapdyns_scalar_times_the_gap(method):
    """One exact step from theta0 moves each context's block by eta c(J) (g+ - g-), c = gapdyn.expected_scalar
    (1 for the Gap itself), with the Gap from gapdyn.gradient_gap_from_logits: the simulate() dispatch, per code."""
    b = _bandit()
    theta0 = np.random.default_rng(1).normal(scale=0.5, size=(b.n_params, b.dim))
    dyn = Dynamics(method=method, group_size=4, steps=1, std="bessel", adv_eps=1e-3, lam=0.4)
    t = simulate(b, dyn, eta=[0.3, 2.0], seed=0, theta0=theta0)
    assert np.array_equal(b.param_map, np.arange(b.n_contexts))  # one block per context: u_c = c(J_c) gap_c
    z = np.einsum("cad,cd->ca", b.features, theta0)  # [C, K] logits
    gap = gapdyn.gradient_gap_from_logits(z, b.rewards, b.features)  # [C, d]
    J = gapdyn.success_rate(softmax(z, axis=1), b.rewards)
    c = np.ones_like(J) if method == "gap" else gapdyn.expected_scalar(method, J, 4, **dyn.method_opts)
    for r, eta in enumerate((0.3, 2.0)):
        np.testing.assert_allclose(t.theta_final[r], theta0 + eta * c[:, None] * gap, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("method", gapdyn.METHOD_NAMES)
def test_sampled_runs_of_every_code_equal_the_gapdyn_loop(method):
    """Sampled mode per code against bandits.reference (gapdyn.group_advantages on the same draws)."""
    b = _bandit()
    dyn = Dynamics(method=method, gradient="sampled", group_size=4, steps=6, std="bessel", lam=0.4)
    fast = simulate(b, dyn, eta=[0.2, 1.5], seed=[3, 4])
    slow = simulate_reference(b, dyn, eta=[0.2, 1.5], seed=[3, 4])
    np.testing.assert_allclose(fast.J, slow.J, rtol=1e-11, atol=0)
    np.testing.assert_allclose(fast.theta_final, slow.theta_final, rtol=1e-10, atol=1e-12)


# --- an unknown code is refused ----------------------------------------------------------------------------


def test_kernel_dispatch_gives_nan_for_a_forged_code():
    groups = np.array(list(itertools.product([0.0, 1.0], repeat=3)))
    tab = engine._grpo_table(3, False, 0.0)
    for code in FORGED:
        assert np.isnan(engine._exact_scalar(code, 0.4, 0.6, 3, tab, 0.1))
        assert np.all(np.isnan(engine._advantages_batch(code, groups, False, 0.0, 0.1)))
        assert not engine._dispatch_known(code, True) and not engine._dispatch_known(code, False)
    assert np.all(np.isnan(engine._advantages_batch(engine._CODE["gap"], groups, False, 0.0, 0.1)))  # no sampled rule
    for name, code in engine._CODE.items():
        assert engine._dispatch_known(code, False)
        assert engine._dispatch_known(code, True) == (name != "gap")


def test_simulate_refuses_a_forged_method_or_code(monkeypatch):
    b = _bandit()
    with pytest.raises(ValueError, match="method 'ppo'"):
        simulate(b, _forged(Dynamics(), method="ppo"), eta=1.0)
    with pytest.raises(ValueError, match="method 'gap'.*sampled"):
        simulate(b, _forged(Dynamics(method="gap"), gradient="sampled"), eta=1.0)
    monkeypatch.setitem(engine._CODE, "ppo", 9)  # a registered name whose code the kernels have no branch for
    for mode in ("exact", "sampled"):
        with pytest.raises(ValueError, match="method 'ppo'"):
            simulate(b, _forged(Dynamics(gradient=mode), method="ppo"), eta=1.0)
        with pytest.raises(ValueError, match="method 'ppo'"):
            simulate(b, _forged(Dynamics(gradient=mode, schedule="adaptive", method="w_reinforce"), method="ppo"), eta=1.0)
    with pytest.raises(ValueError, match="method 'ppo'"):
        advantages_nb("ppo", np.array([[0.0, 1.0]]))
    with pytest.raises(ValueError, match="method 'ppo'"):
        exact_scalar_nb("ppo", 0.5, 4)
    with pytest.raises(ValueError, match="method 'gap'"):
        advantages_nb("gap", np.array([[0.0, 1.0]]))


# --- the safe step rule: gapdyn's, with gapdyn's constant ------------------------------------------------


def _gapdyn_rule(e0, dsum, ksum, cnt, sdmax, ac, tr_delta):
    dmu, kappa = (dsum / cnt, ksum / cnt) if cnt else (0.0, 0.0)
    return gapdyn.safe_step_size(dmu, kappa, sdmax, e0, c=ac, delta=tr_delta, mixed=cnt > 0)


def test_numba_safe_step_equals_gapdyn_on_random_inputs():
    rng = np.random.default_rng(7)
    for _ in range(2000):
        e0 = 10.0 ** rng.uniform(-3, 3)
        cnt = int(rng.integers(0, 5))
        dsum, ksum = rng.normal() * cnt, rng.normal() * 10.0 ** rng.uniform(-2, 2) * cnt
        sdmax = 0.0 if rng.random() < 0.2 else abs(rng.normal()) * 10.0 ** rng.uniform(-2, 2)
        ac, tr_delta = rng.uniform(0.05, 4.0), rng.uniform(0.05, 8.0)
        got = engine._safe_step_size(e0, dsum, ksum, cnt, sdmax, ac, tr_delta)
        assert got == pytest.approx(_gapdyn_rule(e0, dsum, ksum, cnt, sdmax, ac, tr_delta), rel=1e-14, abs=0.0)


def test_numba_safe_step_uses_gapdyns_no_ascent_tolerance():
    """At dmu_hat = NO_ASCENT_TOL sd_hat exactly the step is 0 and one ulp above it is not, in both routes (a
    different tolerance in the kernel, or one numba's cache kept from an older gapdyn, moves the edge)."""
    assert engine.NO_ASCENT_TOL is gss.NO_ASCENT_TOL
    for sd in (0.37, 3.0, 250.0):
        edge = gss.NO_ASCENT_TOL * sd
        for dmu in (edge, np.nextafter(edge, np.inf), np.nextafter(edge, -np.inf), 2 * edge, 0.5 * edge):
            want = _gapdyn_rule(2.0, dmu, 0.5, 1, sd, 1.0, 2.0)
            assert engine._safe_step_size(2.0, dmu, 0.5, 1, sd, 1.0, 2.0) == want
        assert _gapdyn_rule(2.0, edge, 0.5, 1, sd, 1.0, 2.0) == 0.0
        assert _gapdyn_rule(2.0, np.nextafter(edge, np.inf), 0.5, 1, sd, 1.0, 2.0) > 0.0


def test_engine_safe_step_constants_are_gapdyns():
    """The engine's adaptive step takes c and delta from its Schedule (the numba rule has no literals); their
    defaults, and adaptive_step's, are gapdyn.theory.safe_step's SAFE_STEP_C and SAFE_STEP_DELTA; a default adaptive run
    equals one with those constants passed explicitly and differs from one with other constants (the kernel reads
    them)."""
    import inspect

    from bandits.schedules import Schedule, adaptive_step

    assert (Schedule("adaptive").c, Schedule("adaptive").delta) == (gss.SAFE_STEP_C, gss.SAFE_STEP_DELTA)
    sig = inspect.signature(adaptive_step).parameters
    assert (sig["c"].default, sig["delta"].default) == (gss.SAFE_STEP_C, gss.SAFE_STEP_DELTA)
    b = _bandit()
    runs = [simulate(b, Dynamics(gradient="sampled", group_size=4, steps=8, schedule=s), eta=[0.5, 40.0], seed=[3, 4])
            for s in (Schedule("adaptive"), Schedule("adaptive", c=gss.SAFE_STEP_C, delta=gss.SAFE_STEP_DELTA),
                      Schedule("adaptive", c=gss.SAFE_STEP_C / 4, delta=gss.SAFE_STEP_DELTA / 4))]
    assert runs[0].theta_final.tobytes() == runs[1].theta_final.tobytes()
    assert not np.array_equal(runs[0].theta_final, runs[2].theta_final)


# --- seeds: unsigned 64-bit -------------------------------------------------------------------------------

BIG = [2**63, 2**64 - 1]


def test_seeds_up_to_2_64_minus_1_are_kept_and_drive_the_draws():
    b = _bandit()
    dyn = Dynamics(gradient="sampled", group_size=4, steps=5)
    t = simulate(b, dyn, eta=1.0, seed=BIG)
    assert t.seed.dtype == np.uint64 and t.seed.tolist() == BIG
    ref = simulate_reference(b, dyn, eta=1.0, seed=BIG)  # draws from numpy.random.default_rng(seed) per run
    np.testing.assert_allclose(t.J, ref.J, rtol=1e-11, atol=0)
    one = simulate(b, dyn, eta=1.0, seed=np.uint64(2**63))  # a run does not depend on the others
    assert np.array_equal(one.J[0], t.J[0]) and one.seed.tolist() == [2**63]
    assert not np.array_equal(t.J[0], t.J[1])
    grid, E, S = run_grid(b, dyn, etas=[0.5, 2.0], seeds=[0] + BIG)
    assert S.dtype == np.uint64 and S.tolist() == [0] + BIG + [0] + BIG and grid.seed.tolist() == S.tolist()
    assert np.array_equal(simulate(b, dyn, eta=0.5, seed=2**64 - 1).J[0], grid.J[2])


@pytest.mark.parametrize("bad", [-1, 2**64, 1.5, True, np.float64(3.0), np.bool_(True), "3", None, [1, -1]])
def test_seeds_outside_unsigned_64_bit_are_refused(bad):
    b = _bandit()
    with pytest.raises(ValueError, match="seed"):
        simulate(b, Dynamics(steps=1), eta=1.0, seed=bad)
    with pytest.raises(ValueError, match="seeds"):
        run_grid(b, Dynamics(steps=1), etas=[1.0], seeds=bad if np.ndim(bad) else [0, bad])
    with pytest.raises(ValueError, match="seed"):
        simulate_reference(b, Dynamics(steps=1), eta=1.0, seed=bad)


def test_seed_array_of_two_dimensions_is_refused_by_simulate():
    with pytest.raises(ValueError, match="seed"):
        simulate(_bandit(), Dynamics(steps=1), eta=1.0, seed=[[1, 2]])


def test_train_config_seed_is_unsigned_64_bit():
    config = pytest.importorskip("llm_probe.config")
    assert config.TrainConfig(seed=2**64 - 1).seed == 2**64 - 1
    assert config.TrainConfig(seed=2**63).seed == 2**63
    for bad in (-1, 2**64, 1.5, True):
        with pytest.raises(ValueError, match="--seed"):
            config.TrainConfig(seed=bad)


# --- the benchmark's equality check covers every recorded float field -------------------------------------


def test_benchmark_comparison_covers_every_outcome_field():
    """compare_trajectories reports a change in any float array of a Trajectory (each field perturbed in turn)."""
    from benchmarks.bandit import compare_trajectories

    t = simulate(_bandit(), Dynamics(steps=6), eta=[0.5, 2.0], seed=[1, 2])
    assert max(compare_trajectories(t, t).values()) == 0.0
    skip = {"steps", "eta0", "seed", "dynamics", "n_decrease"}  # inputs / integers (n_decrease: compared exactly)
    fields = [f.name for f in dataclasses.fields(Trajectory) if f.name not in skip]
    assert {"J_tail_min", "J_tail_max", "Jbar_min", "Jbar_tail_min", "Jbar_tail_max"} <= set(fields)
    for name in fields:
        x = np.array(getattr(t, name), dtype=float)
        x.flat[np.flatnonzero(np.isfinite(x))[0]] += 0.25
        diff = compare_trajectories(t, dataclasses.replace(t, **{name: x}))
        assert diff.get(name, 0.0) == pytest.approx(0.25), name


# --- the exact/sampled switch is `gradient`, its one name ("mode" means test/quick/full: gapdyn.cmdline.MODES) ----


def test_gradient_is_the_one_name_of_the_exact_sampled_switch():
    new = Dynamics(method="rloo", gradient="sampled", group_size=4, steps=5)
    assert Dynamics("rloo", "sampled", 4, 5) == new  # positional order unchanged
    assert engine.GRADIENTS == ("exact", "sampled") and not hasattr(engine, "MODES")
    assert tuple(gapdyn.COLLAPSE_KINDS) == engine.GRADIENTS  # each gradient names its kind of collapse
    with pytest.raises(TypeError, match="mode"):
        Dynamics(method="rloo", mode="sampled", group_size=4, steps=5)
    assert not hasattr(new, "mode")
