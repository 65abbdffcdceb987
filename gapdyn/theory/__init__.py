"""gapdyn.theory: the formulas of RLVR optimisation dynamics as numpy/scipy functions (docs/equations.md).

Policies and scores (``policy``), J, Phi and the Gradient Gap (``gap``), the method registry (``methods``),
update directions (``directions``), categorical draws (``sampling``), alignment and Theorem 1's bound
(``alignment``), step-size thresholds (``thresholds``), the curvature gap (``curvature``), the safe step rule
(``safe_step``), the token taxonomy (``taxonomy``) and the logistic accuracy law (``logistic``). The public names
are exported from :mod:`gapdyn` (``curvature`` is read as a submodule); a submodule loads on first access
(``gapdyn.theory.gap``), as in the parent package.
"""

from __future__ import annotations

from .._lazy import export_lazily as _export_lazily

_SUBMODULES = ("alignment", "curvature", "directions", "gap", "logistic", "methods", "policy", "safe_step",
               "sampling", "taxonomy", "thresholds")
"""The modules of this package (listed by ``dir()``)."""
_EXPORTS: dict[str, str] = _export_lazily(__name__, {}, submodules=_SUBMODULES)
