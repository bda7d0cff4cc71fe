"""GPU use per workspace, from one of three sources behind one interface.

* NVMLSampler — the embedded hub: NVML per process (through gpupool.gpu.nvml, the only module
  that calls pynvml), attributed to a workspace through the process tree of its server.
* NodeAgentSampler — Kubernetes: per-pod JSON from the node agent DaemonSet.
* DemoSampler — `gpupool up --demo-culling`: what users say of their GPU (busy or idle).
* FileSampler — a JSON file someone else writes; the tests' stand-in for NVML.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpupool.gpu.proctree import descendants
from gpupool.vocab.agent_wire import pod_uses

log = logging.getLogger("gpupool.culler")


@dataclass(frozen=True)
class GPUUse:
    util_pct: float
    memory_mib: int


@dataclass(frozen=True)
class Target:
    """A workspace to sample: owner/name, its server's pid (embedded) or pod uid (k8s)."""

    owner: str
    name: str
    pid: int | None = None
    pod_uid: str = ""
    gpu_uuids: tuple[str, ...] = ()
    whole_gpus: bool = False

    @property
    def key(self) -> str:
        return f"{self.owner}/{self.name}"


class Sampler(Protocol):
    def sample(self, targets: list[Target]) -> dict[str, GPUUse]:
        """GPU use of each target it could measure; a missing key means no data."""
        ...


class NVMLSampler:
    def __init__(self, nvml=None, proc: Path = Path("/proc")) -> None:
        from gpupool.gpu.nvml import NVML

        self.nvml = nvml or NVML()
        self.proc = proc
        self.opened = False
        self.failing = False

    def sample(self, targets: list[Target]) -> dict[str, GPUUse]:
        from gpupool.gpu.nvml import NVMLUnavailable

        try:
            if not self.opened:
                self.nvml.open()
                self.opened = True
            processes = self.nvml.process_samples()
            devices = {d.gpu_uuid: d for d in self.nvml.device_samples()}
        except (NVMLUnavailable, Exception) as err:  # noqa: BLE001 - logged; retried next pass
            # once, not every pass: a hub with virtual GPUs would repeat it all day
            (log.debug if self.failing else log.warning)(
                "NVML sampling failed (no GPU data; retrying each pass): %s", err
            )
            self.failing, self.opened = True, False
            return {}
        if self.failing:
            log.info("NVML sampling works again")
            self.failing = False
        out: dict[str, GPUUse] = {}
        for t in targets:
            if t.whole_gpus and t.gpu_uuids and all(u in devices for u in t.gpu_uuids):
                # a whole GPU is the workspace's alone: device utilization covers every process
                ds = [devices[u] for u in t.gpu_uuids]
                out[t.key] = GPUUse(max(d.util_pct for d in ds), sum(d.memory_used_mib for d in ds))
                continue
            if t.pid is None:
                continue
            pids = descendants(t.pid, self.proc)
            mine = [p for p in processes if p.pid in pids]
            out[t.key] = GPUUse(
                max((p.sm_util_pct for p in mine), default=0.0), sum(p.memory_mib for p in mine)
            )
        return out


def resolve_all(host: str, port: int) -> list[str]:
    """Every address of a name: a headless Service has one DNS record per ready pod."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})  # the address of each (address, port, ...)


class NodeAgentSampler:
    """Reads `{"pods": [{"uid", "gpu_util_pct", "memory_mib"}]}` from every node agent: each
    URL's host is resolved to all its addresses (the chart's headless Service names every agent
    pod), and each address is asked; an agent that does not answer is logged and skipped.
    With `token_file` (the chart's Secret, mounted in the hub pod) each request carries its
    token: the agents answer nobody else. It is read at each pass, so a rotated Secret applies."""

    def __init__(
        self,
        urls: list[str],
        timeout: float = 5,
        resolve: Callable[[str, int], list[str]] = resolve_all,
        token_file: str = "",
    ) -> None:
        self.urls, self.timeout, self.resolve, self.token_file = urls, timeout, resolve, token_file

    def headers(self) -> dict[str, str]:
        if not self.token_file:
            return {}
        try:
            return {"Authorization": f"Bearer {Path(self.token_file).read_text().strip()}"}
        except OSError as err:
            log.error("cannot read the node agents' token from %s: %s", self.token_file, err)
            return {}

    def agent_urls(self) -> list[str]:
        out = []
        for url in self.urls:
            parts = urllib.parse.urlsplit(url)
            try:
                addresses = self.resolve(parts.hostname or "", parts.port or 80)
            except OSError as err:
                log.warning("cannot resolve node agents at %s: %s", url, err)
                continue
            for addr in addresses:
                host = f"[{addr}]" if ":" in addr else addr
                out.append(urllib.parse.urlunsplit(parts._replace(netloc=f"{host}:{parts.port or 80}")))
        return out

    def sample(self, targets: list[Target]) -> dict[str, GPUUse]:
        pods: dict[str, GPUUse] = {}
        headers = self.headers()
        for url in self.agent_urls():
            try:
                with urllib.request.urlopen(
                    urllib.request.Request(url, headers=headers), timeout=self.timeout
                ) as r:
                    answer = pod_uses(json.load(r))  # well-formed pods only (gpupool.vocab.agent_wire)
            except (OSError, ValueError) as err:
                log.warning("node agent %s gave no data: %s", url, err)
                continue
            pods.update((uid, GPUUse(util, memory)) for uid, (util, memory) in answer.items())
        return {t.key: pods[t.pod_uid] for t in targets if t.pod_uid in pods}


class FileSampler:
    """`{"owner/name": {"util_pct": 0, "memory_mib": 0}}` from a file (the tests' fake NVML)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def sample(self, targets: list[Target]) -> dict[str, GPUUse]:
        try:
            with open(self.path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            return {}
        return {
            t.key: GPUUse(float(data[t.key]["util_pct"]), int(data[t.key].get("memory_mib", 0)))
            for t in targets
            if t.key in data
        }


class DemoSampler:
    """The culling demo's GPU use (`gpupool up --demo-culling`): what each user said of their
    workspace's GPU (`%gpupool gpu busy|idle`), from the gpupool API; a workspace nobody said
    anything of is idle, so warnings and parking come by themselves."""

    BUSY_PCT = 100.0

    def __init__(self, read: Callable[[str], dict[str, Any]]) -> None:
        self.read = read  # GET of a gpupool API path, with the culler's token

    def sample(self, targets: list[Target]) -> dict[str, GPUUse]:
        try:
            said = self.read("api/demo/gpu-use").get("use", {})
        except (OSError, ValueError) as err:
            log.warning("the demo's GPU use could not be read: %s", err)
            return {}
        return {t.key: GPUUse(self.BUSY_PCT if said.get(t.key) == "busy" else 0.0, 0) for t in targets}


def make_sampler(
    kind: str, arg: str = "", token_file: str = "", read: Callable[[str], dict[str, object]] | None = None
) -> Sampler:
    if kind == "demo":
        if read is None:
            raise ValueError("the demo sampler reads the gpupool API: it runs in the culler service")
        return DemoSampler(read)
    if kind == "nvml":
        return NVMLSampler()
    if kind == "node-agent":
        return NodeAgentSampler([u for u in arg.split(",") if u], token_file=token_file)
    if kind == "file":
        return FileSampler(arg or os.environ.get("GPUPOOL_CULLER_SAMPLES", ""))
    raise ValueError(f"unknown sampler {kind!r}: use nvml, node-agent, demo or file")
