"""Environment of a workspace on a GPU share: pure function of the placement."""

from __future__ import annotations

import os
from decimal import Decimal

from gpupool.gpu.memory_cap import DEFAULT_CONTEXT_MIB, share_cap_mib
from gpupool.pool import GPU, MILLI_PER_GPU

# on every workspace's PYTHONPATH: from the users' environment in the system prefix when `gpupool
# up` made one (GPUPOOL_USER_PACKAGE, gpupool.host.system_env), never from a clone it cannot read
STARTUP_DIR = os.path.join(
    os.environ.get("GPUPOOL_USER_PACKAGE") or os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "gpu",
    "startup",
)


def fraction_text(milli_per_gpu: int, num_gpus: int) -> str:
    total = Decimal(milli_per_gpu * num_gpus) / MILLI_PER_GPU
    return format(total.normalize(), "f")


def gpu_env(
    gpus: list[GPU],
    milli_per_gpu: int,
    mps_pipe_directory: str = "",
    pythonpath: str = "",
    context_mib: int = DEFAULT_CONTEXT_MIB,
) -> dict[str, str]:
    """Variables that pin a workspace to its GPUs and tell frameworks its share.

    CUDA_VISIBLE_DEVICES names GPUs by UUID where NVML gave one (indices shift when
    devices are hidden; UUIDs do not); virtual GPUs go by index.
    """
    if not gpus:
        return {"CUDA_VISIBLE_DEVICES": ""}  # a CPU-only workspace must not see any GPU
    # the share's part of what the card really has, less its CUDA context (gpupool.gpu.memory_cap)
    per_gpu_mib = min(
        share_cap_mib(milli_per_gpu, g.memory_mib, g.reserved_mib, context_mib=context_mib) for g in gpus
    )
    fraction = Decimal(milli_per_gpu) / MILLI_PER_GPU
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(str(g.index) if g.virtual else g.uuid for g in gpus),
        "GPUPOOL_GPU_FRACTION": fraction_text(milli_per_gpu, len(gpus)),
        "GPUPOOL_GPU_MEMORY_MIB": str(per_gpu_mib),
        "GPUPOOL_GPU_UUIDS": ",".join(g.uuid for g in gpus),
        "GPUPOOL_GPU_MODEL": gpus[0].model,
        "GPUPOOL_GPU_VIRTUAL": "1" if any(g.virtual for g in gpus) else "0",
        # framework knobs: grow on demand instead of grabbing the whole card
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": format(fraction.normalize(), "f"),
        # sitecustomize in STARTUP_DIR caps torch's allocator at the share (see startup/)
        "PYTHONPATH": os.pathsep.join(p for p in (STARTUP_DIR, pythonpath) if p),
    }
    if mps_pipe_directory:
        env["CUDA_MPS_PIPE_DIRECTORY"] = mps_pipe_directory
        # device ordinals are relative to CUDA_VISIBLE_DEVICES
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={per_gpu_mib}M" for i in range(len(gpus)))
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, milli_per_gpu * 100 // MILLI_PER_GPU))
    return env
