"""Timing primitives for noisy shared machines: repeated, interleaved measurements reported as medians.

Every speed in this package is a ratio against a reference measured in the same run, repeat by repeat:
``interleaved(fast, ref, repeats)`` times fast and reference alternately (so a burst of load from another
process hits both), and the spread of the per-repeat ratios is reported next to their median.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass

__all__ = ["Stat", "time_call", "repeat", "interleaved", "ratio", "machine_info", "load_average"]


@dataclass(frozen=True)
class Stat:
    """Median and spread (min, max, interquartile range) of repeated measurements."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def lo(self) -> float:
        return min(self.values)

    @property
    def hi(self) -> float:
        return max(self.values)

    @property
    def iqr(self) -> tuple[float, float]:
        v = sorted(self.values)
        if len(v) < 4:
            return v[0], v[-1]
        q = statistics.quantiles(v, n=4, method="inclusive")
        return q[0], q[2]

    def spread(self) -> str:
        """'[min, max]' of the repeats, relative to the median in percent."""
        m = self.median
        if m == 0 or len(self.values) < 2:
            return "n=1" if len(self.values) < 2 else "[0%]"
        return f"[{100 * (self.lo / m - 1):+.0f}%,{100 * (self.hi / m - 1):+.0f}%]"

    def scaled(self, f: float) -> "Stat":
        return Stat(tuple(v * f for v in self.values))

    def inverse(self, num: float = 1.0) -> "Stat":
        return Stat(tuple(num / v for v in self.values))


def time_call(fn) -> float:
    """Wall time of one call (perf_counter, seconds)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def repeat(fn, repeats: int, warmup: int = 1) -> Stat:
    """Times of ``repeats`` calls of fn after ``warmup`` untimed calls (numba compilation, caches)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    return Stat(tuple(time_call(fn) for _ in range(repeats)))


def interleaved(fns: dict, repeats: int, warmup: int = 1) -> dict[str, Stat]:
    """Times of each named callable, measured alternately ``repeats`` times (after ``warmup`` rounds)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        for f in fns.values():
            f()
    out = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            out[k].append(time_call(f))
    return {k: Stat(tuple(v)) for k, v in out.items()}


def ratio(num: Stat, den: Stat, scale: float = 1.0) -> Stat:
    """Per-repeat ratios scale * num_i / den_i (the repeats were interleaved, so pairs share the load)."""
    return Stat(tuple(scale * a / b for a, b in zip(num.values, den.values)))


def load_average() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:  # pragma: no cover
        return (float("nan"),) * 3


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover
        pass
    return platform.processor() or "unknown"


def _cache_sizes() -> str:
    out = []
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for idx in sorted(os.listdir(base)):
            p = os.path.join(base, idx)
            if not idx.startswith("index"):
                continue
            lvl = open(os.path.join(p, "level")).read().strip()
            typ = open(os.path.join(p, "type")).read().strip()
            size = open(os.path.join(p, "size")).read().strip()
            out.append(f"L{lvl}{'d' if typ == 'Data' else 'i' if typ == 'Instruction' else ''} {size}")
    except OSError:
        return "unknown"
    return ", ".join(out)


def machine_info() -> dict[str, str]:
    """CPU model, cores, caches, Python and library versions, load average."""
    import numba
    import numpy

    info = {
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count()),
        "caches": _cache_sizes(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "numba": numba.__version__,
    }
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:  # pragma: no cover
        info["torch"] = "not installed"
    la = load_average()
    info["load"] = f"{la[0]:.2f} {la[1]:.2f} {la[2]:.2f} (1/5/15 min)"
    return info


def emit_report(title: str, command: str, body: str, out=None, *, details: tuple[str, ...] = ()) -> str:
    """The report of one benchmark command: ``# <title> (<UTC time>[, details])``, ``command: `<command>```, a
    blank line and ``body``; printed, and written to ``out`` (newline-terminated) when given. Returns the text."""
    head = ", ".join((time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), *details))
    text = f"# {title} ({head})\ncommand: `{command.strip()}`\n\n" + body
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text if text.endswith("\n") else text + "\n")
    return text
