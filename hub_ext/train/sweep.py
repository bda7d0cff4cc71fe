"""Sweeps: one job per combination of parameter values, and each run's final metrics.
Pure and bounded: the request body is parsed here before anything is submitted."""

from __future__ import annotations

import itertools
import math
import re

MAX_KEYS = 8
MAX_VALUES = 16
MAX_RUNS = 20  # c.TrainPool.max_sweep_runs default: the widget checks against it as typed
MAX_METRICS = 16
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
METRIC = re.compile(r"([A-Za-z_][A-Za-z0-9_./-]{0,31})\s*[=:]\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")


class SweepError(ValueError):
    pass


def combinations(spec: object, max_runs: int = MAX_RUNS) -> list[dict[str, object]]:
    """`{"lr": [0.1, 0.01], "batch": [32, 64]}` -> the 4 parameter dicts, in a stable order.
    Keys are Python names; values JSON numbers, strings or booleans; at most `max_runs` of them
    (c.TrainPool.max_sweep_runs)."""
    if not isinstance(spec, dict) or not 1 <= len(spec) <= MAX_KEYS:
        raise SweepError(f"sweep must be an object of 1 to {MAX_KEYS} parameters, each with a list of values")
    axes = []
    for key, values in spec.items():
        if not isinstance(key, str) or not NAME.fullmatch(key):
            raise SweepError(f"sweep: {key!r} is not a parameter name")
        if not isinstance(values, list) or not 1 <= len(values) <= MAX_VALUES:
            raise SweepError(f"sweep: {key} needs a list of 1 to {MAX_VALUES} values")
        for v in values:
            if (
                not isinstance(v, str | int | float | bool)
                or (isinstance(v, float) and not math.isfinite(v))
                or (isinstance(v, str) and len(v) > 200)
            ):
                raise SweepError(f"sweep: {key} values must be numbers, short strings or booleans, got {v!r}")
        axes.append([(key, v) for v in values])
    total = math.prod(len(a) for a in axes)
    if total > max_runs:
        raise SweepError(f"sweep: {total} combinations, at most {max_runs} (c.TrainPool.max_sweep_runs)")
    return [dict(combo) for combo in itertools.product(*axes)]


def final_metrics(lines: list[str]) -> dict[str, float]:
    """The last line of the log that prints metrics (`loss=0.12 acc: 0.9`), as numbers."""
    for line in reversed(lines):
        found = METRIC.findall(line[:2000])
        if found:
            return {k: float(v) for k, v in found[:MAX_METRICS]}
    return {}
