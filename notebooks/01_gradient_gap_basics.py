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
# # 01 · Gradient-gap basics
#
# The Gradient Gap g+ − g− (Suk & Duan, arXiv 2510.08539) is the difference between the mean score
# of correct and of incorrect responses. This notebook builds a 100-arm log-linear bandit and checks,
# with gapdyn's functions, the identities the rest of the toolkit relies on
# ([docs/theory.md](../theory.md), sections 2-4): the Gap is exactly ∇Φ, every method's expected step
# points along it, and sampled steps are noisy around that direction.

# %% tags=["parameters"]
# parameters: the test suite sets GAPDYN_NB_MODE=test (small sizes); "quick" by default, "full" for paper scale
import os

from gapdyn.cmdline import MODES

MODE = os.environ.get("GAPDYN_NB_MODE", "quick")
assert MODE in MODES, MODE
N_GROUPS = {"test": 300, "quick": 3000, "full": 30000}[MODE]

# %%
# %matplotlib inline
import numpy as np
from scipy.optimize import approx_fprime

import gapdyn
from paper_figs import plots
from paper_figs.style import new_figure, set_style

set_style()

# %% [markdown]
# ## A log-linear bandit
# K = 100 arms with d = 16 Gaussian features, 10 correct arms, a small random θ. π(a) ∝ exp(θ·φ(a)),
# scores s(a) = φ(a) − E_π[φ]. `INSTANCE = 2` has a finite one-step threshold (last section); many
# instances (e.g. 0) have none: Φ keeps rising along the Gap for every step size.

# %%
INSTANCE = 2
rng = np.random.default_rng(INSTANCE)
K, d = 100, 16
features = rng.standard_normal((K, d))
rewards = np.zeros(K)
rewards[:10] = 1.0
theta = 0.3 * rng.standard_normal(d)

# %%
probs = gapdyn.loglinear_probs(features, theta)
scores = gapdyn.loglinear_scores(features, theta)
J, Phi = gapdyn.success_rate(probs, rewards), gapdyn.log_odds(probs, rewards)
gap = gapdyn.gradient_gap(probs, rewards, scores)
print(f"J = {J:.4f}, Phi = {Phi:.4f}, ||g+ - g-|| = {np.linalg.norm(gap):.4f}")

# %% [markdown]
# ## The Gap is the gradient of the log-odds
# Finite differences of Φ (scipy's `approx_fprime` on `gapdyn.loglinear_logodds_fn`) against g+ − g−:
# the relative error should sit at the finite-difference level (~1e-7), not at a modelling error.

# %%
phi_fn = gapdyn.loglinear_logodds_fn(features, rewards)
fd = approx_fprime(theta, phi_fn)
print("relative error |fd - gap| / |gap| =", np.linalg.norm(fd - gap) / np.linalg.norm(gap))

# %% [markdown]
# ## How far each method's expected step goes along the Gap
# E[w] = c(J, G)·(g+ − g−) for every method; the plot shows c against J for G = 8. Read it as the
# "effective step" multiplier: GRPO's std normalisation (c_G ≈ √(J(1−J))) makes its step largest at
# extreme J; WAPO's extra factor (1 − J) shuts the step off as a prompt gets solved.

# %%
fig, ax = new_figure()
plots.plot_expected_scalars(ax[0, 0], group_size=8);

# %% [markdown]
# ## Sampled steps are noisy: the gap alignment Δμ = ⟨w, g+ − g−⟩
# N groups of G = 8 sampled responses, GRPO advantages (`gapdyn.sampled_direction` draws all groups
# at once). The histogram is the per-group Δμ; the solid line is its Monte-Carlo mean and the dashed
# line the closed form c_G(J)·‖gap‖². They should agree; the mass below 0 is the share of steps that
# move Φ the wrong way to first order.

# %%
batch = (N_GROUPS, K)
directions = gapdyn.sampled_direction(
    "grpo", np.broadcast_to(probs, batch), np.broadcast_to(rewards, batch), np.broadcast_to(scores, batch + (d,)),
    group_size=8, rng=rng,
)
dmus = gapdyn.gap_alignment(directions, gap)
expected = gapdyn.gap_alignment(gapdyn.expected_direction("grpo", probs, rewards, scores, group_size=8), gap)
print(f"share of groups with dmu < 0: {np.mean(dmus < 0):.3f};  all-equal groups (dmu = 0): {np.mean(dmus == 0):.3f}")

# %%
fig, ax = new_figure(width=5)
plots.plot_dmu_samples(dmus, expected, ax[0, 0], method="grpo");

# %% [markdown]
# ## One step along the Gap: where Φ stops rising
# Φ(θ + η w) − Φ(θ) for the unit Gap direction w. It rises for small η (slope ‖gap‖) and eventually
# falls below its start: the crossing is the sharp step threshold (`gapdyn.sharp_step_threshold`), the
# one-step version of the collapse threshold studied in notebook 02.

# %%
w = gap / np.linalg.norm(gap)
eta_sharp = gapdyn.sharp_step_threshold(phi_fn, theta, w)
print(f"sharp one-step threshold along the Gap: eta = {eta_sharp:.4g}")

# %%
fig, ax = new_figure(width=5)
plots.plot_logodds_along_direction(ax[0, 0], phi_fn, theta, w, etas=np.geomspace(1e-2, 1e4, 200), threshold=eta_sharp);
