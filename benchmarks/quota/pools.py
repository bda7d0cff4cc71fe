"""The heterogeneous cluster of the quota benchmark: the same GPUs as the flat pool, but one
8-GPU node in four becomes four 2-GPU workstations with low-end cards (the seeds' case study:
researchers on workstation cards, training on DGXs).

Three ways to run the same jobs on it:
* flat: any job on any GPU that fits (no pools);
* prefer: jobs of up to 2 GPUs prefer the workstations and go to the DGXs when the workstations
  are full (with best-fit packing this is what flat placement does anyway);
* split: jobs of up to 2 GPUs only on the workstations, larger ones only on the DGXs (the DGXs
  kept for big jobs);
* split with per-pool guarantees: the same, each project's guarantee split between the pools
  by their share of the GPUs (`per_pool_guarantees`), so each is reclaimed within its pool.
"""

from __future__ import annotations

from dataclasses import replace

from benchmarks.quota.workload import SimJob, Workload
from gpupool.pool.inventory import GPU, Inventory, Node
from gpupool.pool.pools import NodePool

POOLS = {
    "workstations": NodePool("workstations", models=frozenset({"A2000"})),
    "dgx": NodePool("dgx", models=frozenset({"H100"})),
}


def heterogeneous(w: Workload) -> Workload:
    nodes: list[Node] = []
    for k, n in enumerate(w.inventory.nodes):
        if k % 4 == 3:
            for s in range(4):
                nodes.append(
                    Node(
                        f"{n.name}-ws{s}",
                        tuple(GPU(g, f"{n.name}-ws{s}-{g}", "A2000", 12000, True) for g in range(2)),
                    )
                )
        else:
            nodes.append(Node(n.name, tuple(GPU(g.index, g.uuid, "H100", 80000, True) for g in n.gpus)))
    return replace(w, inventory=Inventory(nodes=tuple(nodes)))


def prefer(j: SimJob) -> tuple[str, ...]:
    return ("workstations", "dgx") if j.gpus <= 2 else ("dgx",)


def split(j: SimJob) -> tuple[str, ...]:
    return ("workstations",) if j.gpus <= 2 else ("dgx",)


def per_pool_guarantees(w: Workload) -> Workload:
    """Each project's guarantee split between the pools by their share of the GPUs (whole
    GPUs; the workstations get the rounded share, the DGXs the rest)."""
    ws = sum(len(n.gpus) for n in w.inventory.nodes if n.model == "A2000")
    share = ws / w.inventory.gpu_count
    projects = {}
    for name, p in w.projects.items():
        on_ws = round(p.guarantee_milli * share / 1000) * 1000
        projects[name] = replace(
            p,
            pools=("dgx", "workstations"),
            pool_guarantees=(("dgx", p.guarantee_milli - on_ws), ("workstations", on_ws)),
        )
    return replace(w, projects=projects)
