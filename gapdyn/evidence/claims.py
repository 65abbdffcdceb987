"""Claims as data: one record per tested statement, its verdict decided by a rule (docs/evidence.md).

A claim carries where it comes from (paper + theorem/equation, or "beyond the papers"), what was
measured (statistic, estimate, 95 % interval, n), the criterion written before the run (as text,
printed literally, and as a machine-checkable :class:`Criterion`), and a verdict that
:func:`decide_verdict` computes from the interval and the criterion, never set by hand:

* ``holds``          the whole interval satisfies the criterion (and, for a test, p_adjusted < alpha);
* ``does not hold``  the whole interval violates it;
* ``inconclusive``   the interval straddles it (or the test is not significant after Holm);
* ``identity``       true by construction (e.g. an exact rescaling); shown, never counted.

Every claim has a **form** (``Claim.form``, one of FORMS), and its criterion follows the form:

* ``bound``       an inequality the paper proves or states: tested by its violations (the share of
                  cases violating it, decided on a one-sided upper limit) with its conservativeness
                  (measured / bound) reported beside it;
* ``law``         a scaling or functional law: an equivalence test (``Criterion.equivalence``: the 90 %
                  interval inside the tolerance band holds, entirely outside does not hold);
* ``existence``   "there is a setting where ...": shown on a realisable setting with an interval
                  that excludes the null;
* ``comparison``  method A vs method B: one-sided tests; Holm over the pre-declared ``primary`` rows
                  only, exploratory rows unadjusted and labelled so;
* ``derived``     a consequence of the model's own equations or of first-order algebra, and
* ``identity``    true by construction: both shown, never counted (``counts_as_evidence`` is False).

Every claim also names the statement it is about by a **key** (``Claim.key``, a key of :data:`STATEMENTS`,
e.g. ``("Suk & Duan", "Theorem 2")``; None for a row that tests no registered statement) and its **role**
(``Claim.role``, one of ROLES): ``test`` (the statement tested in its own setting and form), ``premise`` (a
check that a test's premise holds) or ``exploratory`` (beyond the statement's premise or form). A row counts
under a statement only when its key is that statement, its role is ``test``, its form is counted and its block
is confirmation (:func:`listing`); every other row is listed apart.

Experiments run a discovery block (seeds 0-19) and a confirmation block (seeds 1000-1019);
:func:`replication_table` shows the confirmation verdict and flags disagreement.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np

VERDICTS = ("holds", "does not hold", "inconclusive", "identity")
BLOCKS = ("discovery", "confirmation")
DISCOVERY_SEEDS = tuple(range(0, 20))
"""Default seeds of the discovery block."""
CONFIRMATION_SEEDS = tuple(range(1000, 1020))
"""Default seeds of the confirmation block (disjoint from discovery)."""
CRITERION_KINDS = ("above", "below", "inside", "contains", "identity", "equivalence")
FORMS = ("bound", "law", "existence", "comparison", "derived", "identity")
"""The form of a claim's statement; derived and identity rows are shown but never counted."""
COUNTED_FORMS = ("bound", "law", "existence", "comparison")
EQUIVALENCE_CONFIDENCE = 0.90
"""Two one-sided tests at 5 % each: a law is decided on the 90 % interval."""
ROLES = ("test", "premise", "exploratory")
"""What a row does for its statement: tests it (counted), checks a test's premise, or explores beyond it."""
LISTINGS = ("counted", "premise", "exploratory", "discovery only", "derived", "identity")
"""Where :func:`listing` puts a decided row; only "counted" rows enter a statement's counts."""


@dataclass(frozen=True)
class Statement:
    """One statement that claims can test: ``paper`` and ``item`` make its key; ``text`` says it; ``cite`` is
    where it is stated; ``note`` says where it is covered instead when no claim of the project tests it."""

    paper: str
    item: str
    text: str
    cite: str
    note: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.paper, self.item)


