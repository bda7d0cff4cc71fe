"""Pure pieces of the Kubernetes workspace pod, in the spirit of kubespawner's objects.py:
putting a GPU share on a pod, and which profiles a user may see. Tested without a cluster."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes_asyncio.client import V1EnvVar, V1Pod, V1ResourceRequirements

from gpupool.gpu.sharing import PodGPU
from gpupool.kube.pod_fit import merged_affinity  # noqa: F401 (its home was here)
from gpupool.pool import BuildLimits, InvalidRequest, parse_gpus
from gpupool.pool.units import UnitError

PROFILE_KEY = "gpupool"  # profile_list entries: {"gpupool": {"gpus": 0.25, "groups": ["students"]}}

# The hub's inventory on Kubernetes is nominal: the device a pod gets is chosen by the scheduler
# and exposed by the device plugin (KAI's fraction: its reservation pod's GPU). An index or UUID
# from the hub would hide that device (any index but 0 hides a pod's only GPU); PYTHONPATH and
# the MPS pipe are paths on the hub's machine, not in the notebook image.
HUB_ONLY_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "GPUPOOL_GPU_UUIDS",
    "GPUPOOL_GPU_VIRTUAL",
    "PYTHONPATH",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
)


def pod_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The share's variables that hold inside a pod: its size and framework knobs, the API URL."""
    return {k: v for k, v in env.items() if k not in HUB_ONLY_ENV}


def apply_pod_gpu(pod: V1Pod, patch: PodGPU, env: Mapping[str, str]) -> V1Pod:
    """Put a GPU share on the notebook container (the first) and the pod; returns the pod."""
    meta, spec = pod.metadata, pod.spec
    meta.labels = {**(meta.labels or {}), **patch.labels}
    meta.annotations = {**(meta.annotations or {}), **patch.annotations}
    if patch.scheduler_name:
        spec.scheduler_name = patch.scheduler_name
    if patch.priority_class:
        spec.priority_class_name = patch.priority_class
    container = spec.containers[0]
    if container.resources is None:
        container.resources = V1ResourceRequirements()
    container.resources.limits = {**(container.resources.limits or {}), **patch.limits}
    names = set(env)
    container.env = [e for e in container.env or [] if _env_name(e) not in names]
    container.env += [V1EnvVar(name=k, value=v) for k, v in env.items()]
    return pod


def _env_name(e: Any) -> str:
    return e["name"] if isinstance(e, dict) else e.name


# --- profiles (kubespawner's profile_list) filtered by groups and quota -------------------
def profile_milli(profile: Mapping[str, Any]) -> int:
    """The GPU share a profile gives (milli-GPU), from its `gpupool.gpus`; 0 = no GPU."""
    extra = profile.get(PROFILE_KEY) or {}
    try:
        return parse_gpus(extra.get("gpus", 0)) if extra.get("gpus") not in (None, 0, "0") else 0
    except UnitError as err:
        raise InvalidRequest(
            f"profile {profile.get('slug') or profile.get('display_name')!r}: {err}"
        ) from None


def profile_allowed(
    profile: Mapping[str, Any], groups: Iterable[str], limits: BuildLimits, left_milli: int
) -> bool:
    """Whether a user in `groups`, with `left_milli` of their build quota free, may pick it."""
    extra = profile.get(PROFILE_KEY) or {}
    wanted = set(extra.get("groups") or [])
    if wanted and not wanted & set(groups):
        return False
    milli = profile_milli(profile)
    if milli == 0:
        return True
    return milli in limits.sizes_milli and milli <= min(limits.max_per_workspace_milli, left_milli)


def filter_profiles(
    profiles: Iterable[Mapping[str, Any]], groups: Iterable[str], limits: BuildLimits, left_milli: int
) -> list[dict[str, Any]]:
    """The profiles to offer: the user's groups may use them and they fit the quota left.
    The first one left becomes the default when the configured default was filtered out."""
    groups = list(groups)
    out = [dict(p) for p in profiles if profile_allowed(p, groups, limits, left_milli)]
    if out and not any(p.get("default") for p in out):
        out[0]["default"] = True
    return out


