"""Node pools, per-pool guarantees and elastic jobs as Kubernetes and KAI-Scheduler objects.
Pure functions: the pure core decides (gpupool.pool), these only render.

- A node pool is the nodes that match its definition: `models` -> GPU feature discovery's
  `nvidia.com/gpu.product` label (spaces become '-', as GFD writes them), `nodes` ->
  `kubernetes.io/hostname`; a pool with neither is the nodes labelled `<label key>=<pool>`
  (JobOptions.node_pool_label, KAI's `kai.scheduler/node-pool` by default). GPU indices
  (`gpus`) name cards of one machine and have no meaning on a cluster: such a pool is refused.
- On KAI-Scheduler a node pool is a scheduling shard: a scheduler of its own sees only the
  nodes, queues and PodGroups labelled `kai.scheduler/node-pool=<pool>`; KAI's default shard
  sees only what carries no such label (pkg/scheduler/conf SchedulingNodePoolParams). So a pod
  is in exactly one shard: a workspace or job that may use pools gets ONE of them (`kai_shard`)
  as its label, a leaf queue of that pool (`<queue>-<pool>`) and that pool's node affinity.
  `pool_queues()` renders, per pool, a parent `pool-<pool>` and a leaf per project, labelled
  for the shard (the chart renders the same, with a SchedulingShard per pool).
- Without KAI (kube-scheduler places the pods) a job's pools become required node affinity
  (any of them: the terms are ORed) and, with several, preferred node affinity weighted by
  their order.
- An elastic job (min to max whole GPUs) becomes one pod per GPU: the Job's parallelism is the
  maximum and KAI's `kai.scheduler/batch-min-member` annotation the minimum (KAI gang-schedules
  that many; needs KAI v0.14.1 or later, see kai_version.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpupool.pool import InvalidRequest
from gpupool.pool.jobs import Project
from gpupool.pool.pools import NodePool
from gpupool.vocab.cluster import KAI_NODE_POOL  # the settings' default too

GPU_PRODUCT = "nvidia.com/gpu.product"  # GPU feature discovery
HOSTNAME = "kubernetes.io/hostname"
MIN_MEMBER = "kai.scheduler/batch-min-member"
MAX_TERMS = 16


def gfd_product(model: str) -> str:
    """A GPU model as GPU feature discovery labels it ("NVIDIA H100 80GB HBM3" ->
    "NVIDIA-H100-80GB-HBM3")."""
    return "-".join(model.split())


def pool_term(pool: NodePool, label_key: str) -> dict[str, object]:
    """The nodeSelectorTerm of the nodes in `pool` (its expressions are ANDed)."""
    if pool.gpus and not (pool.models or pool.nodes):
        raise InvalidRequest(
            f"node pool {pool.name!r} is defined by GPU indices, which mean nothing on a"
            " cluster: define it by models or nodes, or label its nodes"
            f" {label_key}={pool.name}"
        )
    exprs = []
    if pool.models:
        exprs.append(
            {"key": GPU_PRODUCT, "operator": "In", "values": sorted(gfd_product(m) for m in pool.models)}
        )
    if pool.nodes:
        exprs.append({"key": HOSTNAME, "operator": "In", "values": sorted(pool.nodes)})
    if not exprs:
        exprs.append({"key": label_key, "operator": "In", "values": [pool.name]})
    return {"matchExpressions": exprs}


def node_affinity(pools: Sequence[NodePool], label_key: str) -> dict[str, object]:
    """The pod's `affinity` for a job that may use `pools`, in order of preference."""
    if not pools:
        return {}
    if len(pools) > MAX_TERMS:
        raise InvalidRequest(f"at most {MAX_TERMS} node pools per job")
    terms = [pool_term(p, label_key) for p in pools]
    affinity: dict[str, object] = {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
    }
    if len(pools) > 1:  # the first pool weighs most
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": max(1, 100 >> i), "preference": t} for i, t in enumerate(terms)
        ]
    return {"nodeAffinity": affinity}


