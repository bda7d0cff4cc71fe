"""The default placement policy keeps per-node state between decisions (score caches by node
version, the NodeIndex of largest shares, whole free GPUs and node classes) so that a
decision at 100,000 GPUs costs about the nodes that changed (benchmarks/placement). Whatever
the sequence of placements and releases, each decision must equal a fresh scan: every
feasible node scored from the cluster state alone, ties to the lowest rank."""

from __future__ import annotations

import random

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from gpupool.pool import GPU, ClusterState, Inventory, Node, Request, get_policy, node_classes
from gpupool.pool.capacity import FragAware, FragModel
from gpupool.pool.node_classes import NodeIndex

SHAPES = [
    Request.for_gpus(250, cpu_milli=2000),
    Request.for_gpus(500, cpu_milli=4000),
    Request.for_gpus(300, cpu_milli=0),
    Request.for_gpus(1000, cpu_milli=8000),
    Request.for_gpus(2000, cpu_milli=16000),
    Request(num_gpu=0, cpu_milli=6000),
    Request.for_gpus(700, cpu_milli=1000, gpu_models=frozenset({"B"})),
    Request.for_gpus(4000, cpu_milli=2000, gpu_models=frozenset({"A"})),
]


def inventory(widths: list[int], models: list[str], cpus: list[int]) -> Inventory:
    return Inventory(
        nodes=tuple(
            Node(
                name=f"n{i}",
                gpus=tuple(GPU(g, f"n{i}-{g}", models[i], 16384) for g in range(w)),
                cpu_milli=cpus[i],
                memory_mib=1 << 20,
            )
            for i, w in enumerate(widths)
        )
    )


def scan(policy: FragAware, state: ClusterState, req: Request):
    """The decision from scratch: no cache, no index, no classes."""
    idx = np.flatnonzero(state.feasible(req))
    if not len(idx):
        return None
    model = FragModel(state, policy._shapes, size_exponent=policy.SIZE_EXPONENT)
    after, gpu = model.best_after(state, idx, req)
    gain = after - model.usable(state, idx)
    pos = int(np.lexsort((state.rank[idx], -gain))[0])
    i = int(idx[pos])
    if req.is_sharing:
        return state.placement_on(i, req, [int(gpu[pos])])
    return state.placement_on(
        i, req, [int(g) for g in np.flatnonzero(state.gpu_free[i] == 1000)[: req.num_gpu]]
    )


clusters = st.integers(1, 14).flatmap(
    lambda n: st.tuples(
        st.lists(st.sampled_from([1, 2, 4, 8]), min_size=n, max_size=n),
        st.lists(st.sampled_from(["A", "B"]), min_size=n, max_size=n),
        st.lists(st.sampled_from([16000, 32000, 64000]), min_size=n, max_size=n),
    )
)
steps = st.lists(
    st.tuples(st.sampled_from(range(len(SHAPES))), st.booleans(), st.integers(0, 10**6)),
    min_size=1,
    max_size=60,
)


def replay(cluster, ops, classes_from: int, prefill: int) -> int:
    state = ClusterState(inventory(*cluster))
    state.shuffle_ties(random.Random(5))
    rng = random.Random(prefill)
    for _ in range(prefill):  # shares on random GPUs: free milli in no particular order along a node
        req = Request.for_gpus(rng.choice([100, 250, 500]), cpu_milli=rng.choice([0, 1000]))
        spot = get_policy("random").choose(state, req, rng)
        if spot is not None:
            state.apply(spot)
    policy = FragAware(refresh_every=8)  # target refreshes (a new model, the caches dropped) often
    policy.CLASSES_FROM = classes_from
    placed, decisions = [], 0
    for shape, release, pick in ops:
        if release and placed:
            state.release(placed.pop(pick % len(placed)))
            continue
        req = SHAPES[shape]
        policy.learn(req)
        index = NodeIndex(state)
        assert (index.feasible(req) == state.feasible(req)).all()
        got = policy.choose(state, req, random.Random(0))
        assert got == scan(policy, state, req)
        decisions += 1
        if got is not None:
            state.apply(got)
            placed.append(got)
    return decisions


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters, ops=steps, classes_from=st.sampled_from([1, 4, 10**9]), prefill=st.integers(0, 40))
def test_every_decision_equals_a_fresh_scan(cluster, ops, classes_from, prefill) -> None:
    replay(cluster, ops, classes_from, prefill)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters, ops=steps, prefill=st.integers(0, 40))
def test_a_hash_collision_costs_time_never_a_wrong_decision(
    cluster, ops, prefill, monkeypatch_weights
) -> None:
    replay(cluster, ops, 1, prefill)  # every node hashes alike here: only the comparison keeps them apart


@pytest.fixture(scope="module")
def monkeypatch_weights():
    saved = node_classes._WEIGHTS.copy()
    node_classes._WEIGHTS[:] = 0
    yield
    node_classes._WEIGHTS[:] = saved


@pytest.mark.parametrize("seed", range(6))
def test_alike_nodes_with_their_gpus_in_another_order_each_get_their_own_gpu(seed: int) -> None:
    """Nodes with the same free shares in a different GPU order are one class: the class's
    score is shared, but the share goes to the GPU of the chosen node that has that room."""
    rng = random.Random(seed)
    used = [750, 0, 500, 250]  # free: 250, 1000, 500, 750
    state = ClusterState(inventory([4] * 6, ["A"] * 6, [64000] * 6))
    state.shuffle_ties(rng)
    for i in range(6):
        for g, milli in enumerate(rng.sample(used, len(used))):
            if milli:
                state.apply(state.placement_on(i, Request.for_gpus(milli), [g]))
    policy = FragAware()
    policy.CLASSES_FROM = 1
    for req in [Request.for_gpus(250, cpu_milli=1000), Request.for_gpus(500), Request.for_gpus(700)] * 3:
        policy.learn(req)
        got = policy.choose(state, req, random.Random(0))
        assert got == scan(policy, state, req)
        state.apply(got)
