"""Embedded mode: workspaces as local processes on a GPU share."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner, set_user_setuid
from tornado import web

from gpupool.contain import WorkloadCgroups, joiner
from gpupool.contain.limits import oom_words
from gpupool.gpu import env_files as gpu_env_files
from gpupool.host.accounts import Account, AccountError, SystemAccounts
from gpupool.host.instance import HUB_VAR, INSTANCE_VAR
from gpupool.pool import PoolError
from gpupool.pool.units import gpus_number
from gpupool.spawner.local_ready import PromptReady
from gpupool.spawner.mixin import GPUSpawnerMixin, with_message
from gpupool.store import Event, Store
from gpupool.vocab.kinds import EventKind


class _LocalGPU(PromptReady, GPUSpawnerMixin):
    """Local-process spawners: the GPU environment, the tag that finds orphaned servers, and the
    workspace's cgroup: the server starts in it, and the workspace has ended (its share may go)
    only once it is empty, whatever its processes did to their session (gpupool.contain)."""

    _join_fds: tuple[int, ...] = ()
    follows_published_gpu = True  # the hub publishes where the share is now (gpupool.gpu.env_files)

    @property
    def cgroups(self) -> WorkloadCgroups:
        return self.gpupool_root.cgroups

    @property
    def cgroup(self) -> str:
        return self.cgroups.workspace(self.user.name, self.name)

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        env.update(self.gpu_environment(env.get("PYTHONPATH", "")))
        env[WORKSPACE_VAR] = workspace_tag(self.user.name, self.name)
        if self.gpupool_allocation is not None:  # where the hub says the share is now (it may move)
            env[gpu_env_files.VAR] = str(
                gpu_env_files.default_folder() / gpu_env_files.file_name(self.user.name, self.name)
            )
        env[HUB_VAR], env[INSTANCE_VAR] = self.cgroups_marker()
        return env

    def cgroups_marker(self) -> tuple[str, str]:
        """What a restarted hub recognizes this instance's servers by (gpupool.host.instance)."""
        return self.cgroups.hub_key, self.cgroups.instance

    async def start(self):
        import asyncio

        began = time.monotonic()
        cgroups = self.cgroups
        # what an earlier server of this workspace left behind ends before the new one starts
        if not await asyncio.to_thread(cgroups.tree.end, self.cgroup, cgroups.stop_timeout_s):
            raise _refused(
                f"processes of your earlier server {self.server_label} do not end; ask an admin", status=409
            )
        # its limits before anything runs in it, no GPU yet: the share's GPUs are allowed once
        # reserved (make_preexec_fn), and follow it when it moves (gpupool.contain.follow)
        limits = cgroups.limits((), self.user_groups, self.limits_profile())
        self._join_fds = tuple(cgroups.tree.join_fds(self.cgroup, limits))
        try:
            url = await super().start()
        finally:
            for fd in self._join_fds:
                os.close(fd)
            self._join_fds = ()
        # the hub's first look then finds it (spawner/local_ready.py)
        await self.wait_listening(url, float(self.start_timeout) - (time.monotonic() - began))
        return url

    def limits_profile(self) -> str:
        """The spawn profile whose c.Containment.profile_limits apply: the size chosen on the form,
        in GPUs as the form writes it ("0.25"); "" for options the reservation then refuses."""
        try:
            return gpus_number(self.spawn_choice().milli)
        except PoolError:
            return ""

    def make_preexec_fn(self, name: str):
        # the child joins the workspace's cgroup first, as root, before anything else runs
        self.allow_own_gpus()
        return joiner(self._join_fds, super().make_preexec_fn(name))

    def allow_own_gpus(self) -> None:
        """Its reserved GPUs' device nodes, and no other, may be opened from its cgroup (called in
        the hub just before the server's process starts: the share is reserved by then)."""
        if self._join_fds:
            self.cgroups.tree.set_gpus(self.cgroup, [g.device_minor for g in self.allocated_gpus()])

    async def end_workload(self, exit_status: int | None = None) -> bool:
        """Kill what is left in the workspace's cgroup (and untracked servers, found by their tag
        where there are no cgroups); True once nothing of it runs. A server the kernel's OOM
        killer ended is recorded with its limit: the hub's home page tells its owner why."""
        import asyncio

        await self.end_orphans()
        cgroups = self.cgroups
        # killed (SIGKILL) with kills counted in its cgroup: the OOM killer ended the server itself
        # (a kernel it killed earlier leaves the server running). Read before the cgroup goes
        if exit_status == -signal.SIGKILL:
            tree = cgroups.tree
            kills = tree.oom_kills(self.cgroup)
            record_oom_stop(self.pool.store, self.user.name, self.name, kills, tree.memory_limit(self.cgroup))
        left = cgroups.tree.pids(self.cgroup)
        if left:
            self.log.warning(
                "ending %d process(es) left in the cgroup of %s: %s", len(left), self.server_label, left[:10]
            )
        return await asyncio.to_thread(cgroups.tree.end, self.cgroup, cgroups.stop_timeout_s)

    def server_pid(self) -> int | None:
        return self.pid

    def server_hub_api_url(self) -> str:
        """JUPYTERHUB_API_URL as this hub gives it to its servers (Spawner.get_env's rule)."""
        from urllib.parse import urlparse

        from jupyterhub.utils import url_path_join

        if self.hub_connect_url is not None:
            return url_path_join(self.hub_connect_url, urlparse(self.hub.api_url).path)
        return self.hub.api_url

    async def end_orphans(self, grace_s: float = 10.0) -> None:
        """SIGTERM this workspace's untracked server processes, SIGKILL what is left after
        `grace_s`: only then may its GPU share go to someone else."""
        pids = stop_orphans(self.user.name, self.name, hub_api_url=self.server_hub_api_url())
        if pids:
            self.log.warning("stopped orphaned server processes %s of %s", pids, self.server_label)
        await wait_gone(pids, grace_s)


