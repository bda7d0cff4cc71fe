"""Integer units: milli-GPU (1000 = one GPU) and MiB of GPU memory.

Quotas are sums of many shares; integers keep those sums exact where floats drift
(0.1 + 0.2 != 0.3).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

MILLI_PER_GPU = 1000


class UnitError(ValueError):
    """A GPU amount that cannot be understood."""


def parse_gpus(value: object) -> int:
    """Turn '0.25', 0.5, 2 or '250m' into milli-GPU.

    Only amounts that are a whole number of milli-GPU are accepted, so that
    '0.0001' is an error instead of silently becoming 0.
    """
    if isinstance(value, bool):
        raise UnitError(f"not a GPU amount: {value!r}")
    text = str(value).strip()
    try:
        milli = Decimal(text[:-1]) if text.endswith("m") else Decimal(text) * MILLI_PER_GPU
    except InvalidOperation:
        raise UnitError(f"not a GPU amount: {value!r} (examples: 0.25, 1, 2, 500m)") from None
    if not milli.is_finite() or milli != milli.to_integral_value():
        raise UnitError(f"not a whole number of milli-GPU: {value!r}")
    return int(milli)


def format_gpus(milli: int) -> str:
    """250 -> '0.25 GPU', 2000 -> '2 GPUs'."""
    amount = Decimal(milli) / MILLI_PER_GPU
    text = format(amount.normalize(), "f")
    return f"{text} GPU" if milli <= MILLI_PER_GPU else f"{text} GPUs"


def share_of(milli: int, memory_mib: int) -> int:
    """GPU memory (MiB) that belongs to a share of a GPU with `memory_mib` in all."""
    return memory_mib * min(milli, MILLI_PER_GPU) // MILLI_PER_GPU