def find_profile(profiles: Iterable[Mapping[str, Any]], slug: str | None) -> Mapping[str, Any] | None:
    """kubespawner's choice: the slug asked for, else the default (or first) profile."""
    profiles = list(profiles)
    for p in profiles:
        if slug and _slug(p) == slug:
            return p
    if slug:
        return None
    return next((p for p in profiles if p.get("default")), profiles[0] if profiles else None)


def _slug(profile: Mapping[str, Any]) -> str:
    from kubespawner.slugs import safe_slug

    return profile.get("slug") or safe_slug(profile.get("display_name", ""))


# --- KAI's queue quota: a workspace the queue cannot run is refused at the form ------------
FINISHED_PHASES = ("Succeeded", "Failed")


def queue_quota_milli(queue: Mapping[str, Any] | None) -> int | None:
    """A KAI Queue's GPU quota (spec.resources.gpu.quota, in GPUs) in milli-GPU; None when it
    has none (-1: unlimited) or the object cannot be read. KAI runs non-preemptible pods (the
    build class) only within it."""
    gpu = (((queue or {}).get("spec") or {}).get("resources") or {}).get("gpu") or {}
    try:
        quota = float(gpu.get("quota", -1))
    except (TypeError, ValueError):
        return None
    return None if quota < 0 else round(quota * 1000)


def queue_held_milli(
    pods: Iterable[Mapping[str, Any]], queue: str, label: str, skip: str = "", memory_mib: int = 0
) -> int:
    """GPU milli the non-preemptible pods of `queue` hold or wait for (not finished nor being
    deleted), but the pod named `skip` (the one being started again). KAI holds only those to
    the queue's quota (NonPreemptibleOverQuota): a project's train jobs borrowing the queue's
    GPUs are preemptible and must not make the hub refuse a workspace KAI would start."""
    from gpupool.gpu.sharing import requested_milli

    total = 0
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        labels = meta.get("labels") or {}
        if labels.get(label) != queue or meta.get("name") == skip:
            continue
        if status.get("phase") in FINISHED_PHASES or meta.get("deletionTimestamp"):
            continue
        if kai_preemptible(labels.get(KAI_PREEMPTIBILITY_LABEL), (pod.get("spec") or {}).get("priority")):
            continue
        total += requested_milli(dict(pod), memory_mib)
    return total


# KAI-Scheduler v0.13's rule (pkg/common/podgroup: CalculatePreemptibility): the pod's
# `kai.scheduler/preemptibility` label when it has one, else a priority below 100 is preemptible.
KAI_PREEMPTIBILITY_LABEL = "kai.scheduler/preemptibility"
KAI_NON_PREEMPTIBLE_PRIORITY = 100


def kai_preemptible(label: object, priority: object) -> bool:
    """Whether KAI counts the pod as preemptible. A pod whose priority is not known (no
    admission filled `spec.priority`) counts as non-preemptible: held to the quota, as before."""
    if label in ("preemptible", "non-preemptible"):
        return label == "preemptible"
    return (
        isinstance(priority, int)
        and not isinstance(priority, bool)
        and priority < KAI_NON_PREEMPTIBLE_PRIORITY
    )


def queue_refusal(queue: str, quota_milli: int | None, held_milli: int, asked_milli: int) -> str:
    """Why KAI would leave this workspace Pending ("" when it fits): non-preemptible pods run
    only within their queue's quota, and nothing would ever say so but a start timeout."""
    if quota_milli is None or held_milli + asked_milli <= quota_milli:
        return ""
    return (
        f"the {queue!r} queue's quota is {quota_milli / 1000:g} GPU and its workspaces hold"
        f" {held_milli / 1000:g}: KAI-Scheduler would not start a {asked_milli / 1000:g} GPU"
        " workspace now; try again when one of them stops, or ask for less"
    )
