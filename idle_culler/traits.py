"""The culler's structured options as trait types (jupyter-resource-usage's habit): each checks its
value where traitlets reads the config, so a typo stops the hub at start with the option and the
value, not the culler at 19:00 when it first computes a workday end."""

from __future__ import annotations

import math
import re
from typing import Any
from zoneinfo import ZoneInfo

from traitlets import Dict, Float, TraitError, Unicode

from gpupool.idle_culler.policy import Limits

LIMIT_FIELDS = frozenset(Limits.__dataclass_fields__)
RESOLVERS = ("warn", "restart-kernel", "stop")  # gentlest first
MAX_SECONDS = 10**9  # about 30 years: anything longer is a typo
POSITIVE = frozenset({"interval_s", "window_s"})  # 0 would make the culler spin
_CLOCK = re.compile(r"([01]?\d|2[0-3]):[0-5]\d")


def _where(obj: object, name: str | None) -> str:
    return f"{type(obj).__name__}.{name}"


def seconds_problem(value: object, positive: bool = False) -> str | None:
    low = "more than 0" if positive else "from 0"
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_SECONDS
        or (positive and value == 0)
    ):
        return f"must be seconds {low} to 1e9, got {value!r}"
    return None


def clock_problem(value: object) -> str | None:
    if not isinstance(value, str) or (value and not _CLOCK.fullmatch(value)):
        return f'{value!r} is not a time of day ("HH:MM", 00:00 to 23:59) or "" for none'
    return None


def zone_problem(value: object) -> str | None:
    if not isinstance(value, str) or not 0 < len(value) <= 255:
        return f"{value!r} is not a time zone"
    try:
        ZoneInfo(value)
    except (KeyError, ValueError, OSError):  # ZoneInfoNotFoundError is a KeyError; "../x" a ValueError
        return f"{value!r} is not a time zone (an IANA name such as 'Europe/Berlin')"
    return None


def limit_problem(key: str, value: object) -> str | None:
    """What is wrong with one limit of an override, or None."""
    if key == "workday_end":
        problem = clock_problem(value)
    elif key == "timezone":
        problem = zone_problem(value)
    elif key == "memory_resolver":
        problem = None if value in RESOLVERS else f"{value!r} is not one of {list(RESOLVERS)}"
    elif key == "hibernate":
        problem = None if isinstance(value, bool) else f"must be True or False, got {value!r}"
    elif key == "hibernate_max_gib":
        ok = not isinstance(value, bool) and isinstance(value, int | float) and 0 < value <= 1 << 20
        problem = None if ok else f"must be GiB more than 0, got {value!r}"
    elif key == "util_threshold_pct":
        ok = not isinstance(value, bool) and isinstance(value, int | float) and 0 <= value <= 100
        problem = None if ok else f"must be a percentage from 0 to 100, got {value!r}"
    else:
        problem = seconds_problem(value, positive=key in POSITIVE)
    return None if problem is None else f"{key} {problem}"


# Any: one Seconds may allow None (allow_none=True) and another not; traitlets types that per
# instance through overloads of its own __init__, which a subclass's __init__ cannot pick
class Seconds(Float[Any, Any]):
    """A duration in seconds: finite, 0 to 1e9 (more than 0 with positive=True)."""

    info_text = "seconds"

    def __init__(self, default_value: float | None, positive: bool = False, **kwargs: Any) -> None:
        self.positive = positive
        super().__init__(default_value, **kwargs)

    def validate(self, obj: object, value: Any) -> float:
        problem = seconds_problem(value, self.positive)
        if problem:
            raise TraitError(f"{_where(obj, self.name)} {problem}")
        return float(value)


class TimeOfDay(Unicode[str, str]):
    """ "HH:MM" (00:00 to 23:59), or "" for none."""

    info_text = 'a time of day "HH:MM" or ""'

    def validate(self, obj: object, value: Any) -> str:
        problem = clock_problem(value)
        if problem:
            raise TraitError(f"{_where(obj, self.name)}: {problem}")
        return value


class TimeZone(Unicode[str, str]):
    """An IANA time zone name the machine's tz database knows."""

    info_text = "an IANA time zone name"

    def validate(self, obj: object, value: Any) -> str:
        problem = zone_problem(value)
        if problem:
            raise TraitError(f"{_where(obj, self.name)}: {problem}")
        return value


class LimitOverrides(Dict):
    """{name: {limit: value}}: names are groups or profiles, limits the culler's own options."""

    info_text = "a dict of {name: {limit: value}}"

    def validate(self, obj: object, value: Any) -> dict[str, object]:
        value = super().validate(obj, value)
        where = _where(obj, self.name)
        for name, over in value.items():
            if not isinstance(name, str) or not isinstance(over, dict):
                raise TraitError(f"{where}[{name!r}] must be a dict of limits, got {over!r}")
            unknown = set(over) - LIMIT_FIELDS
            if unknown:
                raise TraitError(
                    f"{where}[{name!r}]: unknown keys {sorted(map(str, unknown))};"
                    f" the limits are {sorted(LIMIT_FIELDS)}"
                )
            for key, limit in over.items():
                problem = limit_problem(key, limit)
                if problem:
                    raise TraitError(f"{where}[{name!r}]: {problem}")
        return value
