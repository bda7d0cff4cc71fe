"""What the pool has: nodes and their GPUs. Pure data, no discovery here."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.pool.units import MILLI_PER_GPU


@dataclass(frozen=True)
class GPU:
    index: int
    uuid: str
    model: str
    memory_mib: int
    virtual: bool = False  # declared, not found by NVML: the whole flow runs without hardware
    minor: int | None = None  # NVML's minor number: its device node /dev/nvidia<minor> (None: the index)
    reserved_mib: int = 0  # memory the driver keeps for itself (NVML's "reserved"): no share's to use

    @property
    def device_minor(self) -> int:
        return self.index if self.minor is None else self.minor


@dataclass(frozen=True)
class Node:
    name: str
    gpus: tuple[GPU, ...]
    cpu_milli: int = 1_000_000
    memory_mib: int = 1 << 30
    max_pods: int = 1001

    @property
    def model(self) -> str:
        return self.gpus[0].model if self.gpus else ""


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[Node, ...]
    _by_name: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
        object.__setattr__(self, "_by_name", {n: i for i, n in enumerate(names)})

    def index_of(self, node_name: str) -> int:
        return self._by_name[node_name]

    def node(self, node_name: str) -> Node:
        return self.nodes[self._by_name[node_name]]

    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    @property
    def capacity_milli(self) -> int:
        return self.gpu_count * MILLI_PER_GPU

    @property
    def max_gpus_per_node(self) -> int:
        return max((len(n.gpus) for n in self.nodes), default=0)


def virtual_inventory(
    count: int, memory_mib: int = 16384, model: str = "virtual", node: str = "localhost"
) -> Inventory:
    """A single node with `count` declared GPUs, for laptops and CI."""
    gpus = tuple(
        GPU(index=i, uuid=f"GPU-virtual-{i}", model=model, memory_mib=memory_mib, virtual=True)
        for i in range(count)
    )
    return Inventory(nodes=(Node(name=node, gpus=gpus),))
