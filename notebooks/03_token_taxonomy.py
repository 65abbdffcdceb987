# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · The WAPO token taxonomy
#
# One token update on logits z with step a = η·A (`gapdyn.token_step_effects`; derivation in
# [docs/theory.md](../theory.md), section 9): Δlog p_s = a(1 − 2p_s + C) and
# ΔH = −a[p_s(log p_s + H) − Σ p_k²(log p_k + H)], with C = Σ p_k².
# WAPO (arXiv 2606.16154) sorts tokens into **peak** (p_s ≥ C) and **valley** (p_s < C), crossed with
# the sign of A. This notebook checks how often that bin predicts the sign of ΔH, and where it fails.

# %% tags=["parameters"]
# parameters: the test suite sets GAPDYN_NB_MODE=test (small sizes); "quick" by default, "full" for paper scale
import os

from gapdyn.cmdline import MODES

MODE = os.environ.get("GAPDYN_NB_MODE", "quick")
assert MODE in MODES, MODE
N_TOKENS = {"test": 3000, "quick": 40000, "full": 200000}[MODE]

# %%
# %matplotlib inline
import numpy as np

import gapdyn
from paper_figs import data, plots
from paper_figs.style import new_figure, set_style

set_style()

# %% [markdown]
# ## Random positions, first-order effects
# Logits z = σ·N(0, I) with log σ uniform (flat to peaked), V = 32, the token sampled from p as in
# training, A = ±1 and η = 1 (`paper_figs.data.taxonomy_table`). One row per (position, sign of A).

# %%
table = data.taxonomy_table(N_TOKENS, vocab=32, seed=0)
table.head()

# %% [markdown]
# ## ΔH over (p_s, C)
# Left: A > 0, right: A < 0. Colour = mean ΔH per unit step in each (p_s, C) cell; the dashed line is
# p_s = C. Read: for A > 0 peak tokens (below the line) lower the entropy (sharpening) and valley tokens
# raise it; a negative advantage flips both.

# %%
fig, ax = new_figure(1, 2, width=5, layout="constrained")
for a, sign in zip(ax[0], (+1, -1)):
    fig.colorbar(plots.plot_taxonomy_effect(table, a, value="dH", sign=sign), ax=a)

# %% [markdown]
# ## Δp_s over (p_s, C)
# The sampled token's probability always moves with the sign of A; the step is largest for mid-range
# p_s, and tiny at p_s → 1 (the softmax saturates).

# %%
fig, ax = new_figure(1, 2, width=5, layout="constrained")
for a, sign in zip(ax[0], (+1, -1)):
    fig.colorbar(plots.plot_taxonomy_effect(table, a, value="dp_s", sign=sign), ax=a)

# %% [markdown]
# ## Where the bin mispredicts the sign of ΔH
# `paper_figs.data.taxonomy_summary` gives the shares. Left: share of mispredicted tokens per cell
# (dark = always wrong). Right: histogram of the margin p_s − C, all tokens in grey, mispredicted in
# orange. Read: misses live on a thin band just above p_s = C (peak side); valley tokens never disagree.

# %%
data.taxonomy_summary(table)

# %%
fig, ax = new_figure(1, 2, width=5, layout="constrained")
fig.colorbar(plots.plot_taxonomy_misses(table, ax[0, 0]), ax=ax[0, 0])
plots.plot_miss_share_vs_margin(table, ax[0, 1]);

# %% [markdown]
# ## First order vs a finite step
# The formulas are first order in a = η·A. For a finite step of η = 0.5 the exact change
# (`gapdyn.exact_token_step`) should lie close to the diagonal; curvature bends the largest changes.

# %%
rng = np.random.default_rng(1)
z = 2.0 * rng.standard_normal((min(N_TOKENS, 3000), 32))
tokens = gapdyn.sample_group(gapdyn.softmax(z), 2, rng)[:, 0]  # one token per position (groups have G >= 2)
first = gapdyn.token_step_effects(z, tokens, 1.0, 0.5).dH
exact = gapdyn.exact_token_step(z, tokens, 1.0, 0.5).dH
print("sign agreement first order vs exact:", np.mean(np.sign(first) == np.sign(exact)))

# %%
fig, ax = new_figure()
plots.plot_first_order_vs_exact(first, exact, ax[0, 0]);
