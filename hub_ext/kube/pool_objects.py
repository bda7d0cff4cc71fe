"""Node pools, per-pool guarantees and elastic jobs as Kubernetes and KAI-Scheduler objects.
Pure functions: the pure core decides (gpupool.pool), these only render.

- A node pool is the nodes that match its definition: `models` -> GPU feature discovery's
  `nvidia.com/gpu.product` label (spaces become '-', as GFD writes them), `nodes` ->
  `kubernetes.io/hostname`; a pool with neither is the nodes labelled `<label key>=<pool>`
  (JobOptions.node_pool_label). GPU indices (`gpus`) name cards of one machine and have no
  meaning on a cluster: such a pool is refused there.
- A job's pools become required node affinity (any of them: the terms are ORed) and, with
  several, preferred node affinity weighted by the order of preference. kube-scheduler scores
  the preference; KAI-Scheduler filters with Kubernetes' NodeAffinity plugin but does not
  score preferred terms, so on KAI the order is not carried, only the set.
- A guarantee per pool becomes one KAI leaf Queue per project and pool, labelled with KAI's
  node-pool label (`kai.scheduler/node-pool`) so that the scheduling shard of that pool owns
  it, under a parent Queue per pool; the Job of a job the hub sent to that pool carries the
  same label (KAI's pod grouper copies it from the Job to the PodGroup).
- An elastic job (min to max whole GPUs) becomes one pod per GPU: the Job's parallelism is the
  maximum and KAI's `kai.scheduler/batch-min-member` annotation the minimum (KAI gang-schedules
  that many, adds the rest as GPUs allow and evicts pods above it first).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..pool import InvalidRequest
from ..pool.jobs import Project
from ..pool.pools import NodePool

KAI_NODE_POOL = "kai.scheduler/node-pool"  # KAI's default nodePoolLabelKey (scheduling shards)
GPU_PRODUCT = "nvidia.com/gpu.product"  # GPU feature discovery
HOSTNAME = "kubernetes.io/hostname"
MIN_MEMBER = "kai.scheduler/batch-min-member"
MAX_TERMS = 16


def gfd_product(model: str) -> str:
    """A GPU model as GPU feature discovery labels it ("NVIDIA H100 80GB HBM3" ->
    "NVIDIA-H100-80GB-HBM3")."""
    return "-".join(model.split())


def pool_term(pool: NodePool, label_key: str) -> dict:
    """The nodeSelectorTerm of the nodes in `pool` (its expressions are ANDed)."""
    if pool.gpus and not (pool.models or pool.nodes):
        raise InvalidRequest(f"node pool {pool.name!r} is defined by GPU indices, which mean nothing on a"
                             " cluster: define it by models or nodes, or label its nodes"
                             f" {label_key}={pool.name}")
    exprs = []
    if pool.models:
        exprs.append({"key": GPU_PRODUCT, "operator": "In", "values": sorted(gfd_product(m) for m in pool.models)})
    if pool.nodes:
        exprs.append({"key": HOSTNAME, "operator": "In", "values": sorted(pool.nodes)})
    if not exprs:
        exprs.append({"key": label_key, "operator": "In", "values": [pool.name]})
    return {"matchExpressions": exprs}


def node_affinity(pools: Sequence[NodePool], label_key: str) -> dict:
    """The pod's `affinity` for a job that may use `pools`, in order of preference."""
    if not pools:
        return {}
    if len(pools) > MAX_TERMS:
        raise InvalidRequest(f"at most {MAX_TERMS} node pools per job")
    terms = [pool_term(p, label_key) for p in pools]
    affinity: dict = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    if len(pools) > 1:  # the first pool weighs most
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": max(1, 100 >> i), "preference": t} for i, t in enumerate(terms)]
    return {"nodeAffinity": affinity}


def pool_queue_name(queue: str, pool: str) -> str:
    return f"{queue}-{pool}"


def pool_parent_name(pool: str) -> str:
    return f"pool-{pool}"


def pool_queues(projects: Sequence[Project], labels: dict[str, str] | None = None) -> list[dict]:
    """KAI Queues for the projects with a guarantee per pool: a parent Queue per pool (its
    quota the sum of the guarantees there, no limit) and a leaf Queue per project and pool
    (quota: the project's guarantee there; limit: the project's limit, which KAI can only
    apply per shard). Every Queue carries KAI's node-pool label of its pool."""
    per_pool: dict[str, list[tuple[Project, int]]] = {}
    for p in projects:
        for pool, milli in p.pool_guarantees:
            per_pool.setdefault(pool, []).append((p, milli))
    out = []
    for pool, members in per_pool.items():
        meta = {**(labels or {}), KAI_NODE_POOL: pool}
        out.append(_queue(pool_parent_name(pool), meta, f"pool {pool}", sum(m for _, m in members), -1, 1.0))
        for p, milli in members:
            q = _queue(pool_queue_name(p.name, pool), meta, f"{p.name} on {pool}", milli, p.limit_milli, p.weight)
            q["spec"]["parentQueue"] = pool_parent_name(pool)
            q["spec"]["priority"] = p.priority or 100
            out.append(q)
    return out


def _queue(name: str, labels: dict[str, str], display: str, quota_milli: int, limit_milli: int,
           weight: float) -> dict:
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue",
            "metadata": {"name": name, "labels": dict(labels)},
            "spec": {"displayName": display, "resources": {
                "gpu": {"quota": quota_milli / 1000, "overQuotaWeight": weight,
                        "limit": -1 if limit_milli < 0 else limit_milli / 1000},
                "cpu": {"quota": -1, "overQuotaWeight": 1, "limit": -1},
                "memory": {"quota": -1, "overQuotaWeight": 1, "limit": -1}}}}
