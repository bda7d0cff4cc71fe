"""The optional Kueue adapter: the same project guarantees as Kueue queues.

One ClusterQueue per project, all in one cohort: `nominalQuota` is the guarantee,
`borrowingLimit` the room up to the project's limit (none when unlimited), and
`reclaimWithinCohort: Any` lets a project take its guarantee back from borrowers, as
gpupool's own training pool does. A LocalQueue per project in the jobs' namespace; Jobs
name it with the label `kueue.x-k8s.io/queue-name`. The chart renders the same objects; with
user namespaces the hub makes a user's LocalQueue in their namespace before their first Job
of a project there (local_queue).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpupool.pool import MILLI_PER_GPU
from gpupool.pool.training import Project

API = "kueue.x-k8s.io/v1beta2"
GPU = "nvidia.com/gpu"


def _gpus(milli: int) -> int:
    # Kueue counts the device plugin's whole GPUs: a fractional guarantee rounds up
    return math.ceil(milli / MILLI_PER_GPU)


# far above any cluster: the kubelet and the pods' own requests bound CPU and memory, not the queue
UNRATIONED = [{"name": "cpu", "nominalQuota": "1000000"}, {"name": "memory", "nominalQuota": "1Ei"}]


def kueue_objects(
    projects: Mapping[str, Project], namespace: str, cohort: str = "gpupool", flavor: str = "gpu"
) -> list[dict[str, object]]:
    out: list[dict[str, object]] = [
        {"apiVersion": API, "kind": "Cohort", "metadata": {"name": cohort}, "spec": {}},
        {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": flavor}, "spec": {}},
    ]
    for name, p in sorted(projects.items()):
        quota: dict[str, object] = {"name": GPU, "nominalQuota": _gpus(p.guarantee_milli)}
        if p.limit_milli >= 0:
            quota["borrowingLimit"] = max(0, _gpus(p.limit_milli) - _gpus(p.guarantee_milli))
        out.append(
            {
                "apiVersion": API,
                "kind": "ClusterQueue",
                "metadata": {"name": name},
                "spec": {
                    "cohortName": cohort,
                    "namespaceSelector": {},
                    "queueingStrategy": "BestEffortFIFO",
                    "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"},
                    # train pods ask for CPU and memory (a fractional job is not BestEffort), and
                    # Kueue leaves a workload that requests a resource no group covers pending for
                    # ever; gpupool's guarantees are GPUs, so these are covered, not rationed (one
                    # group: a flavor may stand in only one)
                    "resourceGroups": [
                        {
                            "coveredResources": [GPU, "cpu", "memory"],
                            "flavors": [{"name": flavor, "resources": [quota, *UNRATIONED]}],
                        }
                    ],
                },
            }
        )
        out.append(local_queue(name, namespace, name))
    return out


def local_queue(name: str, namespace: str, cluster_queue: str) -> dict[str, object]:
    """A LocalQueue: where Jobs of `namespace` labelled with `name` wait for `cluster_queue`."""
    return {
        "apiVersion": API,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue},
    }
