"""The sequence-environment protocol (bandits.sequence.SequenceEnv) and the one integer validator
(gapdyn._validate.check_int): every sequence bandit declares the protocol and shares its sample, which is draw
on the generator's uniforms; every integer option of the environments is refused through check_int."""

from __future__ import annotations

import typing

import numpy as np
import pytest

from bandits.envs import make_bandit
from bandits.partial import PartialSharingBandit, position_features
from bandits.sequence import SequenceEnv, SharedSequenceBandit, TabularSequenceBandit
from gapdyn._validate import check_int

ENVS = {
    "shared": SharedSequenceBandit.random(V=6, d=3, T=4, rule="MAJ", seed=1),
    "shared, end token": SharedSequenceBandit.random(V=6, d=3, T=5, rule="AC", seed=2, variable_length=True),
    "tabular": TabularSequenceBandit(5, 3, "MAJ"),
    "partial": PartialSharingBandit.random(T=3, rho=0.5, V=5, d=3, seed=3),
}


def test_every_sequence_bandit_declares_the_protocol_and_shares_its_sample():
    members = {n for n in vars(SequenceEnv) if not n.startswith("_")} | set(typing.get_type_hints(SequenceEnv))
    assert {"T", "param_shape", "check_params", "exact", "success_rate", "log_odds", "gap", "draw", "sample"} <= members
    for name, env in ENVS.items():
        assert isinstance(env, SequenceEnv), name
        assert type(env).sample is SequenceEnv.sample, name  # one implementation, not a copy
        for m in members - {"sample"}:
            assert getattr(type(env), m, None) is not getattr(SequenceEnv, m, None) or m == "T", (name, m)
        assert isinstance(env.T, int) and env.T >= 1


@pytest.mark.parametrize("name", list(ENVS))
@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
def test_sample_is_draw_on_the_generators_uniforms(name, batch):
    """sample(params, G, rng) equals draw(params, u) with u = rng.random(batch + (G, T)) from a twin generator,
    for unbatched and batched parameters."""
    env = ENVS[name]
    params = np.random.default_rng(0).normal(size=batch + env.param_shape)
    G = 4
    got = env.sample(params, G, np.random.default_rng(11))
    want = env.draw(params, np.random.default_rng(11).random(batch + (G, env.T)))
    assert got.reward.shape == batch + (G,)
    for field in ("counts", "n", "m", "length", "ended", "reward", "score"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)


@pytest.mark.parametrize("name", list(ENVS))
def test_sample_refuses_bad_arguments_naming_them(name):
    env = ENVS[name]
    params = np.zeros(env.param_shape)
    for bad in (0, 2.0, True, "4"):
        with pytest.raises(ValueError, match="group_size"):
            env.sample(params, bad, np.random.default_rng(0))
    with pytest.raises(ValueError, match="rng"):
        env.sample(params, 4, 0)


def test_check_int_accepts_integers_and_refuses_the_rest():
    assert check_int(3, "n") == 3 and type(check_int(np.int64(3), "n")) is int
    assert check_int(0, "n") == 0 and check_int(2**70, "n", minimum=1) == 2**70
    for bad in (True, np.bool_(True), 2.0, "3", None, np.float64(1.0), -1):
        with pytest.raises(ValueError, match=r"n must be an integer >= 0"):
            check_int(bad, "n")
    with pytest.raises(ValueError, match=r"T must be an integer >= 2, got 1"):
        check_int(1, "T", minimum=2)


@pytest.mark.parametrize("call,name", [
    (lambda: make_bandit(n_arms=2.5), "n_arms"), (lambda: make_bandit(n_contexts=0), "n_contexts"),
    (lambda: make_bandit(dim=True), "dim"), (lambda: make_bandit(n_correct=np.float64(1.0)), "n_correct"),
    (lambda: SharedSequenceBandit.random(V=2, variable_length=True), "V"), (lambda: SharedSequenceBandit.random(d=0), "d"),
    (lambda: SharedSequenceBandit.random(seed=-1), "seed"), (lambda: SharedSequenceBandit.random(seed=2**64), "seed"),
    (lambda: SharedSequenceBandit(np.ones((4, 2)), (0,), "MAJ", 0), "T"),
    (lambda: SharedSequenceBandit(np.ones((4, 2)), (0,), "MAJ", 2, end_token=1.0), "end_token"),
    (lambda: TabularSequenceBandit(1, 3, "MAJ"), "V"), (lambda: TabularSequenceBandit(3, 3, "MAJ", correct=True), "correct"),
    (lambda: position_features(0, V=5, d=0, T=2, rho=0.5), "d"), (lambda: position_features(-1, V=5, d=2, T=2, rho=0.5), "seed"),
    (lambda: PartialSharingBandit(np.ones((2, 3, 1)), correct=1.5), "correct"),
])  # fmt: skip
def test_environment_integers_are_refused_naming_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()
