"""Parking a process's GPU: one small interface, two backends.

A parked process keeps running on the CPU; its GPU memory sits in host memory and its GPU
is free for someone else. The sequence is the CUDA driver's (r570 and later):
lock -> checkpoint (park), then restore -> unlock (resume). States follow the driver's
`CUprocessState`: running, locked, checkpointed, failed; `none` is a process without a
CUDA context (nothing to checkpoint: releasing its share is enough).

* `gpupool.gpu.cuda_checkpoint.CudaCheckpoint` — the real driver, the only module that
  imports `cuda.bindings` (lazily; never in CI).
* `VirtualParking` — for virtual GPUs and CI: the same states and rules, with delays
  modelled per GiB; its state lives in a folder so that a restarted hub finds it again.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

ProcState = Literal["none", "running", "locked", "checkpointed", "failed"]
MAX_PID = 1 << 22  # Linux's pid_max ceiling: anything above is not a pid


class ParkingError(RuntimeError):
    """The driver refused an operation; the message names the process, the step and why."""


def check_pid(pid: object) -> int:
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid <= MAX_PID:
        raise ParkingError(f"{pid!r} is not a process id")
    return pid


class ParkingBackend(Protocol):
    """What the hub needs from a parking mechanism. `gpu_map` maps the UUID a process was
    checkpointed on to the UUID it is restored onto (same model; absent or {}: same GPU)."""

    name: str

    def state(self, pid: int) -> ProcState: ...
    def lock(self, pid: int, timeout_ms: int) -> None: ...
    def checkpoint(self, pid: int) -> None: ...
    def restore(self, pid: int, gpu_map: Mapping[str, str] | None = None) -> None: ...
    def unlock(self, pid: int) -> None: ...


def park_process(backend: ParkingBackend, pid: int, lock_timeout_ms: int = 10_000) -> bool:
    """Lock and checkpoint one process. False: it has no CUDA context (nothing to do).
    A failed checkpoint unlocks again, so the process is never left frozen."""
    state = backend.state(pid)
    if state == "none":
        return False
    if state == "checkpointed":
        return True  # parked already (a retried park after a hub restart)
    if state == "running":
        backend.lock(pid, lock_timeout_ms)
    try:
        backend.checkpoint(pid)
    except ParkingError:
        backend.unlock(pid)
        raise
    return True


def resume_process(backend: ParkingBackend, pid: int, gpu_map: Mapping[str, str] | None = None) -> None:
    """Restore and unlock one process (idempotent: a running process is left alone)."""
    state = backend.state(pid)
    if state == "checkpointed":
        backend.restore(pid, gpu_map)
        state = "locked"
    if state == "locked":
        backend.unlock(pid)


@dataclass(frozen=True)
class Delays:
    """How long the virtual backend takes. Defaults are assumptions, not measurements (no
    GPU was available): device<->host copies of pageable memory at ~10 GiB/s effective over
    PCIe Gen4/5 x16 (peak 32/64 GB/s) plus a fixed cost per call for context teardown/rebuild."""

    fixed_s: float = 0.3
    per_gib_s: float = 0.1

    def for_mib(self, mib: int) -> float:
        return self.fixed_s + self.per_gib_s * mib / 1024


class VirtualParking:
    """The driver's state machine for processes on virtual GPUs.

    Which processes hold a (virtual) CUDA context is decided by `has_context` (the hub passes
    one that recognises Jupyter kernels); their state is a JSON file per pid in `folder`.
    `sleep` is injectable so tests travel in time instead of waiting.
    """

    name = "virtual"

    def __init__(
        self,
        folder: str | os.PathLike[str],
        has_context: Callable[[int], bool],
        memory_mib: Callable[[int], int] = lambda pid: 1024,
        delays: Delays = Delays(),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.has_context, self.memory_mib, self.delays, self.sleep = has_context, memory_mib, delays, sleep

    def _path(self, pid: int) -> Path:
        return self.folder / f"{check_pid(pid)}.json"

    def _read(self, pid: int) -> dict[str, Any]:
        try:
            record = json.loads(self._path(pid).read_text())
        except (OSError, ValueError):
            return {}
        if record.get("started") != _start_time(pid):
            return {}  # another process got this pid since: the record is not about it
        return record

    def _write(self, pid: int, record: dict[str, object]) -> None:
        tmp = self._path(pid).with_suffix(".tmp")
        tmp.write_text(json.dumps({**record, "started": _start_time(pid)}))
        tmp.replace(self._path(pid))

    def state(self, pid: int) -> ProcState:
        record = self._read(pid)
        if record:
            return record["state"]
        return "running" if self.has_context(check_pid(pid)) else "none"

    def _expect(self, pid: int, step: str, allowed: tuple[ProcState, ...]) -> dict[str, Any]:
        state = self.state(pid)
        if state not in allowed:
            # the driver answers CUDA_ERROR_ILLEGAL_STATE here
            raise ParkingError(f"{step} of process {pid}: it is {state}, not {' or '.join(allowed)}")
        return self._read(pid) or {"state": state, "mib": self.memory_mib(pid)}

    def lock(self, pid: int, timeout_ms: int) -> None:
        record = self._expect(pid, "lock", ("running",))
        self._write(pid, {**record, "state": "locked"})

    def checkpoint(self, pid: int) -> None:
        record = self._expect(pid, "checkpoint", ("locked",))
        self.sleep(self.delays.for_mib(record["mib"]))
        self._write(pid, {**record, "state": "checkpointed"})

    def restore(self, pid: int, gpu_map: Mapping[str, str] | None = None) -> None:
        record = self._expect(pid, "restore", ("checkpointed",))
        self.sleep(self.delays.for_mib(record["mib"]))
        self._write(pid, {**record, "state": "locked", "remapped": dict(gpu_map or {})})

    def unlock(self, pid: int) -> None:
        record = self._expect(pid, "unlock", ("locked",))
        self._write(pid, {**record, "state": "running"})

    def remapped(self, pid: int) -> dict[str, str]:
        """The UUID map of the last restore (tests check that a remap reached the driver)."""
        return dict(self._read(pid).get("remapped", {}))


def _start_time(pid: int, proc: Path = Path("/proc")) -> int | None:
    """When the process started (clock ticks since boot): a pid plus this names one process."""
    try:
        return int((proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def kernel_like(pid: int, proc: Path = Path("/proc")) -> bool:
    """A Jupyter kernel (the processes whose variables parking keeps): for virtual contexts."""
    try:
        cmdline = (proc / str(check_pid(pid)) / "cmdline").read_bytes()
    except (OSError, ParkingError):
        return False
    return b"ipykernel" in cmdline


def make_backend(
    kind: str, folder: str = "", delays: Delays = Delays(), kernel_mib: int = 1024
) -> ParkingBackend:
    """`cuda` (the driver; needs cuda-bindings and driver r570+) or `virtual` (each kernel's GPU
    memory said to be `kernel_mib`)."""
    if kind == "cuda":
        from gpupool.gpu.cuda_checkpoint import CudaCheckpoint

        return CudaCheckpoint()
    if kind == "virtual":
        if not folder:
            raise ValueError("the virtual parking backend needs a folder for its state")
        return VirtualParking(folder, kernel_like, memory_mib=lambda pid: kernel_mib, delays=delays)
    raise ValueError(f"unknown parking backend {kind!r}: use 'cuda' or 'virtual'")
