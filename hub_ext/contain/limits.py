"""What one workload may use, enforced by the kernel through the cgroup it already has.

- devices: the NVIDIA GPU device nodes (char major 195, minors 0-253) of every GPU but its own are
  denied. The cgroup v1 devices controller checks each open(2), whatever the process did to its
  environment (CUDA_VISIBLE_DEVICES is only a hint to CUDA); root's tasks included. On cgroup v2
  the same rules are a device eBPF program attached to the workload's cgroup2 folder
  (gpupool.contain.devfilter), the way container runtimes do it: used where no v1 devices
  hierarchy is mounted (a v2 host, or a hybrid one without it), or when asked for. Everything else
  stays as the parent has it (the control devices CUDA needs: nvidiactl 195:255, nvidia-modeset
  195:254, nvidia-uvm and nvidia-caps, whose majors the driver takes at load, see /proc/devices;
  and /dev/null & co). A CPU-only workspace is denied every GPU.
  The check is at open: a descriptor opened while a device was allowed stays usable (the CUDA
  context a moved or parked kernel already had); new opens follow the current rules.
- memory: memory.limit_in_bytes (and memory.memsw.limit_in_bytes where swap is accounted, so that
  swap is no way round it); over it the kernel's OOM killer ends a process of that cgroup only.
- processes: pids.max (threads count: a fork storm stops there).
- CPU: cpu.shares, relative to the other workloads; all workloads share one parent whose own
  shares are lower than the hub's, which keeps a reserved share for the hub and the proxy. In the
  cpu hierarchy alone an instance's train jobs sit together in one folder (`jobs`) that weighs
  as one workspace (`jobs_cpu_shares`): a user who starts sixty runs of a sweep gets the jobs'
  share, not sixty workspaces' worth, and a workspace beside them stays responsive.

Each limit says whether this machine enforces it and, when not, why (`Controllers.status`).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpupool.contain import devfilter

NVIDIA_MAJOR = 195
MODESET_MINOR = 254  # /dev/nvidia-modeset: a control device, like nvidiactl (255)
CTL_MINOR = 255
GPU_MINORS = range(MODESET_MINOR)  # /dev/nvidia<minor>: one per GPU
# the driver's other character devices, majors given at load (/proc/devices)
CONTROL_NAMES = ("nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps", "nvidia-nvswitch", "nvidia-nvlink")
LIMITS = ("devices", "memory", "processes", "cpu")  # what is said, enforced or not, per limit
CONTROLLER = {"devices": "devices", "memory": "memory", "processes": "pids", "cpu": "cpu"}
MAX_PIDS = 4_194_304  # the kernel's pid_max ceiling
MAX_SHARES = 262_144  # cpu.shares' ceiling
JOB_PREFIX = "job-"  # a train job's cgroup is <instance>/job-<id> (WorkloadCgroups.job)
JOBS = "jobs"  # the cpu hierarchy's folder of an instance's train jobs (see `Controllers.folder`)
HUB_SUFFIX = ".hub"  # the hub's own cpu cgroup, `<workloads' root>.hub` beside it (`hold_hub`)
SIZE = re.compile(r"\s*(\d{1,15})\s*([kmgt]?)(i?b?)\s*\Z", re.IGNORECASE)
PERCENT = re.compile(r"\s*(\d{1,3})\s*%\s*\Z")


@dataclass(frozen=True)
class Limits:
    """One workload's limits; 0 is none."""

    gpu_minors: frozenset[int] = frozenset()  # the only GPU device nodes it may open
    memory_bytes: int = 0
    pids_max: int = 0
    cpu_shares: int = 0


def device_rules(minors: Iterable[int]) -> tuple[list[str], list[str]]:
    """(rules to allow, rules to deny) that leave exactly `minors` of the GPU device nodes open.
    Allowing first then denying is make-before-break: a move's destination opens before its
    source closes."""
    mine = {m for m in minors if m in GPU_MINORS}
    allow = [f"c {NVIDIA_MAJOR}:{m} rwm" for m in sorted(mine)]
    deny = [f"c {NVIDIA_MAJOR}:{m} rwm" for m in GPU_MINORS if m not in mine]
    return allow, deny


