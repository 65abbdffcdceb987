"""Verifiable tasks with binary rewards: a bundled addition task and a JSONL question/answer loader.

- :class:`AdditionTask`: "12+34=" -> "46" followed by <eos>; reward 1 only for that exact token string
  (strict format: no extra characters, the end token must follow the answer). Deterministic given a
  ``numpy.random.Generator``.
- :class:`JsonlTask`: problems read from a JSONL file (``{"question": ..., "answer": ...}`` per line,
  GSM8K-style answers "... #### 42" are reduced to "42"); reward 1 when :func:`check_answer` accepts
  the completion's final answer.
- :func:`extract_answer` / :func:`check_answer`: final answer from ``\\boxed{...}``, ``#### x`` or the
  last number; numeric normalisation (commas, $, %, trailing zeros, simple fractions).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

__all__ = ["Problem", "AdditionTask", "JsonlTask", "load_jsonl_problems", "extract_answer", "normalize_answer", "check_answer"]


@dataclass(frozen=True)
class Problem:
    """One prompt and its reference answer."""

    prompt: str
    answer: str


class AdditionTask:
    """a+b= with a, b uniform in [lo, hi] (default two-digit 10..99); target str(a+b) + <eos>."""

    name = "addition"

    def __init__(self, lo: int = 10, hi: int = 99):
        if not (0 <= lo <= hi):
            raise ValueError(f"need 0 <= lo <= hi, got lo={lo}, hi={hi}")
        self.lo, self.hi = int(lo), int(hi)

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """n problems drawn with ``rng`` (prompts all have the same length when lo, hi have equal digits)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        ab = rng.integers(self.lo, self.hi + 1, size=(n, 2))
        return [Problem(f"{a}+{b}=", str(a + b)) for a, b in ab.tolist()]

    def reward(self, completion: str, problem: Problem, *, terminated: bool) -> float:
        """1.0 iff the completion is exactly the answer and ended with <eos> (strict format)."""
        return float(terminated and completion == problem.answer)

    def max_answer_len(self) -> int:
        return len(str(2 * self.hi))


_BOXED = re.compile(r"\\boxed\s*\{")
_HASH = re.compile(r"####\s*([^\n]+)")
_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def _boxed_contents(text: str) -> str | None:
    """Contents of the last \\boxed{...}, braces balanced."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    i = starts[-1]
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i : j - 1] if depth == 0 else None


def extract_answer(text: str) -> str | None:
    """Final answer of a solution text: last \\boxed{..}, else after '####', else the last number."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a string, got {type(text).__name__}")
    b = _boxed_contents(text)
    if b is not None:
        return b.strip()
    h = _HASH.findall(text)
    if h:
        return h[-1].strip()
    nums = _NUMBER.findall(text)
    return nums[-1] if nums else None


def normalize_answer(ans: str) -> str:
    """Canonical form: numbers without commas/$/%/trailing zeros ("1,000.50" -> "1000.5", "3/4" kept
    as an exact fraction, "\\frac{3}{4}" -> "3/4"); other text stripped, lower-cased, spaces collapsed."""
    s = ans.strip().strip(".").replace("\\!", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = re.sub(r"\\(?:d|t)?frac\{([^{}]+)\}\{([^{}]+)\}", r"\1/\2", s)
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s).strip()
    t = s.replace(",", "").replace(" ", "")
    try:
        v = Fraction(t)
    except (ValueError, ZeroDivisionError):
        return " ".join(s.lower().split())
    if v.denominator == 1:
        return str(v.numerator)
    dec = float(v)
    if Fraction(repr(dec)) == v:  # a terminating decimal
        return repr(dec)
    return f"{v.numerator}/{v.denominator}"


def check_answer(completion: str, reference: str) -> bool:
    """True iff the completion's final answer equals the reference after :func:`normalize_answer`
    (numbers compared exactly as fractions; GSM8K references "... #### 42" are reduced first)."""
    ref = extract_answer(reference) if ("####" in reference or "\\boxed" in reference) else reference
    got = extract_answer(completion)
    if got is None or ref is None:
        return False
    return normalize_answer(got) == normalize_answer(ref)


def load_jsonl_problems(path: str | Path, *, question_key: str = "question", answer_key: str = "answer") -> list[Problem]:
    """Problems from a JSONL file; ValueError (with the line number) for a missing/empty file,
    malformed JSON, a non-object line, or a missing/empty question or answer."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"path must be an existing JSONL file, got {str(path)!r}")
    out = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{p.name}: line {n} is not valid JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise ValueError(f"{p.name}: line {n} must be a JSON object, got {type(obj).__name__}")
        for key in (question_key, answer_key):
            v = obj.get(key)
            if isinstance(v, bool) or not isinstance(v, (str, int, float)) or not str(v).strip():
                raise ValueError(f"{p.name}: line {n} lacks a non-empty {key!r} field")
        ans = str(obj[answer_key])
        ref = extract_answer(ans) if "####" in ans or "\\boxed" in ans else ans.strip()
        if ref is None:
            raise ValueError(f"{p.name}: line {n}: cannot extract an answer from {ans!r}")
        out.append(Problem(str(obj[question_key]), ref))
    if not out:
        raise ValueError(f"{p.name}: the file holds no problems (empty)")
    return out


class JsonlTask:
    """Problems from a JSONL file, drawn uniformly with replacement; reward by :func:`check_answer`."""

    name = "jsonl"

    def __init__(self, path: str | Path, **keys):
        self.problems = load_jsonl_problems(path, **keys)

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        idx = rng.integers(0, len(self.problems), size=n)
        return [self.problems[i] for i in idx.tolist()]

    def reward(self, completion: str, problem: Problem, *, terminated: bool) -> float:
        return float(check_answer(completion, problem.answer))

    def max_answer_len(self) -> int:
        return max(len(p.answer) for p in self.problems)
