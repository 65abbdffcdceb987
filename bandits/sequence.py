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
from typing import Literal

import numpy as np
from scipy.special import gammaln, log_softmax, logsumexp

from gapdyn import group_advantages
from gapdyn.methods import get_method

__all__ = [
    "RULES",
    "SharedSequenceBandit",
    "TabularSequenceBandit",
    "SequenceSample",
    "rule_reward",
    "sampled_direction",
    "simulate",
    "critical_eta",
    "place_for_success_rate",
]

RULES = ("AC", "MAJ")
Rule = Literal["AC", "MAJ"]


def _check_rule(rule: str) -> str:
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    return rule


def _check_int(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


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
class SharedSequenceBandit:
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
        object.__setattr__(self, "T", _check_int(self.T, "T", 1))
        if self.end_token is not None:
            e = _check_int(self.end_token, "end_token", 0)
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
        _check_int(V, "V", 3 if variable_length else 2)
        _check_int(d, "d", 1)
        _check_int(seed, "seed", 0)
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

    def success_rate(self, theta) -> np.ndarray:
        """J = sum over rewarded states of P(n, m, ended) (no score sums: cheap)."""
        logp = self.token_logprobs(theta)
        corr, wrong, end = self._masks()
        lse = lambda mask: logsumexp(np.where(mask, logp, -np.inf), axis=-1)  # noqa: E731
        le = lse(end) if self.end_token is not None else np.full(logp.shape[:-1], -np.inf)
        logP = self._state_logP(lse(corr), lse(wrong), le)
        n, m, _ = self.states()
        r = rule_reward(n, m, self.rule)
        return np.exp(logsumexp(np.where(r == 1, logP, -np.inf), axis=-1) - logsumexp(logP, axis=-1))

    def log_odds(self, theta) -> np.ndarray:
        """Phi = log J - log(1 - J) from the state log-probabilities (no score sums: cheap)."""
        logp = self.token_logprobs(theta)
        corr, wrong, end = self._masks()
        lse = lambda mask: logsumexp(np.where(mask, logp, -np.inf), axis=-1)  # noqa: E731
        le = lse(end) if self.end_token is not None else np.full(logp.shape[:-1], -np.inf)
        logP = self._state_logP(lse(corr), lse(wrong), le)
        n, m, _ = self.states()
        r = rule_reward(n, m, self.rule)
        return logsumexp(np.where(r == 1, logP, -np.inf), axis=-1) - logsumexp(np.where(r == 0, logP, -np.inf), axis=-1)

    def gap(self, theta) -> np.ndarray:
        return self.exact(theta)["gap"]

    # -- sampling ------------------------------------------------------------------------------
    def sample(self, theta, group_size: int, rng: np.random.Generator) -> SequenceSample:
        """G i.i.d. responses per leading index of theta, summarised by token counts."""
        if not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        G = _check_int(group_size, "group_size", 1)
        logp = self.token_logprobs(theta)
        p = np.exp(logp)
        batch = p.shape[:-1]
        corr, wrong, end = self._masks()
        if self.end_token is None:
            m = np.full(batch + (G,), self.T, dtype=np.int64)
            ended = np.zeros_like(m)
            content = p
        else:
            pe = np.clip(p[..., self.end_token], 1e-300, 1.0)
            before = rng.geometric(np.broadcast_to(pe[..., None], batch + (G,))) - 1  # non-end tokens before END
            ended = (before < self.T).astype(np.int64)
            m = np.minimum(before, self.T).astype(np.int64)
            content = np.where(end, 0.0, p)
        tot = content.sum(-1, keepdims=True)
        if np.any(tot <= 1e-200):  # the end token has (almost) all the mass: renormalise in log space
            safe = np.exp(log_softmax(np.where(end, -np.inf, logp), axis=-1))
            content = np.where(tot > 1e-200, content / np.maximum(tot, 1e-300), safe)
        else:
            content = content / tot
        pv = np.broadcast_to(content[..., None, :], batch + (G, self.V))
        counts = rng.multinomial(m, pv).astype(np.int64)
        if self.end_token is not None:
            counts[..., self.end_token] += ended
        n = counts[..., corr].sum(-1)
        L = m + ended
        mu = p @ self.features
        score = counts @ self.features - L[..., None] * mu[..., None, :]
        return SequenceSample(counts, n, m, L, ended, rule_reward(n, m, self.rule), score)


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
        "J": np.exp(lJ),
        "Jbar": np.exp(lJbar),
        "Phi": lJ - lJbar,
        "g_plus": g_plus,
        "g_minus": g_minus,
        "gap": g_plus - g_minus,
        "mean_length": np.exp(lP) @ L.astype(np.float64),
    }


