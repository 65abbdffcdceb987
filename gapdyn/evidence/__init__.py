"""gapdyn.evidence: how a claim is decided from runs (docs/evidence.md).

Intervals and tests (``stats``), their measured coverage (``coverage``), sample sizes (``planner``), claim
records and verdicts (``claims``), the study protocol (``experiment``) and its runner (``runner``), resumable
sweeps and their store (``sweep``, ``store``), run outcomes and the eta* estimator (``collapse``), dose-response
fits (``dose``), online detectors (``detectors``) scored as alarms (``alarm``). The public names are exported
from :mod:`gapdyn`; a submodule loads on first access (``gapdyn.evidence.stats``), as in the parent package.
"""

from __future__ import annotations

from .._lazy import export_lazily as _export_lazily

_SUBMODULES = ("alarm", "claims", "collapse", "coverage", "detectors", "dose", "experiment", "planner", "runner",
               "stats", "store", "sweep")
"""The modules of this package (listed by ``dir()``)."""
_EXPORTS: dict[str, str] = _export_lazily(__name__, {}, submodules=_SUBMODULES)
