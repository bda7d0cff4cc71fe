"""Kubernetes mode: KubeSpawner on a GPU share, placed by KAI-Scheduler (or HAMi, MIG, whole GPUs).

The same fixed build quotas and fraction choices as the embedded hub; the quota is checked
again on the final pod manifest, after profiles and hooks, so no path can ask for more.
"""

from __future__ import annotations

from kubespawner import KubeSpawner
from tornado import web
from traitlets import Bool, Dict, Unicode, default

from hub_ext.pool import InvalidRequest

from .kube_objects import BACKENDS, DEFAULT_MIG_PROFILES, pod_gpu, requested_milli
from .mixin import GPUSpawnerMixin, http_error


class GPUKubeSpawner(GPUSpawnerMixin, KubeSpawner):
    gpu_sharing = Unicode(
        "kai",
        config=True,
        help=f"""How a GPU share reaches the pod: {', '.join(BACKENDS)}. kai: KAI-Scheduler with a
        gpu-fraction annotation (needs global.gpuSharing=true); hami: nvidia.com/gpucores and gpumem;
        mig: a MIG profile per fraction; whole: whole GPUs only. Example::

            c.GPUKubeSpawner.gpu_sharing = "hami"
        """,
    )
    kai_queue = Unicode(
        "{group}",
        config=True,
        help="""KAI leaf queue of build workspaces; {username} and {group} (the user's first group, or
        'default') are replaced. Example::

            c.GPUKubeSpawner.kai_queue = "build-{group}"
        """,
    )
    fraction_by_memory = Bool(
        False,
        config=True,
        help="""With kai: ask for GPU memory (gpu-memory annotation, MiB) instead of a fraction. Example::

            c.GPUKubeSpawner.fraction_by_memory = True
        """,
    )
    mig_profiles = Dict(
        config=True,
        help="""With mig: the MIG profile for each fraction (in GPUs). Example::

            c.GPUKubeSpawner.mig_profiles = {0.125: "1g.10gb", 0.25: "2g.20gb", 0.5: "3g.40gb"}
        """,
    )

    @default("scheduler_name")
    def _scheduler_default(self) -> str | None:
        return "kai-scheduler" if self.gpu_sharing == "kai" else None

    def mig_table(self) -> dict[int, str]:
        if not self.mig_profiles:
            return DEFAULT_MIG_PROFILES
        return {round(float(k) * 1000): v for k, v in self.mig_profiles.items()}

    def queue_name(self) -> str:
        groups = self.user_groups or ["default"]
        return self.kai_queue.format(username=self.user.name, group=groups[0])

    async def get_pod_manifest(self):
        pod = await super().get_pod_manifest()
        alloc = self.gpupool_allocation
        if alloc is None:
            return pod
        node = self.pool.inventory.node(alloc.node)
        memory = sum(node.gpus[i].memory_mib * alloc.gpu_milli // 1000 for i in alloc.gpus)
        try:
            patch = pod_gpu(self.gpu_sharing, alloc.total_milli, memory, self.queue_name(), "build",
                            self.mig_table(), self.fraction_by_memory)
        except InvalidRequest as err:
            raise http_error(err) from None
        pod.metadata.labels = {**(pod.metadata.labels or {}), **patch.labels}
        pod.metadata.annotations = {**(pod.metadata.annotations or {}), **patch.annotations}
        if patch.scheduler_name:
            pod.spec.scheduler_name = patch.scheduler_name
        pod.spec.priority_class_name = patch.priority_class
        container = pod.spec.containers[0]
        limits = dict(container.resources.limits or {}) if container.resources else {}
        limits.update(patch.limits)
        container.resources.limits = limits
        for key, value in self.gpu_environment().items():
            container.env = [*(container.env or []), {"name": key, "value": value}]
        self.enforce_quota(self.api_client.sanitize_for_serialization(pod), alloc.total_milli)
        return pod

    def enforce_quota(self, manifest: dict, reserved_milli: int) -> None:
        """The final manifest may not ask for more GPU than the reservation the quota allowed."""
        asked = requested_milli(manifest, self.mig_table())
        if asked > reserved_milli:
            raise web.HTTPError(403, f"the pod asks for {asked / 1000:g} GPU but your quota allowed"
                                     f" {reserved_milli / 1000:g}: a profile or hook added GPUs")

    async def start(self):
        self.reserve_gpus()
        try:
            return await super().start()
        except BaseException:
            self.release_gpus("start failed")
            raise

    async def stop(self, now: bool = False) -> None:
        try:
            await super().stop(now=now)
        finally:
            self.release_gpus("stopped")