def control_majors(proc_devices: str) -> dict[str, int]:
    """The majors of the driver's control devices (the character devices of /proc/devices)."""
    out: dict[str, int] = {}
    block = False
    for line in proc_devices.splitlines():
        if line.strip().lower().startswith("block devices"):
            block = True
        parts = line.split()
        if not block and len(parts) == 2 and parts[0].isdigit() and parts[1] in CONTROL_NAMES:
            out[parts[1]] = int(parts[0])
    return out


def parse_size(value: object, total_bytes: int = 0) -> int:
    """Bytes from "8G", "512MiB", "1073741824", or "25%" of `total_bytes` (0 where that is not
    known); "" or 0: no limit. ValueError names what was wrong."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size must not be negative: {value}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"not a size: {str(value)[:40]!r}")
    if not value.strip():
        return 0
    pct = PERCENT.match(value)
    if pct:
        n = int(pct.group(1))
        if not 0 < n <= 100:
            raise ValueError(f"a share of the machine's memory is 1% to 100%, got {value[:40]!r}")
        return total_bytes * n // 100 if total_bytes > 0 else 0  # no /proc/meminfo: no cgroups either
    m = SIZE.match(value)
    if not m:
        raise ValueError(f"not a size: {value[:40]!r} (e.g. 8G, 512M, 25%)")
    return int(m.group(1)) * 1024 ** "_kmgt".index((m.group(2) or "_").lower())


def size_text(n: int) -> str:
    """8589934592 -> "8 GiB"; what the user reads."""
    for unit, power in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << power:
            value = n / (1 << power)
            return f"{value:.0f} {unit}" if value == int(value) or value >= 100 else f"{value:.1f} {unit}"
    return f"{n} bytes"


def oom_words(kills: int, limit_bytes: int) -> str:
    """ "killed: over its 8 GiB memory limit" for `kills` processes the OOM killer ended in a cgroup
    limited to `limit_bytes` (an unlimited cgroup's value is near 2**63: "out of memory"); ""
    for none."""
    if kills <= 0:
        return ""
    what = f"over its {size_text(limit_bytes)} memory limit" if 0 < limit_bytes < 1 << 62 else "out of memory"
    return f"killed: {what}" + (f" ({kills} processes)" if kills > 1 else "")


def machine_memory(meminfo: str | None = None) -> int:
    """MemTotal of /proc/meminfo, in bytes (0 when unreadable)."""
    try:
        text = Path("/proc/meminfo").read_text() if meminfo is None else meminfo
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def _write(path: Path, value: str) -> None:
    # one rule per write: the kernel parses a single rule from each
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


class Controllers:
    """The cgroup v1 hierarchies beside the freezer (devices, memory, pids, cpu): a workload's
    folder of the same name in each, joined together with the freezer's before it runs anything.

    `roots`: controller -> this hub's folder in that hierarchy; `missing`: limit -> why not."""

    def __init__(
        self,
        roots: dict[str, Path],
        missing: dict[str, str],
        kind: str = "cgroup v1",
        device_program: Path | None = None,
    ) -> None:
        self.roots, self.missing, self.kind = roots, missing, kind
        # cgroup v2: roots["devices"] is a cgroup2 folder and this helper attaches the rules
        # (gpupool.contain.devfilter); None: the v1 devices controller's files
        self.device_program = device_program
        self.jobs_cpu_shares = 0  # the jobs folder's weight (0: the kernel's 1024), see `reserve`

    def status(self) -> dict[str, str]:
        """limit -> "" when enforced here, else the reason it is not."""
        return {limit: self.missing.get(limit, "") for limit in LIMITS}

    def enforced(self, limit: str) -> bool:
        return not self.missing.get(limit, "") and CONTROLLER[limit] in self.roots

    def path(self, controller: str, rel: Path) -> Path:
        return self.folder(controller, self.roots[controller], rel)

    @staticmethod
    def folder(controller: str, root: Path, rel: Path) -> Path:
        """A workload's folder in one hierarchy: `root/rel`, except a train job's in the cpu one,
        which is one level down, in its instance's `jobs` folder (the jobs weigh together)."""
        if controller == "cpu" and rel.name.startswith(JOB_PREFIX):
            return root / rel.parent / JOBS / rel.name
        return root / rel

    def make(self, rel: Path) -> None:
        for ctrl, root in self.roots.items():
            folder = self.folder(ctrl, root, rel)
            os.makedirs(folder, mode=0o755, exist_ok=True)
            if ctrl == "cpu" and folder.parent.name == JOBS and self.jobs_cpu_shares and self.enforced("cpu"):
                _write(folder.parent / "cpu.shares", str(self.jobs_cpu_shares))  # an older hub's value too

    def join_fds(self, rel: Path) -> list[int]:
        """cgroup.procs of the workload in each hierarchy, open for writing (see `joiner`)."""
        self.make(rel)
        fds: list[int] = []
        try:
            for ctrl, root in self.roots.items():
                fds.append(os.open(self.folder(ctrl, root, rel) / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def apply(self, rel: Path, limits: Limits) -> None:
        """Every limit of `limits` on the workload's folders (made if missing). Raises OSError."""
        self.make(rel)
        if self.enforced("devices"):
            self.set_gpus(rel, limits.gpu_minors)
        if self.enforced("memory") and limits.memory_bytes:
            folder = self.path("memory", rel)
            _write(folder / "memory.limit_in_bytes", str(limits.memory_bytes))
            if (folder / "memory.memsw.limit_in_bytes").exists():  # swap is no way round it
                _write(folder / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        if self.enforced("processes") and limits.pids_max:
            _write(self.path("pids", rel) / "pids.max", str(limits.pids_max))
        if self.enforced("cpu") and limits.cpu_shares:
            _write(self.path("cpu", rel) / "cpu.shares", str(limits.cpu_shares))

    def set_gpus(self, rel: Path, minors: Iterable[int]) -> bool:
        """Only `minors` of the GPU device nodes may be opened from now on: the new ones are
        allowed before the others are denied. False when the workload has no cgroup (yet)."""
        if not self.enforced("devices"):
            return False
        folder = self.path("devices", rel)
        allow, deny = device_rules(minors)
        if self.device_program is not None:
            if not folder.is_dir():
                return False
            # one program for the whole set, swapped atomically: a move's caller asks for both
            # ends first, then the destination alone (make-before-break as on v1)
            devfilter.attach(self.device_program, folder, deny)
            return True
        try:
            for rule in allow:
                _write(folder / "devices.allow", rule)
            for rule in deny:
                _write(folder / "devices.deny", rule)
        except FileNotFoundError:
            return False
        return True

    def oom_kills(self, rel: Path) -> int:
        """How many of the workload's processes the kernel killed over its memory limit."""
        if not self.enforced("memory"):
            return 0
        folder = self.path("memory", rel)
        try:
            for line in (folder / "memory.oom_control").read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        except (OSError, ValueError):
            return 0
        return 0

    def memory_limit(self, rel: Path) -> int:
        try:
            return int((self.path("memory", rel) / "memory.limit_in_bytes").read_text())
        except (OSError, ValueError, KeyError):
            return 0

    def remove(self, rel: Path) -> bool:
        """The workload's folder (and those below) in every hierarchy; False while one is busy."""
        ok = True
        for ctrl, root in self.roots.items():
            path = self.folder(ctrl, root, rel)
            below = sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for folder in [*below, path]:
                try:
                    folder.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as err:
                    if err.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                        raise
                    ok = False
        return ok

    def reserve(
        self, workloads_cpu_shares: int, workloads_memory_bytes: int, jobs_cpu_shares: int = 0
    ) -> None:
        """All workloads together: a CPU weight below the hub's (its tasks weigh 1024 each in
        the hierarchy above) and at most `workloads_memory_bytes` of memory, so that the hub, the
        proxy and the services keep a share whatever users run; an instance's train jobs together
        weigh `jobs_cpu_shares` against each workspace (0: the kernel's 1024), from their next
        jobs folder on."""
        self.jobs_cpu_shares = jobs_cpu_shares
        if self.enforced("cpu") and workloads_cpu_shares:
            _write(self.roots["cpu"] / "cpu.shares", str(workloads_cpu_shares))
        if self.enforced("memory") and workloads_memory_bytes:
            _write(self.roots["memory"] / "memory.limit_in_bytes", str(workloads_memory_bytes))

    def hub_folder(self) -> Path | None:
        """The hub's own folder in the cpu hierarchy: beside the workloads' root, not in it, so
        that it weighs against all of them together (and the instances' clean-up never sees it)."""
        root = self.roots.get("cpu")
        return root.with_name(root.name + HUB_SUFFIX) if root is not None else None

    def hold_hub(self, shares: int, pids: Iterable[int]) -> Path | None:
        """The hub's processes (`pids`: the hub itself; the proxy and the services it starts after
        are born there) in a cpu cgroup of weight `shares`, the workloads' root's sibling: when
        the CPUs are busy the hub gets shares / (shares + workloads_cpu_shares) of what the two
        want, whatever users run and however many threads they have. Its children that are
        workloads join their own folders before they run anything (`join_fds`), so none stays
        here. None where not applied (no cpu hierarchy, `shares` 0). Raises OSError."""
        folder = self.hub_folder()
        if folder is None or not shares or not self.enforced("cpu"):
            return None
        os.makedirs(folder, mode=0o755, exist_ok=True)
        _write(folder / "cpu.shares", str(shares))
        for pid in pids:
            _write(folder / "cgroup.procs", str(pid))  # v1: the whole process, every thread
        return folder

    def remove_roots(self) -> None:
        hub = self.hub_folder()
        for root in [*self.roots.values(), *([hub] if hub is not None else [])]:
            try:
                root.rmdir()
            except OSError:
                pass


class NoControllers(Controllers):
    """No limit beside the kill: each says why."""

    def __init__(self, why: dict[str, str]) -> None:
        super().__init__({}, why, "")


def outside_hub(path: str) -> str:
    """A process's own cgroup path, less a hub's folder (`Controllers.hold_hub`) at its end: a
    process started from inside the hub's folder still puts the workloads beside it, not below."""
    head, _, last = path.rstrip("/").rpartition("/")
    if last.startswith("gpupool-") and last.endswith(HUB_SUFFIX):
        return head or "/"
    return path


def v2_devices(
    mounts: list[tuple[str, str, set[str]]], own: dict[str, str], hub_dir: str
) -> tuple[Path | None, Path | None, str]:
    """(this hub's cgroup2 folder, the device program's helper, "") for the devices limit on
    cgroup v2, or (None, None, why not)."""
    point = next((m[0] for m in mounts if m[1] == "cgroup2"), None)
    if point is None:
        return None, None, "no cgroup2 file system is mounted for a device program"
    root = Path(point, own.get("", "/").lstrip("/"), hub_dir)
    try:
        os.makedirs(root, mode=0o755, exist_ok=True)
    except OSError as err:
        return None, None, f"cannot make cgroups under {root}: {err.strerror}"
    program, why = devfilter.helper()
    return (root, program, "") if program else (None, None, why)


def find_controllers(
    mounts: list[tuple[str, str, set[str]]], own: dict[str, str], hub_dir: str, devices: str = "auto"
) -> Controllers:
    """The v1 devices, memory, pids and cpu hierarchies for this hub (folders made now), or the
    reason each cannot be used. `devices`: auto (the v1 controller where mounted, else a cgroup v2
    device program), v1 or v2 (that one only)."""
    roots: dict[str, Path] = {}
    missing: dict[str, str] = {}
    program = None
    for limit in LIMITS:
        ctrl = CONTROLLER[limit]
        if limit == "devices" and devices == "v2":
            continue  # below
        point = next((m[0] for m in mounts if m[1] == "cgroup" and ctrl in m[2]), None)
        if point is None:
            missing[limit] = f"no cgroup v1 {ctrl} hierarchy is mounted"
            continue
        root = Path(point, outside_hub(own.get(ctrl, "/")).lstrip("/"), hub_dir)
        try:
            os.makedirs(root, mode=0o755, exist_ok=True)
            probe = root / f"probe-{os.getpid()}"
            probe.mkdir(exist_ok=True)
            file = {"devices": "devices.deny", "memory": "memory.limit_in_bytes", "pids": "pids.max"}.get(
                ctrl, "cpu.shares"
            )
            ok = (probe / file).exists()
            probe.rmdir()
        except OSError as err:
            missing[limit] = f"cannot make cgroups under {root}: {err.strerror}"
            continue
        if not ok:
            missing[limit] = f"no {file} in the {ctrl} hierarchy"
            continue
        roots[ctrl] = root
    if devices == "v2" or (devices == "auto" and "devices" in missing):
        root2, program, why = v2_devices(mounts, own, hub_dir)
        if root2 is None:
            missing["devices"] = why if devices == "v2" else f"{missing['devices']}; {why}"
        else:
            roots["devices"] = root2
            missing.pop("devices", None)
    return Controllers(roots, missing, device_program=program)
