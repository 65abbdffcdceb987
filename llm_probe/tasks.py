"""Verifiable tasks with binary rewards: a bundled addition task and a JSONL question/answer loader.

- :class:`AdditionTask`: "12+34=" -> "46" followed by <eos>; reward 1 only for that exact token string
  (strict format: no extra characters, the end token must follow the answer). Deterministic given a
  ``numpy.random.Generator``.
- :class:`JsonlTask`: problems read from a JSONL file (``{"question": ..., "answer": ...}`` per line,
  GSM8K-style answers "... #### 42" are reduced to "42"); reward 1 when :func:`check_answer` accepts
  the completion's final answer.
- :func:`extract_answer` / :func:`check_answer`: final answer from the last ``\\boxed{...}`` or
  ``#### x`` (whichever comes later), else the last number; numeric normalisation (commas, $, %,
  trailing zeros, simple fractions) with ASCII digits only.

The checker runs on every sampled completion during training, so its work is bounded on any
string: it looks at the last :data:`MAX_ANSWER_TEXT` characters, numbers have at most
:data:`MAX_NUMBER_DIGITS` digits and no exponent (``1e10000000`` is text, never a float or an
integer of ten million digits), and it never raises on a string.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

__all__ = ["Problem", "AdditionTask", "JsonlTask", "load_jsonl_problems", "iter_jsonl_objects", "extract_answer", "normalize_answer", "check_answer",
           "canonical_number"]


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


MAX_ANSWER_TEXT = 4096
"""Characters of a completion (its end) that the answer extraction looks at."""
MAX_NUMBER_DIGITS = 64
"""Longer digit strings are compared as text, never converted to a number."""

# ASCII digits only ([0-9], not \d: "١٢" or "１２" are not the number 12)
_BOXED = re.compile(r"\\boxed\s*\{")
_HASH = re.compile(r"####[ \t]*([^\n]*)")
_NUMBER = re.compile(r"-?\$?[0-9][0-9,]*(?:\.[0-9]+)?(?:/[0-9]+)?")
_LEADING_NUMBER = re.compile(r"\s*(-?\$?[0-9][0-9,]*(?:\.[0-9]+)?(?:/[0-9]+)?)(?=\s)")
_PLAIN_NUMBER = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]+))?(?:/([0-9]+))?", re.ASCII)


def _boxed_contents(text: str, start: int) -> str | None:
    """Contents of the \\boxed{...} whose brace opens at ``start``, braces balanced (None if unclosed)."""
    depth, j = 1, start
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[start : j - 1] if depth == 0 else None


def _leading_number(s: str) -> str:
    """"12 apples" -> "12": a final answer that starts with a number is that number."""
    m = _LEADING_NUMBER.match(s)
    return m.group(1) if m and m.end() < len(s.rstrip()) else s


def extract_answer(text: str) -> str | None:
    """Final answer of a solution text: the last \\boxed{..} or '#### x', whichever comes later
    (a number followed by words counts as the number), else the last number. Looks at the last
    MAX_ANSWER_TEXT characters only."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a string, got {type(text).__name__}")
    text = text[-MAX_ANSWER_TEXT:]
    boxed = [m.end() for m in _BOXED.finditer(text)]
    hashes = list(_HASH.finditer(text))
    if boxed and (not hashes or boxed[-1] > hashes[-1].start()):
        b = _boxed_contents(text, boxed[-1])
        if b is not None:
            return _leading_number(b.strip()) if b.strip() else None
    if hashes:
        h = hashes[-1].group(1).strip()
        return _leading_number(h) if h else None
    nums = _NUMBER.findall(text)
    return nums[-1] if nums else None


def _parse_number(t: str) -> Fraction | None:
    """An ASCII decimal or fraction ("-1000.50", "3/4", ".5") as an exact Fraction; None otherwise.

    No exponents, at most MAX_NUMBER_DIGITS digits: the work is bounded by the string's length.
    """
    m = _PLAIN_NUMBER.fullmatch(t)
    if m is None or not (m.group(2) or m.group(3)):
        return None
    sign, whole, frac, den = m.group(1), m.group(2) or "0", m.group(3) or "", m.group(4)
    if len(whole) + len(frac) + len(den or "") > MAX_NUMBER_DIGITS:
        return None
    value = Fraction(int(whole + frac), 10 ** len(frac))
    if den is not None:
        if int(den) == 0:
            return None
        value /= int(den)
    return -value if sign == "-" else value