def pool_queue_name(queue: str, pool: str) -> str:
    return f"{queue}-{pool}"


def pool_parent_name(pool: str) -> str:
    return f"pool-{pool}"


def shard_guarantee(project: Project, pool: str) -> int:
    """The project's guarantee (milli-GPU) in `pool`'s KAI shard: its guarantee there, or its
    whole guarantee when its only pool is `pool`; 0 where it only borrows."""
    if project.pool_guarantees:
        return dict(project.pool_guarantees).get(pool, 0)
    return project.guarantee_milli if project.pools == (pool,) else 0


def shard_problem(project: Project) -> str | None:
    """Why KAI cannot hold this project's guarantee (None: it can): one number across several
    shards, each with queues of its own."""
    if project.pool_guarantees or len(project.pools) < 2 or project.guarantee_milli <= 0:
        return None
    return (
        f"project {project.name}: one guarantee of {project.guarantee_milli / 1000:g} GPUs across node pools"
        f" {', '.join(project.pools)} cannot be said to KAI-Scheduler, whose node pools are scheduling"
        ' shards with queues of their own: give it per pool ("guarantee": {' + f'"{project.pools[0]}":'
        f" {project.guarantee_milli / 1000:g}, ...}}) or name one pool"
    )


def kai_shard(project: Project, chosen: Sequence[str], per_pool_choice: str | None) -> str | None:
    """The one pool (KAI shard) a job of `project` goes to: for a guarantee per pool, the pool
    the core chose (`per_pool_choice`, pool_quotas.queue_pool); else the first of the job's
    pools (`chosen`, else the project's); None: the default shard (no pools)."""
    if project.pool_guarantees:
        return per_pool_choice
    order = list(chosen or project.pools)
    return order[0] if order else None


def pool_queues(
    projects: Sequence[Project], pools: Sequence[str] = (), labels: dict[str, str] | None = None
) -> list[dict[str, object]]:
    """KAI Queues of the node pools' shards: per pool (the given ones, and every pool a project
    has a guarantee in), a parent Queue (quota: the sum of the guarantees there, no limit) and a
    leaf Queue per project (quota: `shard_guarantee`; limit: the project's, which KAI can only
    apply per shard; its min runtime). Every Queue carries KAI's node-pool label of its pool."""
    names = list(
        dict.fromkeys(
            [
                *pools,
                *(pool for p in projects for pool, _ in p.pool_guarantees),
                *(p.pools[0] for p in projects if len(p.pools) == 1),
            ]
        )
    )
    out = []
    for pool in sorted(names):
        meta = {**(labels or {}), KAI_NODE_POOL: pool}
        members = sorted(projects, key=lambda p: p.name)
        out.append(
            _queue(
                pool_parent_name(pool),
                meta,
                f"pool {pool}",
                sum(shard_guarantee(p, pool) for p in members),
                -1,
                1.0,
            )
        )
        for p in members:
            q = _queue(
                pool_queue_name(p.name, pool),
                meta,
                f"{p.name} on {pool}",
                shard_guarantee(p, pool),
                p.limit_milli,
                p.weight,
            )
            q["spec"]["parentQueue"] = pool_parent_name(pool)
            q["spec"]["priority"] = p.priority or 100
            out.append(q)
    return out


def _queue(
    name: str, labels: dict[str, str], display: str, quota_milli: int, limit_milli: int, weight: float
) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "displayName": display,
            "resources": {
                "gpu": {
                    "quota": quota_milli / 1000,
                    "overQuotaWeight": weight,
                    "limit": -1 if limit_milli < 0 else limit_milli / 1000,
                },
                "cpu": {"quota": -1, "overQuotaWeight": 1, "limit": -1},
                "memory": {"quota": -1, "overQuotaWeight": 1, "limit": -1},
            },
        },
    }
