"""Every bad-input class of the theory core raises a ValueError naming the argument (one table)."""

import numpy as np

import gapdyn as g
from tests.tables import check_table, raises_value_error

P = np.array([0.2, 0.3, 0.5])
R = np.array([1.0, 0.0, 0.0])
S = g.softmax_scores(np.log(P))


def _bad_input_rows():
    """(row id, zero-argument call, text the ValueError must contain)."""
    for probs, match in (([0.5, -0.2, 0.7], "non-negative"), ([0.5, np.nan, 0.5], "finite"), ([0.5, np.inf, 0.5], "finite"),
                         ([0.5, 0.2, 0.2], "sum to 1"), ([1.0], "at least 2"), ([], "empty"), ("abc", "numeric")):
        rewards = [1.0] * max(len(probs), 1) if isinstance(probs, list) else R
        yield f"probs {probs!r}", lambda p=probs, r=rewards: g.success_rate(p, r), match
    yield "probs beyond PROB_ATOL", lambda: g.success_rate(P + np.array([1e-6, 0, 0]), R), "sum to 1"
    for rewards in ([1.0, 0.5, 0.0], [2.0, 0.0, 0.0], [-1.0, 0, 1], [1.0, np.nan, 0]):
        yield f"rewards {rewards!r}", lambda r=rewards: g.gradient_gap(P, r, S), "rewards"
    yield "rewards shape", lambda: g.success_rate(P, [1.0, 0.0]), "rewards"
    yield "scores shape", lambda: g.gradient_gap(P, R, S[:2]), "scores"
    yield "direction vs gap", lambda: g.gap_alignment(np.ones(3), np.ones(4)), "direction"
    yield "gap_cosine dims", lambda: g.gap_cosine(np.ones(3), np.ones(4)), "direction"
    yield "theta shape", lambda: g.loglinear_probs(np.ones((3, 2)), np.ones(3)), "theta"
    yield "etas vs dmus", lambda: g.cumulative_alignment(np.ones(3), np.ones(4)), "etas"
    for eta in (0.0, -1.0, np.nan, np.inf, "1", None):
        yield f"eta {eta!r}", lambda e=eta: g.token_step_effects(np.zeros(3), 0, 1.0, e), "eta"
    for G in (1, 0, -3, 2.5, True):
        yield f"expected_direction G={G!r}", lambda G=G: g.expected_direction("grpo", P, R, S, group_size=G), "group_size"
        yield f"sampled_direction G={G!r}", lambda G=G: g.sampled_direction(
            "grpo", P, R, S, group_size=G, rng=np.random.default_rng(0)), "group_size"
    yield "group axis of size 1", lambda: g.group_advantages("grpo", np.array([1.0])), "size >= 2"
    yield "non-binary group", lambda: g.group_advantages("grpo", np.array([1.0, 0.3])), "binary"
    for p in ([1.0, 0.0, 0.0], [0.0, 0.5, 0.5]):
        J = float(np.dot(p, R))
        yield f"log_odds at J={J}", lambda p=p: g.log_odds(p, R), "J is 0 or 1"
        yield f"gradient_gap at J={J}", lambda p=p: g.gradient_gap(p, R, S), "J is 0 or 1"
        yield f"expected_scalar at J={J}", lambda J=J: g.expected_scalar("grpo", J, 8), "strictly in (0, 1)"
        yield f"logodds_lower_bound at J0={J}", lambda J=J: g.logodds_lower_bound(J, 1.0), "J0"
    yield "unknown method", lambda: g.expected_direction("ppo", P, R, S, group_size=4), "method must be one of"
    yield "unknown option", lambda: g.group_advantages("grpo", np.array([1.0, 0.0]), lam=0.1), "unknown"
    yield "unknown std", lambda: g.group_advantages("grpo", np.array([1.0, 0.0]), std="sample"), "std"
    yield "RandomState rng", lambda: g.sampled_direction("grpo", P, R, S, group_size=4, rng=np.random.RandomState(0)), "rng"
    yield "token out of range", lambda: g.token_step_effects(np.zeros(3), 3, 1.0, 0.1), "token"
    yield "token not an integer", lambda: g.token_step_effects(np.zeros(3), 0.5, 1.0, 0.1), "token"
    f = g.tabular_logodds_fn(R)
    yield "logodds_fn not callable", lambda: g.sharp_step_threshold(3.0, np.zeros(3), np.ones(3)), "callable"
    yield "threshold direction shape", lambda: g.sharp_step_threshold(f, np.zeros(3), np.ones(2)), "direction"
    yield "L_o = 0", lambda: g.theorem1_step_bound(1.0, L_o=0.0, G_o=1.0), "L_o"
    yield "one-sided rewards from logits", lambda: g.log_odds_from_logits(np.zeros(3), np.ones(3)), "both"


def test_bad_input_raises_value_error_naming_the_argument():
    check_table(((row_id, (call, match)) for row_id, call, match in _bad_input_rows()), raises_value_error)


def test_probability_tolerance_is_documented_and_applied():
    off = P + np.array([1e-9, 0, 0])
    assert np.isfinite(g.success_rate(off, R))  # within PROB_ATOL * K
    raises_value_error(lambda: g.success_rate(P + np.array([1e-6, 0, 0]), R), "sum to 1")
