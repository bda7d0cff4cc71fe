"""Kubernetes mode: KubeSpawner on a GPU share, placed by KAI-Scheduler (or HAMi, MIG, whole GPUs).

The same spawn form, fraction choices and fixed build quotas as the embedded hub. Two
things kubespawner leaves open are closed here: profiles are filtered by the user's groups
and quota (kubespawner#589, #889), and the quota is checked again on the FINAL pod manifest,
after profiles, user options and modify_pod_hook, so no path can ask for more.
"""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic
from typing import Any

from jupyterhub.utils import maybe_future
from kubespawner import KubeSpawner
from slugify import slugify
from tornado import web
from traitlets import Bool, Dict, Float, List, Unicode, default, validate

from gpupool.gpu.sharing import KAI_QUEUE_LABEL, SharingBackend, make_backend, requested_milli, split_milli
from gpupool.kube.pod_fit import RESTRICTED_CONTAINER, added_tolerations
from gpupool.kube.pool_objects import KAI_NODE_POOL, node_affinity, pool_queue_name
from gpupool.pool import InvalidRequest, PoolError, QuotaExceeded
from gpupool.spawner.kube_hibernate import apply_hibernate
from gpupool.spawner.kube_namespace import ensure_workspace_policy
from gpupool.spawner.kube_objects import (
    apply_pod_gpu,
    filter_profiles,
    find_profile,
    merged_affinity,
    pod_environment,
    profile_milli,
    queue_held_milli,
    queue_quota_milli,
    queue_refusal,
)
from gpupool.spawner.kube_ready import PromptStart
from gpupool.spawner.kube_reflector import TRIMMED
from gpupool.spawner.mixin import GPUSpawnerMixin, http_error, with_message
from gpupool.store import Allocation
from gpupool.vocab.kinds import EventKind

_CHECKED = "_gpupool_checked"


