"""Placement policies learn only from real arrivals, and forget an old workload."""

from __future__ import annotations

import copy
import random

import pytest

from gpupool.pool import GPU, ClusterState, Inventory, Node, Request, get_policy
from gpupool.pool.capacity import FragAware, OnlineTarget
from gpupool.pool.fragmentation import FGD
from gpupool.pool.placement import DEFAULT_POLICY, POLICIES
from gpupool.pool.training import Job, Project, schedule


def nodes(n: int, gpus: int = 2, cpu: int = 64000) -> Inventory:
    return Inventory(
        nodes=tuple(
            Node(f"n{i}", tuple(GPU(g, f"n{i}g{g}", "T4", 16000, True) for g in range(gpus)), cpu_milli=cpu)
            for i in range(n)
        )
    )


def learned(policy) -> object:
    """Everything a learning policy has learned, as a comparable value."""
    t = policy.target
    return copy.deepcopy(
        (dict(t.counts), t.seen, getattr(policy, "_shapes", None), getattr(t, "_chosen", None))
    )


@pytest.mark.parametrize("name", ["frag-aware", "fgd"])
def test_planning_a_reclaim_leaves_the_learned_workload_unchanged(name) -> None:
    state = ClusterState(nodes(2))
    policy, twin = get_policy(name), get_policy(name)
    rng = random.Random(0)
    running = []
    for i in range(4):  # the borrowing project holds all four GPUs
        req = Request.for_gpus(1000, cpu_milli=4000)
        for p in (policy, twin):
            p.learn(req)
        placement = policy.choose(state, req, rng)
        state.apply(placement)
        running.append(Job(f"lab{i}", "lab", req, submitted=i, started=i, placement=placement))
    before = learned(policy)
    projects = {"own": Project("own", 2000), "lab": Project("lab", 0)}
    # odd shapes that were never learned: trial placements of them must not be learned either
    pending = [
        Job(f"mine{i}", "own", Request.for_gpus(m, cpu_milli=3000), submitted=10)
        for i, m in enumerate((300, 700))
    ]
    plan = schedule(state, projects, pending, running, now=100, policy=policy, rng=rng)
    assert plan.preempt, "the plan reclaims GPUs from the borrower (trial placements were made)"
    assert learned(policy) == before
    # and later decisions are those of a twin that never planned anything
    probe = ClusterState(nodes(3))
    for m in (250, 500, 250, 1000, 750):
        req = Request.for_gpus(m, cpu_milli=2000)
        a, b = policy.choose(probe, req, rng), twin.choose(probe, req, rng)
        assert a == b
        probe.apply(a)


def test_choosing_alone_learns_nothing() -> None:
    policy = get_policy(DEFAULT_POLICY)
    state = ClusterState(nodes(2))
    for _ in range(50):
        policy.choose(state, Request.for_gpus(500), random.Random(0))
    assert policy.target.seen == 0 and policy.target.counts == {}


def test_registered_names_match_the_classes() -> None:
    assert POLICIES["frag-aware"] is FragAware and POLICIES["fgd"] is FGD
    assert DEFAULT_POLICY == "frag-aware"
    for name, cls in POLICIES.items():
        assert cls.name == name
        words = "".join(w.capitalize() for w in name.split("-"))
        assert cls.__name__.lower().startswith(words.lower()) or cls.__name__ == name.upper(), (name, cls)


def test_an_old_request_counts_half_after_one_half_life() -> None:
    t = OnlineTarget(coverage=1.0, half_life=10)
    t.learn(Request.for_gpus(500))  # request 0
    for _ in range(9):
        t.learn(Request.for_gpus(1000))
    t.learn(Request.for_gpus(250))  # request 10: one half-life later
    weights = {s.gpu_milli: s.weight for s in t.shapes()}
    assert weights[500] / weights[250] == pytest.approx(0.5)
    never = OnlineTarget(coverage=1.0)  # no half-life: every request counts 1 for ever
    for req in (Request.for_gpus(500), Request.for_gpus(250)):
        never.learn(req)
    assert {s.gpu_milli: s.weight for s in never.shapes()} == {500: 1.0, 250: 1.0}


def test_the_learner_stays_bounded_whatever_users_ask_for() -> None:
    t = OnlineTarget(half_life=500, max_shapes=64)
    rng = random.Random(3)
    for _ in range(20_000):  # many distinct shapes, for far longer than the float range of 2^(n/h)
        t.learn(Request.for_gpus(rng.randint(1, 999), cpu_milli=rng.randint(0, 64) * 1000))
    assert len(t.counts) <= 64 and len(t.memory) == len(t.counts)
    assert all(0 < w < 1e7 for w in t.counts.values())
    assert t.shapes()  # still a usable target
    policy, state = FragAware(), ClusterState(nodes(4))
    for cpu in range(600):  # a scheduler trying many request shapes: the score caches stay bounded
        policy.choose(state, Request.for_gpus(500, cpu_milli=cpu), rng)
    assert len(policy._caches) <= FragAware.MAX_CACHED_SHAPES


def test_after_a_workload_shift_the_policy_follows_the_new_workload() -> None:
    """Half a year of whole-GPU jobs, then a term of 0.3-GPU notebooks: with a half-life the
    policy soon decides like one that only ever saw the notebooks; without it, it does not."""
    old = [Request.for_gpus(1000, cpu_milli=8000)] * 3000
    new = [Request.for_gpus(300, cpu_milli=2000)] * 1200
    forgetting, remembering, fresh = FragAware(half_life=200), FragAware(half_life=None), FragAware()
    for req in old:
        forgetting.learn(req)
        remembering.learn(req)
    for req in new:
        for p in (forgetting, remembering, fresh):
            p.learn(req)
    inv = nodes(6, gpus=4)
    rng = random.Random(1)
    state = ClusterState(inv)
    for _ in range(6):  # a partly used cluster
        req = Request.for_gpus(rng.choice([100, 200, 400, 1000]), cpu_milli=1000)
        state.apply(get_policy("random").choose(state, req, rng))
    same_as_fresh = {"forgetting": 0, "remembering": 0}
    req = new[0]
    for _ in range(24):
        want = fresh.choose(state, req, rng)
        same_as_fresh["forgetting"] += forgetting.choose(state, req, rng) == want
        same_as_fresh["remembering"] += remembering.choose(state, req, rng) == want
        state.apply(want)
    assert same_as_fresh["forgetting"] == 24
    assert same_as_fresh["remembering"] < 24


def test_the_hub_learns_from_a_spawn_it_placed_not_from_one_it_refused(tmp_path) -> None:
    from gpupool.pool import BuildLimits, NoCapacity
    from tests.support.pools import make_pool

    policy = FragAware()
    pool = make_pool(tmp_path, 1, limits=BuildLimits(1000, (250, 500, 1000), 1000, 4), placement=policy)
    pool.reserve_build("ann", [], "a", 500)
    assert policy.target.seen == 1  # the real placement is learned, once
    pool.reserve_build("ann", [], "a", 500)  # a retried start keeps its share: nothing new arrived
    assert policy.target.seen == 1
    with pytest.raises(NoCapacity):
        pool.reserve_build("bob", [], "b", 1000)  # no room: never placed, never learned
    assert policy.target.seen == 1
