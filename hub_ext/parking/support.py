"""Whether this hub can park idle GPUs, decided once at start, and what the culler does then.

Parking is the culler's default where it works (benchmarks/culling: parking after 10 min of
idle GPU keeps 87.7 % of the GPU time held in use with no kernel lost, where the best stop
rules reach 73 % and lose the state of every kernel they stop). It works where the hub can
checkpoint the workspace's processes: on its own machine (not on Kubernetes, where the
kernels run in pods elsewhere), with NVIDIA GPUs whose driver has the process checkpoint API
(r570+, cuda-bindings installed) and without CUDA MPS (the driver cannot checkpoint MPS
clients). Elsewhere the stop rules apply. `c.IdleCuller.park_after_s` set by the admin wins
either way; the hub's log says which applies and why.
"""

from __future__ import annotations

from traitlets.config import Config

AUTO_PARK_AFTER_S = 600.0  # benchmarks/culling: 87.7 % used/reserved, 0 lost kernels (10 min); 5 min: 92 %
KUBERNETES = (
    "gpupool-kubernetes",
    "gpupool.spawner.kube.GPUKubeSpawner",
    "gpupool.spawner.kube:GPUKubeSpawner",
)


def parking_support(config: Config, spawner: str) -> tuple[bool, str]:
    """(can park, why), from the config and, where it comes to that, the GPUs and driver."""
    from gpupool.parking.service import GPUParking
    from gpupool.settings.config import GPUPool

    if spawner in KUBERNETES or "kube" in spawner.lower():
        return False, "workspaces run in Kubernetes pods, whose processes the hub cannot checkpoint"
    backend = GPUParking(config=config).backend
    if backend == "virtual":
        return True, "c.GPUParking.backend is 'virtual' (modelled parking, for tests and demos)"
    pool = GPUPool(config=config)
    if pool.mps_pipe_directory:
        return False, "c.GPUPool.mps_pipe_directory is set: the CUDA driver cannot checkpoint MPS clients"
    if not pool.use_nvml:
        return False, "c.GPUPool.use_nvml is off: the GPUs are virtual"
    from gpupool.gpu.nvml import discover_gpus

    if not discover_gpus():
        return False, "no NVIDIA GPU found (virtual GPUs)"
    from gpupool.gpu.cuda_checkpoint import CudaCheckpoint
    from gpupool.gpu.parking import ParkingError

    try:
        CudaCheckpoint()
    except ParkingError as err:
        return False, str(err)
    return True, "the NVIDIA driver checkpoints processes (r570+)"


def culler_park_after(park_after_s: float | None, config: Config, spawner: str) -> tuple[float, str]:
    """The culler's park_after_s and a line for the hub's log saying which rule applies."""
    if park_after_s is not None:
        what = f"parking idle GPUs after {park_after_s / 60:g} min" if park_after_s else "never parking"
        return float(park_after_s), f"idle culler: {what} (c.IdleCuller.park_after_s)"
    ok, why = parking_support(config, spawner)
    if ok:
        return AUTO_PARK_AFTER_S, (
            f"idle culler: parking idle GPUs after {AUTO_PARK_AFTER_S / 60:g} min, the"
            f" default where parking works: {why}"
        )
    return 0.0, f"idle culler: stopping idle workspaces (parking is not available: {why})"
