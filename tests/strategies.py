"""Hypothesis strategies shared by the test modules (kept in one place, xarray-style)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp


@st.composite
def tabular_policies(draw, min_k: int = 2, max_k: int = 200, scale_max: float = 4.0):
    """(logits [K], rewards [K]) with at least one correct and one incorrect response."""
    K = draw(st.integers(min_k, max_k))
    seed = draw(st.integers(0, 2**32 - 1))
    scale = draw(st.floats(0.0, scale_max))
    rng = np.random.default_rng(seed)
    logits = scale * rng.normal(size=K)
    n_correct = draw(st.integers(1, K - 1))
    rewards = np.zeros(K)
    rewards[rng.choice(K, n_correct, replace=False)] = 1.0
    return logits, rewards


@st.composite
def loglinear_policies(draw, min_k: int = 2, max_k: int = 200, max_d: int = 8):
    """(features [K, d], theta [d], rewards [K]) with both reward values present."""
    logits, rewards = draw(tabular_policies(min_k, max_k))
    d = draw(st.integers(1, max_d))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(logits.size, d))
    theta = draw(st.floats(0.0, 1.5)) * rng.normal(size=d)
    return features, theta, rewards


method_names = st.sampled_from(
    ["reinforce", "rloo", "grpo", "dr_grpo", "wapo", "psr", "nsr", "w_reinforce"]
)

small_logits = hnp.arrays(np.float64, st.integers(2, 30), elements=st.floats(-8, 8))


# --- evidence layer (gapdyn.evidence.stats, gapdyn.evidence.collapse, gapdyn.evidence.claims) ---------------------------------


@st.composite
def small_2x2_tables(draw, max_count: int = 12):
    """2x2 tables of non-negative counts with a positive total (Fisher test against enumeration)."""
    cells = draw(st.lists(st.integers(0, max_count), min_size=4, max_size=4).filter(lambda c: sum(c) > 0))
    return np.array(cells).reshape(2, 2)


@st.composite
def two_arm_counts(draw, max_n: int = 120):
    """(k_a, n_a, k_b, n_b): event counts of two arms, 0 <= k <= n, 1 <= n <= max_n (two proportions)."""
    n_a, n_b = draw(st.integers(1, max_n)), draw(st.integers(1, max_n))
    return draw(st.integers(0, n_a)), n_a, draw(st.integers(0, n_b)), n_b


@st.composite
def island_sets(draw, max_islands: int = 6, min_width: float = 1.02, min_gap: float = 1.03):
    """Disjoint collapsing islands [(a, b), ...] inside [1e-3, 10] in increasing order.

    Each island and each gap between islands spans at least the given ratio, so a 1 % grid puts a
    point inside every island and between every two.
    """
    n = draw(st.integers(1, max_islands))
    start = 1e-3 * draw(st.floats(1.1, 3.0))
    islands = []
    for _ in range(n):
        width = draw(st.floats(min_width, 1.3))
        islands.append((start, start * width))
        start = start * width * draw(st.floats(min_gap, 3.0))
    return [iv for iv in islands if iv[1] < 9.0] or [islands[0]]


def island_min_J(islands):
    """A synthetic vectorised run_stats: runs that sit at J = 0 on the half-open islands [a, b), 1 elsewhere."""
    from gapdyn import RunStats

    def run_stats(etas):
        e = np.asarray(etas, dtype=np.float64)
        out = np.ones_like(e)
        for a, b in islands:
            out[(e >= a) & (e < b)] = 0.0
        return RunStats.constant(out)

    return run_stats


finite_intervals = st.tuples(st.floats(-10, 10), st.floats(0, 5)).map(lambda t: (t[0], t[0] + t[1]))


# --- the safe step rule (gapdyn.theory.safe_step) -------------------------------------------------------


@st.composite
def safe_step_batches(draw, max_groups: int = 6, max_group_size: int = 9):
    """(x [N], rewards [N], groups [N]): directional derivatives of sampled completions grouped by prompt,
    with unequal group sizes (1..max_group_size), all-equal and mixed groups, ties and wide scales."""
    n_groups = draw(st.integers(1, max_groups))
    seed = draw(st.integers(0, 2**32 - 1))
    scale = 10.0 ** draw(st.floats(-4, 4))
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, max_group_size + 1, size=n_groups)
    groups = np.repeat(rng.permutation(n_groups * 3)[:n_groups], sizes)
    x = scale * rng.normal(size=groups.size)
    if draw(st.booleans()):  # ties: a few repeated values
        x = np.round(x / scale, 1) * scale
    p = draw(st.sampled_from([0.0, 0.2, 0.5, 0.8, 1.0]))
    rewards = (rng.random(groups.size) < p).astype(np.float64)
    perm = rng.permutation(groups.size)  # group members need not be contiguous
    return x[perm], rewards[perm], groups[perm]


# --- inverse-CDF draws (gapdyn.theory.sampling) ---------------------------------------------------------


@st.composite
def categorical_draw_inputs(draw, max_rows: int = 6, max_k: int = 12, max_n: int = 8):
    """(probs [R, K], u [R, n]): unnormalised rows with zero-mass arms (leading, inner, trailing) and
    masses from 1e-300 to 1e300; uniforms mixing random values with the edges 0, 1 - 2^-53 and 1."""
    R, K, n = draw(st.integers(1, max_rows)), draw(st.integers(1, max_k)), draw(st.integers(1, max_n))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = 10.0 ** draw(st.sampled_from([-300, -20, 0, 20, 300]))
    probs = rng.random((R, K)) * scale / K
    probs[rng.random((R, K)) < draw(st.sampled_from([0.0, 0.3, 0.7]))] = 0.0
    if draw(st.booleans()):  # trailing zero-mass arms
        probs[:, K - draw(st.integers(0, K - 1)):] = 0.0
    empty = np.flatnonzero(probs.sum(1) == 0)
    probs[empty, rng.integers(0, K, empty.size)] = scale / K  # every row has mass
    edges = np.array([0.0, 1.0 - 2.0**-53, 1.0, 0.5])
    u = np.where(rng.random((R, n)) < 0.5, edges[rng.integers(0, 4, (R, n))], rng.random((R, n)))
    return probs, u