WORKSPACE_VAR = "GPUPOOL_WORKSPACE"


def record_oom_stop(store: Store, owner: str, name: str, kills: int, limit_bytes: int) -> bool:
    """The event that says a server ended because the kernel killed it over its memory limit
    (`kills` in its cgroup, `limit_bytes` its limit; no kill: nothing to say). Its owner reads it
    on the home page (gpupool.api.warnings.stops_for)."""
    if kills <= 0:
        return False
    label = f"{owner}/{name}" if name else owner
    detail = oom_words(1, limit_bytes).removeprefix("killed: ")  # the server's own kill: no count
    why = "out of memory" if detail == "out of memory" else f"out of memory ({detail})"
    with store.session() as s:
        s.add(
            Event(
                kind=EventKind.OOM,
                owner=owner,
                name=name,
                message=f"server {label} stopped because {why}",
                data={"kills": kills, "limit_bytes": limit_bytes},
            )
        )
    return True


def workspace_tag(owner: str, name: str) -> str:
    return f"{owner}/{name}"


def stop_orphans(
    owner: str, name: str, proc_root: str = "/proc", hub_api_url: str = "", marker: str = ""
) -> list[int]:
    """SIGTERM processes of a workspace the hub no longer knows about.

    A hub killed between starting a server and recording it leaves a server nobody
    manages, still pinned to a GPU; it is found by the workspace tag in its environment.
    """
    tag = f"{WORKSPACE_VAR}={workspace_tag(owner, name)}".encode()
    # with the hub's API URL, only this hub's servers (another hub on the machine may have a
    # user of the same name)
    hub = f"JUPYTERHUB_API_URL={hub_api_url}".encode() if hub_api_url else b""
    # this hub's GPUPOOL_HUB=<key>: a process marked for another hub is that hub's (one started before
    # the marker existed has none, and is matched by its tag as before)
    mark = marker.encode()
    key = mark.partition(b"=")[0] + b"="
    stopped = []
    for proc in Path(proc_root).iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        other_hub = bool(mark) and any(v.startswith(key) and v != mark for v in environ)
        if tag in environ and (not hub or hub in environ) and not other_hub:
            try:
                os.kill(int(proc.name), signal.SIGTERM)
                stopped.append(int(proc.name))
            except ProcessLookupError:
                pass
    return stopped


def end_orphaned(cgroups: WorkloadCgroups, owner: str, name: str) -> list[int]:
    """After a hub restart, for a workspace the hub does not know as running: end its cgroup (every
    process it started) and SIGTERM untracked servers found by their tag; the pids ended."""
    group = cgroups.workspace(owner, name)
    pids = cgroups.tree.pids(group)
    cgroups.tree.end(group, cgroups.stop_timeout_s)
    return sorted({*pids, *stop_orphans(owner, name, marker=f"{HUB_VAR}={cgroups.hub_key}")})


async def wait_gone(pids: list[int], grace_s: float, step_s: float = 0.1) -> None:
    import asyncio

    for _ in range(int(grace_s / step_s)):
        pids = [p for p in pids if _alive(p)]
        if not pids:
            return
        await asyncio.sleep(step_s)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class GPULocalProcessSpawner(_LocalGPU, LocalProcessSpawner):
    """LocalProcessSpawner on a GPU share: each hub user's server runs as their Unix account,
    named and (optionally) created by `c.SystemAccounts` (TLJH's `jupyter-<name>` when
    `gpupool up` runs as root; the hub name itself by default, as LocalProcessSpawner does)."""

    cleanup_orphans = staticmethod(end_orphaned)
    account: Account | None = None

    async def start(self):
        # before the share is reserved: a user who cannot have an account holds no GPU
        import asyncio

        accounts = SystemAccounts(config=self.config)
        try:
            self.account = await asyncio.to_thread(accounts.ensure, self.user.name)
        except AccountError as err:
            raise _refused(str(err)) from None
        if self.account is None:
            raise _refused(
                f"hub user {self.user.name[:64]!r} has no Unix account"
                f" {accounts.name_for(self.user.name)!r} on this machine to run a server as"
                " (an admin can turn on c.SystemAccounts.create)"
            )
        return await super().start()

    def make_preexec_fn(self, name: str):
        # LocalProcessSpawner passes the hub name; the server runs as the mapped account, in its cgroup
        self.allow_own_gpus()
        return joiner(
            self._join_fds, set_user_setuid(self.account.name if self.account is not None else name)
        )

    def user_env(self, env: dict[str, str]) -> dict[str, str]:
        if self.account is None:
            return super().user_env(env)
        env.update(
            USER=self.account.name, LOGNAME=self.account.name, HOME=self.account.home, SHELL=_TERMINAL_SHELL
        )  # the account's own shell is nologin: terminals need a real one
        # the users' environment's tools, then the system's: not the hub's PATH (root's, which may
        # name folders of a private clone), as jobs have (runners.local.job_path)
        from gpupool.runners.local import job_path

        env["PATH"] = job_path(self.cmd[0] if self.cmd else "")
        return env


_TERMINAL_SHELL = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"


def _refused(message: str, status: int = 403) -> web.HTTPError:
    return with_message(
        web.HTTPError(status, reason="no Unix account" if status == 403 else "workspace still running"),
        message,
    )


class GPUSimpleLocalProcessSpawner(_LocalGPU, SimpleLocalProcessSpawner):
    """SimpleLocalProcessSpawner on a GPU share: no system accounts needed (demos, tests,
    teaching machines where everyone is one Unix user). Not isolated: see its parent."""

    cleanup_orphans = staticmethod(end_orphaned)
