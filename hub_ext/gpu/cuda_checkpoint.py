"""The only module that calls the CUDA driver's process checkpoint API (cuda-bindings).

`cuCheckpointProcessGetState/Lock/Checkpoint/Restore/Unlock` (driver r570+; restore onto
another GPU through `CUcheckpointRestoreArgs.gpuPairs`, newer drivers) act on another
process by pid, so the hub parks a kernel without the kernel's help. Imported lazily by
`gpupool.gpu.parking.make_backend("cuda")`; never imported in CI (no driver there).
Run on an H100 (driver 580, cuda-bindings 13.3): tests/test_parking_gpu.py and
tests/test_gpu_real.py (`gpu` marker).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpupool.gpu.parking import ParkingError, ProcState, check_pid

_STATES: dict[int, ProcState] = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}


def uuid_bytes(uuid: str) -> bytes:
    """NVML's "GPU-8d1c…-…" as the 16 bytes of a CUuuid."""
    text = uuid.removeprefix("GPU-").replace("-", "")
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise ParkingError(f"{uuid!r} is not a GPU UUID") from None
    if len(raw) != 16:
        raise ParkingError(f"{uuid!r} is not a GPU UUID")
    return raw


class CudaCheckpoint:
    name = "cuda"

    def __init__(self) -> None:
        try:
            from cuda.bindings import driver
        except ImportError as err:
            raise ParkingError(
                "parking with the CUDA driver needs the cuda-bindings package (pip install cuda-bindings)"
            ) from err
        missing = [
            f
            for f in (
                "cuCheckpointProcessLock",
                "cuCheckpointProcessCheckpoint",
                "cuCheckpointProcessRestore",
                "cuCheckpointProcessUnlock",
                "cuCheckpointProcessGetState",
            )
            if not hasattr(driver, f)
        ]
        if missing:
            raise ParkingError(f"cuda-bindings is too old for process checkpoints (no {', '.join(missing)})")
        self.driver = driver
        self._call("cuInit", driver.cuInit, 0)
        version = self._call("cuDriverGetVersion", driver.cuDriverGetVersion)
        if int(version) < 12080:  # the API came with driver r570 (CUDA 12.8)
            raise ParkingError(
                f"the NVIDIA driver supports CUDA {int(version) // 1000}.{int(version) % 1000 // 10};"
                " parking needs driver r570 (CUDA 12.8) or later"
            )

    def _call(self, step: str, fn, *args):
        result = fn(*args)
        err = result[0]
        if err != self.driver.CUresult.CUDA_SUCCESS:
            name = getattr(err, "name", str(err))
            raise ParkingError(f"{step} failed: {name}")
        return result[1] if len(result) > 1 else None

    def state(self, pid: int) -> ProcState:
        err, state = self.driver.cuCheckpointProcessGetState(check_pid(pid))
        if err != self.driver.CUresult.CUDA_SUCCESS:
            return "none"  # no CUDA context in that process (or not ours to see)
        return _STATES.get(int(state), "failed")

    def lock(self, pid: int, timeout_ms: int) -> None:
        args = self.driver.CUcheckpointLockArgs()
        args.timeoutMs = max(0, int(timeout_ms))  # 0 would wait forever for running kernels
        self._call(f"lock of process {pid}", self.driver.cuCheckpointProcessLock, check_pid(pid), args)

    def checkpoint(self, pid: int) -> None:
        self._call(
            f"checkpoint of process {pid}", self.driver.cuCheckpointProcessCheckpoint, check_pid(pid), None
        )

    def restore(self, pid: int, gpu_map: Mapping[str, str] | None = None) -> None:
        args = None
        pairs = []
        for old, new in (gpu_map or {}).items():
            if old == new:
                continue
            pair = self.driver.CUcheckpointGpuPair()
            pair.oldUuid = self._uuid(old)
            pair.newUuid = self._uuid(new)
            pairs.append(pair)
        if pairs:
            args = self.driver.CUcheckpointRestoreArgs()
            args.gpuPairs = pairs
            args.gpuPairsCount = len(pairs)
        self._call(f"restore of process {pid}", self.driver.cuCheckpointProcessRestore, check_pid(pid), args)

    def unlock(self, pid: int) -> None:
        self._call(f"unlock of process {pid}", self.driver.cuCheckpointProcessUnlock, check_pid(pid), None)

    def _uuid(self, uuid: str):
        value = self.driver.CUuuid()
        value.bytes = uuid_bytes(uuid)
        return value
