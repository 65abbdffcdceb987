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
