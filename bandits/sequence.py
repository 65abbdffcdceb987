"""Token-level sequence bandits: one prompt, responses of T tokens, binary sequence rewards.

Two parameterisations (docs/equations.md §1, §3 "Token level"; docs/bandits_sequence.md):

- :class:`SharedSequenceBandit` -- SHARED parameters, as in an LLM: one log-linear token policy
  p(v) ~ exp(phi(v) . theta) over V tokens (features phi [V, d]) is used at every position, so a
  response is T i.i.d. tokens. With ``end_token`` set, responses have variable length: tokens are
  drawn until the end token is emitted (it counts in |o|) or T tokens were drawn ("max length").
- :class:`TabularSequenceBandit` -- POSITION-WISE tabular logits z [T, V] (each position its own
  softmax): the negative control (no threshold for exact ascent; see below).

Rewards on the count n of correct content tokens among the m content tokens (end token excluded):
``"AC"`` (all correct): r = 1[m >= 1 and n = m];  ``"MAJ"`` (at least half): r = 1[m >= 1 and 2n >= m].

Exact quantities, shared model [derived here; tested against brute-force enumeration of all
sequences with gapdyn.gradient_gap, against finite differences of Phi and against Monte Carlo]:
let q, w, e be the token probabilities of the correct set, the other non-end tokens and the end
token, and mu_c = E_p[phi | correct], mu_w = E_p[phi | wrong], phi_e, mu = E_p[phi]. A response is
summarised by its state (n, m, ended); |o| = L = m + ended, and

    P(n, m, ended) = C(m, n) q^n w^(m-n) e^ended,   m < T if ended, m = T otherwise,
    E[s | n, m, ended] = n mu_c + (m - n) mu_w + ended phi_e - L mu,

because s(o) = sum_t (phi(o_t) - mu) and, given its class, each token's feature has the class mean.
J = sum P r, g+ = E[s | r = 1], g- = E[s | r = 0], Gap = g+ - g- = grad Phi (docs/equations.md §1). For fixed
length T (no end token) the count is N ~ Binomial(T, q) and this reduces to

    g+- = (E[N | r = +-] - T q) (mu_c - mu_w),    Gap = (E[N | r=1] - E[N | r=0]) (mu_c - mu_w).

All sums run in log space (stable for J near 0 or 1). With 1/|o| normalisation the expected
direction is E[A s / L], which is not parallel to the Gap when L varies (docs/equations.md §2).

Position-wise tabular model [derived]: x_t = 1[o_t correct] are independent Bernoulli(q_t); in
logit space the block t of the Gap is (P(x_t=1 | r=1) - P(x_t=1 | r=0)) (e_c - u_t), u_t = p_t
restricted to the wrong tokens and renormalised. For monotone rules the bracket is >= 0 and any
step along e_c - u_t raises q_t, hence J: exact log-odds ascent cannot collapse at any eta.

Arrays: parameters carry leading batch axes (seeds x etas): shared theta [..., d], tabular
z [..., T, V]. Everything is float64 numpy; randomness only through an explicit Generator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal, Protocol, runtime_checkable

import numpy as np
from scipy.special import expit, gammaln, log_softmax, logsumexp

from gapdyn import COLLAPSE_J, METHOD_NAMES, expected_scalar, group_advantages
from gapdyn._validate import check_int, check_seed
from gapdyn.evidence.collapse import tail_start
from gapdyn.theory.sampling import inverse_cdf_draw

from . import _sequence_kernels as _kern

__all__ = [
    "RULES",
    "SharedSequenceBandit",
    "TabularSequenceBandit",
    "SequenceSample",
    "SequenceEnv",
    "rule_reward",
    "SequenceDynamics",
    "SequenceTrajectory",
    "sequence_sampled_direction",
    "simulate",
    "place_for_success_rate",
]

RULES = ("AC", "MAJ")
Rule = Literal["AC", "MAJ"]


def _prob_from_log(log_p) -> np.ndarray:
    """exp(log p) for a probability summed in log space, capped at 1: such sums can round a little above 0."""
    return np.exp(np.minimum(log_p, 0.0))


def _check_rule(rule: str) -> str:
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    return rule


def rule_reward(n, m, rule: str) -> np.ndarray:
    """r = 1[m >= 1 and n = m] (AC) or 1[m >= 1 and 2 n >= m] (MAJ), elementwise, as float64."""
    _check_rule(rule)
    n, m = np.asarray(n), np.asarray(m)
    if not (np.issubdtype(n.dtype, np.number) and np.issubdtype(m.dtype, np.number)) or not (
        np.all(np.isfinite(n)) and np.all(np.isfinite(m))
    ):
        raise ValueError("n and m must be finite counts")
    ok = (n == m) if rule == "AC" else (2 * n >= m)
    return ((m >= 1) & ok).astype(np.float64)


@dataclass(frozen=True)
class SequenceSample:
    """A group of sampled responses, summarised by counts (all [..., G] unless noted).

    counts [..., G, V]: how often each token occurs (end token included); n: correct content tokens;
    m: content tokens; length: |o| = m + ended; ended: emitted the end token; reward in {0, 1};
    score [..., G, P]: s(o) = grad log pi(o) (flattened for the tabular model).
    """

    counts: np.ndarray
    n: np.ndarray
    m: np.ndarray
    length: np.ndarray
    ended: np.ndarray
    reward: np.ndarray
    score: np.ndarray


@runtime_checkable
class SequenceEnv(Protocol):
    """What :func:`simulate` and :func:`sequence_sampled_direction` need of a sequence bandit: the declared
    interface of :class:`SharedSequenceBandit`, :class:`TabularSequenceBandit` and
    :class:`bandits.partial.PartialSharingBandit`. Parameters are [..., *param_shape]; each method maps the
    leading axes elementwise. The three subclass it explicitly and share its :meth:`sample`."""

    T: int
    """Response length (the maximal length with an end token)."""

    @property
    def param_shape(self) -> tuple[int, ...]:
        """Shape of one parameter point (theta [d] or logits z [T, V])."""
        ...

    def check_params(self, params) -> np.ndarray:
        """params as a finite float64 array [..., *param_shape]; ValueError otherwise."""
        ...

    def exact(self, params) -> dict[str, np.ndarray]:
        """J, Jbar, Phi, the Gap and E|o| per leading index (exact, no sampling)."""
        ...

    def success_rate(self, params) -> np.ndarray:
        ...

    def log_odds(self, params) -> np.ndarray:
        ...

    def gap(self, params) -> np.ndarray:
        ...

    def draw(self, params, u) -> SequenceSample:
        """Responses from pre-drawn uniforms u [..., G, T] (inverse CDF, gapdyn.theory.sampling.inverse_cdf_draw)."""
        ...

    def sample(self, params, group_size: int, rng: np.random.Generator) -> SequenceSample:
        """G i.i.d. responses per leading index of params: :meth:`draw` on ``rng.random(batch + (G, T))``."""
        if not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        G = check_int(group_size, "group_size", minimum=1)
        p = self.check_params(params)
        batch = p.shape[: p.ndim - len(self.param_shape)]
        return self.draw(p, rng.random(batch + (G, self.T)))


# ---------------------------------------------------------------------------------------------
# shared parameters


@lru_cache(maxsize=256)
def _states(T: int, variable: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(n, m, ended) of every response state: m = T (not ended) and, if variable, m < T ended."""
    ns, ms, es = [], [], []
    for m in range(T + 1) if variable else [T]:
        ended = int(variable and m < T)
        ns += list(range(m + 1))
        ms += [m] * (m + 1)
        es += [ended] * (m + 1)
    out = tuple(np.array(a) for a in (ns, ms, es))
    for a in out:
        a.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class SharedSequenceBandit(SequenceEnv):
    """One log-linear token policy p(v) ~ exp(phi(v) . theta) used at every position.

    features: [V, d] token features; correct: indices of the correct tokens; rule: "AC" or "MAJ";
    T: the length (fixed) or the maximal length (with end_token); end_token: None for fixed-length
    responses, else the index of the end token (neither correct nor counted as content).
    """

    features: np.ndarray = field(repr=False)
    correct: tuple[int, ...]
    rule: Rule
    T: int
    end_token: int | None = None

    def __post_init__(self):
        phi = np.array(self.features, dtype=np.float64)
        if phi.ndim != 2 or phi.shape[0] < 2 or phi.shape[1] < 1 or not np.all(np.isfinite(phi)):
            raise ValueError(f"features must be a finite [V, d] array with V >= 2, got shape {phi.shape}")
        phi.setflags(write=False)
        object.__setattr__(self, "features", phi)
        V = phi.shape[0]
        corr = tuple(int(c) for c in np.atleast_1d(self.correct))
        if not corr or len(set(corr)) != len(corr) or any(not 0 <= c < V for c in corr):
            raise ValueError(f"correct must be distinct token indices in [0, {V}), got {self.correct!r}")
        object.__setattr__(self, "correct", corr)
        _check_rule(self.rule)
        object.__setattr__(self, "T", check_int(self.T, "T", minimum=1))
        if self.end_token is not None:
            e = check_int(self.end_token, "end_token", minimum=0)
            if e >= V or e in corr:
                raise ValueError(f"end_token must be a token index in [0, {V}) that is not correct, got {e}")
            object.__setattr__(self, "end_token", e)
        if V - len(corr) - (self.end_token is not None) < 1:
            raise ValueError("need at least one wrong (non-correct, non-end) token")

    @classmethod
    def random(
        cls, *, V: int = 10, d: int = 4, T: int = 1, rule: Rule = "MAJ", seed: int = 0,
        variable_length: bool = False, scale: float = 1.0,
    ) -> "SharedSequenceBandit":
        """Gaussian features N(0, scale^2) [V, d] from default_rng(seed); token 0 correct; end token V-1."""
        if not isinstance(variable_length, (bool, np.bool_)):
            raise ValueError(f"variable_length must be a bool, got {variable_length!r}")
        check_int(V, "V", minimum=3 if variable_length else 2)
        check_int(d, "d", minimum=1)
        check_seed(seed)
        if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)) or not np.isfinite(scale):
            raise ValueError(f"scale must be a finite real number, got {scale!r}")
        phi = scale * np.random.default_rng(seed).standard_normal((V, d))
        return cls(phi, (0,), rule, T, V - 1 if variable_length else None)

    @property
    def V(self) -> int:
        return self.features.shape[0]

    @property
    def d(self) -> int:
        return self.features.shape[1]

    @property
    def n_params(self) -> int:
        return self.d

    def with_T(self, T: int) -> "SharedSequenceBandit":
        return SharedSequenceBandit(self.features, self.correct, self.rule, T, self.end_token)

    def with_rule(self, rule: Rule) -> "SharedSequenceBandit":
        return SharedSequenceBandit(self.features, self.correct, rule, self.T, self.end_token)

    # -- masks and token-level quantities -------------------------------------------------------
    def _masks(self):
        V = self.V
        corr = np.zeros(V, bool)
        corr[list(self.correct)] = True
        end = np.zeros(V, bool)
        if self.end_token is not None:
            end[self.end_token] = True
        return corr, ~corr & ~end, end

    def check_params(self, theta) -> np.ndarray:
        th = np.asarray(theta, dtype=np.float64)
        if th.ndim < 1 or th.shape[-1] != self.d or not np.all(np.isfinite(th)):
            raise ValueError(f"theta must be a finite array [..., {self.d}], got shape {th.shape}")
        return th

    def token_logprobs(self, theta) -> np.ndarray:
        """log p(v) = phi(v) . theta - logsumexp, [..., V]."""
        th = self.check_params(theta)
        return log_softmax(th @ self.features.T, axis=-1)

    def _class_stats(self, logp):
        """log q, log w, log e and the class-mean features mu_c, mu_w, phi_e, mu."""
        corr, wrong, end = self._masks()
        neg = -np.inf

        def lse(mask):
            return logsumexp(np.where(mask, logp, neg), axis=-1)

        def mean(mask, lmass):
            wts = np.exp(np.where(mask, logp, neg) - lmass[..., None])
            return wts @ self.features

        lq, lw = lse(corr), lse(wrong)
        le = lse(end) if self.end_token is not None else np.full(lq.shape, neg)
        mu_c, mu_w = mean(corr, lq), mean(wrong, lw)
        phi_e = self.features[self.end_token] if self.end_token is not None else np.zeros(self.d)
        mu = np.exp(logp) @ self.features
        return lq, lw, le, mu_c, mu_w, np.broadcast_to(phi_e, mu.shape), mu

    def states(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All (n, m, ended) response states, each [S]."""
        return _states(self.T, self.end_token is not None)


    def state_distribution(self, theta):
        """(log P [..., S], E[s | state] [..., S, d], reward [S], length [S]) -- see module doc."""
        logp = self.token_logprobs(theta)
        lq, lw, le, mu_c, mu_w, phi_e, mu = self._class_stats(logp)
        n, m, ended = self.states()
        logP = self._state_logP(lq, lw, le)
        L = m + ended
        cond = (
            n[:, None] * mu_c[..., None, :]
            + (m - n)[:, None] * mu_w[..., None, :]
            + ended[:, None] * phi_e[..., None, :]
            - L[:, None] * mu[..., None, :]
        )
        return logP, cond, rule_reward(n, m, self.rule), L

    def _state_logP(self, lq, lw, le):
        n, m, ended = self.states()
        logC = gammaln(m + 1) - gammaln(n + 1) - gammaln(m - n + 1)
        with np.errstate(invalid="ignore"):
            return (
                logC
                + np.where(n > 0, n * lq[..., None], 0.0)
                + np.where(m - n > 0, (m - n) * lw[..., None], 0.0)
                + np.where(ended > 0, le[..., None], 0.0)
            )

    def exact(self, theta) -> dict[str, np.ndarray]:
        """J, 1-J, Phi, g+, g-, gap (= grad Phi) and E|o|, exactly (log-space state sums)."""
        logP, cond, r, L = self.state_distribution(theta)
        return _exact_from_states(logP, cond, r, L)

    def _reward_logmass(self, theta) -> tuple[np.ndarray, np.ndarray]:
        """(log P(r = 1), log P(r = 0)) from the state log-probabilities (no score sums: cheap)."""
        logp = self.token_logprobs(theta)
        corr, wrong, end = self._masks()
        lse = lambda mask: logsumexp(np.where(mask, logp, -np.inf), axis=-1)  # noqa: E731
        le = lse(end) if self.end_token is not None else np.full(logp.shape[:-1], -np.inf)
        logP = self._state_logP(lse(corr), lse(wrong), le)
        n, m, _ = self.states()
        r = rule_reward(n, m, self.rule)
        return logsumexp(np.where(r == 1, logP, -np.inf), axis=-1), logsumexp(np.where(r == 0, logP, -np.inf), axis=-1)

    def success_rate(self, theta) -> np.ndarray:
        """J = P(r = 1) / (P(r = 1) + P(r = 0)) over the states (no score sums: cheap)."""
        l1, l0 = self._reward_logmass(theta)
        return np.exp(l1 - np.logaddexp(l1, l0))

    def log_odds(self, theta) -> np.ndarray:
        """Phi = log J - log(1 - J) from the state log-probabilities (no score sums: cheap)."""
        l1, l0 = self._reward_logmass(theta)
        return l1 - l0

    def gap(self, theta) -> np.ndarray:
        return self.exact(theta)["gap"]

    # -- sampling ------------------------------------------------------------------------------
    def draw(self, theta, u) -> SequenceSample:
        """Responses from uniforms u [..., G, T]: token t is the inverse CDF of p at u[..., t]; with an
        end token the response stops at its first occurrence (|o| = position + 1), else after T tokens."""
        logp = self.token_logprobs(theta)
        batch = logp.shape[:-1]
        u = np.asarray(u, dtype=np.float64)
        if u.ndim != len(batch) + 2 or u.shape[:-2] != batch or u.shape[-1] != self.T:
            raise ValueError(f"u must have shape {batch} + (G, {self.T}), got {u.shape}")
        p = np.exp(logp)
        G = u.shape[-2]
        # gapdyn's inverse-CDF draw (one row of p per run, G T uniforms): a p = 0 token is never drawn
        tok = inverse_cdf_draw(p, u.reshape(batch + (G * self.T,))).reshape(u.shape)  # [..., G, T]
        corr, wrong, end = self._masks()
        if self.end_token is None:
            m = np.full(tok.shape[:-1], self.T, dtype=np.int64)
            ended = np.zeros_like(m)
        else:
            is_end = tok == self.end_token
            ended = is_end.any(-1).astype(np.int64)
            m = np.where(ended == 1, np.argmax(is_end, axis=-1), self.T).astype(np.int64)
        L = m + ended
        keep = np.arange(self.T) < L[..., None]  # the emitted tokens (end token included)
        counts = ((tok[..., None] == np.arange(self.V)) & keep[..., None]).sum(-2, dtype=np.int64)
        n = counts[..., corr].sum(-1)
        mu = p @ self.features
        score = counts @ self.features - L[..., None] * mu[..., None, :]
        return SequenceSample(counts, n, m, L, ended, rule_reward(n, m, self.rule), score)

    @property
    def param_shape(self) -> tuple[int, ...]:
        return (self.d,)

    # -- kernels of simulate (bandits._sequence_kernels; tested equal to the methods above) ------------------
    def _kernel_args(self):
        corr, _, _ = self._masks()
        end = -1 if self.end_token is None else self.end_token
        return corr, end, self.rule == "AC"

    def _kernel_log_odds(self, theta) -> np.ndarray:
        """Phi of theta [..., d] (as :meth:`log_odds`, by the numba kernel)."""
        th = self.check_params(theta)
        flat = np.ascontiguousarray(th.reshape(-1, self.d))
        l1, l0 = _kern.shared_log_terms(self.features, flat, *self._kernel_args(), self.T)
        return (l1 - l0).reshape(th.shape[:-1])

    def _kernel_exact(self, theta) -> dict[str, np.ndarray]:
        """J, Phi and the Gap of theta [R, d] (as :meth:`exact`, by bandits._sequence_kernels.shared_exact)."""
        lJ, lJbar, gap = _kern.shared_exact(self.features, np.ascontiguousarray(theta, dtype=np.float64),
                                            *self._kernel_args(), self.T)
        return {"J": _prob_from_log(lJ), "Phi": lJ - lJbar, "gap": gap}

    def _kernel_sampled_run(self, theta0, eta, u, stream, adv, *, normalized, steps, every, tail0, collapse_j):
        """Every sampled step of R runs in one kernel call (bandits._sequence_kernels.shared_sampled_run)."""
        th = np.ascontiguousarray(theta0, dtype=np.float64)
        ex = self.exact(th)  # J_0, Phi_0 as the numpy route records them
        return _kern.shared_sampled_run(self.features, th, eta, u, stream, adv, *self._kernel_args(), normalized,
                                        steps, every, tail0, collapse_j, np.asarray(ex["J"], np.float64),
                                        np.asarray(ex["Phi"], np.float64))


def _exact_from_states(logP, cond, r, L) -> dict[str, np.ndarray]:
    neg = -np.inf
    lP = logP - logsumexp(logP, axis=-1, keepdims=True)
    lJ = logsumexp(np.where(r == 1, lP, neg), axis=-1)
    lJbar = logsumexp(np.where(r == 0, lP, neg), axis=-1)
    with np.errstate(invalid="ignore", over="ignore"):
        wp = np.exp(np.where(r == 1, lP, neg) - lJ[..., None])
        wm = np.exp(np.where(r == 0, lP, neg) - lJbar[..., None])
    g_plus = np.einsum("...s,...sd->...d", np.nan_to_num(wp), cond)
    g_minus = np.einsum("...s,...sd->...d", np.nan_to_num(wm), cond)
    return {
        "J": _prob_from_log(lJ),
        "Jbar": _prob_from_log(lJbar),
        "Phi": lJ - lJbar,
        "g_plus": g_plus,
        "g_minus": g_minus,
        "gap": g_plus - g_minus,
        "mean_length": np.exp(lP) @ L.astype(np.float64),
    }


# ---------------------------------------------------------------------------------------------
# position-wise tabular parameters (negative control)


@dataclass(frozen=True)
class TabularSequenceBandit(SequenceEnv):
    """Each position t has its own logits z_t [V] (parameters z [..., T, V]); token ``correct`` is right."""

    V: int
    T: int
    rule: Rule
    correct: int = 0

    def __post_init__(self):
        check_int(self.V, "V", minimum=2)
        check_int(self.T, "T", minimum=1)
        _check_rule(self.rule)
        if not 0 <= check_int(self.correct, "correct", minimum=0) < self.V:
            raise ValueError(f"correct must be in [0, {self.V}), got {self.correct}")

    @property
    def n_params(self) -> int:
        return self.T * self.V

    def with_T(self, T: int) -> "TabularSequenceBandit":
        return TabularSequenceBandit(self.V, T, self.rule, self.correct)

    def check_params(self, z) -> np.ndarray:
        z = np.asarray(z, dtype=np.float64)
        if z.ndim < 2 or z.shape[-2:] != (self.T, self.V) or not np.all(np.isfinite(z)):
            raise ValueError(f"z must be a finite array [..., {self.T}, {self.V}], got shape {z.shape}")
        return z

    def _k(self) -> int:
        return self.T if self.rule == "AC" else (self.T + 1) // 2

    def _log_count_pmfs(self, lq, lw):
        """log pmf of N_{-t} (count over the other positions) for every t: [..., T, T], in log space."""
        T = self.T
        lpmf = np.full(lq.shape + (T,), -np.inf)
        lpmf[..., 0] = 0.0
        for s in range(T):
            new = lpmf + lw[..., s][..., None, None]
            new[..., 1:] = np.logaddexp(new[..., 1:], lpmf[..., :-1] + lq[..., s][..., None, None])
            skip = np.arange(T) == s  # position s is not part of N_{-s}
            lpmf = np.where(skip[:, None], lpmf, new)
        return lpmf

    def _log_terms(self, z):
        """(log q_t, log(1 - q_t), log pmf of N_{-t}, log J, log(1 - J)), all from log-sum-exps.

        log(1 - q_t) is the log-sum-exp of the wrong tokens' log-probabilities (no 1 - q), and
        J = P(N >= k) = q_0 P(N_{-0} >= k - 1) + (1 - q_0) P(N_{-0} >= k), 1 - J likewise.
        """
        logp = log_softmax(z, axis=-1)
        wrong = np.arange(self.V) != self.correct
        lq, lw = logp[..., self.correct], logsumexp(logp[..., wrong], axis=-1)
        k = self._k()
        loo = self._log_count_pmfs(lq, lw)  # [..., T, T] over N_{-t} = 0..T-1
        lq0, lw0, loo0 = lq[..., 0], lw[..., 0], loo[..., 0, :]
        logJ = np.logaddexp(lq0 + logsumexp(loo0[..., k - 1 :], axis=-1), lw0 + logsumexp(loo0[..., k:], axis=-1))
        logJbar = np.logaddexp(lq0 + logsumexp(loo0[..., : k - 1], axis=-1), lw0 + logsumexp(loo0[..., :k], axis=-1))
        return lq, loo, logJ, logJbar

    def exact(self, z) -> dict[str, np.ndarray]:
        """J, Phi and the Gap in logit space [..., T, V] (module doc). Uses P(x_t=1 | r).

        Log space throughout: Phi = log J - log(1 - J) stays finite for logits of +-1e3.
        """
        z = self.check_params(z)
        lq, loo, logJ, logJbar = self._log_terms(z)
        k = self._k()
        # P(x_t = 1 | r = 1) = q_t P(N_{-t} >= k - 1) / J;  P(x_t = 1 | r = 0) = q_t P(N_{-t} < k - 1) / (1 - J)
        a1 = np.exp(lq + logsumexp(loo[..., k - 1 :], axis=-1) - logJ[..., None])
        a0 = np.exp(lq + logsumexp(loo[..., : k - 1], axis=-1) - logJbar[..., None])
        zw = z.copy()
        zw[..., self.correct] = -np.inf
        u = np.exp(log_softmax(zw, axis=-1))  # p restricted to the wrong tokens, from logits (stable)
        e_c = np.zeros(self.V)
        e_c[self.correct] = 1.0
        gap = (a1 - a0)[..., None] * (e_c - u)
        return {"J": _prob_from_log(logJ), "Jbar": _prob_from_log(logJbar),
                "Phi": logJ - logJbar, "gap": gap,
                "mean_length": np.full(logJ.shape, float(self.T))}

    def success_rate(self, z) -> np.ndarray:
        """J = P(N >= k), N = sum_t x_t (Poisson-binomial DP in log space, as :meth:`exact`)."""
        return _prob_from_log(self._log_terms(self.check_params(z))[2])

    def log_odds(self, z) -> np.ndarray:
        """Phi = log J - log(1 - J), both from log-space sums (as :meth:`exact`, without the Gap)."""
        _, _, logJ, logJbar = self._log_terms(self.check_params(z))
        return logJ - logJbar

    def gap(self, z) -> np.ndarray:
        return self.exact(z)["gap"]

    @property
    def param_shape(self) -> tuple[int, ...]:
        return (self.T, self.V)

    def draw(self, z, u) -> SequenceSample:
        """Responses from uniforms u [..., G, T]; the score is e_{o_t} - p_t per position (logit space),
        flattened to [..., G, T*V]."""
        z = self.check_params(z)
        p = np.exp(log_softmax(z, axis=-1))  # [..., T, V]
        batch = p.shape[:-2]
        u = np.asarray(u, dtype=np.float64)
        if u.ndim != len(batch) + 2 or u.shape[:-2] != batch or u.shape[-1] != self.T:
            raise ValueError(f"u must have shape {batch} + (G, {self.T}), got {u.shape}")
        # gapdyn's inverse-CDF draw, one row per (run, position): a p = 0 token is never drawn
        tok = np.swapaxes(inverse_cdf_draw(p, np.swapaxes(u, -1, -2)), -1, -2)  # [..., G, T]
        onehot = tok[..., None] == np.arange(self.V)  # [..., G, T, V] bool
        G = u.shape[-2]
        n = (tok == self.correct).sum(-1)
        m = np.full(n.shape, self.T)
        score = np.subtract(onehot, p[..., None, :, :], dtype=np.float64).reshape(batch + (G, self.T * self.V))
        counts = onehot.sum(-2, dtype=np.int64)
        return SequenceSample(counts, n, m, m.copy(), np.zeros_like(m), rule_reward(n, m, self.rule), score)

    # -- kernels of simulate (bandits._sequence_kernels; tested equal to the methods above) ------------------
    def _kernel_log_odds(self, z) -> np.ndarray:
        """Phi of z [..., T, V] (as :meth:`log_odds`, by the numba kernel)."""
        z = self.check_params(z)
        lJ, lJbar = _kern.tabular_log_terms(np.ascontiguousarray(z.reshape((-1, self.T, self.V))), self.correct,
                                            self._k())
        return (lJ - lJbar).reshape(z.shape[:-2])

    def _kernel_exact(self, z) -> dict[str, np.ndarray]:
        """J, Phi and the Gap of z [R, T, V] (as :meth:`exact`, by bandits._sequence_kernels.tabular_exact)."""
        lJ, lJbar, gap = _kern.tabular_exact(np.ascontiguousarray(z, dtype=np.float64), self.correct, self._k())
        return {"J": _prob_from_log(lJ), "Phi": lJ - lJbar, "gap": gap}

    def _kernel_sampled_run(self, theta0, eta, u, stream, adv, *, normalized, steps, every, tail0, collapse_j):
        """Every sampled step of R runs in one kernel call (bandits._sequence_kernels.tabular_sampled_run)."""
        z0 = np.ascontiguousarray(np.reshape(theta0, (-1, self.T, self.V)), dtype=np.float64)
        scale = 1.0 / self.T if normalized else 1.0  # fixed length: |o| = T
        out = _kern.tabular_sampled_run(z0, eta, u, stream, adv, self.correct, self._k(), scale, steps, every, tail0,
                                        collapse_j)
        return (out[0].reshape(len(z0), -1),) + tuple(out[1:])


# ---------------------------------------------------------------------------------------------
# dynamics


def _direction_from_sample(smp: SequenceSample, method: str, group_size: int, length_normalized: bool,
                           shape: tuple[int, ...], opts: dict) -> np.ndarray:
    A = group_advantages(method, smp.reward, **opts)
    s = smp.score / smp.length[..., None] if length_normalized else smp.score
    return (np.einsum("...g,...gp->...p", A, s) / group_size).reshape(shape)


def sequence_sampled_direction(method: str, env, params, *, group_size: int, rng: np.random.Generator,
                               length_normalized: bool = False, **opts) -> np.ndarray:
    """One sampled group's direction w = (1/G) sum_i A_i s(o_i) [/ |o_i|] per leading index of params.

    A from gapdyn.group_advantages(method, rewards, **opts); the sequence-bandit counterpart of
    gapdyn.sampled_direction (method first, then the distribution: here the environment and its
    parameters). E[w] = scalar(J, G) Gap without 1/|o| (docs/equations.md §2).
    """
    if not isinstance(method, str) or method not in METHOD_NAMES:
        raise ValueError(f"method must be one of {METHOD_NAMES}, got {method!r}")
    if not isinstance(length_normalized, (bool, np.bool_)):
        raise ValueError(f"length_normalized must be a bool, got {length_normalized!r}")
    G = check_int(group_size, "group_size", minimum=2)
    params = env.check_params(params)
    smp = env.sample(params, G, rng)
    return _direction_from_sample(smp, method, G, bool(length_normalized), params.shape, opts)


@dataclass(frozen=True)
class SequenceDynamics:
    """What one sequence-bandit simulation does (everything but eta, seed and theta0).

    method: a gapdyn method name or "gap" (w = Gap = grad Phi: log-odds ascent, exact gradient only), as
    in :class:`bandits.engine.Dynamics`; gradient: "exact" (w = E[w] = scalar(J, G) Gap, gapdyn.expected_scalar)
    or "sampled" (one group of G responses per run and step); group_size: G >= 2; steps: updates;
    length_normalized: divide each response's score by |o| (exact gradient: fixed length only, w / T);
    record_every: record J, Phi at steps 0, s, 2s, ...; std, adv_eps, lam: the method options of gapdyn.
    Every run takes all its steps: a run whose J dips can recover, and its outcome is read from the last
    quarter of its states (:class:`SequenceTrajectory`).
    """

    method: str = "grpo"
    gradient: str = "exact"
    group_size: int = 8
    steps: int = 100
    length_normalized: bool = False
    record_every: int = 1
    std: str = "population"
    adv_eps: float = 0.0
    lam: float = 0.1

    def __post_init__(self):
        from .engine import Dynamics

        # the contextual engine's config validates the shared fields (method, gradient, G, steps, options)
        Dynamics(method=self.method, gradient=self.gradient, group_size=self.group_size, steps=self.steps,
                 record_every=self.record_every, std=self.std, adv_eps=self.adv_eps, lam=self.lam)
        if not isinstance(self.length_normalized, (bool, np.bool_)):
            raise ValueError(f"length_normalized must be a bool, got {self.length_normalized!r}")

    @property
    def method_opts(self) -> dict:
        """Options for gapdyn.group_advantages / expected_scalar (the engine's rule)."""
        from .engine import method_opts

        return method_opts(self.method, std=self.std, adv_eps=self.adv_eps, lam=self.lam)


@dataclass(frozen=True)
class SequenceTrajectory:
    """Output of :func:`simulate` (R runs, n_rec recorded steps; P = the environment's param_shape).

    steps [n_rec]; J, Phi [R, n_rec] at theta_k before update k; J_final, Phi_final [R] after the last
    step; J_min [R]: min of J over every state k = 0..K (K = steps, the final one included); J_tail_min,
    J_tail_max [R]: min and max of J over the last quarter, k >= K - K // 4 (gapdyn.evidence.collapse.tail_start):
    with J_min what decides the run's outcome (collapse is J -> 0 at the end, Suk & Duan (arXiv
    2510.08539), Thm 2); collapse_step [R]: first k with J_k < gapdyn.COLLAPSE_J (-1 if none; a trace
    statistic, the run goes on); theta_final [R, *P]; eta0 [R]; seed [R].
    """

    steps: np.ndarray
    J: np.ndarray
    Phi: np.ndarray
    J_final: np.ndarray
    Phi_final: np.ndarray
    J_min: np.ndarray
    J_tail_min: np.ndarray
    J_tail_max: np.ndarray
    collapse_step: np.ndarray
    theta_final: np.ndarray
    eta0: np.ndarray
    seed: np.ndarray
    dynamics: SequenceDynamics = field(repr=False, default=None)

    @property
    def collapsed(self) -> np.ndarray:
        """Collapsed as Thm 2 states it: J < gapdyn.COLLAPSE_J at every state of the last quarter
        (gapdyn.is_collapsed of the run statistics)."""
        from gapdyn import RunStats, is_collapsed

        clip = lambda v: np.clip(v, 0.0, 1.0)  # noqa: E731
        return is_collapsed(RunStats(clip(self.J_min), clip(self.J_tail_min), clip(self.J_tail_max)))


def _param_shape(env) -> tuple[int, ...]:
    try:
        return tuple(env.param_shape)
    except AttributeError as exc:
        raise ValueError(f"env must be a sequence bandit (with param_shape), got {type(env).__name__}") from exc


def _runs(env, eta, seed, theta0):
    pshape = _param_shape(env)
    eta_arr = np.asarray(eta, dtype=np.float64) if not isinstance(eta, str) else None
    if (eta_arr is None or eta_arr.ndim > 1 or eta_arr.size == 0 or not np.all(np.isfinite(eta_arr))
            or np.any(eta_arr <= 0)):
        raise ValueError(f"eta must be a finite scalar or 1-D array, every entry > 0, got {eta!r}")
    seed_arr = np.atleast_1d(np.asarray(seed))
    if seed_arr.ndim != 1 or not np.issubdtype(seed_arr.dtype, np.integer) or np.any(seed_arr < 0):
        raise ValueError(f"seed must be a non-negative integer or a 1-D array of them, got {seed!r}")
    th0 = None
    if theta0 is not None:
        th0 = env.check_params(theta0)
        if th0.shape not in (pshape,) and (th0.ndim != len(pshape) + 1 or th0.shape[1:] != pshape):
            raise ValueError(f"theta0 must have shape {pshape} or [R, *{pshape}], got {th0.shape}")
    batched_theta = th0 is not None and th0.ndim > len(pshape)
    sizes = [eta_arr.size if eta_arr.ndim else 1, seed_arr.size, th0.shape[0] if batched_theta else 1]
    R = max(sizes)
    if any(s not in (1, R) for s in sizes):
        raise ValueError(f"eta, seed and theta0 must broadcast to R runs, got sizes {sizes}")
    e = np.broadcast_to(eta_arr.reshape(-1), (R,)).copy()
    s = np.broadcast_to(seed_arr.astype(np.int64), (R,)).copy()
    th = np.zeros((R,) + pshape) if th0 is None else np.broadcast_to(th0, (R,) + pshape).copy()
    return e, s, th


def simulate(env, dyn: SequenceDynamics, *, eta, seed=0, theta0=None, backend: str = "numba") -> SequenceTrajectory:
    """theta_{k+1} = theta_k + eta w_k for R runs (the sequence-bandit twin of bandits.engine.simulate).

    env: a sequence bandit (:class:`SharedSequenceBandit`, :class:`TabularSequenceBandit`,
    :class:`bandits.partial.PartialSharingBandit`); dyn: the dynamics; eta: scalar or [R]; seed: int or
    [R]: run r's groups come from uniforms of numpy.random.default_rng(seed[r]) (G x T a step), and
    runs with equal seeds share them (common random numbers across etas); theta0: [*P] or [R, *P]
    (default 0). Exact gradient: w = scalar(J, G) Gap ("gap": w = Gap); sampled: w = (1/G) sum A_i s(o_i).
    backend: "numba" (the kernels of bandits._sequence_kernels where the environment has them: every sampled
    step in one call, the exact J, Phi and Gap per step) or "numpy" (the environment's numpy methods); the
    two agree to round-off and draw the same tokens from the same stream (tests/test_bandits_sequence.py).
    """
    if not isinstance(dyn, SequenceDynamics):
        raise ValueError(f"dyn must be a SequenceDynamics, got {type(dyn).__name__}")
    if backend not in ("numba", "numpy"):
        raise ValueError(f"backend must be 'numba' or 'numpy', got {backend!r}")
    eta0, seeds, params = _runs(env, eta, seed, theta0)
    R, pshape, G = params.shape[0], params.shape[1:], dyn.group_size
    exact_mode = dyn.gradient == "exact"
    T = int(env.T)
    if dyn.length_normalized and exact_mode and getattr(env, "end_token", None) is not None:
        raise ValueError("length_normalized exact dynamics need fixed-length responses (E[A s/|o|] is not a "
                         "scalar times the Gap when |o| varies); use gradient='sampled'")
    opts = dyn.method_opts
    eta_b = eta0.reshape((R,) + (1,) * len(pshape))
    uniq, inverse = np.unique(seeds, return_inverse=True)
    rngs = [np.random.default_rng(int(s)) for s in uniq] if not exact_mode else None
    every = dyn.record_every
    tail0 = tail_start(dyn.steps)  # the last quarter of the states 0..steps
    if backend == "numba" and not exact_mode and hasattr(env, "_kernel_sampled_run"):
        # the same stream: g.random((steps, G, T)) is the steps successive g.random((G, T)) of the loop below
        u = np.stack([g.random((dyn.steps, G, T)) for g in rngs])  # [seeds, steps, G, T]
        out = env._kernel_sampled_run(params.reshape(R, -1), eta0, u, inverse.astype(np.int64),
                                      _advantage_table(dyn.method, G, opts), normalized=bool(dyn.length_normalized),
                                      steps=dyn.steps,
                                      every=every, tail0=tail0, collapse_j=COLLAPSE_J)
        theta, rec_J, rec_Phi, J, Phi, J_min, J_tail_min, J_tail_max, collapse_step = out
        return SequenceTrajectory(
            steps=np.arange(0, dyn.steps, every), J=rec_J, Phi=rec_Phi, J_final=J, Phi_final=Phi, J_min=J_min,
            J_tail_min=J_tail_min, J_tail_max=J_tail_max, collapse_step=collapse_step,
            theta_final=theta.reshape(params.shape), eta0=eta0, seed=seeds, dynamics=dyn,
        )
    exact_fn = env._kernel_exact if backend == "numba" and hasattr(env, "_kernel_exact") else env.exact
    n_rec = (dyn.steps - 1) // every + 1
    rec_J, rec_Phi = np.full((R, n_rec), np.nan), np.full((R, n_rec), np.nan)
    ex = exact_fn(params)
    J, Phi = np.array(ex["J"], dtype=np.float64), np.array(ex["Phi"], dtype=np.float64)
    J_min = J.copy()
    J_tail_min, J_tail_max = np.full(R, np.inf), np.full(R, -np.inf)
    collapse_step = np.where(J < COLLAPSE_J, 0, -1)
    for k in range(dyn.steps):
        if k % every == 0:
            rec_J[:, k // every], rec_Phi[:, k // every] = J, Phi
        if exact_mode:
            w = ex["gap"]
            if dyn.method != "gap":
                Jc = np.clip(J, 1e-300, 1.0 - 1e-16)
                w = expected_scalar(dyn.method, Jc, G, **opts).reshape((-1,) + (1,) * len(pshape)) * w
            if dyn.length_normalized:
                w = w / T
        else:
            u = np.stack([g.random((G, T)) for g in rngs])[inverse]
            smp = env.draw(params, u)
            w = _direction_from_sample(smp, dyn.method, G, dyn.length_normalized, (R,) + pshape, opts)
        params = params + eta_b * w
        if exact_mode:
            ex = exact_fn(params)
            J, Phi = np.array(ex["J"], dtype=np.float64), np.array(ex["Phi"], dtype=np.float64)
        else:  # the Gap is not needed: the log-odds alone (log-space sums), J = sigmoid(Phi)
            Phi = np.array(env.log_odds(params), dtype=np.float64)
            J = expit(Phi)
        J_min = np.minimum(J_min, J)
        if k + 1 >= tail0:
            J_tail_min, J_tail_max = np.minimum(J_tail_min, J), np.maximum(J_tail_max, J)
        collapse_step = np.where((collapse_step < 0) & (J < COLLAPSE_J), k + 1, collapse_step)
    return SequenceTrajectory(
        steps=np.arange(0, dyn.steps, every), J=rec_J, Phi=rec_Phi, J_final=J, Phi_final=Phi, J_min=J_min,
        J_tail_min=J_tail_min, J_tail_max=J_tail_max, collapse_step=collapse_step, theta_final=params, eta0=eta0,
        seed=seeds, dynamics=dyn,
    )


def _advantage_table(method: str, group_size: int, opts: dict) -> np.ndarray:
    """A[c, r] [G + 1, 2]: gapdyn.group_advantages of a response with reward r in a group of G binary rewards
    with c ones (every rule depends on the group only through c: the sampled kernels read A from here)."""
    G = group_size
    r = (np.arange(G)[None, :] < np.arange(G + 1)[:, None]).astype(np.float64)  # row c: c ones, then zeros
    A = group_advantages(method, r, **opts)  # [G + 1, G]
    table = np.zeros((G + 1, 2))
    table[1:, 1] = A[1:, 0]
    table[:-1, 0] = A[:-1, -1]
    return table


def place_for_success_rate(env: SequenceEnv, direction, J0: float, *, base=None, lo: float = -50.0, hi: float = 50.0) -> np.ndarray:
    """params = base + alpha * direction with alpha found by bisection so that J(params) = J0.

    The bisection runs on the log-odds Phi (target logit J0 = log J0 - log(1 - J0)), not on J, so
    1 - J is placed to full relative precision also at J0 = 1 - 1e-12. Phi must be increasing in
    alpha on [lo, hi] around the root (bisection on a bracket found by a scan).
    """
    if isinstance(J0, bool) or not isinstance(J0, (int, float, np.integer, np.floating)) or not 0 < J0 < 1:
        raise ValueError(f"J0 must be in (0, 1), got {J0!r}")
    try:
        lo, hi = float(lo), float(hi)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"lo and hi must be real numbers, got {lo!r}, {hi!r}") from exc
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ValueError(f"lo and hi must be finite with lo < hi, got {lo!r}, {hi!r}")
    def params_like(x, name):
        try:
            return env.check_params(x)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name}: {exc}") from exc

    direction = params_like(direction, "direction")
    base = np.zeros_like(direction) if base is None else params_like(base, "base")
    if base.shape != direction.shape:
        raise ValueError(f"base must have the shape of direction {direction.shape}, got {base.shape}")
    target = float(np.log(J0) - np.log1p(-J0))

    logodds = getattr(env, "_kernel_log_odds", env.log_odds)  # the numba twin where the environment has one
    alphas = np.linspace(lo, hi, 401)
    Phis = logodds(base[None] + alphas.reshape((-1,) + (1,) * direction.ndim) * direction[None])
    above = np.nonzero(Phis >= target)[0]
    if above.size == 0 or above[0] == 0:
        raise ValueError(f"J0={J0} is not reachable along the direction within alpha in [{lo}, {hi}]")
    a, b = alphas[above[0] - 1], alphas[above[0]]
    for _ in range(200):  # ends at adjacent floats (about 60 halvings)
        mid = 0.5 * (a + b)
        if not a < mid < b:
            break
        if logodds(base + mid * direction) >= target:
            b = mid
        else:
            a = mid
    return base + 0.5 * (a + b) * direction