_SD, _WAPO, _CUI = "Suk & Duan (arXiv 2510.08539)", "WAPO (arXiv 2606.16154)", "Cui et al. 2025 (arXiv 2505.22617)"
_UNIT_TESTS = "checked by the unit tests (closed form vs finite differences / Monte Carlo), not by a claim"
_NO_CPU = "not reproducible on a CPU (model scale); the tiny-Qwen runs are the stand-in"
STATEMENTS: dict[tuple[str, str], Statement] = {s.key: s for s in (
    Statement("Suk & Duan", "Gap direction", "grad Phi = g+ - g- (the Gradient Gap is the gradient of the "
              "log-odds); every method's expected direction is a scalar times the Gap", f"{_SD}, eq. of E[w] = "
              "scalar x Gap"),
    Statement("Suk & Duan", "Theorem 1", "J(K) >= sigmoid(logit J0 + M(K)/2) under the step condition; accuracy "
              "is logistic in M", f"{_SD}, Thm 1"),
    Statement("Suk & Duan", "Theorem 2", "above a step-size threshold even aligned steps collapse J to 0",
              f"{_SD}, Thm 2"),
    Statement("Suk & Duan", "Theorem 3", "eta* ~ (1 - J)/T; 1/|o| normalisation cancels one T", f"{_SD}, Thm 3"),
    Statement("Suk & Duan", "stagnation", "a fixed eta stagnates below J = 1; convergence must be judged by M "
              "(not gradient norms)", f"{_SD}, Thm 3 discussion"),
    Statement("Suk & Duan", "LLM runs", "GRPO on Qwen2.5-Math-7B (the paper's LLM runs)", _SD, _NO_CPU),
    Statement("WAPO", "token taxonomy", "peak/valley x sign of A predicts the sign of the entropy change",
              f"{_WAPO}, token taxonomy"),
    Statement("WAPO", "stability", "WAPO keeps the Gap direction and down-weights solved prompts ((1 - J) "
              "factor): more stable than GRPO / Dr. GRPO at equal step", _WAPO),
    Statement("WAPO", "collapse modes", "collapse modes of RLVR runs (high-entropy off-task; repetitive "
              "malformed)", _WAPO, "shown in figure 7 (alerts by llm_probe's documented collapse rule); no "
              "claim: the paper's criterion is not public"),
    Statement("WAPO", "LLM runs", "WAPO vs GRPO/DAPO/GSPO on 1.5B-4B models, MATH-500 etc. (the paper's LLM "
              "runs)", _WAPO, _NO_CPU),
    Statement("Yu et al.", "clip-higher", "clip-higher counters entropy collapse", "Yu et al. 2025 (DAPO, arXiv "
              "2503.14476)"),
    Statement("Zhu et al.", "NSR vs PSR", "negative samples (NSR) keep pass@k at large k better than positive "
              "ones (PSR)", "Zhu et al. 2025 (arXiv 2506.01347)"),
    Statement("Cui et al.", "Lemma 1", "per state, dH = -Cov(log pi, dz) to first order in the logit change",
              f"{_CUI}, Lemma 1"),
    Statement("Cui et al.", "Theorems 1-2", "under (natural) policy gradient the entropy change follows "
              "-eta Cov(log pi, pi A) (-eta Cov(log pi, A))", f"{_CUI}, Thms 1-2"),
    Statement("beyond the papers", "safe step rule", "the safe step rule keeps runs at a collapse lr from ending "
              "collapsed without slowing learning at a safe lr", "docs/theory.md section 11"),
    Statement("beyond the papers", "early warning", "a per-step statistic of the probe warns of the final "
              "collapse earlier than the falling reward", "llm_probe.experiments.early_warning"),
)}
"""The registry of statements, in the order the tables list them: the one place a statement key is defined."""


def statement_key(key, name: str = "key") -> tuple[str, str] | None:
    """``key`` as a registered statement key (a (paper, item) pair of :data:`STATEMENTS`), or None."""
    if key is None:
        return None
    if (isinstance(key, (str, bytes)) or not isinstance(key, Sequence) or len(key) != 2
            or not all(isinstance(k, str) for k in key) or tuple(key) not in STATEMENTS):
        raise ValueError(f"{name} must be None or a registered statement (paper, item), one of "
                         f"{sorted(STATEMENTS)}; got {key!r}")
    return tuple(key)


