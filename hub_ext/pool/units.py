"""Integer units: milli-GPU (1000 = one GPU) and MiB of GPU memory.

Quotas are sums of many shares; integers keep those sums exact where floats drift
(0.1 + 0.2 != 0.3).
"""

from __future__ import annotations

from decimal import Decimal, DecimalException

MILLI_PER_GPU = 1000
MAX_TEXT = 32  # '0.125', '2500m', '1e3m': nothing real is longer
MAX_MILLI = 10**9  # a million GPUs: more than any pool; bounds the arithmetic that follows


class UnitError(ValueError):
    """A GPU amount that cannot be understood."""


def parse_gpus(value: object) -> int:
    """Turn '0.25', 0.5, 2 or '250m' into milli-GPU.

    Only amounts that are a whole number of milli-GPU are accepted, so that
    '0.0001' is an error instead of silently becoming 0.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float | Decimal):
        raise UnitError(f"not a GPU amount: {shown(value)}")
    if isinstance(value, int) and abs(value) > MAX_MILLI:
        raise UnitError(f"more GPUs than any pool has: {shown(value)}")
    text = str(value).strip()
    if len(text) > MAX_TEXT:
        raise UnitError(f"not a GPU amount (over {MAX_TEXT} characters): {shown(value)}")
    try:
        milli = Decimal(text[:-1]) if text.endswith("m") else Decimal(text) * MILLI_PER_GPU
    except DecimalException:  # not a number, or beyond Decimal's exponent range
        raise UnitError(f"not a GPU amount: {shown(value)} (examples: 0.25, 1, 2, 500m)") from None
    # compared before any conversion: '1e999999m' is a valid Decimal whose int() would take
    # the hub's event loop for seconds
    if not milli.is_finite() or abs(milli) > MAX_MILLI:
        raise UnitError(f"more GPUs than any pool has: {shown(value)}")
    if milli != milli.to_integral_value():
        raise UnitError(f"not a whole number of milli-GPU: {shown(value)}")
    return int(milli)


def shown(value: object, limit: int = 40) -> str:
    """A value quoted in an error message, cut to `limit` characters (it may be hostile)."""
    if isinstance(value, str | bytes | list | tuple | dict):
        value = value[: limit + 1] if not isinstance(value, dict) else dict(list(value.items())[:4])
    text = repr(value) if not (isinstance(value, int) and abs(value) > 10**100) else "(a huge number)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_gpus(milli: int) -> str:
    """250 -> '0.25 GPU', 2000 -> '2 GPUs'."""
    amount = Decimal(milli) / MILLI_PER_GPU
    text = format(amount.normalize(), "f")
    return f"{text} GPU" if milli <= MILLI_PER_GPU else f"{text} GPUs"


def share_of(milli: int, memory_mib: int) -> int:
    """GPU memory (MiB) that belongs to a share of a GPU with `memory_mib` in all."""
    return memory_mib * min(milli, MILLI_PER_GPU) // MILLI_PER_GPU
