"""Embedded mode: workspaces as local processes on a GPU share."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner

from .mixin import GPUSpawnerMixin


class _LocalGPU(GPUSpawnerMixin):
    """Local-process spawners: the GPU environment and the tag that finds orphaned servers."""

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        env.update(self.gpu_environment(env.get("PYTHONPATH", "")))
        env[WORKSPACE_VAR] = workspace_tag(self.user.name, self.name)
        return env

    def server_pid(self) -> int | None:
        return self.pid

    async def end_orphans(self, grace_s: float = 10.0) -> None:
        """SIGTERM this workspace's untracked server processes, SIGKILL what is left after
        `grace_s`: only then may its GPU share go to someone else."""
        pids = stop_orphans(self.user.name, self.name)
        if pids:
            self.log.warning("stopped orphaned server processes %s of %s", pids, self.server_label)
        await wait_gone(pids, grace_s)


WORKSPACE_VAR = "GPUPOOL_WORKSPACE"


def workspace_tag(owner: str, name: str) -> str:
    return f"{owner}/{name}"


def stop_orphans(owner: str, name: str, proc_root: str = "/proc") -> list[int]:
    """SIGTERM processes of a workspace the hub no longer knows about.

    A hub killed between starting a server and recording it leaves a server nobody
    manages, still pinned to a GPU; it is found by the workspace tag in its environment.
    """
    tag = f"{WORKSPACE_VAR}={workspace_tag(owner, name)}".encode()
    stopped = []
    for proc in Path(proc_root).iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if tag in environ:
            try:
                os.kill(int(proc.name), signal.SIGTERM)
                stopped.append(int(proc.name))
            except ProcessLookupError:
                pass
    return stopped


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
    """LocalProcessSpawner on a GPU share (users are system accounts)."""

    cleanup_orphans = staticmethod(stop_orphans)


class GPUSimpleLocalProcessSpawner(_LocalGPU, SimpleLocalProcessSpawner):
    """SimpleLocalProcessSpawner on a GPU share: no system accounts needed (demos, tests,
    teaching machines where everyone is one Unix user). Not isolated: see its parent."""

    cleanup_orphans = staticmethod(stop_orphans)
