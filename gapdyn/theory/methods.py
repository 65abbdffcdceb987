"""The registry of policy-gradient methods: group advantages and expected-direction scalars.

One source of truth for method names and advantage rules: the bandit simulators and
the torch losses of ``llm_probe`` both call :func:`group_advantages`, which works on numpy arrays
and torch tensors alike (array-API). Rewards are binary; a group is the last axis (size G).

Expected direction (docs/equations.md §2, derived, Monte-Carlo checked): with m ~ Binomial(G, J),
p_hat = m / G, every method has E[w] = scalar(J, G) * (g+ - g-), where w = (1/G) sum_i A_i s(o_i):

| method      | A_i                                   | scalar(J, G)                         | source |
|-------------|---------------------------------------|--------------------------------------|--------|
| reinforce   | r_i                                   | J (1 - J)                            | Williams 1992 |
| rloo        | r_i - mean of the other G-1           | J (1 - J)                            | Ahmadian et al. 2024 |
| grpo        | (r_i - p_hat) / (std + eps)           | E_m[p_hat (1-p_hat) / (std + eps)]   | Shao et al. 2024 |
| dr_grpo     | r_i - p_hat                           | (1 - 1/G) J (1 - J)                  | Liu et al. 2025 |
| wapo        | max(r_i - p_hat, 0)                   | (1 - 1/G) J (1 - J)^2                | WAPO (docs/equations.md §4) |
| psr         | r_i                                   | J (1 - J)                            | Zhu et al. 2025 |
| nsr         | r_i - 1                               | J (1 - J)                            | Zhu et al. 2025 |
| w_reinforce | lam if r_i else -1                    | (1 + lam) J (1 - J)                  | Zhu et al. 2025 |

GRPO's std is the population std (``std="population"``, c_G(J) = E_m[sqrt(p_hat(1-p_hat))]) or
the Bessel-corrected one (``std="bessel"``, TRL's and verl's choice), which multiplies c_G by
sqrt((G-1)/G) when eps = 0 (the std itself grows by sqrt(G/(G-1)), so the direction shrinks;
checked by Monte Carlo in the tests). All-equal groups give
A = 0 for grpo/dr_grpo/wapo/rloo.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
from scipy.stats import binom

from .._validate import array_namespace_checked, check_group_size, check_open_unit, check_real_option

__all__ = ["Method", "METHODS", "METHOD_NAMES", "get_method", "group_advantages", "expected_scalar", "c_G"]


@dataclass(frozen=True)
class Method:
    """A registered method: its advantage rule, expected scalar and default options."""

    name: str
    advantage: Callable  # (xp, rewards[..., G], **opts) -> advantages[..., G]
    scalar: Callable  # (J ndarray, G int, **opts) -> E[w] / Gap
    defaults: Mapping[str, object] = field(default_factory=dict)
    source: str = ""


def _group_std(xp, r, std: str):
    G = r.shape[-1]
    mean = xp.mean(r, axis=-1, keepdims=True)
    var = xp.sum((r - mean) ** 2, axis=-1, keepdims=True) / (G - 1 if std == "bessel" else G)
    return xp.sqrt(var)


def _adv_reinforce(xp, r):
    return r


def _adv_rloo(xp, r):
    G = r.shape[-1]
    return (G * r - xp.sum(r, axis=-1, keepdims=True)) / (G - 1)


def _adv_dr_grpo(xp, r):
    return r - xp.mean(r, axis=-1, keepdims=True)


def _adv_grpo(xp, r, std="population", eps=0.0):
    sd = _group_std(xp, r, std) + eps
    safe = xp.where(sd > 0, sd, xp.ones_like(sd))
    return xp.where(sd > 0, _adv_dr_grpo(xp, r) / safe, xp.zeros_like(r))


def _adv_wapo(xp, r):
    a = _adv_dr_grpo(xp, r)
    return xp.where(a > 0, a, xp.zeros_like(a))


def _adv_nsr(xp, r):
    return r - 1


def _adv_w_reinforce(xp, r, lam=0.1):
    return xp.where(r > 0, lam * xp.ones_like(r), -xp.ones_like(r))


C_G_MAX_GROUP = 2**62
"""Largest group size :func:`c_G` takes (binomial counts stay exact int64 values); beyond it c_G equals its
large-G limit sqrt(J (1 - J)) to far below double precision."""

_DIRECT_TERMS = 2**12  # G + 1 up to this: every term m = 0..G in one array (rows of J in chunks)
_CHUNK = 2**16  # terms per chunk of a windowed sum: memory stays O(_CHUNK) at any G
_TAIL_LOG = 60.0  # the window keeps m with Bernstein tail bound exp(-_TAIL_LOG) ~ 1e-26 outside it
_SERIES_VAR = 1e9  # G J (1 - J) above this: the delta-method series (next term ~ 1 / (G J (1 - J))^2 < 1e-18)


def _binomial_expectation(J, G, f):
    """E_m[f(m / G)] with m ~ Binomial(G, J), as an exact finite sum over m = 0..G (J in row chunks)."""
    J = np.asarray(J, dtype=np.float64)
    flat = J.reshape(-1)
    m = np.arange(G + 1)
    fm = f(m / G)
    rows = max(1, 2**20 // (G + 1))
    out = np.empty(flat.shape)
    for a in range(0, flat.size, rows):
        out[a : a + rows] = np.sum(binom.pmf(m, G, flat[a : a + rows, None]) * fm, axis=-1)
    return out.reshape(J.shape)[()]


def _windowed_expectation(j: float, G: int, f) -> float:
    """E_m[f(m / G)], m ~ Binomial(G, j), summed over the m within t of G j in chunks of _CHUNK terms.

    t = L/3 + sqrt(L^2/9 + 2 L sigma^2) with L = _TAIL_LOG solves Bernstein's bound
    P(|m - G j| >= t) <= 2 exp(-t^2 / (2 (sigma^2 + t / 3))) = 2 exp(-L) (Boucheron et al. 2013, Thm 2.10),
    sigma^2 = G j (1 - j); f is bounded by 1/2 here, so the terms left out add at most exp(-L).
    """
    mu, var = G * j, G * j * (1.0 - j)
    t = _TAIL_LOG / 3 + np.sqrt(_TAIL_LOG**2 / 9 + 2 * _TAIL_LOG * var)
    lo, hi = max(0, int(np.floor(mu - t))), min(G, int(np.ceil(mu + t)))
    total = 0.0
    for a in range(lo, hi + 1, _CHUNK):
        m = np.arange(a, min(a + _CHUNK, hi + 1), dtype=np.int64)
        total += float(np.sum(binom.pmf(m, G, j) * f(m / G)))
    return total


def _series_expectation(j: float, G: int, k: float, eps: float) -> float:
    """E[f(p_hat)] ~ f(j) + f''(j) j (1 - j) / (2 G) for f(p) = x / (sqrt(k x) + eps), x = p (1 - p).

    The delta method (Casella & Berger 2002, §5.5.4): the next terms carry the third and fourth central
    moments of p_hat, O(G^-2), i.e. relative O((G j (1 - j))^-2). With s = sqrt(k x), g(x) = x / (s + eps):
    g' = (s + 2 eps) / (2 (s + eps)^2), g'' = -k (s + 3 eps) / (4 s (s + eps)^3), f'' = g'' (1 - 2j)^2 - 2 g'.
    """
    x = j * (1.0 - j)
    s = np.sqrt(k * x)
    g = x / (s + eps)
    g1 = (s + 2 * eps) / (2 * (s + eps) ** 2)
    g2 = -k * (s + 3 * eps) / (4 * s * (s + eps) ** 3)
    f2 = g2 * (1 - 2 * j) ** 2 - 2 * g1
    return float(g + f2 * x / (2 * G))


def c_G(J, G, *, std: str = "population", eps: float = 0.0) -> np.ndarray:
    """c_G(J) = sum_m C(G,m) J^m (1-J)^(G-m) x / (sqrt(k x) + eps), x = p_hat (1 - p_hat).

    derived (docs/equations.md §2): GRPO's expected direction is c_G(J) * Gap; k = 1 for the population
    std and G / (G - 1) for the Bessel std. Tends to sqrt(J (1 - J)) as G grows (population, eps=0).
    Memory is bounded at any G: up to 4095 every term; beyond, the terms within a Bernstein tail bound of
    G J (chunks), and once G J (1 - J) > 1e9 the delta-method series to O(1/G). G up to 2**62.
    """
    J = check_open_unit(J)
    G = check_group_size(G)
    if G > C_G_MAX_GROUP:
        raise ValueError(f"group_size must be <= 2**62 for c_G, got {G}; as G grows c_G tends to "
                         f"sqrt(J (1 - J)) (population std, eps = 0)")
    if std not in ("population", "bessel"):
        raise ValueError(f"std must be 'population' or 'bessel', got {std!r}")
    eps = check_real_option(eps, "eps")
    k = G / (G - 1) if std == "bessel" else 1.0

    def f(ph):
        x = ph * (1 - ph)
        sd = np.sqrt(k * x)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(x > 0, x / (sd + eps), 0.0)

    if G + 1 <= _DIRECT_TERMS:
        return _binomial_expectation(J, G, f)
    out = np.empty(J.shape)
    flat = out.reshape(-1)
    for i, Ji in enumerate(J.reshape(-1)):
        j = min(float(Ji), 1.0 - float(Ji))  # f(p) = f(1 - p): the sum at J equals the sum at 1 - J
        if G * j * (1.0 - j) > _SERIES_VAR:
            flat[i] = _series_expectation(j, G, k, eps)
        else:
            flat[i] = _windowed_expectation(j, G, f)
    return out[()]


METHODS: dict[str, Method] = {
    m.name: m
    for m in [
        Method("reinforce", _adv_reinforce, lambda J, G: J * (1 - J), source="Williams 1992 (no baseline)"),
        Method("rloo", _adv_rloo, lambda J, G: J * (1 - J), source="Ahmadian et al. 2024, leave-one-out"),
        Method(
            "grpo",
            _adv_grpo,
            lambda J, G, std="population", eps=0.0: c_G(J, G, std=std, eps=eps),
            {"std": "population", "eps": 0.0},
            "Shao et al. 2024 (DeepSeekMath)",
        ),
        Method("dr_grpo", _adv_dr_grpo, lambda J, G: (1 - 1 / G) * J * (1 - J), source="Liu et al. 2025"),
        Method("wapo", _adv_wapo, lambda J, G: (1 - 1 / G) * J * (1 - J) ** 2, source="WAPO, docs/equations.md §4"),
        Method("psr", _adv_reinforce, lambda J, G: J * (1 - J), source="Zhu et al. 2025, positive only"),
        Method("nsr", _adv_nsr, lambda J, G: J * (1 - J), source="Zhu et al. 2025, negative only"),
        Method(
            "w_reinforce",
            _adv_w_reinforce,
            lambda J, G, lam=0.1: (1 + lam) * J * (1 - J),
            {"lam": 0.1},
            "Zhu et al. 2025, weighted REINFORCE",
        ),
    ]
}
METHOD_NAMES: tuple[str, ...] = tuple(METHODS)


def get_method(method: str) -> Method:
    """Look a method up by name; ValueError listing the known names otherwise."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHOD_NAMES}, got {method!r}")
    return METHODS[method]