def _role(role, name: str = "role") -> str:
    if role not in ROLES:
        raise ValueError(f"{name} must be one of {ROLES}, got {role!r}")
    return role


def _finite(v, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class Criterion:
    """A machine-checkable criterion on a claim's 95 % interval [lo, hi].

    kind "above" (value):         holds if lo > value; does not hold if hi <= value.
    kind "below" (value):         holds if hi < value; does not hold if lo >= value.
    kind "inside" (lo, hi):       holds if the interval lies in [lo, hi]; does not hold if disjoint.
    kind "contains" (value, tol): holds if lo <= value <= hi and (tol given) the interval lies in
                                  [value - tol, value + tol]; does not hold if value is outside;
                                  a containing interval wider than that is inconclusive.
    kind "identity" (value, tol): verdict "identity" if |estimate - value| <= tol, else "does not
                                  hold" (a broken identity is a defect and must show).
    kind "equivalence" (lo, hi):  a law's tolerance band, decided on the claim's 90 % interval (two
                                  one-sided tests): holds if inside [lo, hi], does not hold if the
                                  interval lies entirely outside, inconclusive otherwise.
    alpha: for claims that are tests, "holds" also needs p_adjusted < alpha (Holm-adjusted).
    Build with the class methods: Criterion.above(0), Criterion.inside(0.4, 0.6), ...
    """

    kind: str
    value: float | None = None
    lo: float | None = None
    hi: float | None = None
    tol: float | None = None
    alpha: float | None = None

    def __post_init__(self):
        if self.kind not in CRITERION_KINDS:
            raise ValueError(f"kind must be one of {CRITERION_KINDS}, got {self.kind!r}")
        for name in ("value", "lo", "hi", "tol", "alpha"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, _finite(v, name))
        need = {"above": ("value",), "below": ("value",), "inside": ("lo", "hi"),
                "contains": ("value",), "identity": ("value", "tol"), "equivalence": ("lo", "hi")}[self.kind]
        for name in need:
            if getattr(self, name) is None:
                raise ValueError(f"{name} is required for a criterion of kind {self.kind!r}")
        if self.kind in ("inside", "equivalence") and not self.lo < self.hi:
            raise ValueError(f"hi must exceed lo for {self.kind!r}, got [{self.lo}, {self.hi}]")
        if self.tol is not None and self.tol < 0:
            raise ValueError(f"tol must be >= 0, got {self.tol}")
        if self.alpha is not None and not 0 < self.alpha < 1:
            raise ValueError(f"alpha must lie in (0, 1), got {self.alpha}")

    @classmethod
    def above(cls, value: float, *, alpha: float | None = None) -> Criterion:
        return cls("above", value=value, alpha=alpha)

    @classmethod
    def below(cls, value: float, *, alpha: float | None = None) -> Criterion:
        return cls("below", value=value, alpha=alpha)

    @classmethod
    def inside(cls, lo: float, hi: float, *, alpha: float | None = None) -> Criterion:
        return cls("inside", lo=lo, hi=hi, alpha=alpha)

    @classmethod
    def equivalence(cls, lo: float, hi: float) -> Criterion:
        """A law's tolerance band [lo, hi], decided on a 90 % interval (TOST at 5 %)."""
        return cls("equivalence", lo=lo, hi=hi)

    @classmethod
    def contains(cls, value: float, *, tol: float | None = None) -> Criterion:
        return cls("contains", value=value, tol=tol)

    @classmethod
    def identity(cls, value: float, *, tol: float) -> Criterion:
        return cls("identity", value=value, tol=tol)

    def describe(self) -> str:
        """The criterion as one line of text (what the tables print)."""
        text = {
            "above": lambda: f"interval above {self.value:g}",
            "below": lambda: f"interval below {self.value:g}",
            "inside": lambda: f"interval inside [{self.lo:g}, {self.hi:g}]",
            "equivalence": lambda: f"90 % interval inside the band [{self.lo:g}, {self.hi:g}] (equivalence); "
                                   "entirely outside: does not hold",
            "contains": lambda: f"interval contains {self.value:g}"
            + ("" if self.tol is None else f" and lies within ±{self.tol:g} of it"),
            "identity": lambda: f"identity: estimate = {self.value:g} ± {self.tol:g}",
        }[self.kind]()
        return text + ("" if self.alpha is None else f"; Holm-adjusted p < {self.alpha:g}")

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: Mapping) -> Criterion:
        return cls(**dict(d))