# ---------------------------------------------------------------------------------------------
# position-wise tabular parameters (negative control)


@dataclass(frozen=True)
class TabularSequenceBandit:
    """Each position t has its own logits z_t [V] (parameters z [..., T, V]); token ``correct`` is right."""

    V: int
    T: int
    rule: Rule
    correct: int = 0

    def __post_init__(self):
        _check_int(self.V, "V", 2)
        _check_int(self.T, "T", 1)
        _check_rule(self.rule)
        if not 0 <= _check_int(self.correct, "correct", 0) < self.V:
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
        return {"J": np.exp(logJ), "Jbar": np.exp(logJbar), "Phi": logJ - logJbar, "gap": gap,
                "mean_length": np.full(logJ.shape, float(self.T))}

    def success_rate(self, z) -> np.ndarray:
        """J = P(N >= k), N = sum_t x_t (Poisson-binomial DP in log space, as :meth:`exact`)."""
        return np.exp(self._log_terms(self.check_params(z))[2])

    def log_odds(self, z) -> np.ndarray:
        """Phi = log J - log(1 - J), both from log-space sums (as :meth:`exact`, without the Gap)."""
        _, _, logJ, logJbar = self._log_terms(self.check_params(z))
        return logJ - logJbar

    def gap(self, z) -> np.ndarray:
        return self.exact(z)["gap"]

    def sample(self, z, group_size: int, rng: np.random.Generator) -> SequenceSample:
        """G responses; the score is e_{o_t} - p_t per position (logit space), flattened to [..., G, T*V]."""
        if not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        G = _check_int(group_size, "group_size", 1)
        z = self.check_params(z)
        p = np.exp(log_softmax(z, axis=-1))  # [..., T, V]
        batch = p.shape[:-2]
        cdf = np.cumsum(p, axis=-1)
        u = rng.random(batch + (G, self.T, 1))
        # a u above the rounded cdf total goes to the last token with p > 0, never to a p = 0 one
        last = self.V - 1 - np.argmax(p[..., ::-1] > 0, axis=-1)  # [..., T]
        tok = np.minimum((u > cdf[..., None, :, :]).sum(-1), last[..., None, :])  # [..., G, T]
        onehot = tok[..., None] == np.arange(self.V)  # [..., G, T, V] bool
        n = (tok == self.correct).sum(-1)
        m = np.full(n.shape, self.T)
        score = np.subtract(onehot, p[..., None, :, :], dtype=np.float64).reshape(batch + (G, self.T * self.V))
        counts = onehot.sum(-2, dtype=np.int64)
        return SequenceSample(counts, n, m, m.copy(), np.zeros_like(m), rule_reward(n, m, self.rule), score)


# ---------------------------------------------------------------------------------------------
# dynamics


Env = SharedSequenceBandit | TabularSequenceBandit


def sampled_direction(env: Env, params, method: str, group_size: int, rng: np.random.Generator,
                      *, length_normalized: bool = False) -> np.ndarray:
    """w = (1/G) sum_i A_i s(o_i) [/ |o_i|], A from gapdyn.group_advantages (docs/equations.md §2)."""
    smp = env.sample(params, group_size, rng)
    A = group_advantages(method, smp.reward)
    s = smp.score / smp.length[..., None] if length_normalized else smp.score
    w = np.einsum("...g,...gp->...p", A, s) / group_size
    return w.reshape(np.shape(params))


