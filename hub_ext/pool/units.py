"""Integer units: milli-GPU (1000 = one GPU) and MiB of GPU memory.

Quotas are sums of many shares; integers keep those sums exact where floats drift
(0.1 + 0.2 != 0.3).
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, DecimalException

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


def gpus_number(milli: int) -> str:
    """250 -> '0.25', 2000 -> '2': a GPU amount without its unit (the status bar's "GPU 0.25",
    a form value). Exact: a share is a whole number of milli-GPU, so nothing is rounded."""
    return format((Decimal(milli) / MILLI_PER_GPU).normalize(), "f")


def format_gpus(milli: int) -> str:
    """250 -> '0.25 GPU', 2000 -> '2 GPUs': every GPU amount shown to people goes through this
    (the form, `%gpupool`, the status bar, the home page, the admin pages, error messages)."""
    text = gpus_number(milli)
    return f"{text} GPU" if milli <= MILLI_PER_GPU else f"{text} GPUs"


MILLI_S_PER_GPU_HOUR = MILLI_PER_GPU * 3600  # one GPU held for an hour, in milli-GPU x seconds


def format_gpu_hours(milli_s: int) -> str:
    """Fraction-weighted GPU-hours as every screen shows them, without the unit: three
    significant digits, at most three decimals (the accounting's own precision), grouped
    thousands — 194_400 -> '0.054', 4_500_000 -> '1.25', 44_460_000 -> '12.4', 4.4e9 -> '1,222'.
    A budget's use and its limit go through this alike, so "0.054 of 0.05" never reads
    "0.1 of 0.05" on one screen and "0 of 0.1" on another. A use under half a thousandth
    that is not nothing reads '< 0.001', never '0'."""
    if milli_s == 0:
        return "0"
    hours = Decimal(milli_s) / MILLI_S_PER_GPU_HOUR
    if abs(hours) < Decimal("0.0005"):
        return "< 0.001" if milli_s > 0 else "> -0.001"
    places = max(0, min(3, 2 - hours.adjusted()))
    rounded = hours.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    text = f"{rounded:,f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
