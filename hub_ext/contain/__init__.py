"""Containment of what users run: a cgroup per train job and per workspace (see cgroups.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from traitlets import Dict, Enum, Float, Int, List, TraitError, Unicode, validate
from traitlets.config import Configurable

from gpupool.contain.cgroups import Tree, Unavailable, detect, joiner
from gpupool.contain.limits import JOB_PREFIX, LIMITS, Limits, machine_memory, parse_size, size_text
from gpupool.contain.resolve import resolve
from gpupool.pool.units import UnitError, gpus_number, parse_gpus

__all__ = [
    "Containment",
    "LimitPolicy",
    "Limits",
    "Tree",
    "Unavailable",
    "WorkloadCgroups",
    "detect",
    "joiner",
]
GROUP_KEYS = ("memory_limit", "pids_limit", "cpu_shares")
REQUIRABLE = ("cgroups", *LIMITS)


@dataclass(frozen=True)
class LimitPolicy:
    """Each workload's memory, processes and CPU share (0: none), and what replaces them per hub
    group and per spawn profile (gpupool.contain.resolve has the rule; keys: resolve.KEYS)."""

    memory_bytes: int = 0
    pids_max: int = 0
    cpu_shares: int = 0
    groups: dict[str, dict[str, int]] = field(default_factory=dict)
    profiles: dict[str, dict[str, int]] = field(default_factory=dict)
    workloads_cpu_shares: int = 0  # all workloads together, against the hub's
    jobs_cpu_shares: int = 0  # an instance's train jobs together, against each workspace
    workloads_memory_bytes: int = 0  # all workloads together
    hub_cpu_shares: int = 0  # the hub's own processes together (0: each weighs 1024 where it runs)

    def limits(self, gpu_minors: Iterable[int], groups: Iterable[str] = (), profile: str = "") -> Limits:
        """A workspace's (its owner's groups, its profile) or a train job's (its owner's groups)."""
        defaults = {
            "memory_bytes": self.memory_bytes,
            "pids_max": self.pids_max,
            "cpu_shares": self.cpu_shares,
        }
        got = resolve(defaults, self.groups, self.profiles, groups, profile)
        return Limits(frozenset(gpu_minors), got["memory_bytes"], got["pids_max"], got["cpu_shares"])


class Containment(Configurable):
    """How the hub keeps every process a job or workspace starts in one place it can end."""

    mode = Enum(
        ["auto", "v2", "v1", "off"],
        "auto",
        config=True,
        help="""Which cgroups hold each train
        job and workspace, so that ending it ends every process it started, whatever they did to
        their session (setsid, double fork, env -i). auto: cgroup v2 where /sys/fs/cgroup is
        cgroup2, else the cgroup v1 freezer, else a hybrid set-up's cgroup2 mount; v2 or v1: only
        that one; off: process groups only (what a user's process can leave). Needs a hub that
        runs as root; without cgroups the hub says so at start and signals process groups.
        Example::

            c.Containment.mode = "v1"
        """,
    )
    devices = Enum(
        ["auto", "v1", "v2"],
        "auto",
        config=True,
        help="""How each job and workspace is kept to its own GPUs' device
        nodes. v1: the cgroup v1 devices controller; v2: a device eBPF program attached to the
        workload's cgroup2 folder, as container runtimes do it (a small helper built from Go
        modules with runc's device filter: `make venv` builds it where Go is installed, else the
        hub on first use); auto: v1 where its devices hierarchy is mounted, else v2. Where
        neither can be applied, the start says why. Example::

            c.Containment.devices = "v2"
        """,
    )
    stop_timeout_s = Float(
        10.0,
        config=True,
        help="""Seconds a stopping workspace's cgroup may take to
        empty after SIGKILL (processes in uninterruptible sleep); its GPU share is kept until it is
        empty. Example::

            c.Containment.stop_timeout_s = 30
        """,
    )
    memory_limit = Unicode(
        "50%",
        config=True,
        help="""Host memory each job and workspace may use (all
        its processes together): a size (8G, 512M) or a share of the machine's memory (25%); ""
        for none. Over it the kernel kills a process of that workload only (never the hub's), and
        the job's log says so ("killed: over its 8 GiB memory limit"). Swap counts too where the
        kernel accounts it. cgroup v1 only (said at start otherwise). Example::

            c.Containment.memory_limit = "16G"
        """,
    )
    pids_limit = Int(
        4096,
        min=0,
        max=4_194_304,
        config=True,
        help="""Processes and threads each job and workspace may
        have at once (pids.max; 0: none): a fork storm stops there, not at the machine's limit.
        Data loaders and thread pools count: leave room for them. Example::

            c.Containment.pids_limit = 2048
        """,
    )
    cpu_shares = Int(
        1024,
        min=0,
        max=262_144,
        config=True,
        help="""Each workload's CPU weight against the others when the
        CPUs are busy (cpu.shares, 1024 = even; 0: the kernel's default). Not a cap: an idle
        machine's CPUs are anyone's. Example::

            c.Containment.cpu_shares = 512
        """,
    )
    group_limits = Dict(
        {},
        config=True,
        help="""Per hub group, limits that replace the ones above for
        its members' workspaces and train jobs (keys: memory_limit, pids_limit, cpu_shares; a
        missing key keeps the default). A user in several groups gets the most generous of each;
        a profile's own limits (profile_limits) come before them. Example::

            c.Containment.group_limits = {
                "staff": {"memory_limit": "64G", "pids_limit": 16384, "cpu_shares": 2048},
                "cs101": {"memory_limit": "4G"},
            }
        """,
    )
    profile_limits = Dict(
        {},
        config=True,
        help="""Per spawn profile, limits for the workspaces started with
        it, before the group's and the default (keys as group_limits). On the local spawners a
        profile is the size chosen on the spawn form, in GPUs as the form writes it ("0.25",
        "1", "2"): a workspace of a whole GPU can be given more host memory than a quarter's.
        Train jobs have no profile: their owner's group_limits, else the defaults. Example::

            c.Containment.profile_limits = {
                "0.25": {"memory_limit": "8G", "cpu_shares": 512},
                "1": {"memory_limit": "32G", "cpu_shares": 2048},
            }
        """,
    )
    workloads_cpu_shares = Int(
        256,
        min=2,
        max=262_144,
        config=True,
        help="""The CPU weight of all jobs and workspaces together
        against the hub's processes (together hub_cpu_shares; each 1024 where that is 0): the
        hub, the proxy and gpupool's services keep most of a core whatever users run. Example::

            c.Containment.workloads_cpu_shares = 128
        """,
    )
    jobs_cpu_shares = Int(
        1024,
        min=2,
        max=262_144,
        config=True,
        help="""The CPU weight of all train jobs together against each
        workspace when the CPUs are busy (cgroup v1's cpu.shares; a workspace weighs
        cpu_shares, 1024 by default). Each job's own weight (cpu_shares, group_limits,
        profile_limits) then divides the jobs' part among them, so a user's sixty sweep runs
        cannot starve a workspace beside them. Not a cap: jobs use every CPU no workspace wants.
        Example::

            c.Containment.jobs_cpu_shares = 2048  # the jobs together weigh two workspaces
        """,
    )
    hub_cpu_shares = Int(
        0,
        min=0,
        max=262_144,
        config=True,
        help="""The CPU weight of the hub's own processes together (the
        hub, the proxy and the services it starts), in a cgroup v1 cpu folder of their own beside
        all workloads' (which weigh workloads_cpu_shares): when the CPUs are busy the hub gets
        hub_cpu_shares / (hub_cpu_shares + workloads_cpu_shares) of what the two want, 97 % at
        8192 against the default 256, whatever users run; it uses only what it needs, so an idle hub leaves the CPUs to
        users. The weight also counts against other processes of the hub's own cgroup (a
        system service's slice), where 8192 weighs as 8 busy processes. Applied at start, where the
        cpu limit is enforced; 0 (the default): the hub's processes stay where they started,
        1024 each. Off by default until measured: on the 2-core test machine, with 8192 a
        workspace's own start (in the workloads' 256) took up to a fifth longer, and the
        neighbours benchmark could not show a gain. Example::

            c.Containment.hub_cpu_shares = 4096
        """,
    )
    reserved_memory = Unicode(
        "1G",
        config=True,
        help="""Host memory no job or workspace may take: all of them
        together are limited to the machine's memory less this, so the hub and the proxy keep
        room (a size or a share of the machine, as memory_limit; "" for none). Example::

            c.Containment.reserved_memory = "4G"
        """,
    )
    require = List(
        Unicode(),
        config=True,
        help=f"""Limits without which the hub refuses to start (the
        banner and the log say which are enforced here, and why not): any of
        {", ".join(REQUIRABLE)} ("cgroups": the kill of whole workloads). Example::

            c.Containment.require = ["cgroups", "devices", "memory", "processes"]
        """,
    )

    @validate("memory_limit", "reserved_memory")
    def _check_size(self, proposal):
        try:
            parse_size(proposal["value"], 1 << 40)
        except ValueError as err:
            raise TraitError(f"Containment.{proposal['trait'].name}: {err}") from None
        return proposal["value"]

    @validate("require")
    def _check_require(self, proposal):
        bad = [v for v in proposal["value"] if v not in REQUIRABLE]
        if bad:
            raise TraitError(f"Containment.require: unknown {bad[:5]}; choose from {list(REQUIRABLE)}")
        return proposal["value"]

    @validate("group_limits")
    def _check_groups(self, proposal):
        return {str(k): v for k, v in _checked_table("group_limits", proposal["value"]).items()}

    @validate("profile_limits")
    def _check_profiles(self, proposal):
        out = {}
        for name, limits in _checked_table("profile_limits", proposal["value"]).items():
            try:  # a size is one profile however it is written: "0.50" is "0.5"
                name = gpus_number(parse_gpus(name))
            except UnitError:
                pass  # a named profile (a spawner that offers profiles)
            out[name] = limits
        return out

    def policy(self, total_bytes: int | None = None) -> LimitPolicy:
        """The limits as numbers, for a machine of `total_bytes` (this one's by default)."""
        total = machine_memory() if total_bytes is None else total_bytes

        def numbers(table: dict[str, Any]) -> dict[str, dict[str, int]]:
            return {name: _override(v, total) for name, v in table.items()}

        reserved = parse_size(self.reserved_memory, total)
        return LimitPolicy(
            memory_bytes=parse_size(self.memory_limit, total),
            pids_max=self.pids_limit,
            cpu_shares=self.cpu_shares,
            groups=numbers(self.group_limits),
            profiles=numbers(self.profile_limits),
            workloads_cpu_shares=self.workloads_cpu_shares,
            jobs_cpu_shares=self.jobs_cpu_shares,
            hub_cpu_shares=self.hub_cpu_shares,
            workloads_memory_bytes=max(total - reserved, 1 << 28) if reserved and total else 0,
        )


def _override(limits: dict[str, Any], total_bytes: int) -> dict[str, int]:
    """A group's or profile's option keys -> resolve.KEYS, only those it sets."""
    out = {}
    if "memory_limit" in limits:
        out["memory_bytes"] = parse_size(limits["memory_limit"], total_bytes)
    if "pids_limit" in limits:
        out["pids_max"] = int(limits["pids_limit"])
    if "cpu_shares" in limits:
        out["cpu_shares"] = int(limits["cpu_shares"])
    return out


def _checked_table(option: str, value: dict[str, object]) -> dict[str, object]:
    """group_limits or profile_limits, checked with bounds: the names, the keys, each value."""
    if len(value) > 1000:
        raise TraitError(f"Containment.{option}: at most 1000 entries")
    for name, limits in value.items():
        where = f"Containment.{option}[{str(name)[:64]!r}]"
        if not isinstance(name, str) or not 0 < len(name) <= 255:
            raise TraitError(f"{where}: a name of 1 to 255 characters")
        if not isinstance(limits, dict) or set(limits) - set(GROUP_KEYS):
            raise TraitError(f"{where}: must be a dict with keys among {list(GROUP_KEYS)}")
        try:
            parse_size(limits.get("memory_limit", ""), 1 << 40)
        except ValueError as err:
            raise TraitError(f"{where}: {err}") from None
        for key, top in (("pids_limit", 4_194_304), ("cpu_shares", 262_144)):
            n = limits.get(key, 0)
            if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= top:
                raise TraitError(f"{where}: {key} must be a whole number from 0 to {top}")
    return value


def hub_key(db_url: str) -> str:
    """Names this hub's cgroups and marks its processes: its database, which two hubs on one
    machine never share."""
    return hashlib.sha256(db_url.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class WorkloadCgroups:
    """The cgroups of one hub's instance: a name per job and per workspace."""

    tree: Tree
    instance: str
    hub_key: str = ""
    stop_timeout_s: float = 10.0
    policy: LimitPolicy = field(default_factory=LimitPolicy)

    @property
    def available(self) -> bool:
        return self.tree.available

    def job(self, job_id: str) -> str:
        return f"{self.instance}/{JOB_PREFIX}{job_id}"

    def workspace(self, owner: str, name: str) -> str:
        digest = hashlib.sha256(f"{owner}\0{name}".encode("utf-8", "surrogatepass")).hexdigest()[:20]
        return f"{self.instance}/ws-{digest}"

    def limits(self, gpu_minors: Iterable[int], groups: Iterable[str] = (), profile: str = "") -> Limits:
        return self.policy.limits(gpu_minors, groups, profile)

    def status(self) -> dict[str, str]:
        """limit -> "" when this machine enforces it, else why not ("cgroups": the whole kill)."""
        return {"cgroups": "" if self.available else self.tree.reason, **self.tree.controllers.status()}

    def missing(self, required: Iterable[str]) -> dict[str, str]:
        """The required limits this machine cannot apply, with why."""
        status = self.status()
        return {r: status[r] for r in required if status.get(r)}

    def describe_limits(self) -> list[str]:
        """One line per limit, enforced or not (and why): the log's and the banner's."""
        p, s = self.policy, self.tree.controllers.status()
        values = {
            "devices": "only its own GPUs' device nodes (CUDA_VISIBLE_DEVICES cannot widen it)"
            + (", by a cgroup v2 device program" if self.tree.controllers.device_program else ""),
            "memory": (
                f"{size_text(p.memory_bytes)} of host memory each"
                if p.memory_bytes
                else "no per-workload limit set"
            )
            + (f", {size_text(p.workloads_memory_bytes)} for all" if p.workloads_memory_bytes else ""),
            "processes": f"{p.pids_max} processes each" if p.pids_max else "no limit set",
            "cpu": f"CPU weight {p.cpu_shares} each, train jobs together {p.jobs_cpu_shares or 1024},"
            f" all together {p.workloads_cpu_shares} against the hub's "
            + (f"{p.hub_cpu_shares} (its processes together)" if p.hub_cpu_shares else "1024 a process"),
        }
        for limit, key in (("memory", "memory_bytes"), ("processes", "pids_max"), ("cpu", "cpu_shares")):
            own = [f"group {g}" for g, v in sorted(p.groups.items()) if key in v]
            own += [f"profile {n}" for n, v in sorted(p.profiles.items()) if key in v]
            if own:  # the banner names who gets other values (gpupool.contain.resolve)
                values[limit] += f"; own values for {', '.join(own[:5])}" + (
                    f" and {len(own) - 5} more" if len(own) > 5 else ""
                )
        return [
            f"{limit}: {'enforced' if not s[limit] else 'NOT enforced'}: {values[limit] if not s[limit] else s[limit]}"
            for limit in LIMITS
        ]

    def describe(self) -> str:
        """One line for the log and the banner."""
        if self.available:
            return f"each job and workspace runs in a {self.tree.kind} cgroup of its own ({self.tree.root})"
        return (
            f"NO cgroups ({self.tree.reason}): a job's or workspace's processes that leave their"
            " process group (setsid) can outlive it"
        )
