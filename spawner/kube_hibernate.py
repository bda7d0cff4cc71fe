"""Hibernation on Kubernetes, as pure pieces of the workspace pod (gpupool.gpu.hibernate).

The saved state lives under the user's home (`~/.gpupool/hibernate`), and a cull deletes the
pod: the state survives only where that folder is on the user's PersistentVolumeClaim (z2jh
mounts it at the home by default). On a pod's own disk (emptyDir, the image's layer) a
hibernation would report success and lose everything with the pod, so such a pod is marked
and its saves are refused with the reason: the culler then stops it as before and says why.

The start-up hook (wake before the first cell) is the `sitecustomize` in the gpupool package
installed in the notebook image: the hub's own PYTHONPATH is a path on the hub's machine
(kube_objects.HUB_ONLY_ENV), so the pod gets the image's path instead.
"""

from __future__ import annotations

import posixpath
from typing import Any

from kubernetes_asyncio.client import V1EnvVar, V1Pod

from gpupool.gpu.hibernate import ENV_REFUSED  # why this pod's saves are refused

STATE_SUBDIR = ".gpupool/hibernate"  # under the home (gpupool.gpu.hibernate.state_dir)


def _get(obj: Any, attr: str, key: str) -> Any:
    """A field of a kubernetes model or of its dict form (hooks may hand either)."""
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, attr, None)


def _inside(path: str, mount: str) -> bool:
    path, mount = posixpath.normpath(path), posixpath.normpath(mount)
    return mount == "/" or path == mount or path.startswith(mount + "/")


def state_claim(pod: V1Pod, home: str) -> str | None:
    """The claim that holds `home`/.gpupool/hibernate in the notebook container (the first), or
    None when that folder is on the pod's own disk. The deepest mount holding the path wins, as
    in the container's own file system."""
    if not posixpath.isabs(home):
        return None
    target = posixpath.join(home, STATE_SUBDIR)
    spec = _get(pod, "spec", "spec")
    containers = _get(spec, "containers", "containers") or []
    if not containers:
        return None
    claims = {}
    for v in _get(spec, "volumes", "volumes") or []:
        pvc = _get(v, "persistent_volume_claim", "persistentVolumeClaim")
        claims[_get(v, "name", "name")] = _get(pvc, "claim_name", "claimName") if pvc else None
    mounts = [
        (str(_get(m, "mount_path", "mountPath") or ""), _get(m, "name", "name"))
        for m in _get(containers[0], "volume_mounts", "volumeMounts") or []
    ]
    holding = [(path, name) for path, name in mounts if path and _inside(target, path)]
    if not holding:
        return None
    _, name = max(holding, key=lambda pm: len(posixpath.normpath(pm[0])))
    return claims.get(name) or None


def hibernate_env(pod: V1Pod, home: str, startup_dir: str, image_pythonpath: str = "") -> dict[str, str]:
    """The variables that make the pod's kernels wake from (and save to) the claim: the start-up
    hook first on PYTHONPATH, and the reason saves are refused where the state has no claim."""
    env = {"PYTHONPATH": ":".join(p for p in (startup_dir, image_pythonpath) if p)}
    if state_claim(pod, home) is None:
        env[ENV_REFUSED] = (
            f"{posixpath.join(home, STATE_SUBDIR)} is on the pod's own disk, which is deleted with"
            " the pod: mount the user's volume there (z2jh's singleuser.storage) to hibernate"
        )
    return env


def apply_hibernate(pod: V1Pod, home: str, startup_dir: str) -> V1Pod:
    """Put hibernation's variables on the notebook container, keeping the image's PYTHONPATH set
    on the container (after the hook); returns the pod."""
    container = pod.spec.containers[0]
    current = container.env or []
    old = next(
        (_get(e, "value", "value") or "" for e in current if _get(e, "name", "name") == "PYTHONPATH"), ""
    )
    # a manifest hook may run this twice: the hook stays once, first
    old = ":".join(p for p in old.split(":") if p and p != startup_dir)
    env = hibernate_env(pod, home, startup_dir, old)
    container.env = [e for e in current if _get(e, "name", "name") not in (*env, ENV_REFUSED)]
    container.env += [V1EnvVar(name=k, value=v) for k, v in env.items()]
    return pod
