"""Per-node facts a placement policy needs at every decision, kept up to date incrementally,
and classes of alike nodes so that each class is scored once.

A decision at 100,000 GPUs (12,500 nodes) must not rescan every GPU of every node: only the
node the last decision changed is new. `NodeIndex` follows a ClusterState by its per-node
`version` (bumped by every change the state makes) and recomputes only the nodes whose version
moved: their largest free GPU share and count of whole free GPUs (what `feasible` asks), and
their state signature.

A node's usable capacity, before and after placing a request on it, depends on its GPU model,
its CPU left and the multiset of its GPUs' free milli, nothing else (capacity.FragModel). At
scale most candidates are alike (a 100,000-GPU cluster 70 % full: the 2,076 nodes that fit a
typical request there are all empty and alike), so the policy scores one representative per
class and copies the score: the same decisions as scoring every node. Classes come from a
64-bit hash of the signature, and every member is compared with its representative, so a hash
collision only costs a node being scored on its own.
"""

from __future__ import annotations

import numpy as np

from gpupool.pool.request import Request
from gpupool.pool.state import ClusterState
from gpupool.pool.units import MILLI_PER_GPU

_WEIGHTS = np.random.default_rng(20261126).integers(1, 2**62, size=66, dtype=np.int64)


class NodeIndex:
    """Derived per-node arrays of one ClusterState, refreshed for the nodes that changed."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        n, width = state.gpu_free.shape
        self.version = np.full(n, -1, dtype=np.int64)
        self.top = np.zeros(n, dtype=np.int64)  # the largest free share of a GPU on the node
        self.full = np.zeros(n, dtype=np.int64)  # GPUs with nothing allocated
        self.signature = np.zeros((n, width + 2), dtype=np.int64)  # sorted free milli, CPU, model
        self.hash = np.zeros(n, dtype=np.int64)

    def refresh(self) -> None:
        st = self.state
        changed = np.flatnonzero(st.version != self.version)
        if not len(changed):
            return
        rows = st.gpu_free[changed]
        self.top[changed] = rows.max(axis=1)
        self.full[changed] = (rows == MILLI_PER_GPU).sum(axis=1)
        sig = np.concatenate(
            [np.sort(rows, axis=1), st.cpu_free[changed, None], st.model_id[changed, None]], axis=1
        )
        self.signature[changed] = sig
        if sig.shape[1] <= len(_WEIGHTS):
            with np.errstate(over="ignore"):
                self.hash[changed] = (sig * _WEIGHTS[: sig.shape[1]]).sum(axis=1)
        else:  # very wide nodes (a nominal inventory of thousands of GPUs): each its own class
            self.hash[changed] = changed
        self.version[changed] = st.version[changed]

    def feasible(self, req: Request) -> np.ndarray:
        """ClusterState.feasible, from the kept per-node facts (the same answer)."""
        self.refresh()
        st = self.state
        mask = (st.cpu_free >= req.cpu_milli) & (st.mem_free >= req.memory_mib) & (st.pods < st.max_pods)
        if req.num_gpu == 0:
            return mask
        mask &= st.model_mask(req)
        if req.is_sharing:
            return mask & (self.top >= req.gpu_milli)
        return mask & (self.full >= req.num_gpu)

    def classes(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(representatives, inverse): nodes[i] scores as representatives[inverse[i]]."""
        self.refresh()
        _, first, inverse = np.unique(self.hash[nodes], return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        sig = self.signature[nodes]
        alike = (sig == sig[first][inverse]).all(axis=1)
        if not alike.all():  # a collision: those nodes are their own class
            odd = np.flatnonzero(~alike)
            first = np.concatenate([first, odd])
            inverse = inverse.copy()
            inverse[odd] = np.arange(len(first) - len(odd), len(first))
        return nodes[first], inverse


def gpu_with(state: ClusterState, nodes: np.ndarray, free: np.ndarray) -> np.ndarray:
    """On each node, the lowest-index GPU with exactly `free` milli left (the one a share
    chosen on an alike node goes to: among GPUs equally good, the policy takes the lowest)."""
    return np.argmax(state.gpu_free[nodes] == free[:, None], axis=1)