class GPUKubeSpawner(GPUSpawnerMixin, PromptStart, KubeSpawner):
    kai_queue = Unicode(
        "{group}",
        config=True,
        help="""KAI leaf queue of build workspaces (label kai.scheduler/queue); {username} and
        {group} are replaced. {group} is the first group of `kai_queue_groups` the user belongs
        to, else `kai_default_group`: an explicit choice, never whichever group sorts first.
        The queue must exist: the gpupool chart renders one per project. Example::

            c.GPUKubeSpawner.kai_queue = "build-{group}"
        """,
    )
    kai_queue_groups = List(
        Unicode(),
        config=True,
        help="""Groups that have a KAI queue for their members' workspaces, in order of preference
        (a user in two of them uses the first). The chart's `build.queues`, or its projects.
        Example::

            c.GPUKubeSpawner.kai_queue_groups = ["vision", "nlp"]
        """,
    )
    kai_default_group = Unicode(
        "default",
        config=True,
        help="""{group} of a user in none of `kai_queue_groups` (the chart's default project).
        Example::

            c.GPUKubeSpawner.kai_default_group = "students"
        """,
    )
    fraction_by_memory = Bool(
        False,
        config=True,
        help="""With kai: ask for GPU memory (gpu-memory annotation, MiB of the device's memory)
        instead of a fraction of the device. Example::

            c.GPUKubeSpawner.fraction_by_memory = True
        """,
    )
    mig_profiles = Dict(
        config=True,
        help="""With mig: the MIG profile for each fraction (in GPUs); defaults fit an 80 GB
        A100/H100. Example::

            c.GPUKubeSpawner.mig_profiles = {0.125: "1g.10gb", 0.25: "2g.20gb", 0.5: "3g.40gb"}
        """,
    )
    kai_queue_quota_check = Bool(
        True,
        config=True,
        help="""With kai: before a workspace starts, read its KAI Queue's GPU quota and refuse
        the spawn at the form, with the reason, when the queue's workspaces already hold it
        (KAI runs the non-preemptible build class only within the quota; the pod would stay
        Pending until the start timeout). Needs get on queues.scheduling.run.ai (the gpupool
        chart grants it). Example::

            c.GPUKubeSpawner.kai_queue_quota_check = False
        """,
    )
    kai_queue_cache_s = Float(
        30.0,
        min=0.0,
        config=True,
        help="""With kai_queue_quota_check: for how long a KAI Queue read at one spawn serves the
        other spawns of that queue (seconds), so a class starting together reads it once, not
        once per student; an admin's change to a queue's quota counts from the next read. A
        queue that cannot be read is read again after as long (its quota is not checked
        meanwhile; said once in the log). The queue's pods are read at every spawn. 0: the queue
        is read at every spawn. Example::

            c.GPUKubeSpawner.kai_queue_cache_s = 10
        """,
    )
    build_priority_class = Unicode(
        "build",
        config=True,
        help="""Priority class of workspace pods. KAI treats 100 and above as non-preemptible and
        runs them only within their queue's quota, as fixed build quotas need. Example::

            c.GPUKubeSpawner.build_priority_class = "build"
        """,
    )
    user_namespace_network_policy = Dict(
        config=True,
        help="""With enable_user_namespaces: the spec of the NetworkPolicy the hub makes in each
        user's namespace before the workspace starts (z2jh's own policy covers the hub's
        namespace only); a spawn whose policy cannot be made is refused. The gpupool chart
        renders it from userNamespaces.networkPolicy. Empty: none. Example::

            c.GPUKubeSpawner.user_namespace_network_policy = {
                "podSelector": {"matchLabels": {"component": "singleuser-server"}},
                "policyTypes": ["Ingress", "Egress"],
                "egress": [{"ports": [{"port": 53, "protocol": "UDP"}]}],
            }
        """,
    )
    hibernate_startup_dir = Unicode(
        "",
        config=True,
        help="""Where the notebook image has gpupool's start-up hook (the folder
        gpupool/gpu/startup of the gpupool installed in the image): put first on the pod's
        PYTHONPATH, so a kernel wakes its hibernated variables before the first cell (the
        culler's `hibernate`). The state is kept under the home: a pod whose home is not on a
        PersistentVolumeClaim has its saves refused with the reason (it would be lost with the
        pod). Empty: no hook, no hibernation. Example::

            c.GPUKubeSpawner.hibernate_startup_dir = "/opt/conda/lib/python3.12/site-packages/gpupool/gpu/startup"
        """,
    )
    hibernate_home = Unicode(
        "/home/jovyan",
        config=True,
        help="""The home of the notebook container (where z2jh mounts the user's volume), under
        which hibernated state is kept. Example::

            c.GPUKubeSpawner.hibernate_home = "/home/jovyan"
        """,
    )

    def places_in_pools(self) -> bool:
        return False  # the nominal inventory has no pools: the pod's node affinity keeps it there

    def workspace_pools(self) -> list[str]:
        """The node pools this workspace may use (the user's groups', or the one chosen); with
        KAI only the first: a pod is in one scheduling shard, which never hands it to another."""
        names = [
            n
            for n in self.pool.build_pools(self.user_groups, self.spawn_choice().pool)
            if n in self.pool.node_pools
        ]
        return names[:1] if self.backend().pools_are_shards else names

    def pools_affinity(self, current: dict[str, object], names: list[str]) -> dict[str, object]:
        """The pod's affinity with its node pools' added; `current` is what kubespawner and the
        profile set."""
        pools = [self.pool.node_pools[n] for n in names]
        if not pools:
            return current
        return merged_affinity(current, node_affinity(pools, self.gpupool_root.settings.node_pool_label))

    # the notebook container as the `restricted` Pod Security level admits it, over kubespawner's
    # uid and allowPrivilegeEscalation (on the container only: z2jh's iptables init container,
    # where enabled, keeps its own); c.KubeSpawner.container_security_context still wins
    @default("container_security_context")
    def _restricted_container(self) -> dict[str, object]:
        return dict(RESTRICTED_CONTAINER)

    # --- backends ------------------------------------------------------------
    @default("scheduler_name")
    def _scheduler_default(self) -> str | None:
        return self.backend().scheduler_name

    def mig_table(self) -> dict[int, str] | None:
        return {round(float(k) * 1000): v for k, v in self.mig_profiles.items()} or None

    def backend(self) -> SharingBackend:
        return make_backend(self.gpupool_root.settings.gpu_sharing, self.fraction_by_memory, self.mig_table())

    def queue_name(self, pool: str | None = None) -> str:
        """The KAI leaf queue of this workspace; on a node pool, its project's queue there."""
        mine = set(self.user_groups)
        group = next((g for g in self.kai_queue_groups if g in mine), self.kai_default_group)
        queue = self.kai_queue.format(username=self.user.name, group=group)
        return pool_queue_name(queue, pool) if pool else queue

    async def _start_reflector(self, *args: object, **kwargs: Any) -> Any:
        """kubespawner's shared reflectors (pods, events), made as kubespawner makes them but
        keeping each object without its managedFields (gpupool.spawner.kube_reflector).

        The one place gpupool overrides a private kubespawner method: no public hook chooses
        the reflector's class, and the trimmed copies halve what the hub keeps per workspace.
        Whatever its arguments become, the class is swapped only where it is recognised and
        everything is passed on as given, so a kubespawner that changes this method gets its
        plain reflectors (more memory, the ready wait falls back to its 1-s looks), never a
        failed spawn. tests/test_kube_reflector.py checks the kubespawner we pin still calls it."""
        if isinstance(kwargs.get("reflector_class"), type):
            kwargs["reflector_class"] = TRIMMED.get(kwargs["reflector_class"], kwargs["reflector_class"])
        elif len(args) >= 2 and isinstance(args[1], type):
            args = (args[0], TRIMMED.get(args[1], args[1]), *args[2:])
        return await super()._start_reflector(*args, **kwargs)

    def pod_uid(self) -> str:
        """From the pod reflector's cache (no API call): the node agents report pods by uid."""
        reflector = self.pod_reflector  # None before the first spawn started it
        pod = reflector.pods.get(f"{self.namespace}/{self.pod_name}") if reflector is not None else None
        return ((pod or {}).get("metadata") or {}).get("uid", "")

    def device_memory_mib(self, alloc: Allocation) -> int:
        node = self.pool.inventory.node(alloc.node)
        return min((node.gpus[i].memory_mib for i in alloc.gpus), default=0)

    # --- profiles filtered by groups and quota ---------------------------------
    @validate("profile_list")
    def _filter_profile_list(self, proposal: dict[str, Any]) -> object:
        value = proposal["value"]
        if not value or getattr(value, _CHECKED, False):
            return value

        async def offered(spawner: GPUKubeSpawner) -> list[dict[str, object]]:
            # a callable may be async: awaited as kubespawner awaits it
            profiles = await maybe_future(value(spawner)) if callable(value) else value
            if isinstance(profiles, dict):
                profiles = [profiles[k] for k in sorted(profiles)]
            return spawner.offered_profiles(profiles)

        setattr(offered, _CHECKED, True)
        return offered

    def offered_profiles(self, profiles: list[dict[str, object]]) -> list[dict[str, object]]:
        """The profiles this user may pick now: their groups may use them and they fit the quota left."""
        held = [h for h in self.pool.holdings(self.user.name) if h.server_name != self.name]
        limits = self.pool.quotas.limits_for(self.user_groups)
        left = limits.quota_milli - sum(h.milli for h in held)
        out = filter_profiles(profiles, self.user_groups, limits, left)
        for p in out:
            p.setdefault("slug", slugify(p.get("display_name", "")))
        return out

    def uses_gpu_form(self) -> bool:
        # with a profile list, kubespawner's own form and parser (its trait defaults) apply
        return not self.profile_list

    async def requested_share(self) -> int:
        """milli-GPU asked for: the chosen profile's share, or the spawn form's size."""
        choice = self.spawn_choice()
        if not self.profile_list:
            return choice.milli
        offered = await self.profile_list(self)
        slug = choice.profile
        profile = find_profile(offered, slug)
        if profile is None:
            names = ", ".join(p["slug"] for p in offered) or "none"
            raise InvalidRequest(
                f"profile {slug!r} is not offered to you now (your groups or quota left);"
                f" choose one of: {names}"
            )
        self.gpupool_profile = str(profile.get("slug") or "")
        return profile_milli(profile)

    gpupool_profile = ""  # the offered profile this workspace started with (kept in the spawner's state)

    def culler_profile(self) -> str:
        return self.gpupool_profile if self.profile_list else ""

    def get_state(self) -> dict[str, object]:
        state = super().get_state()
        if self.gpupool_profile:
            state["gpupool_profile"] = self.gpupool_profile
        return state

    def load_state(self, state: dict[str, object]) -> None:
        super().load_state(state)
        self.gpupool_profile = str(state.get("gpupool_profile") or "")

    def clear_state(self) -> None:
        super().clear_state()
        self.gpupool_profile = ""

    # --- lifecycle -----------------------------------------------------------
    async def reserve_share(self) -> Allocation | None:
        """Quota and nominal placement in the hub's pool; None for a profile without GPU."""
        try:
            milli = await self.requested_share()
            if milli == 0:
                self.gpupool_allocation = None
                return None
            split_milli(milli)  # a shape every backend can express
            await self.check_queue_quota(milli)
        except PoolError as err:
            raise self.refused(err) from None
        # off the event loop: on Kubernetes KAI places train jobs, so nothing else in the hub
        # changes the pool's state without the manager's lock
        return await self.reserve_milli_off_loop(milli)

    async def check_queue_quota(self, milli: int) -> None:
        """QuotaExceeded with KAI's reason when the workspace's queue cannot run it now."""
        if not (self.kai_queue_quota_check and self.backend().name == "kai"):
            return
        names = self.workspace_pools()
        queue = self.queue_name(names[0] if names else None)
        quota = queue_quota_milli(await self.read_kai_queue(queue))
        if quota is None:  # unreadable (logged) or unlimited: nothing to hold the spawn to
            return
        selector = f"{KAI_QUEUE_LABEL}={queue}"
        from aiohttp import ClientError
        from kubernetes_asyncio.client.rest import ApiException

        try:
            # the queue's pods now, from the API server (a watch's copy may lag a spawn just made)
            if self.enable_user_namespaces:
                found = await self.api.list_pod_for_all_namespaces(label_selector=selector)
            else:
                found = await self.api.list_namespaced_pod(self.namespace, label_selector=selector)
        except (ApiException, ClientError, TimeoutError) as err:
            # not readable: KAI still has its say when it schedules the pod; the spawn is not
            # refused for what the hub could not read
            self.log.warning(
                "could not read the pods of KAI queue %s (%s): its quota is not checked", queue, err
            )
            return
        pods = self.api.api_client.sanitize_for_serialization(found).get("items") or []
        held = queue_held_milli(pods, queue, KAI_QUEUE_LABEL, skip=self.pod_name)
        why = queue_refusal(queue, quota, held, milli)
        if why:
            raise QuotaExceeded(why)

    async def read_kai_queue(self, queue: str) -> dict[str, object] | None:
        """The KAI Queue `queue` as the API server has it, or None where it cannot be read
        (RBAC, no such queue, no API server: logged). One read serves the hub's spawns for
        kai_queue_cache_s (kept in the hub's root, beside what else spawners read of the cluster)."""
        from aiohttp import ClientError
        from kubernetes_asyncio.client import CustomObjectsApi
        from kubernetes_asyncio.client.rest import ApiException

        reads = self.gpupool_root.cluster_reads
        key = ("kai-queue", queue)
        now = monotonic()
        kept = reads.get(key)
        if kept is not None and now - kept[0] < self.kai_queue_cache_s:
            return kept[1]
        obj: dict[str, object] | None
        try:
            obj = await CustomObjectsApi(self.api.api_client).get_cluster_custom_object(
                "scheduling.run.ai", "v2", "queues", queue
            )
        except (ApiException, ClientError, TimeoutError) as err:
            self.log.warning(
                "could not read KAI queue %s (%s): its quota is not checked for the next %g s",
                queue,
                err,
                self.kai_queue_cache_s,
            )
            obj = None
        reads[key] = (now, obj)
        return obj

    async def get_pod_manifest(self):
        # kubespawner made the user's namespace (named by its own template) before this
        if self.enable_user_namespaces and self.user_namespace_network_policy:
            await ensure_workspace_policy(
                self.api.api_client, self.namespace, self.user_namespace_network_policy
            )
        pod = await super().get_pod_manifest()
        backend = self.backend()
        try:
            names = self.workspace_pools()
            current = (
                self.api.api_client.sanitize_for_serialization(pod.spec.affinity) if pod.spec.affinity else {}
            )
            affinity = self.pools_affinity(current or {}, names)
        except PoolError as err:
            raise http_error(err) from None
        if affinity:
            pod.spec.affinity = affinity  # a plain dict: serialized as it is when the pod is created
        shard = names[0] if names and backend.pools_are_shards else None
        alloc = self.gpupool_allocation
        if alloc is None:  # no GPU, but the scheduler still needs the pod's queue and class
            patch, env = backend.no_gpu(self.queue_name(shard), self.build_priority_class), {}
        else:
            num_gpu, gpu_milli = split_milli(alloc.total_milli)
            try:
                patch = backend.pod_gpu(
                    num_gpu,
                    gpu_milli,
                    self.device_memory_mib(alloc),
                    self.queue_name(shard),
                    self.build_priority_class,
                )
            except InvalidRequest as err:
                raise http_error(err) from None
            env = pod_environment(self.gpu_environment())
            # GPU nodes are usually tainted; a fractional pod asks for no nvidia.com/gpu, so
            # nothing else adds the toleration (z2jh's own tolerations are kept)
            gpu_tolerations = self.gpupool_root.settings.gpu_tolerations
            if gpu_tolerations:
                current = self.api.api_client.sanitize_for_serialization(pod.spec.tolerations or [])
                pod.spec.tolerations = added_tolerations(current, gpu_tolerations)
        if shard:  # KAI's pod grouper copies it to the PodGroup: that pool's shard schedules it
            patch.labels[KAI_NODE_POOL] = shard
        pod = apply_pod_gpu(pod, patch, env)
        if self.hibernate_startup_dir:
            pod = apply_hibernate(pod, self.hibernate_home, self.hibernate_startup_dir)
        return pod

    # modify_pod_hook is the last thing kubespawner runs on the manifest before creating the
    # pod: the quota check wraps whatever hook is configured, so it sees the final pod.
    @default("modify_pod_hook")
    def _default_pod_hook(self) -> Callable[..., object]:
        return self._checked_hook(None)

    @validate("modify_pod_hook")
    def _wrap_pod_hook(self, proposal: dict[str, Any]) -> Callable[..., object]:
        hook = proposal["value"]
        return hook if getattr(hook, _CHECKED, False) else self._checked_hook(hook)

    def _checked_hook(self, hook: Callable[..., object] | None) -> Callable[..., object]:
        async def checked(spawner: GPUKubeSpawner, pod: object) -> object:
            if hook is not None:
                pod = await maybe_future(hook(spawner, pod))  # sync or async, as kubespawner allows
            spawner.enforce_quota(spawner.api.api_client.sanitize_for_serialization(pod))
            return pod

        setattr(checked, _CHECKED, True)
        return checked

    def enforce_quota(self, manifest: dict[str, object]) -> None:
        """Refuse a final manifest that asks for more GPU than the quota reserved for it."""
        alloc = self.gpupool_allocation
        reserved = alloc.total_milli if alloc is not None else 0
        memory = self.device_memory_mib(alloc) if alloc is not None else 0
        try:
            asked = requested_milli(manifest, memory, self.mig_table(), self.backend())
        except (ValueError, ArithmeticError) as err:
            raise web.HTTPError(400, f"the pod's GPU fields cannot be read: {err}") from None
        if asked > reserved:
            msg = (
                f"the pod asks for {asked / 1000:g} GPU but your quota allowed {reserved / 1000:g}:"
                " a profile or hook added GPUs; ask your admin to fix the profile"
            )
            self.pool.store.record(EventKind.REFUSE, msg, owner=self.user.name, name=self.name)
            raise with_message(web.HTTPError(403, msg), msg)
