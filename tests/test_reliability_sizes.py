"""Sizes as arguments: every public gapdyn function either computes at any size in bounded memory (c_G,
checked against exact sums) or refuses above a stated limit with one ValueError line (never MemoryError)."""

from __future__ import annotations

import tracemalloc

import mpmath as mp
import numpy as np
import pytest

import gapdyn
from gapdyn.evidence import planner, stats
from gapdyn.theory import methods

HUGE = 2**40


def _exact_c_G(J: float, G: int, std: str = "population", eps: float = 0.0, width: float | None = None):
    """c_G as a 50-digit mpmath sum; J is taken as the exact binary value of the float. ``width``: sum only
    m within width standard deviations of G J (Bernstein: the rest is below exp(-width^2 / 2.2) at these G)."""
    with mp.workdps(50):
        Jm, k = mp.mpf(J), (mp.mpf(G) / (G - 1) if std == "bessel" else mp.mpf(1))
        lo, hi = 0, G
        if width is not None:
            mu, sd = G * J, (G * J * (1 - J)) ** 0.5
            lo, hi = max(0, int(mu - width * sd)), min(G, int(mu + width * sd) + 1)
        term = mp.binomial(G, lo) * Jm**lo * (1 - Jm) ** (G - lo)
        ratio = Jm / (1 - Jm)
        total = mp.mpf(0)
        for m in range(lo, hi + 1):
            if m > lo:
                term = term * (G - m + 1) / m * ratio
            x = mp.mpf(m) / G * (1 - mp.mpf(m) / G)
            if x > 0:
                total += term * x / (mp.sqrt(k * x) + eps)
        return total


@pytest.mark.parametrize(
    "J, G, std, eps, width",
    [
        (0.3, 4095, "population", 0.0, None),  # the last G summed in one array
        (0.3, 4096, "population", 0.0, None),  # the first G of the windowed sum
        (1e-4, 5000, "bessel", 0.01, None),
        (0.999, 5000, "population", 0.0, None),  # J > 1/2: summed at 1 - J
        (0.3, 10**5, "population", 0.0, 40),
        (0.5, 10**5, "bessel", 0.05, 40),
        (1e-6, 10**7, "population", 0.0, 60),  # a few terms near m = 0 at a large G
    ],
)
def test_c_G_equals_the_exact_sum_at_moderate_G(J, G, std, eps, width):
    got = gapdyn.c_G(J, G, std=std, eps=eps)
    want = _exact_c_G(J, G, std, eps, width)
    assert abs(got - want) <= 1e-12 * abs(want), (float(got), float(want))


@pytest.mark.parametrize("j", [0.5, 0.3, 1e-3])
@pytest.mark.parametrize("std, eps", [("population", 0.0), ("bessel", 0.0), ("population", 0.05)])
def test_c_G_series_and_windowed_sum_agree_where_they_meet(j, std, eps):
    """Beyond G J (1 - J) = 1e9 c_G takes the delta-method series; at 1e8 and 1e9 it equals the windowed
    sum (itself checked against exact sums above) to 1e-12; at 1e5 the neglected O(G^-2) term shows."""
    for v, tol in [(1e8, 1e-12), (1e9, 1e-12)]:
        G = int(v / (j * (1 - j)))
        k = G / (G - 1) if std == "bessel" else 1.0

        def f(ph):
            x = ph * (1 - ph)
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(x > 0, x / (np.sqrt(k * x) + eps), 0.0)

        w = methods._windowed_expectation(j, G, f)
        s = methods._series_expectation(j, G, k, eps)
        assert abs(s - w) <= tol * w, (v, s, w)


def test_c_G_at_2_to_the_40_is_its_large_G_limit():
    x = 0.3 * 0.7
    got = gapdyn.c_G(0.3, HUGE)  # formerly MemoryError (an array over 0..G)
    assert np.isfinite(got)
    # Jensen (sqrt concave) bounds it above by sqrt(E[p_hat (1 - p_hat)]) = sqrt(x (1 - 1/G)) < sqrt(x)
    assert got <= np.sqrt(x * (1 - 1 / HUGE)) * (1 + 1e-15)
    assert got == pytest.approx(np.sqrt(x), rel=1e-9)
    assert gapdyn.expected_scalar("grpo", 0.3, HUGE, std="bessel") == pytest.approx(np.sqrt(x), rel=1e-9)
    d = gapdyn.expected_direction("grpo", np.array([0.3, 0.7]), np.array([1, 0]), np.eye(2), group_size=HUGE)
    assert np.all(np.isfinite(d))


def test_c_G_memory_is_bounded():
    """G = 10**9 on the windowed route: the old full sum held 8 GB; the chunks hold a few MB."""
    tracemalloc.start()
    try:
        got = gapdyn.c_G(np.array([0.3, 0.9]), 10**9)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 * 2**20, peak
    assert got == pytest.approx(np.sqrt([0.21, 0.09]), rel=1e-8)


def test_c_G_refuses_beyond_its_stated_limit():
    with pytest.raises(ValueError) as e:
        gapdyn.c_G(0.3, 2**62 + 1)
    msg = str(e.value)
    assert "\n" not in msg and "2**62" in msg and "sqrt(J (1 - J))" in msg
    assert np.isfinite(gapdyn.c_G(1e-17, 2**62))


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: gapdyn.sample_group(np.array([0.3, 0.7]), HUGE, np.random.default_rng(0)), "group_size"),
        (lambda: gapdyn.sampled_direction("grpo", np.array([0.3, 0.7]), np.array([1, 0]), np.eye(2),
                                          group_size=HUGE, rng=np.random.default_rng(0)), "group_size"),
        (lambda: planner.power_proportion(0.3, HUGE, value=0.5), "n"),
        (lambda: planner.power_two_proportions(0.3, 0.2, HUGE), "n"),
        (lambda: stats.cluster_bootstrap(np.mean, np.arange(5.0), rng=np.random.default_rng(0), n_resamples=HUGE),
         "n_resamples"),
        (lambda: stats.studentized_cluster_bootstrap_mean(np.arange(5.0), rng=np.random.default_rng(0),
                                                          n_resamples=HUGE), "n_resamples"),
        (lambda: stats.bca_cluster_mean(np.arange(5.0), rng=np.random.default_rng(0), n_resamples=HUGE),
         "n_resamples"),
    ],
)
def test_sizes_beyond_memory_are_one_value_error_line(call, name):
    """Formerly MemoryError ("Unable to allocate 8.00 TiB"): now a ValueError naming the argument and limit."""
    with pytest.raises(ValueError) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(name) and ("**" in msg or "2000" in msg), msg
