"""benchmarks.threshold_reproducibility.spreads on a constructed table with known spreads and horizon changes."""

import math

import pandas as pd
import pytest

from benchmarks.threshold_reproducibility import QUANTITIES, spreads


def _rows(values):
    """values[offset][horizon index] for every quantity (the same numbers), one (instance, method)."""
    rows = []
    for k, per_h in enumerate(values):
        for h, v in zip((1000, 2000, 4000), per_h):
            rows.append({"instance": 1, "method": "grpo", "offset": k / len(values), "horizon": h,
                         **{q: v for q in QUANTITIES}})
    return pd.DataFrame(rows)


def test_spread_is_the_worst_horizon_and_change_the_worst_offset():
    vals = [[100.0, 104.0, 110.0], [101.0, 104.0, 108.0], [100.5, 103.0, 109.0], [100.2, 104.5, 111.0]]
    sp = spreads(_rows(vals)).set_index("quantity").loc["eta_50"]
    by_h = list(zip(*vals))
    assert sp["offset_spread"] == pytest.approx(max(max(c) / min(c) - 1 for c in by_h))
    assert sp["H_to_2H"] == pytest.approx(max(abs(v[1] / v[0] - 1) for v in vals))
    assert sp["H_to_4H"] == pytest.approx(max(abs(v[2] / v[0] - 1) for v in vals))
    assert sp["n_finite"] == 12


def test_a_search_without_the_quantity_leaves_the_spreads_unmeasured():
    vals = [[100.0, 104.0, math.nan], [101.0, 104.0, 108.0]]
    sp = spreads(_rows(vals)).set_index("quantity").loc["eta_star"]
    assert math.isnan(sp["offset_spread"]) and math.isnan(sp["H_to_4H"]) and sp["n_finite"] == 5