@dataclass(frozen=True)
class ClaimSpec:
    """What a claim states and how it is judged, frozen before any run.

    source: "Suk & Duan (arXiv 2510.08539), Thm 2" or "beyond the papers"; statement: the claim in
    words; form: one of FORMS; criterion: the machine-checkable rule (its text is derived from it,
    ``criterion_text``); primary: a pre-declared primary comparison; key: the registered statement it is
    about (:data:`STATEMENTS`; None: none); role: one of ROLES (test, premise, exploratory).
    """

    source: str
    statement: str
    form: str
    criterion: Criterion
    primary: bool = False
    key: tuple[str, str] | None = None
    role: str = "test"

    def __post_init__(self):
        for name in ("source", "statement"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string")
        if self.form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {self.form!r}")
        if not isinstance(self.criterion, Criterion):
            raise ValueError("criterion must be a Criterion")
        if (self.form == "identity") != (self.criterion.kind == "identity"):
            raise ValueError("form 'identity' and an identity criterion go together")
        if self.primary and self.form != "comparison":
            raise ValueError("only comparisons are primary")
        object.__setattr__(self, "key", statement_key(self.key))
        _role(self.role)

    @property
    def criterion_text(self) -> str:
        return self.criterion.describe()


def keyed_specs(specs: Mapping[str, ClaimSpec],
                keys: Mapping[str, tuple[tuple[str, str] | None, str]]) -> dict[str, ClaimSpec]:
    """``specs`` with each claim's statement key and role set from ``keys`` ({claim id: (key, role)}, naming
    every claim of ``specs`` and no other): an experiment declares what each row tests beside its criterion."""
    if set(keys) != set(specs):
        raise ValueError(f"keys must name the claims of specs; differ on {sorted(set(keys) ^ set(specs))}")
    out = {}
    for cid, spec in specs.items():
        kr = keys[cid]
        if not isinstance(kr, tuple) or len(kr) != 2:
            raise ValueError(f"keys[{cid!r}] must be (statement key or None, role), got {kr!r}")
        out[cid] = replace(spec, key=kr[0], role=kr[1])
    return out


def decide_verdict(estimate: float, lo: float, hi: float, criterion: Criterion, *,
                   p_adjusted: float | None = None) -> str:
    """The verdict of a claim from its estimate, interval [lo, hi] and criterion (see Criterion). For a test,
    p_adjusted gates "holds" only: not significant, an interval that satisfies the criterion is inconclusive,
    and "does not hold" still needs the whole interval to violate it."""
    estimate, lo, hi = _finite(estimate, "estimate"), _finite(lo, "lo"), _finite(hi, "hi")
    if lo > hi:
        raise ValueError(f"interval must satisfy lo <= hi, got [{lo}, {hi}]")
    if not isinstance(criterion, Criterion):
        raise ValueError("criterion must be a Criterion")
    c = criterion
    if c.kind == "identity":
        return "identity" if abs(estimate - c.value) <= c.tol else "does not hold"
    if c.kind == "above":
        verdict = "holds" if lo > c.value else "does not hold" if hi <= c.value else "inconclusive"
    elif c.kind == "below":
        verdict = "holds" if hi < c.value else "does not hold" if lo >= c.value else "inconclusive"
    elif c.kind in ("inside", "equivalence"):
        verdict = ("holds" if c.lo <= lo and hi <= c.hi
                   else "does not hold" if hi < c.lo or lo > c.hi else "inconclusive")
    else:  # contains
        if not lo <= c.value <= hi:
            verdict = "does not hold"
        elif c.tol is None or (c.value - c.tol <= lo and hi <= c.value + c.tol):
            verdict = "holds"
        else:
            verdict = "inconclusive"
    if c.alpha is not None and verdict == "holds":
        if p_adjusted is None:
            raise ValueError("p_adjusted is required: the criterion has alpha (the claim is a test)")
        if not p_adjusted < c.alpha:
            verdict = "inconclusive"
    return verdict


def canonical_hash(obj) -> str:
    """SHA-256 (first 16 hex digits) of ``obj``'s canonical JSON (keys sorted): the hash recorded for anything fixed
    before a block runs (criteria, alarm specs)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def criteria_hash(criteria: Mapping[str, Criterion]) -> str:
    """SHA-256 (first 16 hex digits) of the criteria by claim id, canonical JSON; order-independent."""
    if not isinstance(criteria, Mapping) or not all(isinstance(v, Criterion) for v in criteria.values()):
        raise ValueError("criteria must be a mapping claim id -> Criterion")
    return canonical_hash({str(k): v.to_dict() for k, v in criteria.items()})


@dataclass(frozen=True)
class Claim:
    """One tested statement with its verdict (decided in __post_init__ by :func:`decide_verdict`).

    id: stable key (same across blocks); source: "Suk & Duan (arXiv 2510.08539), Thm 2" or
    "beyond the papers"; statement: the claim in words; setting: instance, horizon, seeds;
    statistic: what the estimate is; estimate, interval (lo, hi), n, confidence: the measurement;
    criterion_text: written from the paper before the run, printed literally; criterion: its
    machine-checkable form; p_value / p_adjusted: for claims that are tests; block: "discovery" or
    "confirmation"; previously_measured: an earlier value, for the table only; criteria_hash: hash of
    the frozen criteria the claim was judged against; measured: False when the statistic could not be
    computed (too few qualifying instances): the verdict is then "inconclusive" whatever the criterion,
    identities included; reason: why it is not measured (required then), e.g. "too few instances for a
    valid interval". form: one of FORMS (an identity criterion implies "identity"); primary: a
    pre-declared primary comparison (Holm runs over the primaries of a block only); n_planned: the n the
    planner asked for (gapdyn.evidence.planner); conservativeness: measured / bound, for bounds; key: the
    registered statement the row is about (:data:`STATEMENTS`; None: none); role: test, premise or
    exploratory (ROLES). verdict: computed, not an argument; ``why`` says why a claim is inconclusive.
    """

    id: str
    source: str
    statement: str
    setting: str
    statistic: str
    estimate: float
    interval: tuple[float, float]
    n: int
    criterion_text: str
    criterion: Criterion
    block: str = "discovery"
    p_value: float | None = None
    p_adjusted: float | None = None
    confidence: float = 0.95
    previously_measured: str | None = None
    criteria_hash: str | None = None
    measured: bool = True
    form: str | None = None
    primary: bool = False
    reason: str = ""
    n_planned: int | None = None
    conservativeness: float | None = None
    key: tuple[str, str] | None = None
    role: str = "test"
    verdict: str = field(init=False)

    def __post_init__(self):
        for name in ("id", "source", "statement", "setting", "statistic", "criterion_text"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string")
        if self.block not in BLOCKS:
            raise ValueError(f"block must be one of {BLOCKS}, got {self.block!r}")
        if isinstance(self.n, bool) or int(self.n) != self.n or self.n < 1:
            raise ValueError(f"n must be a positive integer, got {self.n!r}")
        if len(tuple(self.interval)) != 2:
            raise ValueError(f"interval must be (lo, hi), got {self.interval!r}")
        lo, hi = (_finite(v, "interval") for v in self.interval)
        object.__setattr__(self, "interval", (lo, hi))
        object.__setattr__(self, "estimate", _finite(self.estimate, "estimate"))
        object.__setattr__(self, "n", int(self.n))
        for name in ("p_value", "p_adjusted"):
            v = getattr(self, name)
            if v is not None and not 0 <= _finite(v, name) <= 1:
                raise ValueError(f"{name} must lie in [0, 1], got {v!r}")
        if self.p_adjusted is not None and self.p_value is not None and self.p_adjusted < self.p_value:
            raise ValueError("p_adjusted must be >= p_value")
        if not isinstance(self.measured, bool):
            raise ValueError(f"measured must be a bool, got {self.measured!r}")
        if not isinstance(self.criterion, Criterion):
            raise ValueError("criterion must be a Criterion")
        if self.form is None and self.criterion.kind == "identity":
            object.__setattr__(self, "form", "identity")
        if self.form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {self.form!r}")
        if (self.form == "identity") != (self.criterion.kind == "identity"):
            raise ValueError(f"form 'identity' and an identity criterion go together (form {self.form!r}, "
                             f"criterion {self.criterion.kind!r})")
        if self.criterion.kind == "equivalence" and abs(self.confidence - EQUIVALENCE_CONFIDENCE) > 1e-12:
            raise ValueError(f"an equivalence criterion is decided on a {EQUIVALENCE_CONFIDENCE * 100:g} % interval, "
                             f"got confidence {self.confidence!r}")
        if not isinstance(self.primary, bool) or (self.primary and self.form != "comparison"):
            raise ValueError(f"primary must be a bool and only comparisons are primary, got {self.primary!r} "
                             f"for form {self.form!r}")
        if not isinstance(self.reason, str) or (not self.measured and not self.reason):
            raise ValueError("reason must be a string, and a claim that is not measured must say why")
        if self.n_planned is not None and (isinstance(self.n_planned, bool) or int(self.n_planned) != self.n_planned
                                           or self.n_planned < 1):
            raise ValueError(f"n_planned must be None or a positive integer, got {self.n_planned!r}")
        if self.conservativeness is not None:
            object.__setattr__(self, "conservativeness", _finite(self.conservativeness, "conservativeness"))
        object.__setattr__(self, "key", statement_key(self.key))
        _role(self.role)
        verdict = (decide_verdict(self.estimate, lo, hi, self.criterion, p_adjusted=self.p_adjusted)
                   if self.measured else "inconclusive")
        object.__setattr__(self, "verdict", verdict)

    @classmethod
    def from_estimate(cls, estimate, **fields) -> Claim:
        """Build a claim from a :class:`gapdyn.Estimate` (estimate, interval, n, confidence taken from it); a
        :class:`gapdyn.evidence.stats.NotMeasured` gives a claim that is not measured, with its reason."""
        from .stats import NotMeasured

        try:
            measured = dict(estimate=estimate.estimate, interval=(estimate.lo, estimate.hi), n=estimate.n,
                            confidence=estimate.confidence)
            unmeasured = isinstance(estimate, NotMeasured)
            fields.setdefault("measured", not unmeasured)
            if not fields["measured"]:
                why = estimate.reason if unmeasured else ""
                fields.setdefault("reason", why or "too few qualifying instances to compute the statistic")
        except AttributeError as exc:
            raise ValueError("estimate must be a gapdyn.Estimate (estimate, lo, hi, n, confidence)") from exc
        clash = sorted(set(measured) & set(fields))
        if clash:
            raise ValueError(f"fields {clash} come from the estimate; do not pass them")
        return cls(**measured, **fields)

    @property
    def counts_as_evidence(self) -> bool:
        """Derived and identity rows are shown but never counted."""
        return self.form in COUNTED_FORMS

    @property
    def why(self) -> str:
        """Why the claim is inconclusive ("" otherwise): not measured (and why), or the interval straddles."""
        if self.verdict != "inconclusive":
            return ""
        if not self.measured:
            return f"not measured: {self.reason}"
        plan = "" if self.n_planned is None else f" (n planned {self.n_planned}, used {self.n})"
        if (self.criterion.alpha is not None and self.p_adjusted is not None
                and decide_verdict(self.estimate, *self.interval, replace(self.criterion, alpha=None)) == "holds"):
            return f"not significant after adjustment (p = {self.p_adjusted:.3g}){plan}"
        return f"interval straddles the criterion{plan}" + (f"; {self.reason}" if self.reason else "")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["interval"] = list(self.interval)
        d["criterion"] = self.criterion.to_dict()
        d["key"] = None if self.key is None else list(self.key)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> Claim:
        """Rebuild a claim; a stored verdict that the rule no longer gives is an error, and so is a record
        that is not a mapping or lacks a required field (ValueError naming it)."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a claim must be a JSON object, got {type(d).__name__}")
        d = dict(d)
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise ValueError(f"claim {d.get('id', '?')!r} has no {', '.join(missing)}")
        unknown = sorted(set(d) - _FIELDS - {"verdict"})
        if unknown:
            raise ValueError(f"claim {d['id']!r} has unknown fields {unknown}")
        stored = d.pop("verdict", None)
        if not isinstance(d["criterion"], Mapping):
            raise ValueError(f"claim {d['id']!r}: criterion must be a JSON object, got {d['criterion']!r}")
        try:
            d["criterion"] = Criterion.from_dict(d["criterion"])
        except TypeError as exc:
            raise ValueError(f"claim {d['id']!r}: criterion {d['criterion']!r} is not a criterion") from exc
        if isinstance(d["interval"], (str, bytes)) or not isinstance(d["interval"], Sequence):
            raise ValueError(f"claim {d['id']!r}: interval must be a list [lo, hi], got {d['interval']!r}")
        d["interval"] = tuple(d["interval"])
        claim = cls(**d)
        if stored is not None and stored != claim.verdict:
            raise ValueError(f"claim {claim.id!r}: stored verdict {stored!r} differs from the rule's {claim.verdict!r}")
        return claim