def _options(m: Method, opts: Mapping[str, object]) -> dict:
    unknown = set(opts) - set(m.defaults)
    if unknown:
        raise ValueError(f"method {m.name!r} takes options {sorted(m.defaults)}, got unknown {sorted(unknown)}")
    out = {**m.defaults, **opts}
    if "std" in out and (not isinstance(out["std"], str) or out["std"] not in ("population", "bessel")):
        raise ValueError(f"std must be 'population' or 'bessel', got {out['std']!r}")
    for name in ("eps", "lam"):
        if name in out:
            out[name] = check_real_option(out[name], name)
    return out


def group_advantages(method: str, rewards, **opts):
    """Advantages A_i of each group (last axis, size G >= 2) under ``method``'s rule (table above).

    Works on numpy arrays and torch tensors (same namespace in, same out). Rewards must be binary.
    """
    m = get_method(method)
    o = _options(m, opts)
    if isinstance(rewards, (list, tuple)):
        rewards = np.asarray(rewards, dtype=np.float64)
    xp = array_namespace_checked(rewards)
    if rewards.ndim < 1 or rewards.shape[-1] < 2:
        raise ValueError(f"rewards must have a group axis (last) of size >= 2, got shape {tuple(rewards.shape)}")
    if not bool(xp.all((rewards == 0) | (rewards == 1))):
        raise ValueError("rewards must be binary (every entry 0 or 1)")
    if hasattr(rewards, "dtype") and not xp.isdtype(rewards.dtype, "real floating"):
        rewards = xp.astype(rewards, xp.float64)
    return m.advantage(xp, rewards, **o)


def expected_scalar(method: str, J, group_size: int, **opts) -> np.ndarray:
    """The scalar c with E[w] = c * (g+ - g-) for ``method`` at success rate J and group size G."""
    m = get_method(method)
    o = _options(m, opts)
    J = check_open_unit(J)
    G = check_group_size(group_size)
    return np.asarray(m.scalar(J, G, **o), dtype=np.float64)
