"""The owner's home in their train Job: the claim their workspace mounts, mounted in the job.

A `%%train` job on Kubernetes otherwise never sees the files its notebook reads. The hub finds
the home as kubespawner mounts it: the volume of KubeSpawner.volume_mounts at the home's path
(z2jh's singleuser.storage: `{pvc_name}`, the claim kubespawner names from pvc_name_template
and makes at the first spawn; or one shared claim with a `{username}` subPath), and expands its
names as kubespawner does (job_namespace.expand: its own slugs), in the job's namespace, the
hub's or the owner's, where kubespawner made the claim.

Where the job may run is the volume's access mode's to say: ReadWriteMany (or ReadOnlyMany for
a read-only mount) anywhere; ReadWriteOnce only on the node whose pods already use the claim
(the workspace's: the volume is attached there, and a second node would wait on "Multi-Attach"
for ever), so the job is pinned to that node, and refused when no pod uses it (no node is
known, and a job placed elsewhere would keep the workspace from starting); ReadWriteOncePod
never (only the workspace's pod may mount it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpupool.kube.job_namespace import expand, template_problem

HOME_VOLUME = "home"
HOSTNAME = "kubernetes.io/hostname"
# the names kubespawner resolves before it expands a volume (its _expand_user_properties)
RESOLVED = ("namespace", "pvc_name")


class HomeUnavailable(ValueError):
    """The job cannot mount its owner's home: the reason, for the user."""


def _entries(value: Any) -> list[dict[str, Any]]:
    """kubespawner's volumes or volume_mounts: a list, or a dict whose values are the entries
    (z2jh's form, in key order as kubespawner sorts them)."""
    if isinstance(value, Mapping):
        return [dict(value[k]) for k in sorted(value)]
    return [dict(v) for v in value or ()]


def find_home(volumes: object, volume_mounts: object, mount_path: str) -> tuple[str, str]:
    """The claim name and subPath (kubespawner templates, unexpanded) of the volume the
    workspace mounts at `mount_path`. ValueError (said when the hub starts) when no claim is
    mounted there."""
    mounts = [m for m in _entries(volume_mounts) if m.get("mountPath") == mount_path]
    if not mounts:
        paths = sorted(str(m.get("mountPath")) for m in _entries(volume_mounts))
        raise ValueError(
            f"the workspaces mount nothing at {mount_path!r} (KubeSpawner.volume_mounts:"
            f" {', '.join(paths) or 'none'}): set c.TrainPool.home_mount_path to the home's"
            " path (z2jh: singleuser.storage.homeMountPath), or turn home_mount off"
        )
    mount = mounts[0]
    volume = next((v for v in _entries(volumes) if v.get("name") == mount.get("name")), None)
    claim = ((volume or {}).get("persistentVolumeClaim") or {}).get("claimName")
    if not claim:
        raise ValueError(
            f"the workspaces' home at {mount_path!r} is not a PersistentVolumeClaim (volume"
            f" {mount.get('name')!r}): a train Job can mount only a claim"
        )
    return str(claim), str(mount.get("subPath") or "")


def home_problem(claim: str, pvc_template: str, sub_path: str, mount_path: str, slug_scheme: str) -> str:
    """Why the hub cannot name an owner's home for their jobs ("" when it can)."""
    for setting, template, more in (
        ("KubeSpawner.pvc_name_template", pvc_template, ("namespace",)),
        ("the home volume's claimName", claim, RESOLVED),
        ("the home mount's subPath", sub_path, RESOLVED),
        ("the home mount's path", mount_path, RESOLVED),
    ):
        why = template_problem(template, slug_scheme, setting, more)
        if why:
            return why
    return ""


def expanded(
    template: str, owner: str, namespace: str, hub_namespace: str, pvc_template: str, slug_scheme: str
) -> str:
    """A home template (claimName, subPath) for `owner`, with kubespawner's `{namespace}` (the
    job's: the workspace's) and `{pvc_name}` (pvc_name_template's expansion) resolved."""
    pvc = expand(pvc_template, owner, hub_namespace, slug_scheme, {"namespace": namespace})
    return expand(template, owner, hub_namespace, slug_scheme, {"namespace": namespace, "pvc_name": pvc})


def home_volume(
    claim: str, sub_path: str, mount_path: str, read_only: bool
) -> tuple[dict[str, object], dict[str, object]]:
    """The pod's volume and the container's mount of the home claim `claim`."""
    volume: dict[str, object] = {
        "name": HOME_VOLUME,
        "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only},
    }
    mount: dict[str, Any] = {"name": HOME_VOLUME, "mountPath": mount_path, "readOnly": read_only}
    if sub_path:
        mount["subPath"] = sub_path
    return volume, mount


def nodes_using(pods: Iterable[Mapping[str, Any]], claim: str) -> list[str]:
    """The nodes of the pods (as JSON) that mount `claim` and have not ended."""
    nodes = set()
    for pod in pods:
        spec, phase = pod.get("spec") or {}, (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed") or not spec.get("nodeName"):
            continue
        if any(
            ((v.get("persistentVolumeClaim") or {}).get("claimName")) == claim
            for v in spec.get("volumes") or ()
        ):
            nodes.add(str(spec["nodeName"]))
    return sorted(nodes)


def home_node(
    claim: str, namespace: str, access_modes: Iterable[str], read_only: bool, nodes: list[str]
) -> str:
    """Where a job mounting the home `claim` must run: "" anywhere, else the node's name.
    HomeUnavailable (the user's reason) where it cannot mount it."""
    modes = set(access_modes)
    where = f"your home ({namespace}/{claim})"
    if "ReadWriteMany" in modes or (read_only and "ReadOnlyMany" in modes):
        return ""
    if "ReadWriteOnce" in modes:
        if len(nodes) == 1:
            return nodes[0]  # the workspace's node: the volume is attached there
        if not nodes:
            raise HomeUnavailable(
                f"{where} is a ReadWriteOnce volume: a job can share it only with your running"
                " server, on its node. Start your server and submit again (or ask your admin for"
                " ReadWriteMany home storage, or to turn the home mount off)"
            )
        raise HomeUnavailable(
            f"{where} is used on several nodes ({', '.join(nodes)}): a job cannot join them"
        )
    if "ReadWriteOncePod" in modes:
        raise HomeUnavailable(f"{where} is ReadWriteOncePod: only your server's pod may mount it")
    raise HomeUnavailable(f"{where} cannot be mounted by a job (access modes: {', '.join(sorted(modes))})")


def pinned(node: str) -> dict[str, object]:
    """A pod affinity that places it on `node` only (merged with the job's own)."""
    term = {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": [node]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
