"""Stage-aware time left of ``gapdyn reproduce``: the remaining stages' measured seconds times this run's pace.

    pace = (wall seconds of this run's finished timed stages) / (their measured seconds)
    left = pace x (measured seconds of the stages not finished)

Warm-up stages are left out of the pace: numba's first compile (in the first experiment of each engine, threshold
and length) and the wait for the tiny-Qwen demo running beside (its wall is what is left of another process's
work), since their time does not scale with the rest. Until a timed stage has finished there is no pace, and the
text says so. Measured seconds: BENCHMARKS.md, "The quick reproduction", per stage (2 cores, load 1.3-2.6, cold
numba cache, demo beside); only the quick mode has them, other modes show counts and elapsed time only.
"""

from __future__ import annotations

__all__ = ["QUICK_STAGE_S", "SERIAL_LLM_S", "WARMUP", "StageETA"]

# (kind, name) -> wall seconds of that stage in the measured quick reproduction (demo beside).
QUICK_STAGE_S: dict[tuple[str, str], float] = {
    ("experiment", "threshold"): 83.5, ("experiment", "length"): 21.9, ("experiment", "success_rate"): 44.7,
    ("experiment", "stagnation"): 29.2, ("experiment", "logistic"): 3.3, ("experiment", "methods"): 12.6,
    ("experiment", "taxonomy"): 1.0, ("llm", "llm_probe"): 1.5,
    **{("figure", f"fig{i}_{n}"): 24.3 / 7 for i, n in enumerate(
        ("phase_diagram", "critical_eta", "stagnation", "logistic", "taxonomy", "methods", "llm_probe"), start=1)},
}
SERIAL_LLM_S = 72.7  # the tiny-Qwen stage run in this process (--no-llm-beside), same measurement, serial column
WARMUP = frozenset({("experiment", "threshold"), ("experiment", "length"), ("llm", "llm_probe")})


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class StageETA:
    """Time left over ``stages`` ((kind, name) in run order) from ``reference`` seconds (None: counts only)."""

    def __init__(self, stages, reference: dict | None, warmup=WARMUP):
        self.stages = list(stages)
        self.reference = reference
        self.warmup = frozenset(warmup)
        self.finished: dict[tuple[str, str], float] = {}

    def done(self, stage: tuple[str, str], seconds: float) -> None:
        """Record that ``stage`` finished after ``seconds`` of wall time."""
        self.finished[stage] = float(seconds)

    def pace(self) -> float | None:
        """Wall seconds per measured second over the finished stages that are timed and not warm-up."""
        if not self.reference:
            return None
        timed = [s for s in self.finished if s in self.reference and s not in self.warmup and self.reference[s] > 0]
        if not timed:
            return None
        return sum(self.finished[s] for s in timed) / sum(self.reference[s] for s in timed)

    def left(self) -> tuple[float | None, int]:
        """(seconds left by the pace, None before there is one; stages left that have no measured time)."""
        rest = [s for s in self.stages if s not in self.finished]
        unknown = sum(1 for s in rest if not self.reference or s not in self.reference)
        pace = self.pace()
        if pace is None:
            return None, unknown
        return pace * sum(self.reference[s] for s in rest if s in self.reference), unknown

    def text(self) -> str:
        """One line for the progress bar: time left and the pace it rests on, or why there is none."""
        if not self.reference:
            return "no measured stage times for this mode: no time left shown"
        seconds, unknown = self.left()
        extra = f", {unknown} stages without a measured time not counted" if unknown else ""
        if seconds is None:
            return f"time left after the first timed stage (compile and warm-up excluded){extra}"
        return f"~{_clock(seconds)} left (measured stage times x this run's pace {self.pace():.2g}){extra}"
