"""What a cluster's installer adds beside the node, for the real-node tests: cluster DNS
(CoreDNS as a Deployment behind the `kube-dns` Service, as kubeadm installs it) and a default
StorageClass whose volumes are folders on the node.

The volumes' provisioner is ours (`LocalVolumes`, a thread in the test process): it does what
an external provisioner does for a StorageClass (Rancher's local-path, a CSI driver's sidecar),
here for folders on the one node: for each pending claim of its class it makes a folder
(mode 0777, as local-path makes them, so a pod's non-root user may write) and a hostPath
PersistentVolume bound to the claim; the PV controller (kube-controller-manager's, real) does
the binding, and a released volume (reclaim policy Delete) loses its folder and its PV.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
from pathlib import Path

import httpx

from tests.cluster.node import CLUSTER_DNS

STORAGE_CLASS = "local"
PROVISIONER = "gpupool.test/local-folders"

COREFILE = """.:1053 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    cache 30
    loop
    loadbalance
}
"""


def coredns_objects(image: str) -> list[dict]:
    """CoreDNS as kubeadm's addon installs it (kube-system, Deployment, `kube-dns` Service at
    the kubelet's clusterDNS address, the RBAC its kubernetes plugin needs). Names outside
    cluster.local get no answer (the node's pods need none)."""
    labels = {"k8s-app": "kube-dns"}
    meta = {"namespace": "kube-system"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "coredns", **meta}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "coredns", **meta},
            "data": {"Corefile": COREFILE},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "coredns", **meta, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "coredns",
                        "dnsPolicy": "Default",
                        "priorityClassName": "system-cluster-critical",
                        "containers": [
                            {
                                "name": "coredns",
                                "image": image,
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "volumeMounts": [
                                    {"name": "config", "mountPath": "/etc/coredns", "readOnly": True}
                                ],
                                # 1053: a non-root process may not bind 53 (CoreDNS's image sets a file
                                # capability for that; our layers carry no xattrs), the Service maps 53 to it
                                "ports": [
                                    {"containerPort": 1053, "name": "dns", "protocol": "UDP"},
                                    {"containerPort": 1053, "name": "dns-tcp", "protocol": "TCP"},
                                ],
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]},
                                    "readOnlyRootFilesystem": True,
                                    "runAsNonRoot": True,
                                },
                                "readinessProbe": {
                                    "httpGet": {"path": "/ready", "port": 8181},
                                    "periodSeconds": 2,
                                },
                                "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}},
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", **meta, "labels": labels},
            "spec": {
                "selector": labels,
                "clusterIP": CLUSTER_DNS,
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": 1053, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": 1053, "protocol": "TCP"},
                ],
            },
        },
    ]


def storage_class() -> dict:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


class LocalVolumes:
    """The StorageClass `local`'s provisioner (see the module docstring)."""

    def __init__(self, http_factory, folder: Path, node: str) -> None:
        self.http_factory, self.folder, self.node = http_factory, folder, node
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="local-volumes")
        self.made: list[str] = []  # PV names, for the tests

    def __enter__(self) -> LocalVolumes:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join(10)

    def _run(self) -> None:
        with self.http_factory() as http:
            while not self.stopped.wait(0.3):
                with contextlib.suppress(httpx.HTTPError, KeyError):
                    self._pass(http)

    def _pass(self, http: httpx.Client) -> None:
        claims = http.get("/api/v1/persistentvolumeclaims").json().get("items", [])
        for claim in claims:
            meta, spec = claim["metadata"], claim["spec"]
            wanted = (meta.get("annotations") or {}).get("volume.kubernetes.io/storage-provisioner")
            if (
                claim.get("status", {}).get("phase") != "Pending"
                or wanted != PROVISIONER
                or spec.get("volumeName")
            ):
                continue
            name = f"pvc-{meta['uid']}"
            path = self.folder / name
            path.mkdir(exist_ok=True)
            path.chmod(0o777)
            pv = {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
                "spec": {
                    "capacity": {"storage": spec["resources"]["requests"]["storage"]},
                    "accessModes": spec["accessModes"],
                    "persistentVolumeReclaimPolicy": "Delete",
                    "storageClassName": STORAGE_CLASS,
                    "volumeMode": "Filesystem",
                    "hostPath": {"path": str(path), "type": "Directory"},
                    "claimRef": {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]},
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "kubernetes.io/hostname",
                                            "operator": "In",
                                            "values": [self.node],
                                        }
                                    ]
                                }
                            ]
                        }
                    },
                },
            }
            r = http.post("/api/v1/persistentvolumes", json=pv)
            if r.status_code < 300:
                self.made.append(name)
        for pv in http.get("/api/v1/persistentvolumes").json().get("items", []):
            meta = pv["metadata"]
            if (meta.get("annotations") or {}).get(
                "pv.kubernetes.io/provisioned-by"
            ) == PROVISIONER and pv.get("status", {}).get("phase") == "Released":
                shutil.rmtree(self.folder / meta["name"], ignore_errors=True)
                http.delete(f"/api/v1/persistentvolumes/{meta['name']}")
