"""gpupool's culling decision for a stock hub: a `cull_arbiter_hook` for jupyterhub-idle-culler >= 2.0,
the culler every zero-to-jupyterhub hub already runs.

jupyterhub-idle-culler asks the hook, for every running server at every pass, whether to cull it
(`hook(inactive=timedelta, inactive_limit=seconds, server=dict)`; True culls). `GPUArbiter` answers
with gpupool's own rule (`gpupool.idle_culler.policy.decide`): a server whose GPU idled
`idle_limit_s` while Jupyter was quiet `jupyter_idle_s` is culled; a GPU idle for `gpu_idle_hard_s`
is taken back even from someone typing; a GPU that is computing keeps its server (a running cell
is never stopped for Jupyter silence); without GPU data only Jupyter silence decides, with the
longer limit. GPU use comes from gpupool's node agents (the chart's DaemonSet), by pod uid; the
pod comes from kubespawner's saved state (`server["state"]`: the culler's role needs the
`admin:server_state` scope to see it) and its uid from the Kubernetes API.

What a stock culler cannot do stays out: it has no warning, extension, parking or budget; the
hook only says cull or keep. Set up: docs/culling.md#gpu-aware-culling-for-a-stock-hub.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gpupool.idle_culler.policy import IdleTracker, Limits, Workspace, decide
from gpupool.idle_culler.sampler import NodeAgentSampler, Target
from gpupool.vocab.culling import CullAction

log = logging.getLogger("gpupool.stock_arbiter")

# a server the culler has not asked about for this long is no longer running: idle-culler asks
# about every running server at every pass, and z2jh's longest pass interval is 10 min
FORGET_S = 3600.0

PodUid = Callable[[str, str], Awaitable[str | None]]  # (namespace, pod name) -> uid

# the limits an admin may set from the culler's environment (GPUPOOL_CULL_LIMITS): the idle
# rules' durations in seconds; the rest of Limits (warnings, parking, budgets) a stock culler
# has no use for
ENV_LIMITS = (
    "idle_limit_s",
    "jupyter_idle_s",
    "gpu_idle_hard_s",
    "max_age_s",
    "busy_grace_s",
    "window_s",
    "stale_after_s",
)
POSITIVE = ("window_s", "stale_after_s")
MAX_LIMIT_S = 366 * 86400.0  # a year: anything longer is a typo, not a limit


def limits_from_env(text: str) -> Limits:
    """`GPUPOOL_CULL_LIMITS`, a JSON object of seconds, e.g. `{"idle_limit_s": 1800}`, over
    `Limits()`. Refused with the reason (the culler does not start) when it names another key
    or a value that is not a number of seconds from 0 to a year (window_s and stale_after_s
    above 0: the GPU data needs a window and a freshness)."""
    if len(text) > 4096:
        raise ValueError("GPUPOOL_CULL_LIMITS: longer than 4096 characters")
    try:
        given = json.loads(text)
    except ValueError as err:
        raise ValueError(f"GPUPOOL_CULL_LIMITS: not JSON: {err}") from None
    if not isinstance(given, dict):
        raise ValueError('GPUPOOL_CULL_LIMITS: a JSON object of seconds, e.g. {"idle_limit_s": 1800}')
    out: dict[str, Any] = {}  # only ENV_LIMITS' float fields, checked below
    for key, value in given.items():
        if key not in ENV_LIMITS:
            raise ValueError(f"GPUPOOL_CULL_LIMITS: {key!r} is not one of {', '.join(ENV_LIMITS)}")
        number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not number or not 0 <= value <= MAX_LIMIT_S or (key in POSITIVE and value == 0):
            lowest = "above 0" if key in POSITIVE else "from 0"
            raise ValueError(f"GPUPOOL_CULL_LIMITS: {key} must be seconds {lowest} up to a year")
        out[key] = float(value)
    return dataclasses.replace(Limits(), **out)


def _epoch(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def api_environ(environ: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
    """The in-cluster client's settings: the API server's address from the pod's environment, or
    the `kubernetes` Service's name where it is missing. JupyterHub starts a managed service (the
    culler) with only its `environment` and a few of the hub's variables (Spawner.env_keep), so
    KUBERNETES_SERVICE_HOST/PORT, which the kubelet gives the hub's container, never reach it."""
    return {"KUBERNETES_SERVICE_HOST": "kubernetes.default.svc", "KUBERNETES_SERVICE_PORT": "443", **environ}


async def kube_pod_uid(namespace: str, name: str) -> str | None:
    """The pod's uid from the Kubernetes API, with the hub pod's service account (z2jh's hub may
    read pods in its namespace)."""
    from kubernetes_asyncio import client, config

    config.load_incluster_config(environ=api_environ())
    async with client.ApiClient() as api:
        try:
            pod = await client.CoreV1Api(api).read_namespaced_pod(name, namespace)
        except client.ApiException as err:
            if err.status == 404:
                return None
            raise
        return pod.metadata.uid