def simulate(
    env: Env,
    params0,
    etas,
    *,
    direction: Literal["sampled", "logodds", "expected"] = "sampled",
    method: str = "grpo",
    group_size: int = 8,
    steps: int = 100,
    rng: np.random.Generator | None = None,
    length_normalized: bool = False,
    collapse_J: float = 0.01,
) -> dict[str, np.ndarray]:
    """theta_{k+1} = theta_k + eta w_k for a batch of runs (params0 [..., P-shape], etas [...]).

    direction: "sampled" (one group per step, ``method``'s advantages, optional 1/|o|),
    "logodds" (w = Gap = grad Phi, exact log-odds ascent) or "expected" (w = E[w] = scalar(J, G) Gap,
    gapdyn.expected_scalar). A run collapses when J < collapse_J; it is then frozen (absorbing by
    definition). Sampled runs stop early once every run has collapsed or has J > 1 - 1e-9.
    Returns J_final, J_min, collapsed (bool), collapse_step (-1 if none), all [...].
    """
    from gapdyn import expected_scalar

    if not isinstance(method, str):
        raise ValueError(f"method must be a method name (str), got {method!r}")
    get_method(method)
    if not isinstance(length_normalized, (bool, np.bool_)):
        raise ValueError(f"length_normalized must be a bool, got {length_normalized!r}")
    if direction not in ("sampled", "logodds", "expected"):
        raise ValueError(f"direction must be 'sampled', 'logodds' or 'expected', got {direction!r}")
    steps = _check_int(steps, "steps", 1)
    if direction == "sampled":
        if not isinstance(rng, np.random.Generator):
            raise ValueError("rng must be a numpy.random.Generator for sampled directions")
        _check_int(group_size, "group_size", 2)
    if isinstance(collapse_J, bool) or not isinstance(collapse_J, (int, float, np.integer, np.floating)) or not (0 < collapse_J < 1):
        raise ValueError(f"collapse_J must be in (0, 1), got {collapse_J!r}")
    params = env.check_params(params0).copy()
    pshape = params.shape[params.ndim - (2 if isinstance(env, TabularSequenceBandit) else 1):]
    etas = np.asarray(etas, dtype=np.float64)
    if etas.shape != params.shape[: params.ndim - len(pshape)] or np.any(~np.isfinite(etas)) or np.any(etas <= 0):
        raise ValueError(f"etas must be finite, > 0 and of the batch shape {params.shape[:params.ndim - len(pshape)]}")
    eta_b = etas.reshape(etas.shape + (1,) * len(pshape))
    J = env.success_rate(params)
    J_min = J.copy()
    alive = J >= collapse_J
    collapse_step = np.where(alive, -1, 0)
    for k in range(steps):
        if direction == "sampled":
            w = sampled_direction(env, params, method, group_size, rng, length_normalized=length_normalized)
        else:
            ex = env.exact(params)
            w = ex["gap"]
            if direction == "expected":
                Jc = np.clip(ex["J"], 1e-12, 1 - 1e-12)
                w = expected_scalar(method, Jc, group_size).reshape(Jc.shape + (1,) * len(pshape)) * w
        alive_b = alive.reshape(alive.shape + (1,) * len(pshape))
        params = np.where(alive_b, params + eta_b * w, params)
        J = env.success_rate(params)
        J_min = np.minimum(J_min, J)
        newly = alive & (J < collapse_J)
        collapse_step = np.where(newly, k + 1, collapse_step)
        alive &= ~newly
        # every run collapsed, or (sampled) settled: J > 1 - 1e-9 makes a failing sample in the
        # remaining steps improbable (< G * steps * 1e-9), so the outcome is decided
        settled = ~alive | ((J > 1.0 - 1e-9) if direction == "sampled" else False)
        if np.all(settled):
            break
    return {"J_final": J, "J_min": J_min, "collapsed": collapse_step >= 0, "collapse_step": collapse_step}


def critical_eta(etas, collapse_prob, *, level: float = 0.5) -> float:
    """Smallest eta of the (increasing) grid with P(collapse) >= level; inf if none."""
    etas = np.asarray(etas, dtype=np.float64)
    pc = np.asarray(collapse_prob, dtype=np.float64)
    if etas.ndim != 1 or etas.shape != pc.shape or np.any(np.diff(etas) <= 0):
        raise ValueError("etas must be 1-D increasing with one collapse probability each")
    if not np.all(np.isfinite(etas)) or not np.all((pc >= 0) & (pc <= 1)):
        raise ValueError("etas must be finite and collapse_prob must lie in [0, 1]")
    if isinstance(level, bool) or not isinstance(level, (int, float, np.integer, np.floating)) or not np.isfinite(level):
        raise ValueError(f"level must be a finite real number, got {level!r}")
    hit = np.nonzero(pc >= level)[0]
    return float(etas[hit[0]]) if hit.size else float("inf")


def place_for_success_rate(env: Env, direction, J0: float, *, base=None, lo: float = -50.0, hi: float = 50.0) -> np.ndarray:
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

    logodds = env.log_odds
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
