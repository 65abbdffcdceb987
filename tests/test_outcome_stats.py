"""The outcome statistics of a run (what decides collapse: J -> 0 at the end, Suk & Duan (arXiv 2510.08539),
Thm 2): J_min over every state 0..K, and min / max of J over the last quarter k >= K - K // 4, tracked inside
the simulators at every step. Independent route: the same statistics recomputed with numpy from a
record_every=1 trajectory's J records plus J_final (the states 0..K-1 and K)."""

from __future__ import annotations

import numpy as np
import pytest

from gapdyn import COLLAPSE_J
from bandits.engine import Dynamics, simulate
from bandits.envs import make_bandit
from bandits.partial import PartialSharingBandit
from bandits.reference import simulate_reference
from bandits.sequence import SequenceDynamics, SharedSequenceBandit, TabularSequenceBandit
from bandits.sequence import simulate as simulate_sequence

TAIL_FIELDS = ("J_tail_min", "J_tail_max", "Jbar_min", "Jbar_tail_min", "Jbar_tail_max")


def _states(J_rec, J_final):
    """J at every state k = 0..K: the records of k = 0..K-1 (record_every=1) and the final state."""
    return np.concatenate([J_rec, J_final[:, None]], axis=1)


@pytest.mark.parametrize("kind,shared,mode,method", [
    ("loglinear", False, "exact", "grpo"), ("loglinear", True, "exact", "rloo"),
    ("tabular", False, "sampled", "grpo"), ("loglinear", True, "sampled", "w_reinforce"),
    ("tabular", True, "exact", "wapo"),
])  # fmt: skip
@pytest.mark.parametrize("steps", [3, 13])
def test_engine_tail_stats_equal_numpy_and_reference(kind, shared, mode, method, steps):
    """Engine kernel (tracked per step) vs numpy over the recorded states (exact on per-context J; the mean over
    contexts to its last ulp: the kernel may divide by C as a reciprocal product) and vs the plain reference
    loop. Large step sizes make J move in the tail, so min and max differ there; steps=3 is a tail of the final
    state alone."""
    b = make_bandit(n_contexts=4, n_arms=10, dim=4, n_correct=3, kind=kind, shared=shared, seed=5)
    dyn = Dynamics(method=method, gradient=mode, group_size=4, steps=steps)
    eta, seed = np.array([0.1, 3.0, 30.0]), np.array([1, 2, 3])
    fast = simulate(b, dyn, eta=eta, seed=seed)
    Js = _states(fast.J, fast.J_final)  # [R, K + 1, C]
    t0 = steps - steps // 4
    np.testing.assert_array_equal(fast.J_min, Js.min(axis=1))
    np.testing.assert_array_equal(fast.J_tail_min, Js[:, t0:].min(axis=1))
    np.testing.assert_array_equal(fast.J_tail_max, Js[:, t0:].max(axis=1))
    Jbar = Js.mean(axis=2)  # [R, K + 1]: contexts are uniform
    for f, want in (("Jbar_min", Jbar.min(axis=1)), ("Jbar_tail_min", Jbar[:, t0:].min(axis=1)),
                    ("Jbar_tail_max", Jbar[:, t0:].max(axis=1))):
        np.testing.assert_allclose(getattr(fast, f), want, rtol=1e-15, atol=0, err_msg=f)
    assert np.all(fast.J_tail_min <= fast.J_tail_max)
    if steps >= 4:  # a tail of several states (else the final state alone: min = max)
        assert np.any(fast.J_tail_min < fast.J_tail_max) and np.any(fast.Jbar_tail_min < fast.Jbar_tail_max)
    slow = simulate_reference(b, dyn, eta=eta, seed=seed)
    for f in ("J_min",) + TAIL_FIELDS:
        np.testing.assert_allclose(getattr(fast, f), getattr(slow, f), rtol=1e-10, atol=0, err_msg=f)


def test_engine_tail_stats_do_not_depend_on_record_every_or_chunk():
    """Tracked at every state: recording every 5 steps and kernel calls of 8 steps give the same bits."""
    b = make_bandit(n_contexts=3, n_arms=12, dim=4, n_correct=2, seed=2)
    eta, seed = [0.5, 20.0], [4, 5]
    ref = simulate(b, Dynamics(gradient="sampled", steps=30, group_size=4), eta=eta, seed=seed)
    other = simulate(b, Dynamics(gradient="sampled", steps=30, group_size=4, record_every=5), eta=eta, seed=seed, chunk=8)
    for f in ("J_min",) + TAIL_FIELDS:
        assert getattr(ref, f).tobytes() == getattr(other, f).tobytes(), f


def _sequence_envs():
    return [
        SharedSequenceBandit.random(V=6, d=3, T=3, rule="MAJ", seed=1),
        SharedSequenceBandit.random(V=6, d=3, T=3, rule="AC", seed=2, variable_length=True),
        TabularSequenceBandit(V=4, T=3, rule="MAJ"),
        PartialSharingBandit.random(T=3, rho=0.5, V=6, d=3, rule="MAJ", seed=4),
    ]


@pytest.mark.parametrize("env_index", [0, 1, 2, 3])
@pytest.mark.parametrize("mode,method", [("exact", "grpo"), ("sampled", "rloo"), ("exact", "gap")])
@pytest.mark.parametrize("steps", [2, 11])
def test_sequence_tail_stats_equal_numpy(env_index, mode, method, steps):
    """bandits.sequence.simulate (shared, variable-length, tabular, partially shared envs): J_min, J_tail_min,
    J_tail_max equal numpy's over the record_every=1 states plus the final one, bit for bit."""
    env = _sequence_envs()[env_index]
    dyn = SequenceDynamics(method=method, gradient=mode, group_size=4, steps=steps)
    tr = simulate_sequence(env, dyn, eta=[0.05, 2.0, 40.0], seed=[0, 1, 2])
    Js = _states(tr.J, tr.J_final)  # [R, K + 1]
    t0 = steps - steps // 4
    np.testing.assert_array_equal(tr.J_min, Js.min(axis=1))
    np.testing.assert_array_equal(tr.J_tail_min, Js[:, t0:].min(axis=1))
    np.testing.assert_array_equal(tr.J_tail_max, Js[:, t0:].max(axis=1))
    first = np.array([int(np.argmax(row < COLLAPSE_J)) if np.any(row < COLLAPSE_J) else -1 for row in Js])
    np.testing.assert_array_equal(tr.collapse_step, first)
