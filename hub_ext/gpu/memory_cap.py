"""How much GPU memory a share may fill, so that shares filled to their caps never fail a neighbour.

share x total is not that: the driver keeps part of the card for itself (NVML's "reserved"), and
every process that opens CUDA pays for its context outside any framework's allocator (hundreds of
MiB: kernels, the module image, cuBLAS workspaces). Four 0.25 shares each filled to a quarter of
the total then overrun the card by four contexts plus the reserve, and the last to allocate fails
although it stayed within its share.

Here a share's cap is its part of what is usable (the total less the reserve, no more than what
was free with nothing of the pool running) less one context allowance, so that for any shares on
one GPU whose parts add up to at most the whole:

    sum(cap + context allowance) <= usable memory

(one CUDA context per share; tested as a property in tests/test_gpu_memory_cap.py).
"""

from __future__ import annotations

from gpupool.pool.units import MILLI_PER_GPU

# MiB outside the allocator per CUDA context. NOT measured on a real GPU yet (no device was lent
# to the session that wrote this): a CUDA 12 context on a recent card is typically 300-600 MiB;
# measure with one process that initialises CUDA and allocates nothing (nvidia-smi's per-process
# memory) and set c.GPUPool.gpu_context_mib to what the machine's stack really takes.
DEFAULT_CONTEXT_MIB = 500


def usable_mib(total_mib: int, reserved_mib: int = 0, free_mib: int | None = None) -> int:
    """What shares may divide: the total less the driver's reserve, and no more than what NVML
    reported free with nothing of the pool running (a display, another service)."""
    usable = max(total_mib - max(reserved_mib, 0), 0)
    if free_mib is not None and free_mib >= 0:
        usable = min(usable, free_mib)
    return usable


def share_cap_mib(
    milli: int,
    total_mib: int,
    reserved_mib: int = 0,
    free_mib: int | None = None,
    context_mib: int = DEFAULT_CONTEXT_MIB,
) -> int:
    """MiB a share of `milli` (1000 = the whole GPU) may allocate on one GPU; 0 when the share is
    too small to hold even its own context (said by the caller, never rounded up)."""
    part = usable_mib(total_mib, reserved_mib, free_mib) * min(max(milli, 0), MILLI_PER_GPU) // MILLI_PER_GPU
    return max(part - max(context_mib, 0), 0)
