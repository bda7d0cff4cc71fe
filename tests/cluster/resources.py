"""Applying manifests to the test control plane, found through the server's own discovery
(server-side apply, as `kubectl apply --server-side` does), and fake GPU nodes for kwok."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cache

import httpx

from tests.cluster.plane import KWOK_NODE
from tests.support import wait


class Resources:
    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    @cache  # noqa: B019 (one per session; discovery does not change under a test)
    def _group(self, api_version: str) -> dict[str, tuple[str, bool]]:
        path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        r = self.http.get(path)
        r.raise_for_status()
        return {
            res["kind"]: (res["name"], res["namespaced"])
            for res in r.json()["resources"]
            if "/" not in res["name"]
        }

    def path(self, api_version: str, kind: str, name: str = "", namespace: str = "") -> str:
        try:
            plural, namespaced = self._group(api_version)[kind]
        except KeyError:
            self._group.cache_clear()  # a CRD applied since
            plural, namespaced = self._group(api_version)[kind]
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if namespaced:
            base += f"/namespaces/{namespace or 'default'}"
        return f"{base}/{plural}" + (f"/{name}" if name else "")

    def apply(self, doc: dict, namespace: str = "") -> dict:
        meta = doc["metadata"]
        url = self.path(doc["apiVersion"], doc["kind"], meta["name"], meta.get("namespace") or namespace)
        r = self.http.patch(
            url,
            params={"fieldManager": "gpupool-test", "force": "true"},
            json=doc,
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
        if r.status_code >= 400:
            raise AssertionError(f"{doc['kind']}/{meta['name']}: {r.status_code} {r.text[:500]}")
        return r.json()

    def apply_all(self, docs: Iterable[dict], namespace: str = "") -> None:
        docs = list(docs)
        # the order kubectl/helm use: definitions and namespaces before what lives in them
        first = (
            "CustomResourceDefinition",
            "Namespace",
            "PriorityClass",
            "ServiceAccount",
            "ClusterRole",
            "Role",
        )
        for doc in sorted(docs, key=lambda d: first.index(d["kind"]) if d["kind"] in first else len(first)):
            self.apply(doc, namespace)
            if doc["kind"] == "CustomResourceDefinition":
                self.wait_established(doc["metadata"]["name"])

    def wait_established(self, name: str, timeout: float = 30) -> None:
        until(
            lambda: any(
                c["type"] == "Established" and c["status"] == "True"
                for c in (
                    self.http.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                    .json()
                    .get("status", {})
                    .get("conditions")
                    or []
                )
            ),
            timeout,
            f"CRD {name} established",
        )

    def get(self, path: str) -> dict | None:
        r = self.http.get(path)
        if r.status_code == 404:
            return None
        r.raise_for_status()
        return r.json()


def gpu_node(
    name: str, gpus: int = 8, product: str = "NVIDIA-H100-80GB-HBM3", memory_mib: int = 81559
) -> dict:
    """A kwok node with `gpus` devices, labelled as NVIDIA's GPU feature discovery labels them."""
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE: "fake"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.memory": str(memory_mib),
                "nvidia.com/gpu.count": str(gpus),
            },
        },
        "spec": {},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def until(
    check: Callable[[], object],
    timeout: float = 30.0,
    what: str = "condition",
    log: Callable[[], str] = lambda: "",
) -> object:
    """Poll `check` until it returns something truthy: the control plane (and KAI or Kueue, on
    their own clocks) acts asynchronously. tests.support.wait.until in the cluster tests' argument
    order; on a timeout says what it waited for, and `log()` (a component's log tail)."""
    return wait.until(check, what, timeout=timeout, detail=log)
