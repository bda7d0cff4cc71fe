"""Every train job and workspace in a cgroup of its own, ended as a whole by the kernel.

A process group or a session is the user's to leave (`setsid`, a double fork, `env -i` from a
terminal); a cgroup is not: every child is born in its parent's cgroup, and only root may move a
process between cgroups (the folders below are root's, 0755, and so is every cgroup.procs above
them). Ending a workload is then one kernel operation over everything it ever started:

- cgroup v2: write 1 to `cgroup.kill` (Linux 5.14+): every process in it gets SIGKILL at once;
- cgroup v1: freeze the workload's freezer cgroup (nothing in it can fork any more), SIGKILL each
  process listed, thaw: the frozen processes die as they wake.

A workload's GPU share goes back only once its cgroup is empty. Where neither is available (the hub
is not root, no cgroup file system, a container without delegation), `Unavailable` says why and the
callers keep their process-group signals; the hub says so at start (log and banner).

Layout: `<mount>/<the hub's own cgroup>/gpupool-<hub key>/<instance id>/<workload>`; the hub key
names this hub's database (two hubs on one machine never meet), the instance id the database's own
identity (gpupool.host.instance checks it at start).
"""

from __future__ import annotations

import errno
import os
import re
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from gpupool.contain import devfilter
from gpupool.contain.limits import LIMITS, Controllers, Limits, NoControllers, find_controllers, oom_words

SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")
FREEZE_WAIT_S = 0.2  # a freezer cgroup freezes in microseconds; a task in D state may take longer


