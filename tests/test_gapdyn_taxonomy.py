"""WAPO token taxonomy (docs/theory.md §9.1): first order vs finite differences; valley sign rule."""

import numpy as np
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

import gapdyn as g


@st.composite
def token_cases(draw):
    V = draw(st.integers(2, 60))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    z = draw(st.floats(0.05, 6.0)) * rng.normal(size=V)
    tok = int(rng.integers(V))
    A = draw(st.sampled_from([-1.0, 1.0])) * draw(st.floats(0.1, 3.0))
    return z, tok, A


@given(token_cases())
def test_first_order_matches_finite_step(case):
    z, tok, A = case
    for eta in (1e-4, 5e-5):
        first = g.token_step_effects(z, tok, A, eta)
        exact = g.exact_token_step(z, tok, A, eta)
        scale = (eta * abs(A)) ** 2 * 10
        np.testing.assert_allclose(exact.dlogp, first.dlogp, atol=scale)
        np.testing.assert_allclose(exact.dp, first.dp, atol=scale)
        np.testing.assert_allclose(exact.dH, first.dH, atol=scale * (1 + np.log(z.size)))


@given(token_cases())
def test_first_order_entropy_matches_autodiff_free_fd(case):
    """dH/da by central differences of H(z + a (e_s - p)) equals the closed form."""
    z, tok, A = case
    p = g.softmax(z)
    e = np.zeros_like(z)
    e[tok] = 1.0

    def H(a):
        q = g.softmax(z + a * (e - p))
        return -np.sum(q * np.log(q))

    h = 1e-6
    fd = (H(h) - H(-h)) / (2 * h)
    eff = g.token_step_effects(z, tok, 1.0, 1.0)
    np.testing.assert_allclose(eff.dH, fd, atol=1e-7)


@given(token_cases())
def test_valley_tokens_always_predict_the_entropy_sign(case):
    z, tok, A = case
    eff = g.token_step_effects(z, tok, A, 1.0)
    if not eff.is_peak and abs(eff.dH) > 1e-14:
        assert eff.entropy_sign == np.sign(A)


def test_bins_predict_most_signs_and_misses_sit_just_above_C(rng):
    z = rng.normal(size=(20000, 16)) * rng.uniform(0.2, 4, size=(20000, 1))
    p = g.softmax(z)
    tok = (p.cumsum(-1) < rng.random((20000, 1))).sum(-1)
    A = rng.choice([-1.0, 1.0], size=20000)
    eff = g.token_step_effects(z, tok, A, 1.0)
    predicted = np.where(eff.is_peak, -np.sign(A), np.sign(A))
    agree = predicted == eff.entropy_sign
    assert agree.mean() > 0.9
    assert agree[~eff.is_peak].all()
    misses = ~agree
    assert np.all(eff.p_token[misses] >= eff.collision[misses])


def test_vectorised_equals_loop_and_bins(rng):
    z = rng.normal(size=(4, 3, 9))
    tok = rng.integers(0, 9, size=(4, 3))
    A = rng.normal(size=(4, 3))
    A[0, 0] = 0.0
    eff = g.token_step_effects(z, tok, A, 0.1)
    for i in range(4):
        for j in range(3):
            one = g.token_step_effects(z[i, j], tok[i, j], A[i, j], 0.1)
            np.testing.assert_allclose(eff.dlogp[i, j], one.dlogp)
            assert eff.bin[i, j] == one.bin
    assert eff.bin[0, 0] == -1
    names = {g.BIN_NAMES[b] for b in eff.bin.ravel() if b >= 0}
    assert names <= set(g.BIN_NAMES)


@given(hnp.arrays(np.float64, st.integers(2, 50), elements=st.floats(-1e3, 1e3)))
def test_extreme_logits_are_finite(z):
    eff = g.token_step_effects(z, 0, 1.0, 0.1)
    assert all(np.all(np.isfinite(x)) for x in (eff.dz, eff.dlogp, eff.dp, eff.dH))


def test_torch_helpers_match_numpy():
    import pytest

    torch = pytest.importorskip("torch", reason="torch is in the [llm] extra")
    rng = np.random.default_rng(0)
    z = rng.normal(size=(5, 11))
    lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    p = np.exp(lp)
    np.testing.assert_allclose(g.collision_probability(torch.tensor(p)).numpy(), (p**2).sum(-1))
    np.testing.assert_allclose(g.token_entropy(torch.tensor(lp)).numpy(), -(p * lp).sum(-1))
    ps, C, A = p[:, 0], (p**2).sum(-1), np.array([1.0, -1, 0, 1, -1])
    np.testing.assert_array_equal(
        g.token_bin_index(torch.tensor(ps), torch.tensor(C), torch.tensor(A)).numpy(), g.token_bin_index(ps, C, A)
    )
