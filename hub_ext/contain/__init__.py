"""Containment of what users run: a cgroup per train job and per workspace (see cgroups.py)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from traitlets import Enum, Float
from traitlets.config import Configurable

from gpupool.contain.cgroups import Tree, Unavailable, detect, joiner

__all__ = ["Containment", "Tree", "Unavailable", "WorkloadCgroups", "detect", "joiner"]


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
    stop_timeout_s = Float(
        10.0,
        config=True,
        help="""Seconds a stopping workspace's cgroup may take to
        empty after SIGKILL (processes in uninterruptible sleep); its GPU share is kept until it is
        empty. Example::

            c.Containment.stop_timeout_s = 30
        """,
    )


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

    @property
    def available(self) -> bool:
        return self.tree.available

    def job(self, job_id: str) -> str:
        return f"{self.instance}/job-{job_id}"

    def workspace(self, owner: str, name: str) -> str:
        digest = hashlib.sha256(f"{owner}\0{name}".encode("utf-8", "surrogatepass")).hexdigest()[:20]
        return f"{self.instance}/ws-{digest}"

    def describe(self) -> str:
        """One line for the log and the banner."""
        if self.available:
            return f"each job and workspace runs in a {self.tree.kind} cgroup of its own ({self.tree.root})"
        return (
            f"NO cgroups ({self.tree.reason}): a job's or workspace's processes that leave their"
            " process group (setsid) can outlive it"
        )
