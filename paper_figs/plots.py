"""Reusable plotting functions: each draws one idea on a given matplotlib Axes from a tidy table.

One namespace, implemented in plots_theory, plots_bandit and plots_llm.

Figure scripts and notebooks call these: they only draw; a drawn slope comes from the experiment's
claim, other fits from gapdyn (``gapdyn.fit_logistic_accuracy``, ``gapdyn.logodds_lower_bound``). Column names follow the README glossary.
"""

from __future__ import annotations

from ._plot_common import panel_unavailable
from .plots_bandit import *  # noqa: F401,F403
from .plots_bandit import __all__ as _bandit
from .plots_llm import *  # noqa: F401,F403
from .plots_llm import __all__ as _llm
from .plots_theory import *  # noqa: F401,F403
from .plots_theory import __all__ as _theory

__all__ = [*_theory, *_bandit, *_llm, "panel_unavailable"]
