"""Every bad-input class of the theory core raises a ValueError naming the argument."""

import numpy as np
import pytest

import gapdyn as g

P = np.array([0.2, 0.3, 0.5])
R = np.array([1.0, 0.0, 0.0])
S = g.softmax_scores(np.log(P))


@pytest.mark.parametrize(
    "probs, match",
    [
        ([0.5, -0.2, 0.7], "non-negative"),
        ([0.5, np.nan, 0.5], "finite"),
        ([0.5, np.inf, 0.5], "finite"),
        ([0.5, 0.2, 0.2], "sum to 1"),
        ([1.0], "at least 2"),
        ([], "empty"),
        ("abc", "numeric"),
    ],
)
def test_bad_probabilities(probs, match):
    with pytest.raises(ValueError, match=match):
        g.success_rate(probs, [1.0] * max(len(probs), 1) if isinstance(probs, list) else R)


def test_probability_tolerance_is_documented_and_applied():
    off = P + np.array([1e-9, 0, 0])
    assert np.isfinite(g.success_rate(off, R))  # within PROB_ATOL * K
    with pytest.raises(ValueError, match="sum to 1"):
        g.success_rate(P + np.array([1e-6, 0, 0]), R)


@pytest.mark.parametrize("rewards", [[1.0, 0.5, 0.0], [2.0, 0.0, 0.0], [-1.0, 0, 1], [1.0, np.nan, 0]])
def test_rewards_outside_binary(rewards):
    with pytest.raises(ValueError, match="rewards"):
        g.gradient_gap(P, rewards, S)


def test_mismatched_shapes():
    with pytest.raises(ValueError, match="rewards"):
        g.success_rate(P, [1.0, 0.0])
    with pytest.raises(ValueError, match="scores"):
        g.gradient_gap(P, R, S[:2])
    with pytest.raises(ValueError, match="direction"):
        g.gap_alignment(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="theta"):
        g.loglinear_probs(np.ones((3, 2)), np.ones(3))
    with pytest.raises(ValueError, match="etas"):
        g.cumulative_alignment(np.ones(3), np.ones(4))


@pytest.mark.parametrize("eta", [0.0, -1.0, np.nan, np.inf, "1", None])
def test_eta_must_be_positive(eta):
    with pytest.raises(ValueError, match="eta"):
        g.token_step_effects(np.zeros(3), 0, 1.0, eta)


@pytest.mark.parametrize("G", [1, 0, -3, 2.5, True])
def test_group_size_at_least_two(G):
    with pytest.raises(ValueError, match="group_size"):
        g.expected_direction("grpo", P, R, S, group_size=G)
    with pytest.raises(ValueError, match="group_size"):
        g.sampled_direction("grpo", P, R, S, group_size=G, rng=np.random.default_rng(0))


def test_group_axis_of_advantages():
    with pytest.raises(ValueError, match="size >= 2"):
        g.group_advantages("grpo", np.array([1.0]))
    with pytest.raises(ValueError, match="binary"):
        g.group_advantages("grpo", np.array([1.0, 0.3]))


@pytest.mark.parametrize("p", [[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]])
def test_J_at_zero_or_one_is_undefined(p):
    with pytest.raises(ValueError, match="J is 0 or 1"):
        g.log_odds(p, R)
    with pytest.raises(ValueError, match="J is 0 or 1"):
        g.gradient_gap(p, R, S)
    with pytest.raises(ValueError, match=r"strictly in \(0, 1\)"):
        g.expected_scalar("grpo", float(np.dot(p, R)), 8)
    with pytest.raises(ValueError, match="J0"):
        g.logodds_lower_bound(float(np.dot(p, R)), 1.0)


def test_unknown_method_and_options():
    with pytest.raises(ValueError, match="method must be one of"):
        g.expected_direction("ppo", P, R, S, group_size=4)
    with pytest.raises(ValueError, match="unknown"):
        g.group_advantages("grpo", np.array([1.0, 0.0]), lam=0.1)
    with pytest.raises(ValueError, match="std"):
        g.group_advantages("grpo", np.array([1.0, 0.0]), std="sample")


def test_bad_rng_and_tokens():
    with pytest.raises(ValueError, match="rng"):
        g.sampled_direction("grpo", P, R, S, group_size=4, rng=np.random.RandomState(0))
    with pytest.raises(ValueError, match="token"):
        g.token_step_effects(np.zeros(3), 3, 1.0, 0.1)
    with pytest.raises(ValueError, match="token"):
        g.token_step_effects(np.zeros(3), 0.5, 1.0, 0.1)


def test_threshold_inputs():
    f = g.tabular_logodds_fn(R)
    with pytest.raises(ValueError, match="callable"):
        g.sharp_step_threshold(3.0, np.zeros(3), np.ones(3))
    with pytest.raises(ValueError, match="direction"):
        g.sharp_step_threshold(f, np.zeros(3), np.ones(2))
    with pytest.raises(ValueError, match="L_o"):
        g.theorem1_step_bound(1.0, L_o=0.0, G_o=1.0)
    with pytest.raises(ValueError, match="both"):
        g.log_odds_from_logits(np.zeros(3), np.ones(3))
