"""The JSON a node agent serves (`GET /pods`, on Kubernetes) and the culler reads, typed once for
both ends: gpupool.idle_culler.node_agent builds an AgentSnapshot, the culler's NodeAgentSampler
reads it back with `pod_uses`, which keeps only well-formed pods. Stdlib only: the agent and the
culler run in their own processes and import no hub code."""

from __future__ import annotations

from typing import TypedDict, TypeGuard

MAX_PODS = 10_000  # pods in one answer: far over the pods one node runs


class PodUse(TypedDict):
    """The GPU use of one pod's processes: on several GPUs, its busiest one."""

    uid: str  # the pod's metadata.uid
    gpu_util_pct: float
    memory_mib: int
    gpus: list[str]  # the UUIDs of the GPUs its processes use


class DeviceUse(TypedDict):
    uuid: str
    util_pct: float
    memory_used_mib: int
    memory_total_mib: int


class AgentSnapshot(TypedDict):
    """The agent's last sample; `error` says why there is none or why it is old."""

    time: float | None  # when it was taken (None: never)
    error: str | None
    pods: list[PodUse]
    gpus: list[DeviceUse]


def pod_uses(body: object) -> dict[str, tuple[float, int]]:
    """uid -> (utilization %, memory MiB) of each well-formed pod of an agent's answer; a pod with a
    wrong type, a number out of bounds or no uid is left out (no data, never a made-up zero), and
    an answer that is no AgentSnapshot gives nothing: the culler's pass goes on without it."""
    pods = body.get("pods") if isinstance(body, dict) else None
    if not isinstance(pods, list):
        return {}
    out: dict[str, tuple[float, int]] = {}
    for p in pods[:MAX_PODS]:
        if not isinstance(p, dict):
            continue
        uid, util, memory = p.get("uid"), p.get("gpu_util_pct"), p.get("memory_mib")
        if not isinstance(uid, str) or not 0 < len(uid) <= 128:
            continue
        if not _number(util, 100) or not _number(memory, 1 << 40):
            continue
        out[uid] = (float(util), int(memory))
    return out


def _number(value: object, top: float) -> TypeGuard[float]:
    """A JSON number from 0 to `top` (not true/false; NaN fails the bound)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and 0 <= value <= top
