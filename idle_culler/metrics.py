"""Prometheus metrics of the culler: per-workspace allocation, GPU use, idle time, culls."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class Metrics:
    def __init__(self, port: int = 0, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        labels = ["owner", "server"]
        self.allocated = Gauge(
            "gpupool_workspace_allocated_gpus", "GPU share held", labels, registry=self.registry
        )
        self.util = Gauge(
            "gpupool_workspace_gpu_utilization_pct",
            "GPU utilization in the last sample",
            labels,
            registry=self.registry,
        )
        self.memory = Gauge(
            "gpupool_workspace_gpu_memory_mib", "GPU memory in use", labels, registry=self.registry
        )
        self.idle = Gauge(
            "gpupool_workspace_gpu_idle_seconds",
            "Seconds the GPU has been idle (-1: no fresh GPU data)",
            labels,
            registry=self.registry,
        )
        self.culls = Counter(
            "gpupool_culls", "Workspaces culled, by reason", ["reason"], registry=self.registry
        )
        if port:
            start_http_server(port, registry=self.registry)

    def observe(self, ws, milli: int, use, fresh: bool) -> None:
        labels = {"owner": ws.owner, "server": ws.name}
        self.allocated.labels(**labels).set(milli / 1000)
        self.util.labels(**labels).set(use.util_pct if use else 0)
        self.memory.labels(**labels).set(use.memory_mib if use else 0)
        self.idle.labels(**labels).set(ws.gpu_idle_s if fresh and ws.gpu_idle_s is not None else -1)