def _decimal_string(v: Fraction) -> str | None:
    """The exact decimal of a fraction whose denominator is 2^a 5^b ("1000.5"), else None."""
    d, twos, fives = v.denominator, 0, 0
    while d % 2 == 0:
        d, twos = d // 2, twos + 1
    while d % 5 == 0:
        d, fives = d // 5, fives + 1
    if d != 1:
        return None
    n = max(twos, fives)
    digits = str(abs(v.numerator) * 10**n // v.denominator).rjust(n + 1, "0")
    out = f"{digits[:-n]}.{digits[-n:]}".rstrip("0").rstrip(".")
    return ("-" if v < 0 else "") + out


def normalize_answer(ans: str) -> str:
    """Canonical form: numbers without commas/$/%/trailing zeros ("1,000.50" -> "1000.5", "3/4" kept
    as an exact fraction, "\\frac{3}{4}" -> "3/4"); other text stripped, lower-cased, spaces collapsed.
    Only the first MAX_ANSWER_TEXT characters are looked at."""
    if not isinstance(ans, str):
        raise ValueError(f"ans must be a string, got {type(ans).__name__}")
    s = ans[:MAX_ANSWER_TEXT].strip().rstrip(".")
    s = s if s[1:2] in tuple("0123456789") else s.lstrip(".")  # ".5" is a number; ". text" is not
    s = s.replace("\\!", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = re.sub(r"\\(?:d|t)?frac\{([^{}]+)\}\{([^{}]+)\}", r"\1/\2", s)
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s).strip()
    v = _parse_number(s.replace(",", "").replace(" ", ""))
    if v is None:
        return " ".join(s.lower().split())
    if v.denominator == 1:
        return str(v.numerator)
    dec = _decimal_string(v)
    return dec if dec is not None else f"{v.numerator}/{v.denominator}"


def check_answer(completion: str, reference: str) -> bool:
    """True iff the completion's final answer equals the reference after :func:`normalize_answer`
    (numbers compared exactly as fractions; GSM8K references "... #### 42" are reduced first).
    Bounded work and no exception for any pair of strings (ValueError for non-strings)."""
    for name, v in (("completion", completion), ("reference", reference)):
        if not isinstance(v, str):
            raise ValueError(f"{name} must be a string, got {type(v).__name__}")
    ref = extract_answer(reference) if ("####" in reference or "\\boxed" in reference) else reference
    got = extract_answer(completion)
    if got is None or ref is None:
        return False
    return normalize_answer(got[:MAX_ANSWER_TEXT]) == normalize_answer(ref[:MAX_ANSWER_TEXT])


class _Number(str):
    """A JSON number kept as its literal text (``exact_numbers=True`` of :func:`iter_jsonl_objects`)."""


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a finite number")


def _finite_float(literal: str) -> float:
    v = float(literal)
    if v in (float("inf"), float("-inf")):
        raise ValueError(f"{literal} is not a finite float64 number")
    return v


def _jsonl_lines(p: Path, where: str):
    """(line number, text) of every line of ``p``; records end at b"\n" only. A line that is not UTF-8 is a
    ValueError naming the file, the line and the byte offset within it."""
    for n, raw in enumerate(p.read_bytes().split(b"\n"), 1):
        try:
            yield n, raw.decode("utf-8").removesuffix("\r")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{where}: line {n} is not valid UTF-8 (byte {exc.start} of the line: "
                             f"{raw[exc.start:exc.start + 1]!r})") from None


def iter_jsonl_objects(path: str | Path, *, name: str = "path", exact_numbers: bool = False):
    """(line number, object) of every non-blank line of a JSONL file; ValueError naming the file and the line for
    a missing file, a line that is not UTF-8, malformed JSON, NaN / Infinity / a float beyond float64 (1e400), an
    integer beyond Python's digit limit, or a non-object line. Records end at "\n" only: str.splitlines would also split inside strings
    holding U+2028, U+2029, U+0085, \x1c.. or \v / \f (valid raw in JSON). ``exact_numbers``: every number
    comes back as its literal text (a ``str`` subclass), no int or float conversion at all."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{name} must be an existing JSONL file, got {str(path)!r}")
    where = str(p)
    kw = {"parse_constant": _refuse_constant, "parse_float": _finite_float}
    if exact_numbers:
        kw.update(parse_int=_Number, parse_float=_Number)
    for n, line in _jsonl_lines(p, where):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, **kw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: line {n} is not valid JSON ({exc.msg})") from None
        except ValueError as exc:  # NaN / Infinity, or an integer beyond sys.get_int_max_str_digits()
            raise ValueError(f"{where}: line {n}: {' '.join(str(exc).split())[:200]}") from None
        except RecursionError:
            raise ValueError(f"{where}: line {n} nests too deeply to be read") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: line {n} must be a JSON object, got {type(obj).__name__}")
        yield n, obj


MAX_REFERENCE_CHARS = MAX_ANSWER_TEXT
"""Characters a numeric reference answer may take when written out in full (1e-5000 is refused, not expanded)."""


def canonical_number(literal: str) -> str:
    """The text a correct completion writes for the JSON number ``literal``: an integer's digits
    ("1e16" -> "10000000000000000", "-0" -> "0"), an exact decimal without exponent or trailing zeros
    ("1.50" -> "1.5", "2.5e-3" -> "0.0025"); ValueError for a value beyond float64's range (1e400, read as
    inf by float-based readers) or one longer than MAX_REFERENCE_CHARS characters written out."""
    from decimal import Context, Decimal, InvalidOperation

    if not isinstance(literal, str) or len(literal) > MAX_REFERENCE_CHARS:
        raise ValueError(f"a number of more than {MAX_REFERENCE_CHARS} characters is refused")
    integer = re.fullmatch(r"-?[0-9]+", literal) is not None  # exact in JSON and Python: no float range
    try:
        d = Decimal(literal)
    except InvalidOperation:
        raise ValueError(f"{literal!r} is not a number") from None
    if not d.is_finite() or (not integer and abs(d) > Decimal("1.7976931348623157e308")):
        raise ValueError(f"{literal} is not a finite float64 number (float-based readers read it as inf)")
    if d == 0:
        return "0"
    if d.adjusted() >= MAX_REFERENCE_CHARS or -d.adjusted() >= MAX_REFERENCE_CHARS:
        raise ValueError(f"{literal} would take more than {MAX_REFERENCE_CHARS} characters written out")
    text = format(d.normalize(Context(prec=2 * MAX_REFERENCE_CHARS + 2)), "f")  # exact: no rounding
    return text.rstrip("0").rstrip(".") if "." in text else text


def _field_text(v, key: str) -> str:
    """A question / answer field as text: a string as it is, a JSON number as :func:`canonical_number`."""
    if isinstance(v, _Number):
        return canonical_number(v)
    if isinstance(v, str):
        return v
    raise ValueError(f"the {key!r} field must be a string or a number, got "
                     f"{'null' if v is None else type(v).__name__}")


MAX_LISTED_ERRORS = 20
"""Malformed rows named in one error of :func:`load_jsonl_problems` (the rest are counted)."""


def load_jsonl_problems(path: str | Path, *, question_key: str = "question", answer_key: str = "answer") -> list[Problem]:
    """Problems from a JSONL file; one ValueError naming the file and the line of every malformed row (the
    first MAX_LISTED_ERRORS of them): a line that is not UTF-8 or not JSON, a non-object line, a
    missing/empty question or answer, a non-finite number (NaN, Infinity, 1e400) or an answer without a
    final answer. Numeric answers are the text a correct completion writes (:func:`canonical_number`:
    1e16 -> "10000000000000000", 1.50 -> "1.5")."""
    p = Path(path)
    where = str(p)
    if not p.is_file():
        raise ValueError(f"path must be an existing JSONL file, got {str(path)!r}")
    out, errors = [], []
    kw = {"parse_constant": _refuse_constant, "parse_int": _Number, "parse_float": _Number}
    try:
        lines = list(_jsonl_lines(p, where))
    except ValueError as exc:  # not UTF-8: list every such line
        lines = []
        for n, raw in enumerate(p.read_bytes().split(b"\n"), 1):
            try:
                lines.append((n, raw.decode("utf-8").removesuffix("\r")))
            except UnicodeDecodeError as err:
                errors.append(f"line {n} is not valid UTF-8 (byte {err.start} of the line)")
        if not errors:  # pragma: no cover - the same decoding twice
            raise exc
    for n, line in lines:
        if not line.strip():
            continue
        try:
            obj = json.loads(line, **kw)
            if not isinstance(obj, dict):
                raise ValueError(f"must be a JSON object, got {type(obj).__name__}")
            texts = {}
            for key in (question_key, answer_key):
                v = obj.get(key)
                if v is None or isinstance(v, bool) or (isinstance(v, str) and not v.strip()):
                    raise ValueError(f"lacks a non-empty {key!r} field")
                texts[key] = _field_text(v, key)
            ans = texts[answer_key]
            ref = extract_answer(ans) if "####" in ans or "\\boxed" in ans else ans.strip()
            if ref is None:
                raise ValueError(f"cannot extract an answer from {ans!r}")
            out.append(Problem(texts[question_key], ref))
        except json.JSONDecodeError as exc:
            errors.append(f"line {n} is not valid JSON ({exc.msg})")
        except RecursionError:
            errors.append(f"line {n} nests too deeply to be read")
        except ValueError as exc:
            errors.append(f"line {n}: {' '.join(str(exc).split())[:200]}")
    if errors:
        more = f"; and {len(errors) - MAX_LISTED_ERRORS} more" if len(errors) > MAX_LISTED_ERRORS else ""
        raise ValueError(f"{where}: {len(errors)} malformed row{'s' * (len(errors) > 1)}: "
                         f"{'; '.join(errors[:MAX_LISTED_ERRORS])}{more}")
    if not out:
        raise ValueError(f"{where}: the file holds no problems (empty)")
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
