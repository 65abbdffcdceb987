"""The logistic relation between accuracy and cumulative alignment.

docs/equations.md §3: accuracy ~ sigmoid(a M + b); Theorem 1 gives a = 1/2, b = logit J0 as a lower bound.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.optimize import curve_fit
from scipy.special import expit, logit

from .._validate import as_float_array

__all__ = ["LogisticFit", "fit_logistic_accuracy"]


class LogisticFit(NamedTuple):
    """accuracy ~ sigmoid(slope * M + intercept) with goodness of fit."""

    slope: float
    intercept: float
    slope_stderr: float
    intercept_stderr: float
    r2: float  # 1 - SS_res / SS_tot on the accuracy scale
    rmse: float
    n: int

    def predict(self, M):
        return expit(self.slope * np.asarray(M, dtype=np.float64) + self.intercept)


def fit_logistic_accuracy(M, accuracy) -> LogisticFit:
    """Least-squares fit of accuracy = sigmoid(a M + b) (scipy.optimize.curve_fit)."""
    M = as_float_array(M, "M", min_ndim=1).ravel()
    acc = as_float_array(accuracy, "accuracy", min_ndim=1).ravel()
    if M.shape != acc.shape:
        raise ValueError(f"M and accuracy must have the same number of points, got {M.size} and {acc.size}")
    if M.size < 3:
        raise ValueError("need at least 3 points to fit a logistic curve")
    if np.any((acc < 0) | (acc > 1)):
        raise ValueError("accuracy must lie in [0, 1]")
    b0 = float(logit(np.clip(acc.mean(), 1e-3, 1 - 1e-3)))
    (a, b), cov = curve_fit(lambda m, a, b: expit(a * m + b), M, acc, p0=(0.5, b0), maxfev=20000)
    pred = expit(a * M + b)
    ss_res = float(np.sum((acc - pred) ** 2))
    ss_tot = float(np.sum((acc - acc.mean()) ** 2))
    se = np.sqrt(np.clip(np.diag(cov), 0, None)) if np.all(np.isfinite(cov)) else np.full(2, np.nan)
    return LogisticFit(
        slope=float(a),
        intercept=float(b),
        slope_stderr=float(se[0]),
        intercept_stderr=float(se[1]),
        r2=1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan"),
        rmse=float(np.sqrt(ss_res / M.size)),
        n=int(M.size),
    )
