"""What makes a pod that runs user code fit a real cluster, as pure functions of plain JSON:
tolerations (GPU nodes are usually tainted, and a fractional pod asks for no `nvidia.com/gpu`,
so nothing else adds the toleration), node selectors and affinity, CPU and memory requests, pull
secrets, a securityContext that the `restricted` Pod Security level admits, and no API token.
Train Jobs (objects.py) and workspaces (gpupool.spawner.kube) take them from here."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

# The `restricted` Pod Security Standard, pod and container halves. runAsNonRoot without a
# runAsUser needs an image whose USER is numeric and not 0 (the Jupyter images' 1000 is).
RESTRICTED_POD: dict[str, object] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER: dict[str, object] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def tolerations_for(
    base: Sequence[Mapping[str, object]], gpu: Sequence[Mapping[str, object]], has_gpu: bool
) -> list[dict[str, object]]:
    """`base` for every pod, `gpu` too for a pod with a GPU share (a CPU-only pod stays off
    tainted GPU nodes); each once, in that order."""
    out: list[dict[str, object]] = []
    for t in [*base, *(gpu if has_gpu else ())]:
        if dict(t) not in out:
            out.append(dict(t))
    return out


def added_tolerations(
    current: Sequence[Mapping[str, object]] | None, more: Sequence[Mapping[str, object]]
) -> list[dict[str, object]]:
    """`current` (what the pod has) with those of `more` it lacks."""
    out = [dict(t) for t in current or ()]
    out += [dict(t) for t in more if dict(t) not in out]
    return out


def merged_affinity(current: Mapping[str, Any], pools: Mapping[str, Any]) -> dict[str, Any]:
    """`current` (the pod's affinity, as JSON) with a node pools' affinity added: each required
    term the pod already had is ANDed with each pool's term (any pool, and what the profile
    asked), preferred terms are added, pod (anti-)affinity is kept."""
    out = {k: v for k, v in current.items()}
    mine = dict(current.get("nodeAffinity") or {})
    theirs = pools.get("nodeAffinity") or {}
    req = "requiredDuringSchedulingIgnoredDuringExecution"
    pref = "preferredDuringSchedulingIgnoredDuringExecution"
    have = (mine.get(req) or {}).get("nodeSelectorTerms") or []
    add = (theirs.get(req) or {}).get("nodeSelectorTerms") or []
    if add:
        terms = (
            [
                {**t, "matchExpressions": [*(t.get("matchExpressions") or []), *a["matchExpressions"]]}
                for t in have
                for a in add
            ]
            if have
            else list(add)
        )
        mine[req] = {"nodeSelectorTerms": terms}
    if theirs.get(pref):
        mine[pref] = [*(mine.get(pref) or []), *theirs[pref]]
    if mine:
        out["nodeAffinity"] = mine
    return out


def container_resources(
    resources: Mapping[str, Mapping[str, str]], gpu_limits: Mapping[str, str]
) -> dict[str, dict[str, str]]:
    """CPU and memory `resources` ({"requests": ..., "limits": ...}) with the GPU share's limits
    (extended resources: Kubernetes sets their requests equal). A GPU key in `resources` never
    overrides the share: the quota counted the share."""
    out: dict[str, dict[str, str]] = {}
    for kind in ("requests", "limits"):
        part = {str(k): str(v) for k, v in (resources.get(kind) or {}).items() if not _gpu_key(str(k))}
        if kind == "limits":
            part.update(gpu_limits)
        if part:
            out[kind] = part
    return out


def _gpu_key(name: str) -> bool:
    return name.startswith("nvidia.com/")


def resources_for(
    default: Mapping[str, Any], per_project: Mapping[str, Mapping[str, Any]], project: str
) -> dict[str, Any]:
    """A project's resources: its own requests and limits over the default's, key by key."""
    own = per_project.get(project) or {}
    return {
        kind: {**(default.get(kind) or {}), **(own.get(kind) or {})}
        for kind in ("requests", "limits")
        if default.get(kind) or own.get(kind)
    }


def merged(base: Mapping[str, Any], over: Mapping[str, object]) -> dict[str, object]:
    """`over` on `base`, nested dicts merged (securityContext halves)."""
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out