_FIELDS = {f.name for f in fields(Claim) if f.init}
_REQUIRED = ("id", "source", "statement", "setting", "statistic", "estimate", "interval", "n", "criterion_text",
             "criterion")


def listing(claim: Claim, *, confirmation_only: bool = True) -> str:
    """Where a decided row is listed (one of LISTINGS), by its own fields, in this order: its form when it is
    derived or identity; "discovery only" when its block is discovery (and ``confirmation_only``); its role
    when premise or exploratory; "exploratory" when it names no statement (key None); else "counted": a test of
    its statement, counted under ``claim.key``."""
    if not claim.counts_as_evidence:
        return claim.form
    if confirmation_only and claim.block != "confirmation":
        return "discovery only"
    if claim.role != "test":
        return claim.role
    return "exploratory" if claim.key is None else "counted"


def claims_to_json(claims: Iterable[Claim]) -> str:
    """Serialise claims to a JSON list of plain dicts."""
    return json.dumps([c.to_dict() for c in claims], indent=1)


def claims_from_json(text: str) -> list[Claim]:
    """Inverse of :func:`claims_to_json` (verdicts re-decided and checked)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"text is not valid JSON ({exc})") from None
    if not isinstance(data, list):
        raise ValueError(f"text must hold a JSON list of claims, got {type(data).__name__}")
    out = []
    for i, d in enumerate(data):
        try:
            out.append(Claim.from_dict(d))
        except ValueError as exc:
            raise ValueError(f"claim {i}: {exc}") from None
    return out


def holm_adjust_claims(claims: Sequence[Claim]) -> list[Claim]:
    """Set p_adjusted (Holm over the primary claims that carry a p-value) and re-decide their verdicts.

    Exploratory tests (primary False) keep p_adjusted = p_value: unadjusted, and labelled exploratory in
    the tables. If no claim is marked primary, every test is treated as one family (the older rule).
    """
    from .stats import holm_adjust

    tested = [i for i, c in enumerate(claims) if c.p_value is not None]
    if any(claims[i].primary for i in tested):
        out = [replace(c, p_adjusted=c.p_value) if c.p_value is not None and not c.primary else c for c in claims]
        claims = out
        tested = [i for i in tested if claims[i].primary]
    out = list(claims)
    if tested:
        adj = holm_adjust([claims[i].p_value for i in tested])
        for i, p in zip(tested, adj):
            out[i] = replace(claims[i], p_adjusted=float(p))
    return out


def count_verdicts(claims: Iterable[Claim]) -> dict[str, int]:
    """How many evidence claims hold / do not hold / are inconclusive; identity and derived rows apart.

    Keys: the three evidence verdicts, "identity" and "derived" (rows of those forms, whatever their
    verdict: a broken identity shows as "does not hold" in the tables, not here).
    """
    counts = dict.fromkeys(("holds", "does not hold", "inconclusive", "identity", "derived"), 0)
    for c in claims:
        counts[c.verdict if c.counts_as_evidence else c.form] += 1
    return counts


TABLE_COLUMNS = ("id", "block", "form", "source", "statement", "setting", "statistic", "estimate", "lo", "hi", "n",
                 "n_planned", "criterion", "verdict", "why", "primary", "p_value", "p_adjusted", "conservativeness",
                 "previously_measured", "criteria_hash")


def claims_table(claims: Iterable[Claim]):
    """A pandas DataFrame with one row per claim (pandas imported lazily)."""
    import pandas as pd

    rows = []
    for c in claims:
        d = c.to_dict()
        d["lo"], d["hi"] = c.interval
        if not c.measured:  # no placeholder numbers: the row says "not measured" and why
            d["estimate"] = d["lo"] = d["hi"] = math.nan
        d["criterion"] = c.criterion_text
        d["why"] = c.why
        rows.append({k: d[k] for k in TABLE_COLUMNS})
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(df, columns: Sequence[str] | None = None) -> str:
    """Render a DataFrame (e.g. from :func:`claims_table`) as a GitHub markdown table."""
    cols = list(df.columns if columns is None else columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df[cols].itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines)


def claims_markdown(claims: Iterable[Claim], columns: Sequence[str] = (
        "id", "block", "form", "source", "statistic", "estimate", "lo", "hi", "n", "n_planned", "criterion", "verdict",
        "why")) -> str:
    """The claims as a markdown table (the form column marks derived and identity rows, never counted)."""
    return markdown_table(claims_table(claims), columns)


def replication_table(discovery: Iterable[Claim], confirmation: Iterable[Claim]):
    """One row per claim id: both blocks' verdicts, the verdict shown (confirmation's) and a flag.

    verdict = the confirmation verdict ("" when no confirmation claim exists); agree = both blocks
    reached the same verdict; flag = "disagree", "no confirmation" or "" .
    """
    import pandas as pd

    disc = {c.id: c for c in discovery}
    conf = {c.id: c for c in confirmation}
    for name, group, block in (("discovery", disc, "discovery"), ("confirmation", conf, "confirmation")):
        bad = [c.id for c in group.values() if c.block != block]
        if bad:
            raise ValueError(f"{name} claims must have block={block!r}; wrong: {bad}")
    rows = []
    for cid in list(disc) + [k for k in conf if k not in disc]:
        d, c = disc.get(cid), conf.get(cid)
        dv = d.verdict if d else ""
        cv = c.verdict if c else ""
        agree = bool(d and c and dv == cv)
        flag = "" if agree else "no confirmation" if c is None else "no discovery" if d is None else "disagree"
        ref = c or d
        rows.append({"id": cid, "source": ref.source, "statistic": ref.statistic,
                     "estimate": c.estimate if c else math.nan,
                     "lo": c.interval[0] if c else math.nan, "hi": c.interval[1] if c else math.nan,
                     "criterion": ref.criterion_text, "discovery": dv, "confirmation": cv,
                     "verdict": cv, "agree": agree, "flag": flag})
    return pd.DataFrame(rows)
