"""The testbed's verifiable task: multi-digit addition written out column by column (a scratchpad), then the answer.

A prompt names the scratchpad's verbosity (the completion-length knob T) and the two numbers::

    L|1234+5678=       long:  4+8+0=12;3+7+1=11;2+6+1=9;1+5+0=6;>6912<eos>      (36 tokens + <eos>)
    S|1234+5678=       short: 4812;3711;269;156;>6912<eos>                      (23 tokens + <eos>)

Columns run from the least significant digit; in the long form each column writes ``x+y+c=s`` (c the carry in,
s the column sum), in the short form ``xys`` (the carry in is left implicit: it is the tens digit of the column
before). Both forms do the same computation (copy the column's digits, add them with the carry); only the number
of tokens differs, so the length knob changes T and not the task. The reward is 1 iff the completion ended
with <eos> and its text after the last ``>`` is exactly the sum (the outcome is verified, the scratchpad is not).

Held-out problems are a fixed set of pairs (drawn once from :data:`HELDOUT_SEED`) that the training stream never
draws (rejected), so held-out accuracy measures generalisation to unseen problems. Character-level tokenizer over
printable ASCII (:func:`testbed_tokenizer`, 98 ids): the task's text uses 18 of them, the policy may emit any.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

from ..tasks import Problem

__all__ = ["LENGTHS", "ScratchpadAddition", "scratchpad", "testbed_tokenizer", "TESTBED_ALPHABET", "HELDOUT_SEED"]

LENGTHS = ("long", "short")
"""The two scratchpad verbosities (prompt flags 'L' and 'S')."""
_FLAG = {"long": "L", "short": "S"}
TESTBED_ALPHABET = "".join(c for c in string.printable if c not in "\t\n\r\x0b\x0c")
"""The 95 printable ASCII characters: the tokenizer's symbols (+ <pad>, <eos>, <unk>)."""
HELDOUT_SEED = 20261202
"""Seed of the held-out pairs (never drawn by the training stream)."""


def scratchpad(a: int, b: int, length: str, digits: int) -> str:
    """The reference completion for a + b (without <eos>): columns least significant first, then '>' and the sum."""
    if length not in _FLAG:
        raise ValueError(f"length must be one of {LENGTHS}, got {length!r}")
    xs, ys = str(a).zfill(digits)[::-1], str(b).zfill(digits)[::-1]
    carry, cols = 0, []
    for x, y in zip(xs, ys):
        s = int(x) + int(y) + carry
        cols.append(f"{x}+{y}+{carry}={s};" if length == "long" else f"{x}{y}{s};")
        carry = s // 10
    return "".join(cols) + ">" + str(a + b)


@dataclass(frozen=True)
class ScratchpadAddition:
    """a + b with a, b uniform on [10^(digits-1), 10^digits - 1], written out with a scratchpad.

    ``length``: 'long', 'short' or 'mixed' (each problem's flag drawn 50/50: the supervised warm start trains
    both lengths); ``n_heldout``: size of the held-out set, which the training stream never draws."""

    digits: int = 4
    length: str = "long"
    n_heldout: int = 512
    name: str = "scratchpad_addition"

    def __post_init__(self):
        if isinstance(self.digits, bool) or not isinstance(self.digits, int) or not 2 <= self.digits <= 9:
            raise ValueError(f"digits must be an integer in 2..9, got {self.digits!r}")
        if self.length not in LENGTHS + ("mixed",):
            raise ValueError(f"length must be one of {LENGTHS + ('mixed',)}, got {self.length!r}")
        if isinstance(self.n_heldout, bool) or not isinstance(self.n_heldout, int) or self.n_heldout < 1:
            raise ValueError(f"n_heldout must be an integer >= 1, got {self.n_heldout!r}")

    @property
    def cache_key(self) -> str:
        return f"scratchpad:{self.digits}:{self.length}:{self.n_heldout}"

    def _pairs(self, rng: np.random.Generator, n: int) -> np.ndarray:
        lo, hi = 10 ** (self.digits - 1), 10**self.digits - 1
        return rng.integers(lo, hi + 1, size=(n, 2))

    def heldout_pairs(self) -> list[tuple[int, int]]:
        """The held-out (a, b) pairs: distinct, fixed by :data:`HELDOUT_SEED` and the digit count."""
        rng = np.random.default_rng([HELDOUT_SEED, self.digits])
        seen: dict[tuple[int, int], None] = {}
        while len(seen) < self.n_heldout:
            for a, b in self._pairs(rng, self.n_heldout).tolist():
                if len(seen) < self.n_heldout:
                    seen.setdefault((a, b), None)
        return list(seen)

    def _problem(self, a: int, b: int, length: str) -> Problem:
        return Problem(f"{_FLAG[length]}|{a}+{b}=", scratchpad(a, b, length, self.digits))

    def _lengths(self, rng: np.random.Generator, n: int) -> list[str]:
        if self.length != "mixed":
            return [self.length] * n
        return [LENGTHS[i] for i in rng.integers(0, 2, size=n).tolist()]

    def heldout(self, length: str | None = None) -> list[Problem]:
        """The held-out problems at ``length`` (default: the task's; 'mixed' alternates long and short)."""
        length = self.length if length is None else length
        pairs = self.heldout_pairs()
        if length == "mixed":
            return [self._problem(a, b, LENGTHS[i % 2]) for i, (a, b) in enumerate(pairs)]
        return [self._problem(a, b, length) for a, b in pairs]

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """n training problems drawn with ``rng`` (never a held-out pair)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        held = self._heldout_set()
        out: list[tuple[int, int]] = []
        while len(out) < n:
            out.extend(p for p in map(tuple, self._pairs(rng, n - len(out)).tolist()) if p not in held)
        return [self._problem(a, b, ln) for (a, b), ln in zip(out, self._lengths(rng, n))]

    def _heldout_set(self) -> frozenset:
        cached = self.__dict__.get("_held")
        if cached is None:
            cached = frozenset(self.heldout_pairs())
            object.__setattr__(self, "_held", cached)
        return cached

    def reward(self, completion: str, problem: Problem, *, terminated: bool) -> float:
        """1.0 iff the completion ended with <eos> and its text after the last '>' is the sum."""
        if not terminated or ">" not in completion:
            return 0.0
        return float(completion.rsplit(">", 1)[1] == problem.answer.rsplit(">", 1)[1])

    def max_completion_tokens(self, length: str | None = None) -> int:
        """Tokens of the longest reference completion at ``length`` (+1 for <eos>)."""
        length = self.length if length is None else length
        longest = max(len(scratchpad(10**self.digits - 1, 10**self.digits - 1, ln, self.digits))
                      for ln in (LENGTHS if length == "mixed" else (length,)))
        return longest + 1

    def max_answer_len(self) -> int:
        return self.max_completion_tokens()


def testbed_tokenizer():
    """The testbed's character-level tokenizer: one id per printable ASCII character (+ pad, eos, unk: 98)."""
    from ..tokenizer import build_char_tokenizer

    return build_char_tokenizer(TESTBED_ALPHABET)
