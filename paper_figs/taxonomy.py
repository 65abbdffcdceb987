"""The WAPO taxonomy table behind figure 5 and notebook 03: gapdyn.token_step_effects on random positions.

No formula lives here: gapdyn computes every effect; this module draws the inputs, tabulates the
outputs and states THEORY.md §4's claims as a verdict table.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

import gapdyn

__all__ = ["BIN_DH_SIGN", "taxonomy_table", "taxonomy_summary", "taxonomy_verdict"]

BIN_DH_SIGN: dict[str, int] = {"pos_peak": -1, "pos_valley": +1, "neg_peak": +1, "neg_valley": -1}
"""The sign of Delta H that each WAPO bin predicts (THEORY.md §4: sharpening, rising, rising, falling)."""


def taxonomy_table(
    n_tokens: int = 20000,
    *,
    vocab: int = 32,
    seed: int = 0,
    sigma_range: tuple[float, float] = (0.05, 8.0),
) -> pd.DataFrame:
    """First-order effects of one token update for random positions, one row per (position, sign of A).

    Logits z = sigma * N(0, I_V) with log sigma uniform over ``sigma_range`` (flat to peaked
    distributions); the token s is sampled from p = softmax(z), as in training. For A = +1 and
    A = -1 (eta = 1, weight 1) :func:`gapdyn.token_step_effects` gives Delta H, Delta p_s, the bin
    and the exact first-order sign of Delta H; ``bin_sign`` is the sign the bin predicts
    (:data:`BIN_DH_SIGN`), ``mispredicted`` marks tokens where the two differ.

    Columns: p_s, C, H, A, dH, dp_s, bin, sign_dH, bin_sign, mispredicted.
    """
    if int(n_tokens) < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    if int(vocab) < 2:
        raise ValueError(f"vocab must be >= 2, got {vocab}")
    lo, hi = sigma_range
    if not (0 < lo < hi):
        raise ValueError(f"sigma_range must satisfy 0 < low < high, got {sigma_range}")
    rng = np.random.default_rng(seed)
    n, V = int(n_tokens), int(vocab)
    sigma = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
    z = sigma[:, None] * rng.standard_normal((n, V))
    p = gapdyn.softmax(z)
    token = gapdyn.sample_group(p, 2, rng)[:, 0]
    H = gapdyn.token_entropy(gapdyn.log_softmax(z))
    frames = []
    for A in (1.0, -1.0):
        e = gapdyn.token_step_effects(z, token, A, 1.0)
        names = np.asarray(gapdyn.BIN_NAMES)[e.bin]
        bin_sign = np.array([BIN_DH_SIGN[b] for b in names])
        dp_s = np.take_along_axis(e.dp, token[:, None], axis=-1)[:, 0]
        frames.append(
            pd.DataFrame(
                {
                    "p_s": e.p_token,
                    "C": e.collision,
                    "H": H,
                    "A": A,
                    "dH": e.dH,
                    "dp_s": dp_s,
                    "bin": names,
                    "sign_dH": e.entropy_sign.astype(int),
                    "bin_sign": bin_sign,
                    "mispredicted": e.entropy_sign != bin_sign,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def taxonomy_summary(table: pd.DataFrame) -> dict[str, float]:
    """Headline numbers of the taxonomy table (A = +1 rows; A = -1 flips every sign alike).

    share_bin_correct: share of sampled tokens whose bin predicts the exact sign of Delta H;
    valley_mispredicted: count of valley tokens that disagree (THEORY.md: never);
    max_gap_of_misses: the largest p_s - C among misses (THEORY.md: misses sit just above p_s = C).
    """
    pos = table[table["A"] > 0]
    miss = pos[pos["mispredicted"]]
    valley = pos["bin"].str.endswith("valley")
    return {
        "n_tokens": int(len(pos)),
        "share_bin_correct": float(1.0 - pos["mispredicted"].mean()),
        "share_peak": float((~valley).mean()),
        "valley_mispredicted": int((pos["mispredicted"] & valley).sum()),
        "max_gap_of_misses": float((miss["p_s"] - miss["C"]).max()) if len(miss) else 0.0,
        "median_gap_of_misses": float((miss["p_s"] - miss["C"]).median()) if len(miss) else 0.0,
    }


def taxonomy_verdict(summary: dict) -> pd.DataFrame:
    """THEORY.md §4's taxonomy claims against :func:`taxonomy_summary` (same columns as ``analyse``).

    "~97%" is read as "at least 90% of sampled tokens"; "misses sit just above p_s = C" as "every miss
    has 0 <= p_s - C < 0.05".
    """
    share, vmiss, gap = summary["share_bin_correct"], summary["valley_mispredicted"], summary["max_gap_of_misses"]
    rows = [
        ("WAPO bin predicts the exact sign of dH for ~97% of sampled tokens", "random softmax positions, V=32",
         share, "~0.97 (>= 0.9)", "holds" if share >= 0.9 else "does not hold"),
        ("valley tokens never disagree with the exact sign of dH", "random softmax positions, V=32",
         vmiss, 0, "holds" if vmiss == 0 else "does not hold"),
        ("misses sit just above p_s = C", "random softmax positions, V=32",
         gap, "max(p_s - C) < 0.05", "holds" if gap < 0.05 else "does not hold"),
    ]
    return pd.DataFrame(rows, columns=["claim", "setting", "measured", "expected", "holds"])