class Tree:
    """One hub's cgroups: folders under `root` in one hierarchy. Names are relative paths of
    short segments ("3fa2c1/job-0a1b2c"), never a user's string."""

    kind = ""  # "cgroup v2" / "cgroup v1 (freezer)": said in the log and the banner
    available = True
    reason = ""

    def __init__(self, root: Path, controllers: Controllers | None = None) -> None:
        self.root = root
        # the limits beside the kill (gpupool.contain.limits): devices, memory, processes, CPU
        self.controllers = controllers or NoControllers(
            {limit: f"not applied by gpupool on {self.kind or 'this machine'}" for limit in LIMITS}
        )

    @staticmethod
    def rel(name: str) -> Path:
        parts = name.split("/")
        if not name or not all(SEGMENT.match(p) for p in parts):
            raise ValueError(f"not a cgroup name: {name[:80]!r}")
        return Path(*parts)

    def path(self, name: str) -> Path:
        return self.root / self.rel(name)

    def make(self, name: str) -> None:
        """The cgroup (and those above it), root's and 0755: a user may read it, never write in it."""
        os.makedirs(self.path(name), mode=0o755, exist_ok=True)

    def join_fd(self, name: str) -> int | None:
        """cgroup.procs of a new or emptied cgroup, open for writing: a child writes b"0" to it before
        it runs anything (see `joiner`). The kernel checks the opener's (root's) credentials, so the
        child may already have switched to its user's account."""
        self.make(name)
        return os.open(self.path(name) / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)

    def join_fds(self, name: str, limits: Limits | None = None) -> list[int]:
        """As `join_fd`, in every hierarchy the tree has (the v1 devices, memory, pids and cpu ones
        beside the freezer), with `limits` applied before anything joins: a workload never runs a
        moment without them (None: join as it is, e.g. a second process of a running workload).
        Close them all after the start."""
        fd = self.join_fd(name)
        if fd is None:
            return []
        fds = [fd]
        try:
            rel = self.rel(name)
            if limits is not None:
                self.controllers.apply(rel, limits)
            fds += self.controllers.join_fds(rel)
        except BaseException:
            for f in fds:
                os.close(f)
            raise
        return fds

    def set_gpus(self, name: str, minors: Iterable[int]) -> bool:
        """The workload may open only these GPUs' device nodes from now on (see Controllers.set_gpus)."""
        return self.controllers.set_gpus(self.rel(name), minors)

    def oom_kills(self, name: str) -> int:
        return self.controllers.oom_kills(self.rel(name))

    def memory_limit(self, name: str) -> int:
        return self.controllers.memory_limit(self.rel(name))

    def memory_note(self, name: str) -> str:
        """What the kernel's OOM killer did in the workload's cgroup, in its user's words ("killed:
        over its 8 GiB memory limit"; "" nothing). Read before the cgroup is removed: the count
        lives in it (memory.oom_control)."""
        return oom_words(self.oom_kills(name), self.memory_limit(name))

    def pids(self, name: str) -> list[int]:
        try:
            text = (self.path(name) / "cgroup.procs").read_text()
        except FileNotFoundError:
            return []
        return [int(p) for p in text.split()]

    def empty(self, name: str) -> bool:
        return not self.pids(name)

    def signal(self, name: str, sig: int) -> None:
        """`sig` to every process of the workload, whatever session or group it moved to."""
        for pid in self.pids(name):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill(self, name: str) -> bool:
        """SIGKILL everything in the cgroup; True once it is empty (the processes may take a moment
        to exit: call again, or `wait_empty`)."""
        raise NotImplementedError

    def remove(self, name: str) -> bool:
        """Remove the (empty) cgroup; False while processes remain in it."""
        path = self.path(name)
        for child in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            try:
                child.rmdir()
            except OSError:
                return False
        try:
            path.rmdir()
        except FileNotFoundError:
            pass
        except OSError as err:
            if err.errno in (errno.EBUSY, errno.ENOTEMPTY):
                return False
            raise
        # its folders in the other hierarchies (empty once the freezer's is: the same processes)
        return self.controllers.remove(self.rel(name))

    def remove_root(self) -> None:
        """The hub's own folder in every hierarchy, where empty (a test's or `make clean`'s end)."""
        self.controllers.remove_roots()
        try:
            self.root.rmdir()
        except OSError:
            pass

    def names(self, under: str = "") -> list[str]:
        """The cgroups right below `under` (or the hub's root)."""
        base = self.path(under) if under else self.root
        try:
            return sorted(p.name for p in base.iterdir() if p.is_dir() and SEGMENT.match(p.name))
        except FileNotFoundError:
            return []

    def end(self, name: str, timeout_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> bool:
        """Kill the cgroup, wait (at most `timeout_s`) until it is empty and remove it. Blocking:
        call it off the event loop. False when processes remain (uninterruptible sleep)."""
        deadline = clock() + timeout_s
        while not self.kill(name):
            if clock() > deadline:
                return False
            time.sleep(0.02)
        return self.remove(name)


# what gpupool does not do on cgroup v2 (yet): said at start, per limit
V2_MISSING = {
    "devices": "cgroup v2 needs a device eBPF program attached to each cgroup; none is attached here",
    "memory": "gpupool sets memory.limit_in_bytes on cgroup v1 only (no memory.max on v2 yet)",
    "processes": "gpupool sets pids.max on cgroup v1 only",
    "cpu": "gpupool sets cpu.shares on cgroup v1 only (no cpu.weight on v2 yet)",
}


class V2(Tree):
    kind = "cgroup v2"

    def __init__(self, root: Path, controllers: Controllers | None = None) -> None:
        super().__init__(root, controllers or NoControllers(V2_MISSING))

    @classmethod
    def with_devices(cls, root: Path, devices: str = "auto") -> V2:
        """The tree with its device program (the helper, built if needed) unless `devices` is
        v1 or the helper cannot be had: then the start says why."""
        if devices == "v1":
            return cls(
                root, NoControllers({**V2_MISSING, "devices": "no cgroup v1 devices hierarchy on cgroup v2"})
            )
        program, why = devfilter.helper()
        if program is None:
            return cls(root, NoControllers({**V2_MISSING, "devices": why}))
        others = {k: v for k, v in V2_MISSING.items() if k != "devices"}
        # the workload's own cgroup2 folder, which it joins anyway: the program sits on it
        return cls(root, Controllers({"devices": root}, others, "cgroup v2", device_program=program))

    def kill(self, name: str) -> bool:
        path = self.path(name)
        try:
            (path / "cgroup.kill").write_text("1")
        except FileNotFoundError:
            return True  # no cgroup, no process
        return not self._populated(path)

    def empty(self, name: str) -> bool:
        return not self._populated(self.path(name))

    @staticmethod
    def _populated(path: Path) -> bool:
        try:
            events = (path / "cgroup.events").read_text()
        except FileNotFoundError:
            return False
        return "populated 1" in events


class V1Freezer(Tree):
    kind = "cgroup v1 (freezer)"

    def kill(self, name: str) -> bool:
        path = self.path(name)
        state = path / "freezer.state"
        try:
            state.write_text("FROZEN")
        except FileNotFoundError:
            return True
        deadline = time.monotonic() + FREEZE_WAIT_S
        while state.read_text().strip() != "FROZEN" and time.monotonic() < deadline:
            time.sleep(0.002)
        # frozen: nothing in it forks between this list and the signals (if it did not freeze in
        # time, a child born meanwhile is caught by the next call)
        self.signal(name, signal.SIGKILL)
        state.write_text("THAWED")
        return self.empty(name)


class Unavailable(Tree):
    """No cgroups: callers keep their process-group signals. `reason` says why, in plain words."""

    kind = ""
    available = False

    def __init__(self, reason: str) -> None:
        super().__init__(
            Path("/nonexistent"), NoControllers({limit: f"no cgroups: {reason}" for limit in LIMITS})
        )
        self.reason = reason

    def make(self, name: str) -> None:
        pass

    def join_fd(self, name: str) -> int | None:
        return None

    def join_fds(self, name: str, limits: Limits | None = None) -> list[int]:
        return []

    def pids(self, name: str) -> list[int]:
        return []

    def kill(self, name: str) -> bool:
        return True

    def remove(self, name: str) -> bool:
        return True

    def names(self, under: str = "") -> list[str]:
        return []


def joiner(
    fd: int | Sequence[int] | None, then: Callable[[], None] | None = None
) -> Callable[[], None] | None:
    """A Popen preexec_fn that puts the child in the cgroup (fd from `join_fd`, or every fd of
    `join_fds`: one per hierarchy) before it runs anything else, then calls `then` (e.g. the switch
    to the user's account)."""
    fds = [] if fd is None else [fd] if isinstance(fd, int) else list(fd)
    if not fds:
        return then

    def preexec() -> None:
        for f in fds:
            os.write(f, b"0")  # "0": the writing process itself
        if then is not None:
            then()

    return preexec


# --- finding the hierarchy ----------------------------------------------------------------
def mounts(mountinfo: str) -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of every cgroup file system in /proc/self/mountinfo."""
    out = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) >= 5 and len(rfields) >= 3 and rfields[0] in ("cgroup", "cgroup2"):
            out.append((fields[4].replace("\\040", " "), rfields[0], set(rfields[2].split(","))))
    return out


def own_paths(proc_cgroup: str) -> dict[str, str]:
    """The hub's own cgroup in each hierarchy: "" for v2, each controller name for v1."""
    out = {}
    for line in proc_cgroup.splitlines():
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hid == "0" and controllers == "":
            out[""] = path
        for c in controllers.split(","):
            if c:
                out[c] = path
    return out


def detect(
    mode: str,
    hub_key: str,
    mountinfo: str | None = None,
    proc_cgroup: str | None = None,
    devices: str = "auto",
) -> Tree:
    """This machine's cgroups for this hub (`mode`: auto, v2, v1 or off). auto: v2 where the whole
    hierarchy is cgroup2 (/sys/fs/cgroup itself), else the v1 freezer, else a cgroup2 mount of a
    hybrid set-up. Made and checked at once: `Unavailable` with the reason when it cannot be used.
    `devices` (auto, v1, v2): how the GPU devices limit is applied, see limits.find_controllers."""
    if mode == "off":
        return Unavailable("turned off (c.Containment.mode = 'off')")
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text() if mountinfo is None else mountinfo
        proc_cgroup = Path("/proc/self/cgroup").read_text() if proc_cgroup is None else proc_cgroup
    except OSError as err:
        return Unavailable(f"cannot read the process's cgroups: {err}")
    found = mounts(mountinfo)
    mine = own_paths(proc_cgroup)
    v2 = [m for m in found if m[1] == "cgroup2"]
    v1 = [m for m in found if m[1] == "cgroup" and "freezer" in m[2]]
    unified = [m for m in v2 if m[0] == "/sys/fs/cgroup"]
    choices: list[tuple[type[Tree], str, str]] = []  # (class, mount point, own path)
    if mode in ("auto", "v2"):
        choices += [(V2, m[0], mine.get("", "/")) for m in unified]
    if mode in ("auto", "v1"):
        choices += [(V1Freezer, m[0], mine.get("freezer", "/")) for m in v1]
    if mode in ("auto", "v2"):
        choices += [(V2, m[0], mine.get("", "/")) for m in v2 if m not in unified]
    if not choices:
        return Unavailable(
            {"v2": "no cgroup2 file system is mounted", "v1": "no cgroup v1 freezer is mounted"}.get(
                mode, "no cgroup v2 nor v1 freezer hierarchy is mounted"
            )
        )
    why = ""
    for cls, point, own in choices:
        root = Path(point, own.lstrip("/"), f"gpupool-{hub_key}")
        if cls is V2 and not Path(point, "cgroup.procs").exists():
            continue
        try:
            os.makedirs(root, mode=0o755, exist_ok=True)
            probe = root / f"probe-{os.getpid()}"
            probe.mkdir(exist_ok=True)
            ok = (probe / ("cgroup.kill" if cls is V2 else "freezer.state")).exists()
            probe.rmdir()
        except OSError as err:
            why = f"cannot make cgroups under {root}: {err.strerror}"
            continue
        if not ok:
            why = (
                "the kernel has no cgroup.kill (Linux 5.14+)"
                if cls is V2
                else "no freezer.state in the freezer"
            )
            continue
        if cls is V1Freezer:
            return V1Freezer(root, find_controllers(found, mine, root.name, devices))
        return V2.with_devices(root, devices)
    return Unavailable(why)