class GPUArbiter:
    """`c.IdleCuller.cull_arbiter_hook = GPUArbiter(agents=[...])` in jupyterhub-idle-culler's config file.

    Example::

        from gpupool.idle_culler.stock_arbiter import GPUArbiter
        c.IdleCuller.cull_arbiter_hook = GPUArbiter(agents=["http://node-agent.gpupool:9402/pods"])
    """

    def __init__(
        self,
        agents: list[str] | None = None,
        *,
        limits: Limits | None = None,
        token_file: str = "",
        sample: Callable[[list[Target]], dict[str, Any]] | None = None,
        pod_uid: PodUid = kube_pod_uid,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.limits = limits or Limits()
        if sample is None:
            sampler = NodeAgentSampler(agents or [], token_file=token_file)
            sample = sampler.sample
        self.sample, self.pod_uid, self.clock = sample, pod_uid, clock
        self.trackers: dict[str, IdleTracker] = {}  # by pod uid, across passes
        # (namespace, pod, server's start) -> uid, for the pod's life: kubespawner names a user's pod
        # the same at every start, and a server started again must not be judged by its old pod's GPU
        self.uids: dict[tuple[str, str, str], str] = {}
        self.asked: dict[tuple[str, str, str], float] = {}  # when each was last asked about
        self.read_at: float | None = None  # one read of the agents per pass, however many servers
        self.read_for: set[str] = set()  # the pods that read asked about
        self.lock = asyncio.Lock()

    @classmethod
    def from_env(cls) -> GPUArbiter:
        """Settings from the culler's environment (the z2jh snippet sets them): GPUPOOL_NODE_AGENTS
        (comma-separated URLs), GPUPOOL_NODE_AGENT_TOKEN_FILE, and GPUPOOL_CULL_LIMITS (optional,
        `limits_from_env`: the defaults are gpupool's own culler's)."""
        agents = [u for u in os.environ.get("GPUPOOL_NODE_AGENTS", "").split(",") if u]
        limits = (
            limits_from_env(os.environ["GPUPOOL_CULL_LIMITS"])
            if os.environ.get("GPUPOOL_CULL_LIMITS")
            else None
        )
        return cls(agents, limits=limits, token_file=os.environ.get("GPUPOOL_NODE_AGENT_TOKEN_FILE", ""))

    async def _uid(self, server: dict[str, Any], now: float) -> str | None:
        state = server.get("state") or {}
        name, namespace = state.get("pod_name"), state.get("namespace")
        if not (name and namespace):
            return None  # no kubespawner state (or no admin:server_state scope): Jupyter alone decides
        key = (namespace, name, str(server.get("started") or ""))
        self.asked[key] = now
        if key not in self.uids:
            uid = await self.pod_uid(namespace, name)
            if uid is None:
                return None
            self.uids[key] = uid
        return self.uids[key]

    def _forget(self, now: float) -> None:
        """Servers not asked about for FORGET_S are gone (idle-culler asks every running one at every
        pass): their uids and GPU history go, so that neither is read nor kept for ever."""
        for key in [k for k, t in self.asked.items() if now - t > FORGET_S]:
            del self.asked[key]
            uid = self.uids.pop(key, None)
            if uid is not None:
                self.trackers.pop(f"/{uid}", None)

    async def _read(self, uid: str, now: float) -> None:
        async with self.lock:
            recent = self.read_at is not None and now - self.read_at < self.limits.window_s / 2
            if recent and uid in self.read_for:
                return
            # a pod first seen in this pass is read now, not at the next pass: unread, it would
            # be judged as having no GPU data (Jupyter alone), which the GPU data may contradict
            self._forget(now)
            self.read_at, self.read_for = now, {*self.uids.values(), uid}
            # the node agents' answer for every pod this culler knows; a blocking read, off the loop
            targets = [Target(owner="", name=u, pod_uid=u) for u in self.read_for]
            used = await asyncio.to_thread(self.sample, targets)
            for key, use in used.items():
                tracker = self.trackers.setdefault(
                    key, IdleTracker(self.limits.window_s, self.limits.util_threshold_pct)
                )
                tracker.add(now, use.util_pct)

    async def __call__(
        self, *, inactive: dt.timedelta, inactive_limit: int, server: dict[str, Any], **_: object
    ) -> bool:
        now = self.clock()
        gpu_idle_s = None
        try:
            uid = await self._uid(server, now)
            if uid is not None:
                await self._read(uid, now)
                tracker = self.trackers.get(f"/{uid}")
                if tracker is not None and tracker.fresh(now, self.limits.stale_after_s):
                    gpu_idle_s = tracker.idle_s
        except Exception:
            # fail-safe, as gpupool's own culler: no GPU data never culls for GPU idleness
            log.exception("no GPU data for %s", server.get("name") or server.get("url"))
        started = _epoch(server.get("started")) or now
        ws = Workspace(
            owner="",
            name=server.get("name", ""),
            started=started,
            last_activity=now - inactive.total_seconds(),
            gpu_idle_s=gpu_idle_s,
        )
        return decide(ws, now, self.limits).action == CullAction.CULL
